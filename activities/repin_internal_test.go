package activities

import (
	"strings"
	"testing"

	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// TestRepinTarget: each guest cell takes the given pCPUs of its host
// cell, or the lowest its host cell has free (whole cores under
// isolate), and keeps everything else; what cannot be is refused saying
// why.
func TestRepinTarget(t *testing.T) {
	host, err := numa.Uniform(numa.UniformSpec{Cells: 2, Cores: 4, Threads: 2, MemoryMB: 8192})
	if err != nil {
		t.Fatal(err)
	}
	cellOf := func(hostCell int, pins map[int]int, policy numa.ThreadPolicy) numa.PlacedCell {
		var vcpus []int
		for v := range pins {
			vcpus = append(vcpus, v)
		}
		return numa.PlacedCell{GuestCell: hostCell, HostCell: hostCell, DedicatedVCPUs: numa.NewCPUSet(vcpus...), Pins: pins,
			MemoryMB: 1024, CPUPolicy: numa.CPUPolicyDedicated, ThreadPolicy: policy}
	}
	// Guest cells 0 and 1 on host cells 1 and 0, in that order.
	cell1, cell0 := host.Cell(1).PCPUs.List(), host.Cell(0).PCPUs.List()
	p := &numa.Placement{Cells: []numa.PlacedCell{
		cellOf(1, map[int]int{0: cell1[6], 1: cell1[7]}, ""),
		cellOf(0, map[int]int{2: cell0[6], 3: cell0[7]}, ""),
	}}
	p.Cells[0].GuestCell, p.Cells[1].GuestCell = 0, 1
	snap := &ledger.Snapshot{Topology: host, Pins: []ledger.Pin{
		{CPU: cell0[0], ClaimID: "other"}, {CPU: cell1[6], ClaimID: "mine"}, {CPU: cell1[7], ClaimID: "mine"},
		{CPU: cell0[6], ClaimID: "mine"}, {CPU: cell0[7], ClaimID: "mine"},
	}}
	pins := func(p *numa.Placement) string {
		var s []string
		for _, c := range p.Cells {
			s = append(s, c.PinnedPCPUs().String())
		}
		return strings.Join(s, " ")
	}
	given := numa.NewCPUSet(cell0[2], cell0[3], cell1[4], cell1[5])
	got, err := repinTarget(snap, p, "mine", given)
	if err != nil {
		t.Fatal(err)
	}
	if want := numa.NewCPUSet(cell1[4], cell1[5]).String() + " " + numa.NewCPUSet(cell0[2], cell0[3]).String(); pins(got) != want {
		t.Errorf("re-pin to %s: cells pinned to %s, want %s", given, pins(got), want)
	}
	if got.Cells[0].Pins[0] != cell1[4] || got.Cells[1].Pins[3] != cell0[3] || got.Cells[0].MemoryMB != 1024 {
		t.Errorf("re-pin to %s: cells %+v", given, got.Cells)
	}
	if pins(p) != numa.NewCPUSet(cell1[6], cell1[7]).String()+" "+numa.NewCPUSet(cell0[6], cell0[7]).String() {
		t.Errorf("the placement asked from changed: %s", pins(p))
	}
	// Packed: the lowest free or its own, past another claim's pCPU.
	got, err = repinTarget(snap, p, "mine", numa.CPUSet{})
	if err != nil {
		t.Fatal(err)
	}
	if want := numa.NewCPUSet(cell1[0], cell1[1]).String() + " " + numa.NewCPUSet(cell0[1], cell0[2]).String(); pins(got) != want {
		t.Errorf("packed: cells pinned to %s, want %s", pins(got), want)
	}
	// Isolate takes whole cores.
	iso := &numa.Placement{Cells: []numa.PlacedCell{cellOf(0, map[int]int{0: cell0[6]}, numa.ThreadPolicyIsolate)}}
	got, err = repinTarget(&ledger.Snapshot{Topology: host, Pins: []ledger.Pin{{CPU: cell0[0], ClaimID: "other"}}}, iso, "mine", numa.CPUSet{})
	if err != nil {
		t.Fatal(err)
	}
	sibling := host.Cell(0).Siblings[0]
	if core := got.Cells[0].PinnedPCPUs(); core.Intersects(sibling) {
		t.Errorf("isolate packed onto %s, which shares a core with the other claim's %d (%s)", core, cell0[0], sibling)
	}
	for _, tt := range []struct {
		name  string
		p     *numa.Placement
		pcpus numa.CPUSet
		says  string
	}{
		{"floating", &numa.Placement{VCPUs: 2}, numa.CPUSet{}, "no pinned vCPUs"},
		{"too few", p, numa.NewCPUSet(cell0[2]), "1 pCPU given"},
		{"another cell", p, numa.NewCPUSet(cell0[1], cell0[2], cell0[3], cell1[4]), "guest cell 0 pins 2 pCPUs of host cell 1"},
	} {
		if _, err := repinTarget(snap, tt.p, "mine", tt.pcpus); err == nil || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s: repinTarget = %v, want an error saying %q", tt.name, err, tt.says)
		}
	}
}
