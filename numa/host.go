package numa

import (
	"fmt"
	"math"
)

// Host is a hypervisor host's NUMA topology together with its current usage.
type Host struct {
	Cells []Cell `json:"cells"`
	// SharedSet is the host's cpu_shared_set: where emulator threads of
	// guests with hw:emulator_threads_policy=share run. Empty when unset.
	SharedSet CPUSet `json:"shared_set"`
	// PackCells orders host cells fullest first instead of emptiest first
	// (Nova's packing_host_numa_cells_allocation_strategy).
	PackCells bool `json:"pack_cells,omitempty"`
	// Limits are the allocation ratios for shared vCPUs and memory; nil
	// means no overcommit checks, as in Nova without limits.
	Limits *Limits `json:"limits,omitempty"`

	// MemoryUsedMB and VCPUUsage are the host-level usage (HostUsage) of
	// all its guests, NUMA-placed or not: a guest without a NUMA topology
	// counts here alone.
	MemoryUsedMB int64 `json:"memory_usage_mb,omitempty"`
	VCPUUsage    int   `json:"vcpu_usage,omitempty"`

	// Devices are the host's free PCI devices, pooled as Nova's PCI stats
	// pool them. Placement.Devices names them by index.
	Devices []DevicePool `json:"pci_pools,omitempty"`
	// PCIDevices lists the host's devices one by one, when it is known
	// that closely (a ledger's host): Devices are then its free ones,
	// pooled (FreeDevicePools), and a fit names the devices it takes.
	PCIDevices []PCIDevice `json:"pci_devices,omitempty"`
}

// Limits are a host's allocation ratios. Pinned vCPUs never overcommit.
type Limits struct {
	CPUAllocationRatio float64 `json:"cpu_allocation_ratio"`
	RAMAllocationRatio float64 `json:"ram_allocation_ratio"`
	// ReservedHostMemoryMB is memory no guest gets (Nova's
	// reserved_host_memory_mb), taken off the host-level memory limit.
	ReservedHostMemoryMB int64 `json:"reserved_host_memory_mb,omitempty"`
}

// Validate checks that the ratios are positive numbers and the reserved
// memory is not negative; nil limits are valid.
func (l *Limits) Validate() error {
	if l == nil {
		return nil
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"cpu_allocation_ratio", l.CPUAllocationRatio}, {"ram_allocation_ratio", l.RAMAllocationRatio}} {
		if !(r.v > 0) || math.IsInf(r.v, 0) {
			return fmt.Errorf("numa: %s %v must be a positive number", r.name, r.v)
		}
	}
	if l.ReservedHostMemoryMB < 0 {
		return fmt.Errorf("numa: reserved_host_memory_mb %d must not be negative", l.ReservedHostMemoryMB)
	}
	return nil
}

// Cell is one host NUMA cell: what it has and what is already in use.
type Cell struct {
	ID int `json:"id"`
	// CPUs can run shared (floating) vCPUs: cpu_shared_set ∩ cell.
	CPUs CPUSet `json:"cpuset"`
	// PCPUs can be pinned to one vCPU each: cpu_dedicated_set ∩ cell.
	PCPUs CPUSet `json:"pcpuset"`
	// Siblings are the SMT thread groups (cores), each within CPUs ∪ PCPUs.
	// Their order is the order in which pinning considers cores.
	Siblings []CPUSet `json:"siblings"`
	MemoryMB int64    `json:"memory_mb"`
	// Pages are the page pools; real hosts always report the 4 KiB pool.
	Pages  []PagePool `json:"mempages"`
	Socket int        `json:"socket"`
	// SocketUnknown is set when the host did not say which socket the
	// cell is on; then no device can be fitted under the socket policy.
	SocketUnknown bool `json:"socket_unknown,omitempty"`
	// Network is which networks reach the cell's NICs; nil when the host
	// does not say.
	Network *NetworkAffinity `json:"network_metadata,omitempty"`

	// PinnedCPUs are the PCPUs already owned by guests.
	PinnedCPUs CPUSet `json:"pinned_cpus"`
	// MemoryUsedMB is the memory guests placed on this cell use.
	MemoryUsedMB int64 `json:"memory_usage_mb"`
	// CPUUsage counts the shared vCPUs placed on this cell.
	CPUUsage int `json:"cpu_usage"`
}

// PagePool is a cell's pool of one page size.
type PagePool struct {
	SizeKB   int64 `json:"size_kb"`
	Total    int64 `json:"total"`
	Used     int64 `json:"used"`
	Reserved int64 `json:"reserved"`
}

// Free is the number of pages a guest can still take.
func (p PagePool) Free() int64 { return p.Total - p.Used - p.Reserved }

// FreePCPUs returns the cell's pinnable CPUs not yet pinned.
func (c *Cell) FreePCPUs() CPUSet { return c.PCPUs.Difference(c.PinnedCPUs) }

// AvailMemoryMB returns the cell's memory not yet used.
func (c *Cell) AvailMemoryMB() int64 { return c.MemoryMB - c.MemoryUsedMB }

// ThreadsPerCore is the size of the cell's largest sibling group (1 without
// SMT).
func (c *Cell) ThreadsPerCore() int {
	n := 1
	for _, s := range c.Siblings {
		n = max(n, s.Len())
	}
	return n
}

// pagePool returns the pool of the given size, or nil.
func (c *Cell) pagePool(sizeKB int64) *PagePool {
	for i := range c.Pages {
		if c.Pages[i].SizeKB == sizeKB {
			return &c.Pages[i]
		}
	}
	return nil
}

// smallestPage returns the smallest page size the cell offers, 0 if none.
func (c *Cell) smallestPage() int64 {
	var s int64
	for _, p := range c.Pages {
		if s == 0 || p.SizeKB < s {
			s = p.SizeKB
		}
	}
	return s
}

// Cell returns the cell with the given id, or nil.
func (h *Host) Cell(id int) *Cell {
	for i := range h.Cells {
		if h.Cells[i].ID == id {
			return &h.Cells[i]
		}
	}
	return nil
}

// Clone returns a deep copy of h whose usage can be changed independently.
func (h *Host) Clone() *Host {
	out := *h
	out.Cells = make([]Cell, len(h.Cells))
	for i, c := range h.Cells {
		c.Siblings = append([]CPUSet(nil), c.Siblings...)
		c.Pages = append([]PagePool(nil), c.Pages...)
		out.Cells[i] = c
	}
	if h.Limits != nil {
		l := *h.Limits
		out.Limits = &l
	}
	out.Devices = append([]DevicePool(nil), h.Devices...)
	return &out
}

// SharedCPUs returns the CPUs of every cell that guests without pinned
// vCPUs float over: the host's shared pool.
func (h *Host) SharedCPUs() CPUSet {
	var out CPUSet
	for _, c := range h.Cells {
		out = out.Union(c.CPUs)
	}
	return out
}

// SeparatePools takes every pinnable CPU out of h's shared CPUs (each
// cell's and the host's cpu_shared_set), so that no floating vCPU or
// emulator thread can run where a guest may be pinned. A cell whose shared
// and pinnable CPUs are the same set, as a host given neither
// cpu_shared_set nor cpu_dedicated_set has them, keeps them pinnable only.
// CPUs given as both shared and dedicated otherwise, which Nova refuses
// too, are an error that names them; h is separated all the same.
func (h *Host) SeparatePools() error {
	var pinnable, overlap CPUSet
	for i := range h.Cells {
		c := &h.Cells[i]
		pinnable = pinnable.Union(c.PCPUs)
		if both := c.CPUs.Intersection(c.PCPUs); !both.IsEmpty() {
			if !c.CPUs.Equal(c.PCPUs) {
				overlap = overlap.Union(both)
			}
			c.CPUs = c.CPUs.Difference(c.PCPUs)
		}
	}
	overlap = overlap.Union(h.SharedSet.Intersection(pinnable))
	h.SharedSet = h.SharedSet.Difference(pinnable)
	if !overlap.IsEmpty() {
		return fmt.Errorf("numa: cpus %s are both shared and dedicated; the sets must not overlap, or a floating guest would run on pinned pCPUs", overlap)
	}
	return nil
}

// WithoutUsage returns a copy of h with no pins, memory, shared vCPUs or
// pages in use: the bare topology.
func (h *Host) WithoutUsage() *Host {
	out := h.Clone()
	out.MemoryUsedMB, out.VCPUUsage = 0, 0
	for i := range out.Cells {
		c := &out.Cells[i]
		c.PinnedCPUs, c.MemoryUsedMB, c.CPUUsage = CPUSet{}, 0, 0
		for j := range c.Pages {
			c.Pages[j].Used = 0
		}
	}
	return out
}

// Validate checks that the topology is self-consistent: unique cell ids,
// sibling groups that are disjoint and inside the cell's CPUs, CPUs that
// belong to one cell only, usage within capacity. Its error names the first
// bad value.
func (h *Host) Validate() error {
	if len(h.Cells) == 0 || len(h.Cells) > MaxCells {
		return fmt.Errorf("numa: host has %d cells; allowed are 1-%d", len(h.Cells), MaxCells)
	}
	if err := h.Limits.Validate(); err != nil {
		return err
	}
	if h.MemoryUsedMB < 0 || h.VCPUUsage < 0 {
		return fmt.Errorf("numa: host-level usage %d MiB and %d vCPUs must not be negative", h.MemoryUsedMB, h.VCPUUsage)
	}
	ids := map[int]bool{}
	var all CPUSet
	for i := range h.Cells {
		c := &h.Cells[i]
		if c.ID < 0 {
			return fmt.Errorf("numa: cell id %d is negative; ids are 0 or more", c.ID)
		}
		if ids[c.ID] {
			return fmt.Errorf("numa: cell id %d appears twice; ids must be unique", c.ID)
		}
		ids[c.ID] = true
		usable := c.CPUs.Union(c.PCPUs)
		if usable.Intersects(all) {
			return fmt.Errorf("numa: cell %d: cpus %s also belong to another cell", c.ID, usable.Intersection(all))
		}
		all = all.Union(usable)
		var seen CPUSet
		for _, s := range c.Siblings {
			if !s.IsSubsetOf(usable) {
				return fmt.Errorf("numa: cell %d: sibling group %s has cpus outside the cell's cpus %s", c.ID, s, usable)
			}
			if s.Intersects(seen) {
				return fmt.Errorf("numa: cell %d: sibling group %s overlaps another group", c.ID, s)
			}
			seen = seen.Union(s)
		}
		if err := checkCellBounds(c); err != nil {
			return err
		}
		if c.MemoryUsedMB < 0 || c.CPUUsage < 0 {
			return fmt.Errorf("numa: cell %d: usage must not be negative", c.ID)
		}
		if !c.PinnedCPUs.IsSubsetOf(c.PCPUs) {
			return fmt.Errorf("numa: cell %d: pinned cpus %s are not in its pcpuset %s", c.ID, c.PinnedCPUs.Difference(c.PCPUs), c.PCPUs)
		}
		sizes := map[int64]bool{}
		for _, p := range c.Pages {
			if p.SizeKB <= 0 || p.Total < 0 || p.Used < 0 || p.Reserved < 0 {
				return fmt.Errorf("numa: cell %d: page pool %d KiB: sizes and counts must not be negative", c.ID, p.SizeKB)
			}
			if sizes[p.SizeKB] {
				return fmt.Errorf("numa: cell %d: page size %d KiB listed twice", c.ID, p.SizeKB)
			}
			sizes[p.SizeKB] = true
		}
	}
	for i := range h.Devices {
		if err := h.Devices[i].validate(i, h); err != nil {
			return err
		}
	}
	return h.validateDevices()
}

// sortedCellOrder returns the indexes of h.Cells in the order Nova tries
// them when the guest has fewer cells than the host: by free memory, then by
// free pCPUs (pinned guests) or shared CPU usage (shared guests), emptiest
// first unless the host packs. The sorts are stable, so ties keep the
// previous order, exactly as Nova's successive sorted() calls.
func (h *Host) sortedCellOrder(pinned bool) []int {
	n := len(h.Cells)
	order := make([]int, n)
	keys := make([]int64, n)
	for i := range order {
		order[i] = i
	}
	pack := h.PackCells
	// Python's sorted(reverse=True) keeps equal elements in their original
	// order, so a descending sort is a stable sort on the negated key. An
	// insertion sort is stable, and hosts have a handful of cells.
	sortBy := func(descending bool) {
		for i := 1; i < n; i++ {
			for j := i; j > 0; j-- {
				ka, kb := keys[order[j-1]], keys[order[j]]
				if descending {
					ka, kb = -ka, -kb
				}
				if ka <= kb {
					break
				}
				order[j-1], order[j] = order[j], order[j-1]
			}
		}
	}
	for i := range h.Cells {
		keys[i] = h.Cells[i].AvailMemoryMB()
	}
	sortBy(!pack)
	for i := range h.Cells {
		c := &h.Cells[i]
		if pinned {
			keys[i] = int64(c.PCPUs.Len() - countIntersection(c.PCPUs, c.PinnedCPUs))
		} else {
			keys[i] = int64(c.CPUUsage)
		}
	}
	sortBy(pinned != pack)
	return order
}
