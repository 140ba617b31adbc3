package hypervisor

import (
	"errors"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/numa"
)

func TestRepinPins(t *testing.T) {
	const head = `<domain><name>vm</name><uuid>3a82b0a4-5c0e-4b8e-9a51-2f5d2e7c1d10</uuid><memory unit='KiB'>1048576</memory>`
	dom := func(body string) string { return head + body + `</domain>` }
	cur := dom(`<vcpu>2</vcpu><cputune><vcpupin vcpu='0' cpuset='2'/><vcpupin vcpu='1' cpuset='3'/><emulatorpin cpuset='2-3'/></cputune>` +
		`<cpu><numa><cell id='0' cpus='0-1' memory='1048576' unit='KiB'/></numa></cpu><numatune><memory mode='strict' nodeset='0'/><memnode cellid='0' mode='strict' nodeset='0'/></numatune>`)
	tests := []struct {
		name, def string
		want      string // a part of the error; empty: accepted
	}{
		{"the same pins", cur, ""},
		{"other pCPUs of the node", strings.NewReplacer("cpuset='2'", "cpuset='4'", "cpuset='3'", "cpuset='5'", "cpuset='2-3'", "cpuset='4-5'").Replace(cur), ""},
		{"another vCPU count", strings.Replace(cur, "<vcpu>2</vcpu>", "<vcpu>3</vcpu>", 1), "cannot change the vCPU count (2 to 3)"},
		{"memory on another node", strings.ReplaceAll(cur, "nodeset='0'", "nodeset='1'"), "cannot change the host NUMA nodes of the guest's memory (nodes 0 to nodes 1)"},
		{"another guest cell size", strings.Replace(cur, "memory='1048576'", "memory='524288'", 1), "cannot change the guest NUMA cells"},
		{"another domain", strings.Replace(cur, "3a82b0a4", "4a82b0a4", 1), "is of domain vm (4a82b0a4-5c0e-4b8e-9a51-2f5d2e7c1d10), not vm"},
		{"a vCPU unpinned", strings.Replace(cur, "<vcpupin vcpu='1' cpuset='3'/>", "", 1), "leaves vCPU 1 without pins"},
		{"the emulator unpinned", strings.Replace(cur, "<emulatorpin cpuset='2-3'/>", "", 1), "leaves the emulator threads without pins"},
		{"not XML", "<domain", "does not parse"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pins, err := RepinPins(cur, tt.def)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("RepinPins = %v, want the pins", err)
				}
				if got := pins.HostCPUs(); got.IsEmpty() {
					t.Errorf("RepinPins read no pins from %s", tt.def)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrRejected) {
				t.Fatalf("RepinPins = %v; want an error containing %q, wrapping ErrRejected", err, tt.want)
			}
		})
	}
	pins, err := RepinPins(cur, tests[1].def)
	if err != nil || !pins.HostCPUs().Equal(numa.MustParse("4-5")) {
		t.Errorf("RepinPins to pCPUs 4-5 = %v, %v; want pins on 4-5", pins, err)
	}
}
