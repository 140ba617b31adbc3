package xmlpatch

import (
	"slices"
	"sort"

	"github.com/pinflow/pinflow/numa"
)

// Pins is the pinning a domain carries, as libvirt would apply it.
type Pins struct {
	// VCPUs is the vCPU count of <vcpu>.
	VCPUs int `json:"vcpus"`
	// DefaultCPUs is <vcpu cpuset>: where vCPUs without a vcpupin run.
	DefaultCPUs numa.CPUSet `json:"vcpu_cpuset,omitzero"`
	// VCPUPins maps a vCPU to the host CPUs of its <vcpupin>.
	VCPUPins map[int]numa.CPUSet `json:"vcpu_pins,omitempty"`
	// EmulatorPins is <emulatorpin cpuset>.
	EmulatorPins numa.CPUSet `json:"emulator_pins,omitzero"`
	// IOThreadPins maps an I/O thread id to the host CPUs of its <iothreadpin>.
	IOThreadPins map[int]numa.CPUSet `json:"iothread_pins,omitempty"`
	// IOThreads are the ids of the domain's I/O threads, pinned or not.
	IOThreads []int `json:"iothreads,omitempty"`
	// Memory is <numatune><memory>; nil without one.
	Memory *MemoryPolicy `json:"memory,omitempty"`
	// MemNodes maps a guest cell id to its <numatune><memnode>.
	MemNodes map[int]MemoryPolicy `json:"memnodes,omitempty"`
	// Sched maps each vCPU named by a <vcpusched> to its scheduler; libvirt
	// writes one element per vCPU or one per range, so ranges are expanded.
	Sched map[int]Sched `json:"vcpu_sched,omitempty"`
	// RealtimeVCPUs are the vCPUs scheduled fifo or rr.
	RealtimeVCPUs numa.CPUSet `json:"realtime_vcpus,omitzero"`
	// RealtimePriority is the priority of every realtime vCPU when they
	// share one, otherwise 0 (Sched has each vCPU's).
	RealtimePriority int `json:"realtime_priority,omitempty"`
	// GuestCells are the guest NUMA cells of <cpu><numa>, in document order.
	GuestCells []GuestCell `json:"guest_cells,omitempty"`
	// Devices are the host PCI devices of the domain's <hostdev type='pci'>
	// and <interface type='hostdev'> elements, as numa's addresses
	// ("0000:81:00.1"), in document order.
	Devices []string `json:"devices,omitempty"`
	// DeviceNames are the host-side names of the devices pinflow's ports
	// reach by name (macvtap, vdpa and virtio-forwarder interfaces), in
	// document order; the host's device list maps them to its devices
	// (numa.Host.DeviceNamed).
	DeviceNames []string `json:"device_names,omitempty"`
}

// MemoryPolicy is a NUMA memory policy: a mode and host nodes.
type MemoryPolicy struct {
	// Mode is strict, preferred, interleave or restrictive; "" when the
	// element leaves it to libvirt's default (strict).
	Mode    string      `json:"mode,omitempty"`
	Nodeset numa.CPUSet `json:"nodeset"`
	// Placement is "auto" when numad chooses the nodes.
	Placement string `json:"placement,omitempty"`
}

// Sched is one vCPU's scheduler policy.
type Sched struct {
	Scheduler string `json:"scheduler"`
	Priority  int    `json:"priority,omitempty"`
}

// GuestCell is one guest NUMA cell.
type GuestCell struct {
	ID        int         `json:"id"`
	VCPUs     numa.CPUSet `json:"vcpus"`
	MemoryKiB uint64      `json:"memory_kib"`
}

// HostCPUs returns every host CPU the domain's pins name: vCPU, emulator
// and I/O thread pins. Reconciliation compares it with the ledger's owners.
func (p *Pins) HostCPUs() numa.CPUSet {
	out := p.EmulatorPins
	for _, s := range p.VCPUPins {
		out = out.Union(s)
	}
	for _, s := range p.IOThreadPins {
		out = out.Union(s)
	}
	return out
}

// PinnedCPUs returns the host CPUs the domain holds one to one: those of
// each vCPU, emulator or I/O thread pin that names a single CPU. A pin to
// several CPUs floats over them, as a vCPU without a pin floats over
// <vcpu cpuset>; Reach says where such threads may run.
func (p *Pins) PinnedCPUs() numa.CPUSet {
	var out numa.CPUSet
	add := func(s numa.CPUSet) {
		if s.Len() == 1 {
			out = out.Union(s)
		}
	}
	add(p.EmulatorPins)
	for _, s := range p.VCPUPins {
		add(s)
	}
	for _, s := range p.IOThreadPins {
		add(s)
	}
	return out
}

// Reach returns every host CPU some thread of the domain may run on, as
// libvirt applies its pins: each vCPU, the emulator and each I/O thread on
// its own pin, else on <vcpu cpuset>, else on every CPU of the host (all).
func (p *Pins) Reach(all numa.CPUSet) numa.CPUSet {
	fallback := all
	if !p.DefaultCPUs.IsEmpty() {
		fallback = p.DefaultCPUs
	}
	out := p.HostCPUs()
	unpinned := p.EmulatorPins.IsEmpty()
	for v := range p.VCPUs {
		if p.VCPUPins[v].IsEmpty() {
			unpinned = true
		}
	}
	for _, id := range p.IOThreads {
		if p.IOThreadPins[id].IsEmpty() {
			unpinned = true
		}
	}
	if unpinned {
		out = out.Union(fallback)
	}
	return out
}

// PinsFor returns the pins Patch writes for placement p: vCPU and
// emulator pins (or the <vcpu cpuset> of a guest without NUMA cells), the <memory> and per-cell <memnode> nodesets, the guest
// cells and, when p names realtime vCPUs, their fifo scheduling (at
// numa.DefaultRealtimePriority when p.RealtimePriority is 0). What comes
// from the domain instead (memory modes, I/O thread pins, the realtime
// vCPUs of a placement without any) is left empty.
func PinsFor(p *numa.Placement) (*Pins, error) {
	if p == nil {
		return nil, badPlacement("no placement given")
	}
	if err := checkPlacement(p); err != nil {
		return nil, err
	}
	out := &Pins{VCPUPins: map[int]numa.CPUSet{}, Memory: &MemoryPolicy{}, MemNodes: map[int]MemoryPolicy{}}
	for _, c := range p.Cells {
		if !c.SharedVCPUs.IsEmpty() && c.HostCPUs.IsEmpty() {
			return nil, badPlacement("guest cell %d: shared vCPUs %s need the host cell's shared CPUs (host_cpuset), which the placement lacks", c.GuestCell, c.SharedVCPUs)
		}
		for v, pc := range c.Pins {
			out.VCPUPins[v] = numa.NewCPUSet(pc)
		}
		for _, v := range c.SharedVCPUs.List() {
			out.VCPUPins[v] = c.HostCPUs
		}
		vcpus := c.SharedVCPUs.Union(c.DedicatedVCPUs)
		out.VCPUs += vcpus.Len()
		host := numa.NewCPUSet(c.HostCell)
		out.Memory.Nodeset = out.Memory.Nodeset.Union(host)
		out.MemNodes[c.GuestCell] = MemoryPolicy{Nodeset: host}
		out.GuestCells = append(out.GuestCells, GuestCell{ID: c.GuestCell, VCPUs: vcpus, MemoryKiB: uint64(c.MemoryMB) * 1024})
	}
	sort.Slice(out.GuestCells, func(i, j int) bool { return out.GuestCells[i].ID < out.GuestCells[j].ID })
	if !p.HasNUMA() {
		out.DefaultCPUs = p.FloatCPUs
	}
	out.EmulatorPins = p.EmulatorPCPUs()
	if !p.RealtimeVCPUs.IsEmpty() {
		prio := p.RealtimePriority
		if prio == 0 {
			prio = numa.DefaultRealtimePriority
		}
		out.Sched = map[int]Sched{}
		for _, v := range p.RealtimeVCPUs.List() {
			out.Sched[v] = Sched{Scheduler: "fifo", Priority: prio}
		}
		out.RealtimeVCPUs, out.RealtimePriority = p.RealtimeVCPUs, prio
	}
	return out, nil
}

// DeviceAddresses are the PCI devices the domain uses on host h: those it
// passes through, and those its ports reach by name, mapped by h's device
// list. A name h does not list stays as it is, so that a check against
// the list finds it missing.
func (p *Pins) DeviceAddresses(h *numa.Host) []string {
	out := slices.Clone(p.Devices)
	for _, n := range p.DeviceNames {
		if d := h.DeviceNamed(n); d != nil {
			out = append(out, d.Address)
			continue
		}
		out = append(out, n)
	}
	return out
}
