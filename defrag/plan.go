// Package defrag plans the defragmentation of a host: which of its
// guests to re-pin in place, and, only where no re-pin can make the room,
// which to live-migrate away, so that the host keeps whole cores free or
// can take a given flavor.
//
// A host fragments as guests come and go: guests of thread policy prefer
// end up on one thread of many cores, and a guest that needs whole cores
// (isolate) or many pCPUs of one cell fits nowhere although the pCPUs
// are there. A re-pin keeps each guest cell on its host cell, with its
// memory and pages, so it can only gather a cell's pinned threads onto
// fewer cores; a migration frees a cell's memory and pages too.
//
// The plan is computed on a copy of the host's ledger state, one step
// after another, each step's target fitted where the steps before it left
// the host, so that the plan runs in order without a conflict. It is
// greedy: each re-pin is the one that frees the most whole cores of the
// cells the flavor needs, and a plan that gets there is then pruned of
// every step it can do without. Guests of thread policy isolate hold
// whole cores wherever they are and are not re-pinned.
package defrag

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/pinflow/pinflow/drain"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/placement"
)

// Guest is one guest at rest on the host.
type Guest struct {
	UUID      string
	Name      string
	Placement *numa.Placement
	// Request is what a migration fits elsewhere; Migratable says whether
	// a live migration can move it (its devices can be unplugged).
	Request    *numa.Request
	Migratable bool
	// Group is the guest's server group, nil for none.
	Group *placement.ServerGroup
}

// Repin is one re-pin of a plan: the guest's pinned vCPUs and reserved
// emulator pCPU move from From to To ('pinflow repin UUID --pcpus To').
type Repin struct {
	UUID string      `json:"uuid"`
	Name string      `json:"name,omitempty"`
	From numa.CPUSet `json:"from"`
	To   numa.CPUSet `json:"to"`
}

// CellRoom is what one host cell has free for pinning.
type CellRoom struct {
	Cell      int `json:"cell"`
	FreePCPUs int `json:"free_pcpus"`
	// FreeCores are the cell's cores with no pCPU pinned, of Cores.
	FreeCores int `json:"free_cores"`
	Cores     int `json:"cores"`
}

// Plan is how to defragment a host: the migrations first, then the
// re-pins, in order.
type Plan struct {
	Host string `json:"host"`
	// For is the flavor the plan makes room for, empty for none: then the
	// plan frees as many whole cores as re-pins can.
	For        string       `json:"for,omitempty"`
	Migrations []drain.Move `json:"migrations"`
	Repins     []Repin      `json:"repins"`
	Before     []CellRoom   `json:"before"`
	After      []CellRoom   `json:"after"`
	// Fits says whether For fits once the plan has run, and Placement
	// where; Reason says why not.
	Fits      bool            `json:"fits"`
	Placement *numa.Placement `json:"placement,omitempty"`
	Reason    string          `json:"reason,omitempty"`
	// Unplaceable are guests the plan must migrate that fit on no other
	// host; then it has no step.
	Unplaceable []drain.Unplaceable `json:"unplaceable,omitempty"`
}

// Moves counts the plan's steps.
func (p *Plan) Moves() int { return len(p.Migrations) + len(p.Repins) }

// Steps says the plan's steps in words: "2 re-pins and 1 migration".
func (p *Plan) Steps() string {
	return countOf(len(p.Repins), "re-pin", "re-pins") + " and " + countOf(len(p.Migrations), "migration", "migrations")
}

// Input is what Make plans from.
type Input struct {
	Host string
	// State is the host's ledger state: every claim's usage on it.
	State *numa.Host
	// Guests are the guests at rest on the host; every other claim's pins
	// stay where they are.
	Guests []Guest
	// For is the flavor to make room for, ForName its name for people;
	// nil for none.
	For     *numa.Request
	ForName string
	// Targets are the hosts a migration may go to (drain.Targets); none
	// when empty.
	Targets map[string]*numa.Host
}

// Make plans the defragmentation of in.Host. It changes none of its
// input but the guests' groups, by the migrations it plans.
func Make(in Input) Plan {
	plan := Plan{Host: in.Host, For: in.ForName, Migrations: []drain.Move{}, Repins: []Repin{}, Before: rooms(in.State)}
	state := in.State.Clone()
	if in.For == nil {
		all := compact(state, in.Guests, nil, nil)
		want := freeCoresOf(mustReplay(state, in.Guests, all), nil)
		plan.Repins = prune(state, in.Guests, all, func(h *numa.Host) bool { return freeCoresOf(h, nil) >= want })
		after, _ := replay(state, in.Guests, plan.Repins)
		plan.After = rooms(after)
		return plan
	}
	fits := func(h *numa.Host) bool { _, err := numa.Fit(h, in.For); return err == nil }
	guests := in.Guests
	if !fits(state) {
		seq, ok := repinsFor(state, guests, in.For)
		if !ok {
			// No re-pin makes the room: migrate the fewest guests away,
			// then re-pin the rest.
			away := migrations(state, guests, in.For)
			if away == nil {
				plan.After = plan.Before
				plan.Reason = "it does not fit even with every guest that can move gone: " + fitError(state.WithoutUsage(), in.For)
				return plan
			}
			var moving []drain.Guest
			for _, g := range away {
				moving = append(moving, drain.Guest{UUID: g.UUID, Name: g.Name, Request: g.Request, Group: g.Group})
				state, guests = without(state, guests, g)
			}
			moved := drain.Make(in.Host, moving, in.Targets)
			if len(moved.Unplaceable) > 0 {
				plan.After, plan.Unplaceable = plan.Before, moved.Unplaceable
				u := moved.Unplaceable[0]
				plan.Reason = fmt.Sprintf("it must migrate %s away, and no other host takes %s: %s", countOf(len(moving), "guest", "guests"), cmp.Or(u.Name, u.UUID), u.Reason)
				return plan
			}
			plan.Migrations = moved.Moves
			seq, _ = repinsFor(state, guests, in.For)
		}
		plan.Repins = prune(state, guests, seq, fits)
	}
	after, _ := replay(state, guests, plan.Repins)
	plan.After = rooms(after)
	if p, err := numa.Fit(after, in.For); err != nil {
		plan.Reason = strings.TrimPrefix(err.Error(), "numa: ")
	} else {
		plan.Fits, plan.Placement = true, p
	}
	return plan
}

// repinsFor are re-pins after which r fits on state, ok false when none
// do. It tries first the re-pins that free whole cores of the host cells
// r takes on the host compacted as far as re-pins go, and stops as soon
// as r fits.
func repinsFor(state *numa.Host, guests []Guest, r *numa.Request) ([]Repin, bool) {
	all, p, err := packed(state, guests, r)
	if err != nil {
		return nil, false
	}
	fits := func(h *numa.Host) bool { _, err := numa.Fit(h, r); return err == nil }
	var cells []int
	for _, c := range p.Cells {
		cells = append(cells, c.HostCell)
	}
	if seq := compact(state, guests, cells, fits); len(cells) > 0 && fits(mustReplay(state, guests, seq)) {
		return seq, true
	}
	return all, true
}

// packed compacts state as far as re-pins go (compact) and fits r on it:
// the re-pins and where r goes, or why it does not fit even so.
func packed(state *numa.Host, guests []Guest, r *numa.Request) ([]Repin, *numa.Placement, error) {
	all := compact(state, guests, nil, nil)
	p, err := numa.Fit(mustReplay(state, guests, all), r)
	return all, p, err
}

// compact re-pins guests one at a time, each time the one whose re-pin
// frees the most whole cores of cells (of every cell when nil), until no
// re-pin frees one or enough (when not nil) says the host has room. Each
// guest is re-pinned once at most.
func compact(state *numa.Host, guests []Guest, cells []int, enough func(*numa.Host) bool) []Repin {
	h := state.Clone()
	moved := map[string]bool{}
	seq := []Repin{}
	for enough == nil || !enough(h) {
		base := freeCoresOf(h, cells)
		var best Repin
		var bestAfter *numa.Host
		bestGain := 0
		for _, g := range guests {
			if moved[g.UUID] {
				continue
			}
			r, after, ok := step(h, g)
			if !ok {
				continue
			}
			gain := freeCoresOf(after, cells) - base
			if gain > bestGain || (gain == bestGain && bestAfter != nil && r.To.Len() < best.To.Len()) {
				best, bestAfter, bestGain = r, after, gain
			}
		}
		if bestAfter == nil {
			break
		}
		seq = append(seq, best)
		moved[best.UUID] = true
		h = bestAfter
	}
	return seq
}

// prune drops each re-pin of seq, last first, without which the plan
// still ends on a host ok accepts.
func prune(state *numa.Host, guests []Guest, seq []Repin, ok func(*numa.Host) bool) []Repin {
	for i := len(seq) - 1; i >= 0; i-- {
		if h, rest := replay(state, guests, slices.Delete(slices.Clone(seq), i, i+1)); ok(h) {
			seq = rest
			i = min(i, len(seq))
		}
	}
	return seq
}

// replay re-pins the guests of seq on a copy of state in order, each
// where step puts it then (its pCPUs may differ from seq's once a re-pin
// before it is gone), and returns the host after them and the re-pins
// made: one that changes no pins is left out.
func replay(state *numa.Host, guests []Guest, seq []Repin) (*numa.Host, []Repin) {
	h := state.Clone()
	out := []Repin{}
	for _, r := range seq {
		i := slices.IndexFunc(guests, func(g Guest) bool { return g.UUID == r.UUID })
		if i < 0 {
			continue
		}
		next, after, ok := step(h, guests[i])
		if !ok {
			continue
		}
		out = append(out, next)
		h = after
	}
	return h, out
}

func mustReplay(state *numa.Host, guests []Guest, seq []Repin) *numa.Host {
	h, _ := replay(state, guests, seq)
	return h
}

// step re-pins g on a copy of h as Target packs it: the re-pin and the
// host after it; ok false when g is not re-pinned (thread policy isolate
// or require, which gain nothing, or no pinned vCPUs) or its pins would
// not change.
func step(h *numa.Host, g Guest) (Repin, *numa.Host, bool) {
	if !repinnable(g.Placement) {
		return Repin{}, nil, false
	}
	target, err := Target(h, g.Placement, numa.CPUSet{})
	if err != nil {
		return Repin{}, nil, false
	}
	from, to := pinsOf(g.Placement), pinsOf(target)
	if from.Equal(to) {
		return Repin{}, nil, false
	}
	after := h.Clone()
	old, err := numa.Usage(after, g.Placement)
	if err != nil {
		return Repin{}, nil, false
	}
	after.Remove(old)
	us, err := numa.Usage(after, target)
	if err != nil || after.Add(us) != nil {
		return Repin{}, nil, false
	}
	return Repin{UUID: g.UUID, Name: g.Name, From: from, To: to}, after, true
}

// repinnable says whether the plan re-pins a guest placed so: one with
// pinned vCPUs and no cell of thread policy isolate, whose cores are the
// guest's whole wherever it goes.
func repinnable(p *numa.Placement) bool {
	pinned := false
	for _, c := range p.Cells {
		if c.ThreadPolicy == numa.ThreadPolicyIsolate {
			return false
		}
		pinned = pinned || len(c.Pins) > 0
	}
	return pinned
}

// migrations are the fewest guests whose going makes room for r once the
// rest are re-pinned: the one guest that does it with the fewest pinned
// pCPUs and the least memory, or else the largest guests one after
// another until one more does it. Nil when not all of them together do.
func migrations(state *numa.Host, guests []Guest, r *numa.Request) []Guest {
	var candidates []Guest
	for _, g := range guests {
		if g.Migratable && g.Request != nil {
			candidates = append(candidates, g)
		}
	}
	slices.SortStableFunc(candidates, func(a, b Guest) int { return size(a).compare(size(b)) })
	h, rest := state, guests
	var away []Guest
	for len(candidates) > 0 {
		for _, g := range candidates {
			if hg, rg := without(h, rest, g); packedFits(hg, rg, r) {
				return append(away, g)
			}
		}
		largest := candidates[len(candidates)-1]
		candidates = candidates[:len(candidates)-1]
		away = append(away, largest)
		h, rest = without(h, rest, largest)
	}
	return nil
}

// packedFits says whether r fits on h once its guests are re-pinned as
// far as re-pins go.
func packedFits(h *numa.Host, guests []Guest, r *numa.Request) bool {
	_, _, err := packed(h, guests, r)
	return err == nil
}

// without is state and guests with g gone.
func without(state *numa.Host, guests []Guest, g Guest) (*numa.Host, []Guest) {
	h := state.Clone()
	if us, err := numa.Usage(h, g.Placement); err == nil {
		h.Remove(us)
	}
	h.RemoveHost(g.Placement.HostUsage())
	return h, slices.DeleteFunc(slices.Clone(guests), func(o Guest) bool { return o.UUID == g.UUID })
}

// guestSize orders guests by what moving them costs.
type guestSize struct {
	pinned int
	memory int64
	uuid   string
}

func size(g Guest) guestSize {
	s := guestSize{uuid: g.UUID, memory: g.Placement.MemoryMB}
	for _, c := range g.Placement.Cells {
		s.pinned += len(c.Pins)
		s.memory += c.MemoryMB
	}
	return s
}

func (a guestSize) compare(b guestSize) int {
	if a.pinned != b.pinned {
		return a.pinned - b.pinned
	}
	if a.memory != b.memory {
		return int(a.memory - b.memory)
	}
	return strings.Compare(a.uuid, b.uuid)
}

// pinsOf are the pCPUs p pins and reserves.
func pinsOf(p *numa.Placement) numa.CPUSet {
	var out numa.CPUSet
	for _, c := range p.Cells {
		out = out.Union(c.PinnedPCPUs()).Union(c.Reserved)
	}
	return out
}

// freeCoresOf counts the whole free cores of h's cells (all when nil).
func freeCoresOf(h *numa.Host, cells []int) int {
	n := 0
	for i := range h.Cells {
		if cells == nil || slices.Contains(cells, h.Cells[i].ID) {
			n += freeCores(&h.Cells[i])
		}
	}
	return n
}

// rooms is what each of h's cells has free for pinning.
func rooms(h *numa.Host) []CellRoom {
	out := make([]CellRoom, 0, len(h.Cells))
	for i := range h.Cells {
		c := &h.Cells[i]
		out = append(out, CellRoom{Cell: c.ID, FreePCPUs: c.FreePCPUs().Len(), FreeCores: freeCores(c), Cores: len(cores(c))})
	}
	return out
}

// fitError is why r does not fit h, for people.
func fitError(h *numa.Host, r *numa.Request) string {
	if _, err := numa.Fit(h, r); err != nil {
		return strings.TrimPrefix(err.Error(), "numa: ")
	}
	return "it fits"
}
