package numa

import (
	"fmt"
	"math/bits"
)

// The bounds on every size numa accepts. They are far above any real
// machine and keep all arithmetic on sizes exact: a host's memory in KiB
// (MaxCells × MaxCellMemoryMB × 1024 = 2^50) stays below 2^53, where the
// ledger's Redis scripts, whose numbers are doubles, would round, and a
// page pool's size in KiB cannot overflow an int64. Each is checked before
// anything is multiplied by it.
const (
	// MaxCells is the most NUMA cells a host may have: Linux's
	// MAX_NUMNODES at its largest.
	MaxCells = 1024
	// MaxThreadsPerCore is the most SMT threads a core may have (SMT8).
	MaxThreadsPerCore = 8
	// MaxPCPUs is the most CPUs a host may have: every CPU id a CPUSet
	// holds. It bounds cells × cores × threads.
	MaxPCPUs = MaxCPU + 1
	// MaxCellMemoryMB is the most memory a host cell may have, 1 PiB.
	MaxCellMemoryMB = 1 << 30
	// MaxPageSizeKB is the largest page size, 16 GiB (POWER's largest
	// huge page).
	MaxPageSizeKB = 16 << 20
	// MaxGuestVCPUs is the most vCPUs a guest may have: one per CPU id.
	MaxGuestVCPUs = MaxCPU + 1
	// MaxGuestMemoryMB is the most memory a guest may have: as much as
	// the largest host has.
	MaxGuestMemoryMB = MaxCells * MaxCellMemoryMB
)

// checkShape checks the cells, cores and threads of a uniform host, each
// product only once its factors are known not to overflow it.
func (s UniformSpec) checkShape() error {
	shape := fmt.Sprintf("host shape %d cells x %d cores x %d threads", s.Cells, s.Cores, s.Threads)
	switch {
	case s.Cells < 1 || s.Cores < 1 || s.Threads < 1:
		return fmt.Errorf("numa: %s: each must be at least 1", shape)
	case s.Cells > MaxCells:
		return fmt.Errorf("numa: %s: at most %d cells are allowed", shape, MaxCells)
	case s.Threads > MaxThreadsPerCore:
		return fmt.Errorf("numa: %s: at most %d threads per core are allowed", shape, MaxThreadsPerCore)
	}
	if hi, cpus := bits.Mul64(uint64(s.Cells), uint64(s.Cores)); hi != 0 || cpus > MaxPCPUs || cpus*uint64(s.Threads) > MaxPCPUs {
		return fmt.Errorf("numa: %s: more than %d CPUs; at most %d are allowed", shape, MaxPCPUs, MaxPCPUs)
	}
	return nil
}

// checkCellMemory checks one cell's memory.
func checkCellMemory(memoryMB int64) error {
	if memoryMB < 1 || memoryMB > MaxCellMemoryMB {
		return fmt.Errorf("memory %d MiB per cell: allowed are 1-%d MiB", memoryMB, MaxCellMemoryMB)
	}
	return nil
}

// checkPages checks count pages of sizeKB against a cell of memoryMB
// (already checked): the size is a power of two from 8 KiB to
// MaxPageSizeKB, and the pages fit in the cell.
func checkPages(sizeKB, count, memoryMB int64) error {
	if sizeKB <= 4 || sizeKB > MaxPageSizeKB || sizeKB&(sizeKB-1) != 0 {
		return fmt.Errorf("huge page size %d KiB: allowed are powers of two from 8 KiB to %d KiB", sizeKB, MaxPageSizeKB)
	}
	if most := memoryMB * 1024 / sizeKB; count < 0 || count > most {
		return fmt.Errorf("%d huge pages of %d KiB: allowed are 0-%d, what the cell's %d MiB hold", count, sizeKB, most, memoryMB)
	}
	return nil
}

// checkCellBounds checks the sizes of a cell that Validate's consistency
// checks would compute with: its memory, and its page pools against the
// most memory a cell may have.
func checkCellBounds(c *Cell) error {
	if err := checkCellMemory(c.MemoryMB); err != nil {
		return fmt.Errorf("numa: cell %d: %w", c.ID, err)
	}
	for _, p := range c.Pages {
		if p.SizeKB < 1 || p.SizeKB > MaxPageSizeKB {
			return fmt.Errorf("numa: cell %d: page size %d KiB: allowed are 1-%d KiB", c.ID, p.SizeKB, MaxPageSizeKB)
		}
		most := MaxCellMemoryMB * 1024 / p.SizeKB
		for _, n := range []int64{p.Total, p.Used, p.Reserved} {
			if n < 0 || n > most {
				return fmt.Errorf("numa: cell %d: page pool %d KiB: counts %d/%d/%d (total/used/reserved): allowed are 0-%d", c.ID, p.SizeKB, p.Total, p.Used, p.Reserved, most)
			}
		}
	}
	return nil
}

// checkSize checks a guest's vCPUs and memory.
func checkSize(vcpus int, memoryMB int64) error {
	if vcpus < 1 || vcpus > MaxGuestVCPUs {
		return invalid("InvalidVCPUs", "vcpus %d: allowed are 1-%d", vcpus, MaxGuestVCPUs)
	}
	if memoryMB < 1 || memoryMB > MaxGuestMemoryMB {
		return invalid("InvalidMemory", "memory_mb %d: allowed are 1-%d MiB", memoryMB, MaxGuestMemoryMB)
	}
	return nil
}
