package xmlpatch

import (
	"strings"
	"testing"

	"github.com/pinflow/pinflow/numa"
)

// TestPatchFloatingGuest: a placement without NUMA cells writes its host's
// shared CPUs as <vcpu cpuset>, over a cpuset the source host gave, and
// keeps the element's other attributes; one without FloatCPUs (recorded
// before pinflow wrote them) leaves the element as it was.
func TestPatchFloatingGuest(t *testing.T) {
	for _, tt := range []struct {
		name, vcpu string
		float      numa.CPUSet
		want       string
	}{
		{"no cpuset yet", "<vcpu placement='static'>2</vcpu>", set("0-1"), "<vcpu placement='static' cpuset='0-1'>2</vcpu>"},
		{"the source host's", "<vcpu placement='static' cpuset='4-5'>2</vcpu>", set("0,8"), "<vcpu placement='static' cpuset='0,8'>2</vcpu>"},
		{"a placement without FloatCPUs", "<vcpu placement='static' cpuset='4-5'>2</vcpu>", numa.CPUSet{}, "<vcpu placement='static' cpuset='4-5'>2</vcpu>"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := strings.Replace(minimal(2, "", ""), "<vcpu placement='static'>2</vcpu>", tt.vcpu, 1)
			p := &numa.Placement{VCPUs: 2, MemoryMB: 2048, FloatCPUs: tt.float}
			got, err := Patch(src, p)
			if err != nil {
				t.Fatalf("Patch(%s): %v", tt.name, err)
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("Patch(%s) wrote\n%s\nwant it to hold %s", tt.name, got, tt.want)
			}
			// Nothing else changes.
			checkUntouched(t, tt.name, strings.Replace(src, tt.vcpu, tt.want, 1), got)
			pins, err := Read(got)
			if err != nil {
				t.Fatal(err)
			}
			all := set("0-15")
			if want := tt.float; !want.IsEmpty() && !pins.Reach(all).Equal(want) {
				t.Errorf("Patch(%s): Reach %s, want %s", tt.name, pins.Reach(all), want)
			}
			if want, _ := PinsFor(p); !want.DefaultCPUs.Equal(tt.float) {
				t.Errorf("PinsFor(%s).DefaultCPUs = %s, want %s", tt.name, want.DefaultCPUs, tt.float)
			}
		})
	}
}

// TestReachAndPinnedCPUs: where a domain's threads may run, as libvirt
// applies its pins, and what it holds one to one.
func TestReachAndPinnedCPUs(t *testing.T) {
	all := set("0-7")
	for _, tt := range []struct {
		name          string
		pins          Pins
		reach, pinned string
	}{
		{"nothing pinned: the whole host", Pins{VCPUs: 2}, "0-7", ""},
		{"<vcpu cpuset> alone", Pins{VCPUs: 2, DefaultCPUs: set("0-1")}, "0-1", ""},
		{"every thread pinned one to one", Pins{VCPUs: 2, VCPUPins: map[int]numa.CPUSet{0: set("2"), 1: set("3")}, EmulatorPins: set("2-3")}, "2-3", "2-3"},
		{"vCPUs pinned, the emulator not", Pins{VCPUs: 2, VCPUPins: map[int]numa.CPUSet{0: set("2"), 1: set("3")}}, "0-7", "2-3"},
		{"the emulator follows <vcpu cpuset>", Pins{VCPUs: 1, DefaultCPUs: set("0"), VCPUPins: map[int]numa.CPUSet{0: set("4")}}, "0,4", "4"},
		{"a vCPU left out", Pins{VCPUs: 2, VCPUPins: map[int]numa.CPUSet{0: set("2")}, EmulatorPins: set("2")}, "0-7", "2"},
		{"an I/O thread left out", Pins{VCPUs: 1, VCPUPins: map[int]numa.CPUSet{0: set("2")}, EmulatorPins: set("2"),
			IOThreads: []int{1, 2}, IOThreadPins: map[int]numa.CPUSet{1: set("2")}}, "0-7", "2"},
		{"mixed: shared vCPUs float over the cell's shared CPUs", Pins{VCPUs: 2,
			VCPUPins: map[int]numa.CPUSet{0: set("0-1"), 1: set("5")}, EmulatorPins: set("0-1,5")}, "0-1,5", "5"},
		{"an isolated emulator", Pins{VCPUs: 1, VCPUPins: map[int]numa.CPUSet{0: set("5")}, EmulatorPins: set("6")}, "5-6", "5-6"},
	} {
		if got := tt.pins.Reach(all).String(); got != tt.reach {
			t.Errorf("Reach(%s) = %q, want %q", tt.name, got, tt.reach)
		}
		if got := tt.pins.PinnedCPUs().String(); got != tt.pinned {
			t.Errorf("PinnedCPUs(%s) = %q, want %q", tt.name, got, tt.pinned)
		}
	}
}
