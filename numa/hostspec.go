package numa

import "fmt"

// HostSpec is how an operator describes a host to pinflow, in JSON: cells
// with their CPUs, sibling groups, memory, page pools and usage, plus the
// host's cpu_dedicated_set / cpu_shared_set. It is also the host of the
// Nova reference cases in testdata/nova (see Case).
type HostSpec struct {
	Cells           []CellSpec `json:"cells"`
	CPUDedicatedSet string     `json:"cpu_dedicated_set,omitempty"`
	CPUSharedSet    string     `json:"cpu_shared_set,omitempty"`
	// SiblingsOrder is accepted for compatibility; pinflow keeps sibling
	// groups in the order given.
	SiblingsOrder string `json:"siblings_order,omitempty"`
	PackCells     bool   `json:"packing_host_numa_cells_allocation_strategy,omitempty"`
	// PCIPools are the host's free PCI devices (Host.Devices).
	PCIPools []DevicePool `json:"pci_pools,omitempty"`
	// PCIDevices lists the host's devices one by one (Host.PCIDevices),
	// as a host the ledger keeps gives them.
	PCIDevices []PCIDevice `json:"pci_devices,omitempty"`
}

// CellSpec is one host cell of a HostSpec. CPUSet and PCPUSet, when absent,
// are derived from CPUs and the host's cpu_*_set as Nova's libvirt driver
// does.
type CellSpec struct {
	ID            int        `json:"id"`
	CPUs          []int      `json:"cpus,omitempty"`
	CPUSet        *[]int     `json:"cpuset,omitempty"`
	PCPUSet       *[]int     `json:"pcpuset,omitempty"`
	Siblings      [][]int    `json:"siblings,omitempty"`
	MemoryMB      int64      `json:"memory_mb"`
	MemoryUsageMB int64      `json:"memory_usage_mb,omitempty"`
	CPUUsage      int        `json:"cpu_usage,omitempty"`
	PinnedCPUs    []int      `json:"pinned_cpus,omitempty"`
	MemPages      []PagePool `json:"mempages,omitempty"`
	// Socket is the cell's CPU socket; absent when unknown.
	Socket *int `json:"socket,omitempty"`
	// NetworkMetadata is which networks reach the cell's NICs.
	NetworkMetadata *NetworkAffinity `json:"network_metadata,omitempty"`
}

func idSet(field string, ids []int) (CPUSet, error) {
	var b cpuSetBuilder
	for _, id := range ids {
		if id < 0 || id > MaxCPU {
			return CPUSet{}, fmt.Errorf("%s: cpu id %d out of range 0-%d", field, id, MaxCPU)
		}
		b.add(id)
	}
	return b.set(), nil
}

// Host converts the spec into a validated Host with the given limits (nil:
// none).
func (s *HostSpec) Host(limits *Limits) (*Host, error) {
	if len(s.Cells) == 0 {
		return nil, fmt.Errorf("numa: host: cells is empty; at least one cell is required")
	}
	var dedicated, shared CPUSet
	var err error
	if s.CPUDedicatedSet != "" {
		if dedicated, err = Parse(s.CPUDedicatedSet); err != nil {
			return nil, fmt.Errorf("numa: host: cpu_dedicated_set: %w", err)
		}
	}
	if s.CPUSharedSet != "" {
		if shared, err = Parse(s.CPUSharedSet); err != nil {
			return nil, fmt.Errorf("numa: host: cpu_shared_set: %w", err)
		}
	}
	var online CPUSet
	cells := make([]Cell, len(s.Cells))
	for i := range s.Cells {
		cs := &s.Cells[i]
		where := fmt.Sprintf("numa: host: cells[%d]", i)
		c := &cells[i]
		c.ID, c.MemoryMB, c.MemoryUsedMB, c.CPUUsage = cs.ID, cs.MemoryMB, cs.MemoryUsageMB, cs.CPUUsage
		c.Pages = append([]PagePool(nil), cs.MemPages...)
		if cs.Socket != nil {
			c.Socket = *cs.Socket
		} else {
			c.SocketUnknown = true
		}
		if cs.NetworkMetadata != nil {
			n := NetworkAffinity{Physnets: append([]string(nil), cs.NetworkMetadata.Physnets...), Tunneled: cs.NetworkMetadata.Tunneled}
			c.Network = &n
		}
		cpus, err := idSet(where+".cpus", cs.CPUs)
		if err != nil {
			return nil, err
		}
		if cs.CPUSet != nil {
			if c.CPUs, err = idSet(where+".cpuset", *cs.CPUSet); err != nil {
				return nil, err
			}
		}
		if cs.PCPUSet != nil {
			if c.PCPUs, err = idSet(where+".pcpuset", *cs.PCPUSet); err != nil {
				return nil, err
			}
		}
		if c.PinnedCPUs, err = idSet(where+".pinned_cpus", cs.PinnedCPUs); err != nil {
			return nil, err
		}
		online = online.Union(cpus).Union(c.CPUs).Union(c.PCPUs)
	}
	// Nova's libvirt driver: shared CPUs are cpu_shared_set, or every online
	// CPU when neither option is set; pinnable CPUs are cpu_dedicated_set,
	// or the shared ones under the legacy configuration.
	availShared := online
	switch {
	case !shared.IsEmpty():
		availShared = shared.Intersection(online)
	case !dedicated.IsEmpty():
		availShared = CPUSet{}
	}
	availDedicated := dedicated.Intersection(online)
	if availDedicated.IsEmpty() && shared.IsEmpty() {
		availDedicated = availShared
	}
	for i := range s.Cells {
		cs, c := &s.Cells[i], &cells[i]
		if cs.CPUSet == nil && cs.PCPUSet == nil {
			cpus, _ := idSet("", cs.CPUs)
			c.CPUs = cpus.Intersection(availShared)
			c.PCPUs = cpus.Intersection(availDedicated)
		}
		usable := c.CPUs.Union(c.PCPUs)
		if len(cs.Siblings) == 0 {
			for _, id := range usable.List() {
				c.Siblings = append(c.Siblings, NewCPUSet(id))
			}
		}
		for j, g := range cs.Siblings {
			set, err := idSet(fmt.Sprintf("numa: host: cells[%d].siblings[%d]", i, j), g)
			if err != nil {
				return nil, err
			}
			if set = set.Intersection(usable); !set.IsEmpty() {
				c.Siblings = append(c.Siblings, set)
			}
		}
	}
	h := &Host{Cells: cells, SharedSet: shared, PackCells: s.PackCells, Limits: limits,
		Devices: append([]DevicePool(nil), s.PCIPools...), PCIDevices: append([]PCIDevice(nil), s.PCIDevices...)}
	if err := h.Validate(); err != nil {
		return nil, err
	}
	return h, nil
}

// SpecOf returns the spec of a host, the inverse of HostSpec.Host.
func SpecOf(h *Host) HostSpec {
	list := func(c CPUSet) *[]int { l := c.List(); return &l }
	s := HostSpec{CPUSharedSet: h.SharedSet.String(), PackCells: h.PackCells,
		PCIPools: append([]DevicePool(nil), h.Devices...), PCIDevices: append([]PCIDevice(nil), h.PCIDevices...)}
	var dedicated CPUSet
	for _, c := range h.Cells {
		dedicated = dedicated.Union(c.PCPUs)
		socket := &c.Socket
		if c.SocketUnknown {
			socket = nil
		}
		cs := CellSpec{ID: c.ID, CPUs: c.CPUs.Union(c.PCPUs).List(), CPUSet: list(c.CPUs), PCPUSet: list(c.PCPUs),
			MemoryMB: c.MemoryMB, MemoryUsageMB: c.MemoryUsedMB, CPUUsage: c.CPUUsage, PinnedCPUs: c.PinnedCPUs.List(),
			MemPages: append([]PagePool(nil), c.Pages...), Socket: socket}
		if c.Network != nil {
			n := NetworkAffinity{Physnets: append([]string(nil), c.Network.Physnets...), Tunneled: c.Network.Tunneled}
			cs.NetworkMetadata = &n
		}
		for _, g := range c.Siblings {
			cs.Siblings = append(cs.Siblings, g.List())
		}
		s.Cells = append(s.Cells, cs)
	}
	s.CPUDedicatedSet = dedicated.String()
	return s
}
