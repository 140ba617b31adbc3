package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/numa"
)

// chaosSharedPerCell is how many shared CPUs each cell of a host with
// shared CPUs has beside its pinnable ones: enough for the largest
// floating guest cell of a run.
const chaosSharedPerCell = 2

// chaosHostSets are the shared and dedicated CPUs of the i-th host of a
// run of two cells of cores pinnable CPUs each. Every third host, from
// h1, is registered with neither set, as a host of pinned guests only:
// every CPU pinnable, none shared. The others have chaosSharedPerCell
// more CPUs in each cell, shared: the first of each cell on one, the last
// on the next, by turns, so that a guest moved between two of them with
// its source's cpuset would float over its destination's pinnable CPUs.
func chaosHostSets(i, cores int) (shared, dedicated numa.CPUSet) {
	if i%3 == 1 {
		return numa.CPUSet{}, numa.CPUSet{}
	}
	per := cores + chaosSharedPerCell
	last := (i-(i+1)/3)%2 == 1 // the hosts with shared CPUs before this one, by turns
	for cell := range 2 {
		lo, hi := cell*per, (cell+1)*per-1
		pool := numa.Range(lo, lo+chaosSharedPerCell-1)
		if last {
			pool = numa.Range(hi-chaosSharedPerCell+1, hi)
		}
		shared = shared.Union(pool)
		dedicated = dedicated.Union(numa.Range(lo, hi).Difference(pool))
	}
	return shared, dedicated
}

// hostSetArgs are the `host add` flags of a host of chaosHostSets'.
func hostSetArgs(cores int, shared, dedicated numa.CPUSet) []string {
	if shared.IsEmpty() {
		return []string{"--cores", fmt.Sprint(cores)}
	}
	return []string{"--cores", fmt.Sprint(cores + chaosSharedPerCell), "--shared", shared.String(), "--dedicated", dedicated.String()}
}

// chaosTopology is the topology file of a host of chaosHostSets' with an
// SR-IOV NIC of four VFs on each of its two cells.
func chaosTopology(t testing.TB, cores int, shared, dedicated numa.CPUSet) string {
	t.Helper()
	if shared.IsEmpty() {
		return nicTopology(t, 2, cores, 4)
	}
	h, err := numa.Uniform(numa.UniformSpec{Cells: 2, Cores: cores + chaosSharedPerCell, Threads: 1, MemoryMB: 16384,
		Shared: shared, Dedicated: dedicated})
	if err != nil {
		t.Fatal(err)
	}
	for c := range 2 {
		h.PCIDevices = append(h.PCIDevices, nic(c, c, 4)...)
	}
	return topologyFile(t, h)
}

// guestKind is what a chaos guest asks of its host's CPUs.
type guestKind int

const (
	kindPinned guestKind = iota
	// kindFloating has no CPU policy and no NUMA topology: its domain
	// gets <vcpu cpuset> of its host's shared CPUs.
	kindFloating
	// kindFloatingNUMA has no CPU policy and one NUMA cell: its vCPUs are
	// pinned to its cell's shared CPUs.
	kindFloatingNUMA
	// kindMixed is hw:cpu_policy=mixed: vCPU 0 floats over its cell's
	// shared CPUs, the others are pinned.
	kindMixed
)

func (k guestKind) String() string {
	return [...]string{"pinned", "floating", "floating-numa", "mixed"}[k]
}

// floats says whether the guest needs shared CPUs: a host without any
// refuses it.
func (k guestKind) floats() bool { return k != kindPinned }

// flavor is the kind's flavor at its smaller size; a resize takes it one
// vCPU up and back.
func (k guestKind) flavor() guest.Flavor {
	f := guest.Flavor{VCPUs: 2, MemoryMB: 512, ExtraSpecs: map[string]string{}}
	switch k {
	case kindPinned:
		f.ExtraSpecs["hw:cpu_policy"] = "dedicated"
	case kindFloatingNUMA:
		f.VCPUs = 1
		f.ExtraSpecs["hw:numa_nodes"] = "1"
	case kindMixed:
		f.ExtraSpecs["hw:cpu_policy"] = "mixed"
		f.ExtraSpecs["hw:cpu_dedicated_mask"] = "^0"
	}
	return f
}

// slotKind is the kind of the boot-th guest a slot boots: odd slots (the
// ones with devices in a run with devices) boot pinned guests, even slots
// every kind by turns.
func slotKind(slot, boot int) guestKind {
	if slot%2 == 1 {
		return kindPinned
	}
	return [...]guestKind{kindFloating, kindMixed, kindFloatingNUMA, kindPinned}[(slot/2+boot)%4]
}

// noSharedCPUs says whether a boot failed as one of a floating or mixed
// guest on a host without shared CPUs is refused.
func noSharedCPUs(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "the host has no shared CPUs") ||
		strings.Contains(err.Error(), "shared CPUs, the cell has 0"))
}
