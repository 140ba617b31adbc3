package defrag

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/pinflow/pinflow/numa"
)

// Target is placement p re-pinned on h, whose pinned CPUs include p's:
// its pinned vCPUs and reserved emulator pCPU go to other pCPUs of the
// host cells they are on, and everything else stays. In each cell they
// take the pCPUs of pcpus in that host cell, the vCPUs in order and then
// the emulator; when pcpus is empty, the pCPUs free or p's own that
// leave the cell the most whole cores free (pack). The ledger judges the
// rest when it claims the target.
func Target(h *numa.Host, p *numa.Placement, pcpus numa.CPUSet) (*numa.Placement, error) {
	if p == nil || !slices.ContainsFunc(p.Cells, func(c numa.PlacedCell) bool { return len(c.Pins) > 0 }) {
		return nil, errors.New("it has no pinned vCPUs to re-pin (cpu policy dedicated or mixed)")
	}
	own, err := numa.Usage(h, p)
	if err != nil {
		return nil, fmt.Errorf("its placement is not on the host: %w", err)
	}
	need := 0
	for _, c := range p.Cells {
		need += len(c.Pins) + c.Reserved.Len()
	}
	if pcpus.Len() > 0 && pcpus.Len() != need {
		return nil, fmt.Errorf("%s given (%s), and it pins %s: one per pinned vCPU and one for a reserved emulator thread", countOf(pcpus.Len(), "pCPU", "pCPUs"), pcpus, countOf(need, "pCPU", "pCPUs"))
	}
	out := *p
	out.Cells = slices.Clone(p.Cells)
	for i := range out.Cells {
		cell := &out.Cells[i]
		host := h.Cell(cell.HostCell)
		vcpus := slices.Sorted(maps.Keys(cell.Pins))
		n := len(vcpus) + cell.Reserved.Len()
		var picked []int
		if pcpus.Len() > 0 {
			mine := pcpus.Intersection(host.PCPUs)
			if mine.Len() != n {
				return nil, fmt.Errorf("its guest cell %d pins %s of host cell %d (pinnable: %s), and %d of those given are there: a re-pin keeps each guest cell on its host cell",
					cell.GuestCell, countOf(n, "pCPU", "pCPUs"), host.ID, host.PCPUs, mine.Len())
			}
			picked = mine.List()
		} else {
			avail := host.FreePCPUs().Union(own[i].PinnedCPUs)
			picked = pack(host, avail, n, cell.ThreadPolicy)
			if len(picked) < n {
				return nil, fmt.Errorf("host cell %d has %s free or its own as thread policy %s takes them, and guest cell %d pins %d",
					host.ID, countOf(len(picked), "pCPU", "pCPUs"), policyName(cell.ThreadPolicy), cell.GuestCell, n)
			}
		}
		cell.Pins = make(map[int]int, len(vcpus))
		for j, v := range vcpus {
			cell.Pins[v] = picked[j]
		}
		cell.Reserved = numa.NewCPUSet(picked[len(vcpus):]...)
	}
	return &out, nil
}

// pack picks n of avail, the cell's pCPUs a guest cell may take, so that
// the cell keeps the most whole cores free, or fewer when avail has not
// n that policy allows. Under isolate each pCPU is the first of a whole
// free core (its siblings go with it, unused). Otherwise the guest fills
// the free threads of cores in use first, the fullest first (under
// require only cores with two threads free or more), and then whole cores
// one after another.
// Ties go to the lowest pCPU, so a plan is the same every time.
func pack(c *numa.Cell, avail numa.CPUSet, n int, policy numa.ThreadPolicy) []int {
	var partial, whole [][]int
	for _, core := range cores(c) {
		free := core.Intersection(avail)
		switch {
		case free.IsEmpty():
		case free.Equal(core):
			whole = append(whole, free.List())
		default:
			partial = append(partial, free.List())
		}
	}
	var out []int
	take := func(cpus []int) {
		out = append(out, cpus[:min(len(cpus), n-len(out))]...)
	}
	switch policy {
	case numa.ThreadPolicyIsolate:
		for _, core := range whole {
			take(core[:1])
		}
	case numa.ThreadPolicyRequire:
		partial = slices.DeleteFunc(partial, func(core []int) bool { return len(core) < 2 })
		fallthrough
	default:
		slices.SortStableFunc(partial, func(a, b []int) int { return len(a) - len(b) })
		for _, core := range append(partial, whole...) {
			take(core)
		}
	}
	return out
}

// cores are the cell's pinnable pCPUs grouped by core, in the cell's
// order: its sibling groups, and each pCPU no group holds on its own.
func cores(c *numa.Cell) []numa.CPUSet {
	var out []numa.CPUSet
	var grouped numa.CPUSet
	for _, s := range c.Siblings {
		if core := s.Intersection(c.PCPUs); !core.IsEmpty() {
			out = append(out, core)
			grouped = grouped.Union(core)
		}
	}
	for _, cpu := range c.PCPUs.Difference(grouped).List() {
		out = append(out, numa.NewCPUSet(cpu))
	}
	return out
}

// freeCores counts the cell's cores with no pCPU pinned.
func freeCores(c *numa.Cell) int {
	n := 0
	for _, core := range cores(c) {
		if !core.Intersects(c.PinnedCPUs) {
			n++
		}
	}
	return n
}

func policyName(p numa.ThreadPolicy) string {
	if p == "" {
		return string(numa.ThreadPolicyPrefer)
	}
	return string(p)
}

// countOf is n things, in words.
func countOf(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
