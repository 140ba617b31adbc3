package drain

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/placement"
)

// host is a host of cells cells with cpus pinnable pCPUs each (SMT
// pairs) and memoryMB per cell in 4 KiB pages.
func host(cells, cpus int, memoryMB int64) *numa.Host {
	h := &numa.Host{}
	for i := range cells {
		lo := i * cpus
		c := numa.Cell{ID: i, PCPUs: numa.Range(lo, lo+cpus-1), MemoryMB: memoryMB, Socket: i,
			Pages: []numa.PagePool{{SizeKB: 4, Total: memoryMB * 256}}}
		for s := lo; s < lo+cpus; s += 2 {
			c.Siblings = append(c.Siblings, numa.Range(s, min(s+1, lo+cpus-1)))
		}
		h.Cells = append(h.Cells, c)
	}
	return h
}

func guest(t testing.TB, uuid string, vcpus int, memoryMB int64, specs ...string) Guest {
	t.Helper()
	m := map[string]string{"hw:cpu_policy": "dedicated"}
	for i := 0; i+1 < len(specs); i += 2 {
		m[specs[i]] = specs[i+1]
	}
	r, err := numa.NewRequest(vcpus, memoryMB, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	return Guest{UUID: uuid, Name: "vm-" + uuid, Request: r}
}

// occupy places req on h for real, as a guest already there.
func occupy(t testing.TB, h *numa.Host, req *numa.Request) {
	t.Helper()
	p, err := numa.Fit(h, req)
	if err != nil {
		t.Fatal(err)
	}
	us, err := numa.Usage(h, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Add(us); err != nil {
		t.Fatal(err)
	}
}

// TestPlanFitsAsAWhole: two targets of 6 pCPUs and guests of 2, 3, 4
// and 3 pinned vCPUs: exactly enough room, but only when the largest is
// placed first. In the order given, packing would put 2 and 3 together,
// then 4 on the other host, and leave the last 3 nowhere.
func TestPlanFitsAsAWhole(t *testing.T) {
	targets := map[string]*numa.Host{"t1": host(1, 6, 16384), "t2": host(1, 6, 16384)}
	guests := []Guest{guest(t, "a2", 2, 1024), guest(t, "b3", 3, 1024), guest(t, "c4", 4, 1024), guest(t, "d3", 3, 1024)}
	p := Make("src", guests, targets)
	if !p.Complete() {
		t.Fatalf("plan left %+v unplaced", p.Unplaceable)
	}
	if p.Moves[0].UUID != "c4" {
		t.Errorf("the largest guest is not planned first: %+v", p.Moves)
	}
	got := map[string]string{}
	for _, m := range p.Moves {
		got[m.UUID] = m.Target
	}
	if got["c4"] != got["a2"] || got["b3"] != got["d3"] || got["c4"] == got["b3"] {
		t.Errorf("targets = %v, want c4 with a2 and b3 with d3", got)
	}
	checkPlan(t, p, guests, targets)
	if cpus := targets["t1"].Cells[0].PinnedCPUs; !cpus.IsEmpty() {
		t.Errorf("Make changed the targets' state: t1 pins %s", cpus)
	}
}

// TestPlanReportsUnplaceable: a guest larger than any target's free cell
// is reported with the targets' reasons, and the others are planned.
func TestPlanReportsUnplaceable(t *testing.T) {
	t1 := host(2, 4, 8192)
	occupy(t, t1, guest(t, "x", 2, 1024).Request)
	targets := map[string]*numa.Host{"t1": t1}
	p := Make("src", []Guest{guest(t, "huge", 6, 1024), guest(t, "ok", 2, 1024)}, targets)
	if p.Complete() || len(p.Unplaceable) != 1 || p.Unplaceable[0].UUID != "huge" {
		t.Fatalf("unplaceable = %+v, want huge alone", p.Unplaceable)
	}
	if r := p.Unplaceable[0].Reason; !strings.Contains(r, "t1:") {
		t.Errorf("reason %q does not name the target's reason", r)
	}
	if len(p.Moves) != 1 || p.Moves[0].UUID != "ok" || p.Moves[0].Target != "t1" {
		t.Errorf("moves = %+v, want ok onto t1", p.Moves)
	}
	if p := Make("src", []Guest{guest(t, "a", 1, 512)}, nil); p.Complete() || !strings.Contains(p.Unplaceable[0].Reason, "no target host") {
		t.Errorf("with no targets: %+v", p)
	}
}

// TestPlanPacks: each guest goes where the fewest pinnable CPUs remain,
// ties by name.
func TestPlanPacks(t *testing.T) {
	fuller := host(1, 8, 8192)
	occupy(t, fuller, guest(t, "x", 4, 1024).Request)
	targets := map[string]*numa.Host{"a-empty": host(1, 8, 8192), "b-fuller": fuller, "c-empty": host(1, 8, 8192)}
	p := Make("src", []Guest{guest(t, "g", 2, 512)}, targets)
	if len(p.Moves) != 1 || p.Moves[0].Target != "b-fuller" {
		t.Errorf("moves = %+v, want g onto b-fuller", p.Moves)
	}
	delete(targets, "b-fuller")
	if p := Make("src", []Guest{guest(t, "g", 2, 512)}, targets); p.Moves[0].Target != "a-empty" {
		t.Errorf("tie: moves = %+v, want a-empty (by name)", p.Moves)
	}
}

// TestPlanRandomNeverOverfills: on random clouds every plan applies move
// by move onto the targets without any pCPU, memory or page going past
// its limit, and a guest is unplaceable only when it fits no target as
// the plan left them.
func TestPlanRandomNeverOverfills(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 200 {
		targets := map[string]*numa.Host{}
		for i := range 1 + rng.IntN(5) {
			h := host(1+rng.IntN(2), 2*(1+rng.IntN(6)), int64(1024*(2+rng.IntN(8))))
			for range rng.IntN(4) {
				if p, err := numa.Fit(h, guest(t, "x", 1+rng.IntN(3), 512).Request); err == nil {
					us, _ := numa.Usage(h, p)
					_ = h.Add(us)
				}
			}
			targets[fmt.Sprintf("t%d", i)] = h
		}
		var guests []Guest
		for i := range 1 + rng.IntN(8) {
			specs := []string{}
			if rng.IntN(3) == 0 {
				specs = append(specs, "hw:cpu_thread_policy", "isolate")
			}
			if rng.IntN(3) == 0 {
				specs = append(specs, "hw:numa_nodes", "2")
			}
			r, err := numa.NewRequest(2*(1+rng.IntN(3)), int64(512*(1+rng.IntN(6))), merge(specs), nil)
			if err != nil {
				continue
			}
			guests = append(guests, Guest{UUID: fmt.Sprintf("g%d", i), Request: r})
		}
		p := Make("src", guests, targets)
		t.Run(fmt.Sprint(round), func(t *testing.T) { checkPlan(t, p, guests, targets) })
	}
}

func merge(kv []string) map[string]string {
	m := map[string]string{"hw:cpu_policy": "dedicated"}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// checkPlan applies the plan's moves to copies of the targets, each with
// the ledger's own usage rules (numa.Usage, Host.Add refuse overlaps and
// overcommit), and checks every unplaceable guest truly fits nowhere on
// what the moves left.
func checkPlan(t *testing.T, p Plan, guests []Guest, targets map[string]*numa.Host) {
	t.Helper()
	state := map[string]*numa.Host{}
	for n, h := range targets {
		state[n] = h.Clone()
	}
	byUUID := map[string]Guest{}
	for _, g := range guests {
		byUUID[g.UUID] = g
	}
	if len(p.Moves)+len(p.Unplaceable) != len(guests) {
		t.Errorf("%d moves and %d unplaceable for %d guests", len(p.Moves), len(p.Unplaceable), len(guests))
	}
	for _, m := range p.Moves {
		h := state[m.Target]
		if h == nil {
			t.Fatalf("move of %s onto unknown target %q", m.UUID, m.Target)
		}
		us, err := numa.Usage(h, m.Placement)
		if err == nil {
			err = h.Add(us)
		}
		if err != nil {
			t.Errorf("move of %s onto %s does not apply: %v", m.UUID, m.Target, err)
		}
		if pinned := m.Placement.Cells; len(pinned) == 0 && byUUID[m.UUID].Request.HasNUMA() {
			t.Errorf("move of %s has no cells", m.UUID)
		}
	}
	for _, u := range p.Unplaceable {
		for n, h := range state {
			if _, err := numa.Fit(h, byUUID[u.UUID].Request); err == nil {
				t.Errorf("%s reported unplaceable (%s), but it fits %s as the plan left it", u.UUID, u.Reason, n)
			}
		}
	}
}

// TestPlanKeepsServerGroups: the plan counts the members it moves, so two
// members of a 1-per-host anti-affinity group go to two targets though
// packing would put both on the fuller one, a third has no target left,
// and a target already holding a member takes none; a soft
// anti-affinity group is kept apart where room allows, and together where
// it does not.
func TestPlanKeepsServerGroups(t *testing.T) {
	targets := map[string]*numa.Host{"t1": host(1, 8, 8192), "t2": host(1, 8, 8192), "t3": host(1, 8, 8192)}
	occupy(t, targets["t1"], guest(t, "x", 4, 512).Request)
	hard := &placement.ServerGroup{Name: "db", Policy: ledger.PolicyAntiAffinity, MaxPerHost: 1,
		On: map[string][]string{"src": {"m1", "m2", "m3"}, "t3": {"m4"}}}
	var guests []Guest
	for _, u := range []string{"m1", "m2", "m3"} {
		g := guest(t, u, 1, 512)
		g.Group = hard
		guests = append(guests, g)
	}
	plan := Make("src", guests, targets)
	got := map[string]string{}
	for _, m := range plan.Moves {
		got[m.UUID] = m.Target
	}
	if len(plan.Moves) != 2 || got["m1"] != "t1" || got["m2"] != "t2" {
		t.Errorf("Make moves %v, want m1 to t1 (the fuller) and m2 to t2", got)
	}
	if len(plan.Unplaceable) != 1 || plan.Unplaceable[0].UUID != "m3" || !strings.Contains(plan.Unplaceable[0].Reason, "t3: anti-affinity group db allows 1 of its members per host, and t3 holds m4") {
		t.Errorf("Make unplaceable %+v, want m3 with the rule on t3 named", plan.Unplaceable)
	}

	soft := &placement.ServerGroup{Name: "web", Policy: ledger.PolicySoftAntiAffinity, On: map[string][]string{"src": {"w1", "w2", "w3", "w4"}}}
	guests = nil
	for _, u := range []string{"w1", "w2", "w3", "w4"} {
		g := guest(t, u, 1, 512)
		g.Group = soft
		guests = append(guests, g)
	}
	per := map[string]int{}
	for _, m := range Make("src", guests, targets).Moves {
		per[m.Target]++
	}
	if per["t1"] != 2 || per["t2"] != 1 || per["t3"] != 1 {
		t.Errorf("soft anti-affinity members planned %v, want one per target and the fourth with the fullest", per)
	}
}
