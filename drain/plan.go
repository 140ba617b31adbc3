// Package drain plans the emptying of a host: where each of its guests
// goes, NUMA-cell exact, before anything moves.
//
// The plan is computed on copies of the targets' ledger state: each guest
// is fitted with numa.Fit on a target that already carries the guests
// planned before it, so the plan as a whole fits, not only each guest on
// its own. Guests are planned hardest first (most pinned CPUs, then most
// memory), as bin packing does: a large guest placed last finds the room
// the small ones fragmented.
package drain

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/placement"
)

// Guest is one guest to move off the host.
type Guest struct {
	UUID    string
	Name    string
	Request *numa.Request
	// Group is the guest's server group, nil for none; the guests of one
	// group share it, so that the plan counts the moves it makes.
	Group *placement.ServerGroup
}

// Move is where the plan puts one guest.
type Move struct {
	UUID      string          `json:"uuid"`
	Name      string          `json:"name,omitempty"`
	Target    string          `json:"target"`
	Placement *numa.Placement `json:"placement"`
}

// Unplaceable is a guest that no target can take, with why.
type Unplaceable struct {
	UUID   string `json:"uuid"`
	Name   string `json:"name,omitempty"`
	Reason string `json:"reason"`
}

// Plan is where every guest of Source goes, or why it cannot.
type Plan struct {
	Source      string        `json:"source"`
	Moves       []Move        `json:"moves"`
	Unplaceable []Unplaceable `json:"unplaceable,omitempty"`
	// Blocked are claims on the source that are no guest at rest (an
	// operation in flight, a resize awaiting its confirmation, a
	// quarantine): the host is not empty until they are gone.
	Blocked []Unplaceable `json:"blocked,omitempty"`
	// NotLive are guests a live drain cannot move: their devices cannot
	// be unplugged. The live-then-cold and cold policies move them cold.
	NotLive []Unplaceable `json:"not_live,omitempty"`
}

// Complete says whether every guest has a target and nothing blocks.
func (p *Plan) Complete() bool {
	return len(p.Unplaceable) == 0 && len(p.Blocked) == 0 && len(p.NotLive) == 0
}

// Make plans guests onto targets (host name to its current ledger state;
// the caller leaves out the source and every host that must not take
// guests). Each guest goes to the target that fits it and is left with
// the fewest free pinnable CPUs (placement.FreeAfter, the packing
// ChooseHost uses), ties broken by name. A member of a server group goes
// only where its group's hard rule lets it, counting the members planned
// before it, and where its soft rule would rather it went when some
// target there takes it. The targets' states are not changed; the
// groups' members are, by the moves planned.
func Make(source string, guests []Guest, targets map[string]*numa.Host) Plan {
	names := make([]string, 0, len(targets))
	state := make(map[string]*numa.Host, len(targets))
	for n, h := range targets {
		names = append(names, n)
		state[n] = h.Clone()
	}
	sort.Strings(names)
	plan := Plan{Source: source, Moves: []Move{}}
	for _, g := range hardestFirst(guests) {
		best, bestRank, bestFree, bestP := "", 0, 0, (*numa.Placement)(nil)
		var misses []string
		for _, n := range names {
			rank := 0
			if g.Group != nil {
				if why := g.Group.Refuses(n, g.UUID); why != "" {
					misses = append(misses, fmt.Sprintf("%s: %s", n, why))
					continue
				}
				rank = g.Group.Prefers(n, g.UUID)
			}
			h := state[n]
			p, err := numa.Fit(h, g.Request)
			if err != nil {
				misses = append(misses, fmt.Sprintf("%s: %s", n, strings.TrimPrefix(err.Error(), "numa: ")))
				continue
			}
			free := placement.FreeAfter(h, p)
			if best == "" || rank < bestRank || (rank == bestRank && free < bestFree) {
				best, bestRank, bestFree, bestP = n, rank, free, p
			}
		}
		if best == "" {
			plan.Unplaceable = append(plan.Unplaceable, Unplaceable{UUID: g.UUID, Name: g.Name, Reason: noTarget(misses)})
			continue
		}
		us, err := numa.Usage(state[best], bestP)
		if err == nil {
			err = state[best].Add(us)
		}
		if err == nil {
			err = state[best].AddHost(bestP.HostUsage())
		}
		if err != nil {
			// A fit the host cannot carry is a bug in the fit; the guest
			// is not planned rather than planned twice onto the same pCPUs.
			plan.Unplaceable = append(plan.Unplaceable, Unplaceable{UUID: g.UUID, Name: g.Name,
				Reason: fmt.Sprintf("its fit on %s could not be applied: %v", best, err)})
			continue
		}
		if g.Group != nil {
			g.Group.Add(best, g.UUID)
		}
		plan.Moves = append(plan.Moves, Move{UUID: g.UUID, Name: g.Name, Target: best, Placement: bestP})
	}
	return plan
}

// hardestFirst orders guests by pinned CPUs, then memory, then vCPUs,
// largest first; ties by uuid, so a plan is the same every time.
func hardestFirst(guests []Guest) []Guest {
	out := slices.Clone(guests)
	slices.SortStableFunc(out, func(a, b Guest) int {
		if c := cmp.Compare(pinned(b.Request), pinned(a.Request)); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Request.MemoryMB, a.Request.MemoryMB); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Request.VCPUs, a.Request.VCPUs); c != 0 {
			return c
		}
		return cmp.Compare(a.UUID, b.UUID)
	})
	return out
}

// pinned counts the dedicated vCPUs a request pins.
func pinned(r *numa.Request) int {
	n := 0
	for _, c := range r.Cells {
		n += c.DedicatedVCPUs.Len()
	}
	return n
}

// noTarget says why no target took a guest, naming a few of the targets'
// reasons (a fleet has too many to list).
func noTarget(misses []string) string {
	const shown = 3
	switch {
	case len(misses) == 0:
		return "there is no target host"
	case len(misses) <= shown:
		return "no target fits it: " + strings.Join(misses, "; ")
	default:
		return fmt.Sprintf("no target fits it: %s; and %d more", strings.Join(misses[:shown], "; "), len(misses)-shown)
	}
}
