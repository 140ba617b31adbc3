package hypervisor

import (
	"fmt"
	"maps"
	"slices"

	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// RepinPins reads the pins a re-pin of a domain from its definition cur
// to def applies, and refuses, with ErrRejected, what a running guest
// cannot take in place: another domain's definition, another vCPU
// count, guest NUMA topology or set of devices, or memory bound to other
// host nodes. A strict memory binding,
// pinflow's, cannot change while QEMU runs, and huge pages and a
// device's locked memory stay on the node they were taken from; a guest
// whose memory must move moves to another host, or restarts.
func RepinPins(cur, def string) (*xmlpatch.Pins, error) {
	was, err := ReadDomainIdentity(cur)
	if err != nil {
		return nil, fmt.Errorf("the domain's definition %w", err)
	}
	is, err := ReadDomainIdentity(def)
	if err != nil {
		return nil, fmt.Errorf("the re-pinned definition %w", err)
	}
	if was.UUID != is.UUID || was.Name != is.Name {
		return nil, fmt.Errorf("the re-pinned definition is of domain %s (%s), not %s (%s): %w", is.Name, is.UUID, was.Name, was.UUID, ErrRejected)
	}
	from, err := xmlpatch.Read(cur)
	if err != nil {
		return nil, fmt.Errorf("the domain's definition: %w", err)
	}
	to, err := xmlpatch.Read(def)
	if err != nil {
		return nil, fmt.Errorf("the re-pinned definition: %w: %w", err, ErrRejected)
	}
	refuse := func(what string, a, b any) error {
		return fmt.Errorf("a re-pin cannot change %s (%v to %v) while the guest runs: %w", what, a, b, ErrRejected)
	}
	switch {
	case from.VCPUs != to.VCPUs:
		return nil, refuse("the vCPU count", from.VCPUs, to.VCPUs)
	case !slices.EqualFunc(from.GuestCells, to.GuestCells, func(a, b xmlpatch.GuestCell) bool {
		return a.ID == b.ID && a.MemoryKiB == b.MemoryKiB && a.VCPUs.Equal(b.VCPUs)
	}):
		return nil, refuse("the guest NUMA cells", from.GuestCells, to.GuestCells)
	case !slices.Equal(from.Devices, to.Devices) || !slices.Equal(from.DeviceNames, to.DeviceNames):
		return nil, refuse("the PCI devices", append(from.Devices, from.DeviceNames...), append(to.Devices, to.DeviceNames...))
	case !sameMemory(from.Memory, to.Memory):
		return nil, refuse("the host NUMA nodes of the guest's memory", memoryText(from.Memory), memoryText(to.Memory))
	}
	for _, c := range slices.Sorted(maps.Keys(from.MemNodes)) {
		a, b := from.MemNodes[c], to.MemNodes[c]
		if !sameMemory(&a, &b) {
			return nil, refuse(fmt.Sprintf("the host NUMA nodes of guest cell %d's memory", c), memoryText(&a), memoryText(&b))
		}
	}
	if len(from.MemNodes) != len(to.MemNodes) {
		return nil, refuse("the guest cells bound to host NUMA nodes", slices.Sorted(maps.Keys(from.MemNodes)), slices.Sorted(maps.Keys(to.MemNodes)))
	}
	// A live pin call sets a mask and cannot take one away: a thread
	// pinned now must have its new pins in def.
	for v := range from.VCPUs {
		if pinned(from.VCPUPins[v], from.DefaultCPUs) && !pinned(to.VCPUPins[v], to.DefaultCPUs) {
			return nil, fmt.Errorf("the re-pinned definition leaves vCPU %d without pins: %w", v, ErrRejected)
		}
	}
	if !from.EmulatorPins.IsEmpty() && to.EmulatorPins.IsEmpty() {
		return nil, fmt.Errorf("the re-pinned definition leaves the emulator threads without pins: %w", ErrRejected)
	}
	for id, set := range from.IOThreadPins {
		if !set.IsEmpty() && to.IOThreadPins[id].IsEmpty() {
			return nil, fmt.Errorf("the re-pinned definition leaves I/O thread %d without pins: %w", id, ErrRejected)
		}
	}
	return to, nil
}

func pinned(own, def numa.CPUSet) bool { return !own.IsEmpty() || !def.IsEmpty() }

func sameMemory(a, b *xmlpatch.MemoryPolicy) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Mode == b.Mode && a.Placement == b.Placement && a.Nodeset.Equal(b.Nodeset)
}

func memoryText(m *xmlpatch.MemoryPolicy) string {
	if m == nil {
		return "none"
	}
	if m.Placement == "auto" {
		return "auto"
	}
	return "nodes " + m.Nodeset.String()
}
