package hypervisor

import (
	"errors"
	"testing"

	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

func TestPinsFit(t *testing.T) {
	// A one-cell host: online cpus 0-1, NUMA node 0.
	cpus, nodes := numa.MustParse("0-1"), numa.MustParse("0")
	tests := []struct {
		name, xml string
		want      string // the whole error; empty: it fits
	}{
		{"fits", `<domain><vcpu cpuset='0-1'>2</vcpu><cputune><vcpupin vcpu='0' cpuset='1'/><emulatorpin cpuset='0'/><iothreadpin iothread='1' cpuset='0-1'/></cputune><numatune><memory mode='strict' nodeset='0'/><memnode cellid='0' mode='strict' nodeset='0'/></numatune></domain>`, ""},
		{"no pins", `<domain><vcpu>2</vcpu></domain>`, ""},
		{"nodes chosen by numad", `<domain><vcpu>1</vcpu><numatune><memory mode='strict' placement='auto'/></numatune></domain>`, ""},
		{"vcpupin to a missing cpu", `<domain><vcpu>2</vcpu><cputune><vcpupin vcpu='1' cpuset='5'/></cputune></domain>`,
			`<vcpupin vcpu='1'> cpuset "5" names cpus 5 the host does not have; its online cpus are 0-1: rejected by the hypervisor`},
		{"emulatorpin partly off the host", `<domain><vcpu>1</vcpu><cputune><emulatorpin cpuset='0-2'/></cputune></domain>`,
			`<emulatorpin> cpuset "0-2" names cpus 2 the host does not have; its online cpus are 0-1: rejected by the hypervisor`},
		{"iothreadpin to a missing cpu", `<domain><vcpu>1</vcpu><cputune><iothreadpin iothread='1' cpuset='7'/></cputune></domain>`,
			`<iothreadpin iothread='1'> cpuset "7" names cpus 7 the host does not have; its online cpus are 0-1: rejected by the hypervisor`},
		{"vcpu cpuset", `<domain><vcpu cpuset='3'>1</vcpu></domain>`,
			`<vcpu> cpuset "3" names cpus 3 the host does not have; its online cpus are 0-1: rejected by the hypervisor`},
		{"memory on a missing node", `<domain><vcpu>1</vcpu><numatune><memory mode='strict' nodeset='1'/></numatune></domain>`,
			`<numatune><memory> nodeset "1" names NUMA nodes 1 the host does not have; its nodes are 0: rejected by the hypervisor`},
		{"memnode partly on a missing node", `<domain><vcpu>1</vcpu><numatune><memnode cellid='1' mode='strict' nodeset='0-1'/></numatune></domain>`,
			`<memnode cellid='1'> nodeset "0-1" names NUMA nodes 1 the host does not have; its nodes are 0: rejected by the hypervisor`},
		{"lowest vcpu first", `<domain><vcpu>4</vcpu><cputune><vcpupin vcpu='3' cpuset='9'/><vcpupin vcpu='2' cpuset='8'/></cputune></domain>`,
			`<vcpupin vcpu='2'> cpuset "8" names cpus 8 the host does not have; its online cpus are 0-1: rejected by the hypervisor`},
		{"cpus before nodes", `<domain><vcpu>1</vcpu><cputune><emulatorpin cpuset='4'/></cputune><numatune><memory nodeset='3'/></numatune></domain>`,
			`<emulatorpin> cpuset "4" names cpus 4 the host does not have; its online cpus are 0-1: rejected by the hypervisor`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pins, err := xmlpatch.Read(tt.xml)
			if err != nil {
				t.Fatalf("xmlpatch.Read(%s): %v", tt.xml, err)
			}
			err = PinsFit(pins, cpus, nodes)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("PinsFit(%s) = %v, want nil", tt.xml, err)
				}
				return
			}
			if err == nil || err.Error() != tt.want || !errors.Is(err, ErrRejected) {
				t.Fatalf("PinsFit(%s) = %v;\nwant %q, wrapping ErrRejected", tt.xml, err, tt.want)
			}
		})
	}
}

func TestUsedCPUs(t *testing.T) {
	pinned := `<domain><vcpu>2</vcpu><cputune><vcpupin vcpu='0' cpuset='2'/><vcpupin vcpu='1' cpuset='3'/><emulatorpin cpuset='5'/></cputune></domain>`
	tests := []struct {
		name    string
		d       Domain
		want    string
		wantErr bool
	}{
		{"running", Domain{UUID: "u", State: StateRunning, XML: pinned}, "2-3,5", false},
		{"paused", Domain{UUID: "u", State: StatePaused, XML: pinned}, "2-3,5", false},
		{"shut off", Domain{UUID: "u", State: StateShutoff, XML: pinned}, "", false},
		{"floating", Domain{UUID: "u", State: StateRunning, XML: `<domain><vcpu cpuset='0-1'>2</vcpu></domain>`}, "", false},
		{"mixed", Domain{UUID: "u", State: StateRunning, XML: `<domain><vcpu>2</vcpu><cputune><vcpupin vcpu='0' cpuset='0-1'/><vcpupin vcpu='1' cpuset='3'/><emulatorpin cpuset='0-1,3'/></cputune></domain>`}, "3", false},
		{"unreadable", Domain{UUID: "u", State: StateRunning, XML: "<domain>"}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := UsedCPUs(tt.d)
			if (err != nil) != tt.wantErr {
				t.Fatalf("UsedCPUs(%s) error %v, want error %v", tt.name, err, tt.wantErr)
			}
			if got.String() != tt.want {
				t.Errorf("UsedCPUs(%s) = %q, want %q", tt.name, got, tt.want)
			}
		})
	}
}

// TestBreaches: a domain whose threads may run on pCPUs another guest's
// claim dedicates breaks the promise, whatever its state but shut off; a
// guest's own claims and a floating guest kept to the shared set do not.
func TestBreaches(t *testing.T) {
	all := numa.Range(0, 5)
	owners := map[int]Owner{2: {Claim: "c-p", Guest: "p"}, 3: {Claim: "c-p", Guest: "p"}, 4: {Claim: "c-q", Guest: "q"}}
	pinned := `<domain><vcpu>2</vcpu><cputune><vcpupin vcpu='0' cpuset='2'/><vcpupin vcpu='1' cpuset='3'/><emulatorpin cpuset='2-3'/></cputune></domain>`
	doms := []Domain{
		{UUID: "p", Name: "pinned", State: StateRunning, XML: pinned},
		{UUID: "f", Name: "kept", State: StateRunning, XML: `<domain><vcpu cpuset='0-1'>2</vcpu></domain>`},
		{UUID: "w", Name: "whole", State: StateRunning, XML: `<domain><vcpu>2</vcpu></domain>`},
		{UUID: "e", Name: "emulator", State: StatePaused, XML: `<domain><vcpu>1</vcpu><cputune><vcpupin vcpu='0' cpuset='0'/></cputune></domain>`},
		{UUID: "o", Name: "off", State: StateShutoff, XML: `<domain><vcpu>2</vcpu></domain>`},
	}
	got := Breaches(doms, all, owners)
	want := []string{
		"domain whole (w, running) may run on pCPUs 2-4 that claim c-p of guest p and claim c-q of guest q dedicate",
		"domain emulator (e, paused) may run on pCPUs 2-4 that claim c-p of guest p and claim c-q of guest q dedicate",
	}
	if len(got) != len(want) {
		t.Fatalf("Breaches = %v, want %d: %v", got, len(want), want)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("Breaches[%d] = %q, want %q", i, got[i], want[i])
		}
	}
}
