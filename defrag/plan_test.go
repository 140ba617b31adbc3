package defrag

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/numa"
)

// host is a host of cells of cores with two threads each (siblings
// 2k and 2k+1), every CPU pinnable, 64 GiB a cell.
func host(t testing.TB, cells, cores int) *numa.Host {
	t.Helper()
	h, err := numa.Uniform(numa.UniformSpec{Cells: cells, Cores: cores, Threads: 2, MemoryMB: 65536})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.SeparatePools(); err != nil {
		t.Fatal(err)
	}
	return h
}

// pinned places a guest with one vCPU on each pCPU of pcpus, on host
// cell cell, under policy, and adds it to h.
func pinned(t testing.TB, h *numa.Host, uuid string, cell int, policy numa.ThreadPolicy, pcpus ...int) Guest {
	t.Helper()
	pins := map[int]int{}
	for v, p := range pcpus {
		pins[v] = p
	}
	p := &numa.Placement{Cells: []numa.PlacedCell{{HostCell: cell, DedicatedVCPUs: numa.Range(0, len(pcpus)-1), Pins: pins,
		MemoryMB: 1024, CPUPolicy: numa.CPUPolicyDedicated, ThreadPolicy: policy}}}
	us, err := numa.Usage(h, p)
	if err == nil {
		err = h.Add(us)
	}
	if err != nil {
		t.Fatalf("guest %s on %v: %v", uuid, pcpus, err)
	}
	r, err := numa.NewRequest(len(pcpus), 1024, map[string]string{"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": string(cmpOr(policy, numa.ThreadPolicyPrefer))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return Guest{UUID: uuid, Name: uuid, Placement: p, Request: r, Migratable: true}
}

func cmpOr(p, def numa.ThreadPolicy) numa.ThreadPolicy {
	if p == "" {
		return def
	}
	return p
}

// siblings is a flavor of n vCPUs of thread policy require on one cell:
// on hosts of two threads a core, n/2 whole free cores. (Isolate, which
// fragmentation hurts the same way, fits no SMT host with a dedicated
// set, as in Nova.)
func siblings(t testing.TB, n int) *numa.Request {
	t.Helper()
	r, err := numa.NewRequest(n, 1024, map[string]string{"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": "require", "hw:numa_nodes": "1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// run applies the plan as the defrag would, each re-pin to its To as
// 'pinflow repin --pcpus' does, checking that each step is one the ledger
// takes, and returns the host after it.
func run(t *testing.T, h *numa.Host, guests []Guest, plan Plan) *numa.Host {
	t.Helper()
	h = h.Clone()
	for _, m := range plan.Migrations {
		i := slices.IndexFunc(guests, func(g Guest) bool { return g.UUID == m.UUID })
		h, guests = without(h, guests, guests[i])
	}
	for _, r := range plan.Repins {
		g := guests[slices.IndexFunc(guests, func(g Guest) bool { return g.UUID == r.UUID })]
		if from := pinsOf(g.Placement); !from.Equal(r.From) {
			t.Fatalf("re-pin of %s from %s, but it is on %s", r.UUID, r.From, from)
		}
		target, err := Target(h, g.Placement, r.To)
		if err != nil {
			t.Fatalf("re-pin of %s to %s: %v", r.UUID, r.To, err)
		}
		old, _ := numa.Usage(h, g.Placement)
		h.Remove(old)
		us, err := numa.Usage(h, target)
		if err == nil {
			err = h.Add(us)
		}
		if err != nil {
			t.Fatalf("re-pin of %s to %s: %v", r.UUID, r.To, err)
		}
	}
	return h
}

func TestPlanRepinsForAFlavor(t *testing.T) {
	h := host(t, 1, 4)
	// One thread of each of three cores pinned: one whole core free.
	guests := []Guest{pinned(t, h, "a", 0, "", 0), pinned(t, h, "b", 0, "", 2), pinned(t, h, "c", 0, "", 4)}
	two := siblings(t, 4)
	if _, err := numa.Fit(h, two); err == nil {
		t.Fatal("two whole cores fit the fragmented host before the plan")
	}
	plan := Make(Input{Host: "h", State: h, Guests: guests, For: two, ForName: "two"})
	if !plan.Fits || len(plan.Repins) != 1 || len(plan.Migrations) != 0 {
		t.Fatalf("plan: fits %v, %d re-pins, %d migrations (%s), want one re-pin that makes it fit", plan.Fits, len(plan.Repins), len(plan.Migrations), plan.Reason)
	}
	after := run(t, h, guests, plan)
	if _, err := numa.Fit(after, two); err != nil {
		t.Errorf("after the plan's re-pin %+v: %v", plan.Repins[0], err)
	}
	if plan.Before[0].FreeCores != 1 || plan.After[0].FreeCores != 2 || plan.After[0].FreePCPUs != 5 {
		t.Errorf("rooms before %+v, after %+v; want 1 then 2 free cores, 5 free pCPUs", plan.Before, plan.After)
	}
	if h.Cell(0).PinnedCPUs.String() != "0,2,4" || pinsOf(guests[2].Placement).String() != "4" {
		t.Errorf("the plan changed its input: host pins %s", h.Cell(0).PinnedCPUs)
	}
	// A flavor that fits already takes no step.
	if plan := Make(Input{Host: "h", State: h, Guests: guests, For: siblings(t, 2)}); !plan.Fits || plan.Moves() != 0 {
		t.Errorf("a flavor that fits: fits %v, %d moves", plan.Fits, plan.Moves())
	}
}

func TestPlanCompactsWithoutAFlavor(t *testing.T) {
	h := host(t, 2, 4)
	guests := []Guest{
		pinned(t, h, "a", 0, "", 0), pinned(t, h, "b", 0, "", 2), pinned(t, h, "c", 0, "", 4),
		pinned(t, h, "d", 1, "", 8, 10, 12),
		// An isolate guest holds its whole core wherever it is.
		pinned(t, h, "iso", 1, numa.ThreadPolicyIsolate, 14),
	}
	plan := Make(Input{Host: "h", State: h, Guests: guests})
	after := run(t, h, guests, plan)
	var free []int
	for i := range after.Cells {
		free = append(free, freeCores(&after.Cells[i]))
	}
	// Cell 0: three threads fill two cores; cell 1: d's three threads
	// two cores, iso's core its own.
	if want := []int{2, 1}; !slices.Equal(free, want) {
		t.Errorf("free cores after %+v: %v, want %v", plan.Repins, free, want)
	}
	if len(plan.Repins) != 2 {
		t.Errorf("%d re-pins (%+v), want 2: one in each cell", len(plan.Repins), plan.Repins)
	}
	for _, r := range plan.Repins {
		if r.UUID == "iso" {
			t.Errorf("the plan re-pins the isolate guest: %+v", r)
		}
	}
	if plan.Fits || plan.For != "" {
		t.Errorf("a plan without a flavor says it fits one: %+v", plan)
	}
}

func TestPlanMigratesWhereRepinsCannot(t *testing.T) {
	h := host(t, 1, 4)
	// x holds cores 0 and 1 whole; y one thread of cores 2 and 3.
	guests := []Guest{pinned(t, h, "x", 0, numa.ThreadPolicyRequire, 0, 1, 2, 3), pinned(t, h, "y", 0, "", 4, 6)}
	three := siblings(t, 6)
	spare := host(t, 1, 4)
	plan := Make(Input{Host: "h", State: h, Guests: guests, For: three, Targets: map[string]*numa.Host{"spare": spare}})
	if !plan.Fits || len(plan.Migrations) != 1 || plan.Migrations[0].UUID != "x" || plan.Migrations[0].Target != "spare" {
		t.Fatalf("plan: fits %v, migrations %+v (%s), want x migrated to spare", plan.Fits, plan.Migrations, plan.Reason)
	}
	if len(plan.Repins) != 1 || plan.Repins[0].UUID != "y" {
		t.Fatalf("re-pins %+v, want y's", plan.Repins)
	}
	if _, err := numa.Fit(run(t, h, guests, plan), three); err != nil {
		t.Errorf("after the plan: %v", err)
	}
	// No target: the plan says which guest fits nowhere.
	plan = Make(Input{Host: "h", State: h, Guests: guests, For: three})
	if plan.Fits || len(plan.Unplaceable) != 1 || !strings.Contains(plan.Reason, "it must migrate 1 guest away, and no other host takes x: there is no target host") {
		t.Errorf("without targets: fits %v, unplaceable %+v, reason %q", plan.Fits, plan.Unplaceable, plan.Reason)
	}
	// A guest that cannot move live is not migrated.
	guests[0].Migratable = false
	if plan := Make(Input{Host: "h", State: h, Guests: guests, For: three, Targets: map[string]*numa.Host{"spare": spare}}); plan.Fits || !strings.Contains(plan.Reason, "does not fit even with every guest that can move gone") {
		t.Errorf("x not migratable: fits %v, migrations %+v, reason %q", plan.Fits, plan.Migrations, plan.Reason)
	}
}

// TestPlanRandomHosts: on random fragmented hosts, every plan runs step by
// step as the ledger takes it, ends where it says, and, for a flavor, takes
// at most one re-pin more than the fewest any subset of the guests in any
// order needs.
func TestPlanRandomHosts(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	var greedy, fewest, solved int
	for i := range 300 {
		h, guests := fragmented(t, rng, 2, 4, 0.5)
		for _, r := range []*numa.Request{nil, siblings(t, 2+rng.IntN(3))} {
			plan := Make(Input{Host: "h", State: h, Guests: guests, For: r})
			after := run(t, h, guests, plan)
			if r == nil {
				continue
			}
			_, err := numa.Fit(after, r)
			if plan.Fits != (err == nil) {
				t.Fatalf("host %d: the plan says fits %v, the host after it: %v", i, plan.Fits, err)
			}
			if len(plan.Migrations) > 0 || len(plan.Unplaceable) > 0 {
				continue
			}
			best, ok := bruteForce(h, guests, r, len(plan.Repins))
			if plan.Fits && !ok {
				t.Fatalf("host %d: the plan fits with %d re-pins, the brute force finds none", i, len(plan.Repins))
			}
			if ok && !plan.Fits {
				t.Fatalf("host %d: the brute force fits with %d re-pins, the plan not at all: %s", i, best, plan.Reason)
			}
			if ok && len(plan.Repins) > best+1 {
				t.Errorf("host %d: the plan takes %d re-pins, the brute force %d", i, len(plan.Repins), best)
			}
			if ok {
				solved++
				greedy += len(plan.Repins)
				fewest += best
			}
		}
	}
	if solved == 0 {
		t.Fatal("no random host needed a re-pin the plan made")
	}
	t.Logf("%d hosts made to fit: %d re-pins planned, %d the fewest", solved, greedy, fewest)
}

// fragmented is a host of cells of cores after a random history of boots
// and deletes of guests of 1 to 3 vCPUs, mostly prefer, some require,
// until about load of its pCPUs are pinned.
func fragmented(t testing.TB, rng *rand.Rand, cells, cores int, load float64) (*numa.Host, []Guest) {
	h := host(t, cells, cores)
	total := h.Cells[0].PCPUs.Len() * cells
	var guests []Guest
	for n := 0; n < 40*cells*cores; n++ {
		used := 0
		for _, c := range h.Cells {
			used += c.PinnedCPUs.Len()
		}
		if len(guests) > 0 && (float64(used) > load*float64(total) || rng.IntN(3) == 0) {
			k := rng.IntN(len(guests))
			h, guests = without(h, guests, guests[k])
			continue
		}
		policy := "prefer"
		if rng.IntN(5) == 0 {
			policy = "require"
		}
		vcpus := 1 + rng.IntN(3)
		r, err := numa.NewRequest(vcpus, 512, map[string]string{"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": policy, "hw:numa_nodes": "1"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Boot on a random cell with a free pCPU: spread, as a fleet's
		// hosts see guests come from a scheduler that weighs other things.
		p, err := randomFit(rng, h, r)
		if err != nil {
			continue
		}
		us, _ := numa.Usage(h, p)
		if err := h.Add(us); err != nil {
			t.Fatal(err)
		}
		guests = append(guests, Guest{UUID: fmt.Sprintf("g%03d", n), Placement: p, Request: r, Migratable: true})
	}
	return h, guests
}

// randomFit places r on h with its vCPUs on random free pCPUs of a cell
// that has room, as the fit would under prefer only by chance.
func randomFit(rng *rand.Rand, h *numa.Host, r *numa.Request) (*numa.Placement, error) {
	p, err := numa.Fit(h, r)
	if err != nil || r.Cells[0].ThreadPolicy == numa.ThreadPolicyRequire {
		return p, err
	}
	cell := h.Cell(p.Cells[0].HostCell)
	free := cell.FreePCPUs().List()
	rng.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	for v := range p.Cells[0].Pins {
		p.Cells[0].Pins[v] = free[v]
	}
	return p, nil
}

// bruteForce is the fewest re-pins, at most limit, after which r fits:
// every subset of the guests of that size in every order, each re-pinned
// as Target packs it.
func bruteForce(h *numa.Host, guests []Guest, r *numa.Request, limit int) (int, bool) {
	fits := func(h *numa.Host) bool { _, err := numa.Fit(h, r); return err == nil }
	if fits(h) {
		return 0, true
	}
	var movable []Guest
	for _, g := range guests {
		if repinnable(g.Placement) {
			movable = append(movable, g)
		}
	}
	limit = max(limit, 1)
	for k := 1; k <= min(limit, len(movable)); k++ {
		if search(h, movable, k, map[string]bool{}, fits) {
			return k, true
		}
	}
	// The plan's count did not suffice: is there any at all?
	for k := limit + 1; k <= min(4, len(movable)); k++ {
		if search(h, movable, k, map[string]bool{}, fits) {
			return k, true
		}
	}
	return 0, false
}

func search(h *numa.Host, guests []Guest, k int, used map[string]bool, fits func(*numa.Host) bool) bool {
	if k == 0 {
		return fits(h)
	}
	for _, g := range guests {
		if used[g.UUID] {
			continue
		}
		_, after, ok := step(h, g)
		if !ok {
			continue
		}
		used[g.UUID] = true
		found := search(after, guests, k-1, used, fits)
		delete(used, g.UUID)
		if found {
			return true
		}
	}
	return false
}
