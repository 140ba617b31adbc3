package defrag

import (
	"strings"
	"testing"

	"github.com/pinflow/pinflow/numa"
)

// TestTarget: each guest cell takes the given pCPUs of its host cell, or
// those its host cell has free or its own that leave the most whole cores
// free (whole cores under isolate), and keeps everything else; what
// cannot be is refused saying why.
func TestTarget(t *testing.T) {
	h := host(t, 2, 4)
	cellOf := func(hostCell int, pins map[int]int, policy numa.ThreadPolicy) numa.PlacedCell {
		var vcpus []int
		for v := range pins {
			vcpus = append(vcpus, v)
		}
		return numa.PlacedCell{GuestCell: hostCell, HostCell: hostCell, DedicatedVCPUs: numa.NewCPUSet(vcpus...), Pins: pins,
			MemoryMB: 1024, CPUPolicy: numa.CPUPolicyDedicated, ThreadPolicy: policy}
	}
	// Guest cells 0 and 1 on host cells 1 and 0, in that order; another
	// guest on pCPU 0.
	p := &numa.Placement{Cells: []numa.PlacedCell{
		cellOf(1, map[int]int{0: 14, 1: 15}, ""),
		cellOf(0, map[int]int{2: 6, 3: 7}, ""),
	}}
	p.Cells[0].GuestCell, p.Cells[1].GuestCell = 0, 1
	for _, pl := range []*numa.Placement{p, {Cells: []numa.PlacedCell{cellOf(0, map[int]int{0: 0}, "")}}} {
		us, err := numa.Usage(h, pl)
		if err == nil {
			err = h.Add(us)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	pins := func(p *numa.Placement) string {
		var s []string
		for _, c := range p.Cells {
			s = append(s, c.PinnedPCPUs().String())
		}
		return strings.Join(s, " ")
	}
	given := numa.NewCPUSet(2, 3, 12, 13)
	got, err := Target(h, p, given)
	if err != nil {
		t.Fatal(err)
	}
	if want := "12-13 2-3"; pins(got) != want {
		t.Errorf("re-pin to %s: cells pinned to %s, want %s", given, pins(got), want)
	}
	if got.Cells[0].Pins[0] != 12 || got.Cells[1].Pins[3] != 3 || got.Cells[0].MemoryMB != 1024 {
		t.Errorf("re-pin to %s: cells %+v", given, got.Cells)
	}
	if pins(p) != "14-15 6-7" {
		t.Errorf("the placement asked from changed: %s", pins(p))
	}
	// Packed: onto the free thread of the other guest's core first, then
	// a whole core; its own core is free to take.
	got, err = Target(h, p, numa.CPUSet{})
	if err != nil {
		t.Fatal(err)
	}
	if want := "8-9 1-2"; pins(got) != want {
		t.Errorf("packed: cells pinned to %s, want %s", pins(got), want)
	}
	// Isolate takes whole cores.
	iso := &numa.Placement{Cells: []numa.PlacedCell{cellOf(0, map[int]int{0: 6}, numa.ThreadPolicyIsolate)}}
	bare := host(t, 2, 4)
	for _, pl := range []*numa.Placement{iso, {Cells: []numa.PlacedCell{cellOf(0, map[int]int{0: 0}, "")}}} {
		us, _ := numa.Usage(bare, pl)
		if err := bare.Add(us); err != nil {
			t.Fatal(err)
		}
	}
	got, err = Target(bare, iso, numa.CPUSet{})
	if err != nil {
		t.Fatal(err)
	}
	if core := got.Cells[0].PinnedPCPUs(); core.String() != "2" {
		t.Errorf("isolate packed onto %s, want 2, the first whole core free", core)
	}
	for _, tt := range []struct {
		name  string
		p     *numa.Placement
		pcpus numa.CPUSet
		says  string
	}{
		{"floating", &numa.Placement{VCPUs: 2}, numa.CPUSet{}, "no pinned vCPUs"},
		{"too few", p, numa.NewCPUSet(2), "1 pCPU given"},
		{"another cell", p, numa.NewCPUSet(1, 2, 3, 12), "guest cell 0 pins 2 pCPUs of host cell 1"},
	} {
		if _, err := Target(h, tt.p, tt.pcpus); err == nil || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s: Target = %v, want an error saying %q", tt.name, err, tt.says)
		}
	}
	// No room elsewhere: the guest stays on its own pCPUs.
	full := h.Clone()
	full.Cell(1).PinnedCPUs = full.Cell(1).PCPUs
	if got, err := Target(full, p, numa.CPUSet{}); err != nil || pins(got) != "14-15 1-2" {
		t.Errorf("a full host cell: Target = %v, %v; want cell 0 where it is", got, err)
	}
}
