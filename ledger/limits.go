package ledger

import (
	"fmt"
	"math"

	"github.com/pinflow/pinflow/numa"
)

// The limits a claim is held to are exactly those numa.Fit applies to a
// guest cell on a host cell (numa/fit.go, cellView.fit), split in two:
//
//   - Counter limits, which depend on what the cell already gives out.
//     Only the claim script sees the host's real counters, so only it
//     judges these: each claim sends, per usage field, the amount it adds
//     and the most the field may reach (its cap).
//   - Per-guest bounds, which depend on the topology and the claim alone
//     (a guest cell's memory against the cell's small-page pool or its
//     memory, its shared vCPUs against the cell's shared CPUs). The script
//     refuses a claim fitted against another topology generation, so
//     these are checked here, once, for every claim, fitted or explicit.
//
// Beside them every claim is held to the host-level limits numa.Fit
// applies to the guest as a whole (numa.Host.HostLimits, FitsHost), which
// depend on the topology alone and so are caps like the cells'.
//
// numa.Fit leaves default small pages uncapped on purpose (they may
// overcommit: only strict pages are locked), and holds no counter of a
// guest cell that is neither pinned nor shared to a ratio without
// Limits, as Nova without limits.

// noCap marks a counter that may grow without limit.
const noCap = -1

// cellCaps are the most each of one cell's counters may reach once a
// claim's usage of the cell is added, or noCap.
type cellCaps struct {
	mem, shared, pages int64
}

// capsOf returns the caps numa.Fit holds usage u of cell c to. ratios
// says the guest cell is held to the host's allocation ratios: it floats
// shared vCPUs or belongs to a mixed guest (numa.Fit's !pinned || mixed).
func capsOf(h *numa.Host, c *numa.Cell, u numa.CellUsage, ratios bool) cellCaps {
	caps := cellCaps{mem: noCap, shared: noCap, pages: noCap}
	if u.Dedicated {
		// A pinned guest cell needs its memory free: "needs N MiB, M MiB
		// are free".
		caps.mem = c.MemoryMB
	}
	if ratios && h.Limits != nil {
		// usage > float(n) * ratio refuses; for whole numbers that is
		// usage > floor(float(n) * ratio), computed here in float64
		// exactly as numa.Fit does.
		caps.shared = floorCap(float64(c.CPUs.Len()) * h.Limits.CPUAllocationRatio)
		if m := floorCap(float64(c.MemoryMB) * h.Limits.RAMAllocationRatio); m != noCap && (caps.mem == noCap || m < caps.mem) {
			caps.mem = m
		}
	}
	if u.StrictPages {
		for _, p := range c.Pages {
			if p.SizeKB == u.PageSizeKB {
				// numa.PagePool.Free: total less used less reserved.
				caps.pages = p.Total - p.Reserved
			}
		}
	}
	return caps
}

// floorCap is the largest whole number not above limit, or noCap when
// limit is too large to bind (or not a number).
func floorCap(limit float64) int64 {
	if !(limit < 1<<62) {
		return noCap
	}
	return int64(math.Floor(max(limit, 0)))
}

// ratioHeld says, per host cell of p, whether its guest cell is held to
// the allocation ratios.
func ratioHeld(p *numa.Placement, cell int) bool {
	if p == nil {
		return false
	}
	for _, pc := range p.Cells {
		if pc.HostCell == cell {
			return !pc.CPUPolicy.Pinned() || pc.CPUPolicy == numa.CPUPolicyMixed
		}
	}
	return false
}

// checkBounds checks usage u of cell c against numa.Fit's per-guest
// bounds: what no state of the host could make fit.
func checkBounds(c *numa.Cell, u numa.CellUsage, ratios bool) error {
	if ratios && u.SharedCPUs > c.CPUs.Len() {
		return fmt.Errorf("%w: cell %d: %d shared vCPUs, the cell has %d shared CPUs", ErrInvalid, c.ID, u.SharedCPUs, c.CPUs.Len())
	}
	if u.PageSizeKB != 0 && !u.StrictPages {
		for _, p := range c.Pages {
			if p.SizeKB == u.PageSizeKB && u.Pages > p.Total {
				return fmt.Errorf("%w: cell %d: %d MiB, the cell has %d MiB of %d KiB pages", ErrInvalid, c.ID, u.MemoryMB, p.Total*p.SizeKB/1024, p.SizeKB)
			}
		}
	} else if len(c.Pages) == 0 && u.MemoryMB > c.MemoryMB {
		return fmt.Errorf("%w: cell %d: %d MiB, the cell has %d MiB", ErrInvalid, c.ID, u.MemoryMB, c.MemoryMB)
	}
	return nil
}

// withinCaps checks that adding us (of a claim placed as p) to the
// counters of state, a host with usage, keeps every counter within its
// cap: the claim script's check, made on the cached view for a placement
// given explicitly, so that one the ledger would refuse is refused before
// it is sent.
func withinCaps(state *numa.Host, us []numa.CellUsage, p *numa.Placement) error {
	if err := state.FitsHost(p.HostUsage()); err != nil {
		return err
	}
	for _, u := range us {
		c := state.Cell(u.Cell)
		if c == nil {
			return fmt.Errorf("host has no cell %d", u.Cell)
		}
		caps := capsOf(state, c, u, ratioHeld(p, u.Cell))
		if caps.mem != noCap && u.MemoryMB > 0 && c.MemoryUsedMB+u.MemoryMB > caps.mem {
			return fmt.Errorf("cell %d: %d MiB more would take its memory to %d MiB, above the limit %d MiB", c.ID, u.MemoryMB, c.MemoryUsedMB+u.MemoryMB, caps.mem)
		}
		if caps.shared != noCap && u.SharedCPUs > 0 && int64(c.CPUUsage+u.SharedCPUs) > caps.shared {
			return fmt.Errorf("cell %d: %d shared vCPUs more would take it to %d, above the limit %d", c.ID, u.SharedCPUs, c.CPUUsage+u.SharedCPUs, caps.shared)
		}
		if caps.pages != noCap && u.Pages > 0 {
			for _, pool := range c.Pages {
				if pool.SizeKB == u.PageSizeKB && pool.Used+u.Pages > caps.pages {
					return fmt.Errorf("cell %d: %d more %d KiB pages would take it to %d, above the %d not reserved", c.ID, u.Pages, pool.SizeKB, pool.Used+u.Pages, caps.pages)
				}
			}
		}
	}
	return nil
}
