package numa

import "fmt"

// CellUsage is what a placement consumes on one host cell: exactly what a
// ledger adds when it claims the placement and removes when it releases it.
type CellUsage struct {
	Cell int `json:"cell"` // host cell id
	// PinnedCPUs are the pCPUs the guest owns: its pins and emulator pCPU,
	// and under thread policy isolate their whole sibling groups.
	PinnedCPUs CPUSet `json:"pinned_cpus"`
	MemoryMB   int64  `json:"memory_mb"`
	// SharedCPUs counts shared vCPUs floating on the cell's shared CPUs.
	SharedCPUs int `json:"shared_cpus"`
	// Pages of PageSizeKB the guest's memory takes (the requested size, or
	// the cell's smallest); 0 when the cell reports no page pools.
	PageSizeKB int64 `json:"page_size_kb"`
	Pages      int64 `json:"pages"`
	// Dedicated cells may not overcommit memory.
	Dedicated bool `json:"dedicated"`
	// StrictPages is set when the guest asked for its page size: such pages
	// are locked and may not overcommit. Default small pages may, as memory
	// checks for them are against the pool's total, not its free pages.
	StrictPages bool `json:"strict_pages"`
}

// Usage returns what p consumes on h, one entry per placed cell. It fails
// when p does not belong on h: an unknown host cell, a pCPU outside the
// cell's pcpuset, a page size the cell does not offer.
func Usage(h *Host, p *Placement) ([]CellUsage, error) {
	out := make([]CellUsage, 0, len(p.Cells))
	for _, pc := range p.Cells {
		c := h.Cell(pc.HostCell)
		if c == nil {
			return nil, fmt.Errorf("numa: usage: guest cell %d: host has no cell %d", pc.GuestCell, pc.HostCell)
		}
		u := CellUsage{Cell: c.ID, MemoryMB: pc.MemoryMB, SharedCPUs: pc.SharedVCPUs.Len(), Dedicated: pc.CPUPolicy.Pinned()}
		if !u.Dedicated && len(pc.Pins) > 0 {
			return nil, fmt.Errorf("numa: usage: guest cell %d: cpu policy %q has no pins, but %d are given", pc.GuestCell, pc.CPUPolicy, len(pc.Pins))
		}
		cpus := pc.PinnedPCPUs().Union(pc.Reserved)
		if out := cpus.Difference(c.PCPUs); !out.IsEmpty() {
			return nil, fmt.Errorf("numa: usage: guest cell %d: pCPUs %s are not pinnable CPUs of host cell %d (%s)", pc.GuestCell, out, c.ID, c.PCPUs)
		}
		if pc.ThreadPolicy == ThreadPolicyIsolate {
			for _, s := range c.Siblings {
				if s.Intersects(cpus) {
					cpus = cpus.Union(s)
				}
			}
			if out := cpus.Difference(c.PCPUs); !out.IsEmpty() {
				return nil, fmt.Errorf("numa: usage: guest cell %d: isolate needs the siblings %s, which are not pinnable", pc.GuestCell, out)
			}
		}
		u.PinnedCPUs = cpus
		size := pc.PageSizeKB
		if size == 0 {
			size = c.smallestPage()
		}
		if size != 0 {
			if c.pagePool(size) == nil {
				return nil, fmt.Errorf("numa: usage: guest cell %d: host cell %d has no %d KiB pages", pc.GuestCell, c.ID, size)
			}
			u.PageSizeKB, u.Pages, u.StrictPages = size, pc.MemoryMB*1024/size, pc.PageSizeKB != 0
		}
		out = append(out, u)
	}
	return out, nil
}

// Add applies usage to h, as a claim does. It refuses, changing nothing,
// when a pCPU is already pinned, pages run out, or a dedicated cell's
// memory would overcommit.
func (h *Host) Add(us []CellUsage) error {
	for _, u := range us {
		c := h.Cell(u.Cell)
		if c == nil {
			return fmt.Errorf("numa: add: host has no cell %d", u.Cell)
		}
		if busy := u.PinnedCPUs.Intersection(c.PinnedCPUs); !busy.IsEmpty() {
			return fmt.Errorf("numa: add: cell %d: pCPUs %s are already pinned", c.ID, busy)
		}
		if out := u.PinnedCPUs.Difference(c.PCPUs); !out.IsEmpty() {
			return fmt.Errorf("numa: add: cell %d: pCPUs %s are not pinnable", c.ID, out)
		}
		if u.StrictPages {
			if pool := c.pagePool(u.PageSizeKB); pool == nil || pool.Free() < u.Pages {
				return fmt.Errorf("numa: add: cell %d: not enough free %d KiB pages for %d", c.ID, u.PageSizeKB, u.Pages)
			}
		}
		if u.Dedicated && c.MemoryUsedMB+u.MemoryMB > c.MemoryMB {
			return fmt.Errorf("numa: add: cell %d: %d MiB more would exceed its %d MiB", c.ID, u.MemoryMB, c.MemoryMB)
		}
	}
	for _, u := range us {
		h.apply(u, 1)
	}
	return nil
}

// Remove takes usage off h, as a release does.
func (h *Host) Remove(us []CellUsage) {
	for _, u := range us {
		h.apply(u, -1)
	}
}

func (h *Host) apply(u CellUsage, sign int64) {
	c := h.Cell(u.Cell)
	if c == nil {
		return
	}
	if sign > 0 {
		c.PinnedCPUs = c.PinnedCPUs.Union(u.PinnedCPUs)
	} else {
		c.PinnedCPUs = c.PinnedCPUs.Difference(u.PinnedCPUs)
	}
	c.MemoryUsedMB = max(0, c.MemoryUsedMB+sign*u.MemoryMB)
	c.CPUUsage = max(0, c.CPUUsage+int(sign)*u.SharedCPUs)
	if pool := c.pagePool(u.PageSizeKB); pool != nil {
		pool.Used = max(0, pool.Used+sign*u.Pages)
	}
}
