package numa

import "fmt"

// UniformSpec describes a host whose cells are all alike.
type UniformSpec struct {
	Cells, Cores, Threads int
	// Dedicated and Shared are the host's cpu_dedicated_set and
	// cpu_shared_set; with neither, every CPU is both, as in Nova's legacy
	// form (a ledger keeps them pinnable only: Host.SeparatePools).
	Dedicated, Shared CPUSet
	// MemoryMB is each cell's memory.
	MemoryMB int64
	// HugePages are each cell's huge page pools: page size in KiB -> count.
	// The rest of the memory is the 4 KiB pool.
	HugePages map[int64]int64
}

// Uniform builds the host: CPUs numbered cell by cell and, within a cell,
// core by core (core c of cell i holds the Threads ids from
// (i*Cores+c)*Threads), so sibling threads are adjacent.
func Uniform(s UniformSpec) (*Host, error) {
	if err := s.checkShape(); err != nil {
		return nil, err
	}
	if err := checkCellMemory(s.MemoryMB); err != nil {
		return nil, fmt.Errorf("numa: %w", err)
	}
	var huge int64
	for size, n := range s.HugePages {
		if err := checkPages(size, n, s.MemoryMB); err != nil {
			return nil, fmt.Errorf("numa: %w", err)
		}
		huge += size * n
	}
	if huge > s.MemoryMB*1024 {
		return nil, fmt.Errorf("numa: huge pages take %d MiB of a cell's %d MiB; together they may take at most all of it", huge/1024, s.MemoryMB)
	}
	perCell := s.Cores * s.Threads
	all := Range(0, s.Cells*perCell-1)
	if out := s.Dedicated.Union(s.Shared).Difference(all); !out.IsEmpty() {
		return nil, fmt.Errorf("numa: cpus %s are not on the host (it has %s)", out, all)
	}
	if both := s.Dedicated.Intersection(s.Shared); !both.IsEmpty() {
		return nil, fmt.Errorf("numa: cpus %s are both dedicated and shared; the sets must not overlap", both)
	}
	h := &Host{SharedSet: s.Shared}
	for i := 0; i < s.Cells; i++ {
		cpus := Range(i*perCell, (i+1)*perCell-1)
		c := Cell{ID: i, MemoryMB: s.MemoryMB, Socket: i}
		switch {
		case s.Dedicated.IsEmpty() && s.Shared.IsEmpty():
			c.CPUs, c.PCPUs = cpus, cpus
		default:
			c.CPUs, c.PCPUs = cpus.Intersection(s.Shared), cpus.Intersection(s.Dedicated)
		}
		for core := 0; core < s.Cores; core++ {
			lo := (i*s.Cores + core) * s.Threads
			if g := Range(lo, lo+s.Threads-1).Intersection(c.CPUs.Union(c.PCPUs)); !g.IsEmpty() {
				c.Siblings = append(c.Siblings, g)
			}
		}
		c.Pages = []PagePool{{SizeKB: 4, Total: (s.MemoryMB*1024 - huge) / 4}}
		for _, size := range []int64{2048, 1048576} {
			if n, ok := s.HugePages[size]; ok {
				c.Pages = append(c.Pages, PagePool{SizeKB: size, Total: n})
			}
		}
		for size, n := range s.HugePages {
			if size != 2048 && size != 1048576 {
				c.Pages = append(c.Pages, PagePool{SizeKB: size, Total: n})
			}
		}
		h.Cells = append(h.Cells, c)
	}
	return h, h.Validate()
}
