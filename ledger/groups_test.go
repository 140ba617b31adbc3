package ledger

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/guest"
)

var memberFlavor = guest.Flavor{VCPUs: 1, MemoryMB: 256, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}

// member records instance uuid as a member of group.
func member(t testing.TB, l *Ledger, uuid, group string) {
	t.Helper()
	if _, err := l.CreateMember(context.Background(), uuid, "vm-"+uuid, memberFlavor, guest.VMBuilding, "", group); err != nil {
		t.Fatalf("CreateMember(%s, group %s): %v", uuid, group, err)
	}
}

func memberSpec(t testing.TB, id, host, uuid string) ClaimSpec {
	return ClaimSpec{ID: id, Host: host, InstanceUUID: uuid, Kind: KindBoot, OwnerWorkflowID: "instance-" + uuid, OwnerRunID: "run-1",
		Request: dedicated(t, 1, 256)}
}

func createGroup(t testing.TB, l *Ledger, g Group) {
	t.Helper()
	if err := l.CreateGroup(context.Background(), g); err != nil {
		t.Fatalf("CreateGroup(%+v): %v", g, err)
	}
}

func TestGroupBadInput(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	createGroup(t, l, Group{Name: "db", Policy: PolicyAntiAffinity, MaxPerHost: 2})
	before := dump(t, rdb)
	for _, tt := range []struct {
		name string
		g    Group
		want string
	}{
		{"bad name", Group{Name: "a:b", Policy: PolicyAffinity}, `group name "a:b"`},
		{"empty name", Group{Name: "", Policy: PolicyAffinity}, `group name ""`},
		{"unknown policy", Group{Name: "x", Policy: "spread"}, `group policy "spread"`},
		{"limit with affinity", Group{Name: "x", Policy: PolicyAffinity, MaxPerHost: 2}, "only an anti-affinity group takes it"},
		{"limit with soft anti-affinity", Group{Name: "x", Policy: PolicySoftAntiAffinity, MaxPerHost: 2}, "only an anti-affinity group takes it"},
		{"negative limit", Group{Name: "x", Policy: PolicyAntiAffinity, MaxPerHost: -1}, "max members per host -1"},
		{"exists with another rule", Group{Name: "db", Policy: PolicyAntiAffinity, MaxPerHost: 3}, "exists with policy anti-affinity, at most 2 per host"},
	} {
		err := l.CreateGroup(ctx, tt.g)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("CreateGroup(%s: %+v) = %v, want an error with %q", tt.name, tt.g, err, tt.want)
		}
	}
	if _, err := l.CreateMember(ctx, "u1", "vm", memberFlavor, guest.VMBuilding, "", "nosuch"); !errors.Is(err, ErrUnknownGroup) {
		t.Errorf("CreateMember in an unknown group = %v, want ErrUnknownGroup", err)
	}
	if err := l.CreateGroup(ctx, Group{Name: "db", Policy: PolicyAntiAffinity, MaxPerHost: 2}); err != nil {
		t.Errorf("CreateGroup again with the same rule = %v, want a retry's success", err)
	}
	if diff := dumpDiff(before, dump(t, rdb)); diff != "" {
		t.Errorf("refused group input changed Redis:\n%s", diff)
	}
}

// TestAntiAffinityHoldsUnderRacingClaims: members of one anti-affinity
// group race for few hosts, each trying every host in its own order; the
// claims that land never put more members on a host than the group
// allows, every loser is told which rule stands in its way, and the
// counters match the claims.
func TestAntiAffinityHoldsUnderRacingClaims(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	hosts := []string{"h1", "h2", "h3"}
	for _, h := range hosts {
		register(t, l, h, testHost(2, 16))
	}
	createGroup(t, l, Group{Name: "quorum", Policy: PolicyAntiAffinity, MaxPerHost: 2})
	const members = 16
	for i := range members {
		member(t, l, fmt.Sprintf("m%02d", i), "quorum")
	}
	placed := make([]string, members)
	var wg sync.WaitGroup
	for i := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := fmt.Sprintf("m%02d", i)
			order := slices.Clone(hosts)
			rand.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
			for _, h := range order {
				_, err := l.Claim(ctx, memberSpec(t, "boot-"+u, h, u))
				var rule *GroupRuleError
				switch {
				case err == nil:
					placed[i] = h
					return
				case errors.As(err, &rule):
					if rule.Group != "quorum" || rule.Max != 2 || len(rule.Members) == 0 || !errors.Is(err, ErrConflict) {
						t.Errorf("Claim(%s on %s) refused with %+v, want the group's rule and the members in the way", u, h, rule)
					}
				default:
					t.Errorf("Claim(%s on %s): %v", u, h, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	per := map[string]int{}
	for _, h := range placed {
		if h != "" {
			per[h]++
		}
	}
	for _, h := range hosts {
		if per[h] != 2 {
			t.Errorf("host %s holds %d members of the group, want exactly 2 (the limit, with more members than room): %v", h, per[h], per)
		}
		s := snapshot(t, l, h)
		if s.Groups["quorum"] != int64(per[h]) {
			t.Errorf("host %s counts %d members, its claims %d", h, s.Groups["quorum"], per[h])
		}
	}
}

// TestAntiAffinityCountsAMemberOnce: a member's second claim on its host
// (a same-host resize) is no second member, and only its last release
// takes it off the count.
func TestAntiAffinityCountsAMemberOnce(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(1, 8))
	createGroup(t, l, Group{Name: "pair", Policy: PolicyAntiAffinity})
	member(t, l, "a", "pair")
	member(t, l, "b", "pair")
	if _, err := l.Claim(ctx, memberSpec(t, "boot-a", "h1", "a")); err != nil {
		t.Fatal(err)
	}
	resize := memberSpec(t, "resize-a", "h1", "a")
	resize.Kind = KindResizeDest
	if _, err := l.Claim(ctx, resize); err != nil {
		t.Fatalf("second claim of the same member on its host: %v", err)
	}
	var rule *GroupRuleError
	if _, err := l.Claim(ctx, memberSpec(t, "boot-b", "h1", "b")); !errors.As(err, &rule) || !slices.Equal(rule.Members, []string{"a"}) {
		t.Fatalf("claim of a second member = %v, want the rule naming member a", err)
	}
	if err := l.Release(ctx, "h1", "boot-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, memberSpec(t, "boot-b", "h1", "b")); !errors.As(err, &rule) {
		t.Fatalf("member a still holds a claim on h1, yet b's claim = %v", err)
	}
	if err := l.Release(ctx, "h1", "resize-a"); err != nil {
		t.Fatal(err)
	}
	if s := snapshot(t, l, "h1"); len(s.Groups) != 0 {
		t.Errorf("counters after every claim went: %v, want none", s.Groups)
	}
	if _, err := l.Claim(ctx, memberSpec(t, "boot-b", "h1", "b")); err != nil {
		t.Errorf("claim of b once a left: %v", err)
	}
	// A quarantine states what runs: it is neither counted nor refused.
	q := memberSpec(t, "quarantine-a", "h1", "a")
	q.Kind = KindQuarantine
	if _, err := l.Claim(ctx, q); err != nil {
		t.Errorf("quarantine of a member's pCPUs: %v", err)
	}
	if s := snapshot(t, l, "h1"); s.Groups["pair"] != 1 {
		t.Errorf("counters %v, want member b alone", s.Groups)
	}
}

// TestAffinityHoldsUnderRacingFirstClaims: members of an affinity group
// race to claim first, each on hosts in its own order; all that land are
// on one host, the group's; a first member whose claim fails leaves the
// group free.
func TestAffinityHoldsUnderRacingFirstClaims(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	hosts := []string{"h1", "h2", "h3", "h4"}
	for _, h := range hosts {
		register(t, l, h, testHost(2, 16))
	}
	createGroup(t, l, Group{Name: "tight", Policy: PolicyAffinity})
	const members = 12
	for i := range members {
		member(t, l, fmt.Sprintf("m%02d", i), "tight")
	}
	placed := make([]string, members)
	var wg sync.WaitGroup
	for i := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := fmt.Sprintf("m%02d", i)
			order := slices.Clone(hosts)
			rand.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
			for _, h := range order {
				_, err := l.Claim(ctx, memberSpec(t, "boot-"+u, h, u))
				var rule *GroupRuleError
				switch {
				case err == nil:
					placed[i] = h
					return
				case !errors.As(err, &rule):
					t.Errorf("Claim(%s on %s): %v", u, h, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	g, err := l.Group(ctx, "tight")
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range placed {
		if h != g.Host {
			t.Errorf("member m%02d is on %q, the group on %q", i, h, g.Host)
		}
	}

	// A first member that does not fit gives its host back.
	createGroup(t, l, Group{Name: "loose", Policy: PolicyAffinity})
	member(t, l, "big", "loose")
	big := memberSpec(t, "boot-big", "h4", "big")
	big.Request = dedicated(t, 64, 256)
	if _, err := l.Claim(ctx, big); err == nil {
		t.Fatal("a 64-vCPU claim fitted a 32-pCPU host")
	}
	if g, err := l.Group(ctx, "loose"); err != nil || g.Host != "" {
		t.Fatalf("group after its first member's failed claim: %+v %v, want no host", g, err)
	}
	big.Request = dedicated(t, 2, 256)
	big.Host = "h3"
	if _, err := l.Claim(ctx, big); err != nil {
		t.Fatalf("first member's claim elsewhere after a failure: %v", err)
	}

	// Fenced down, the group's host keeps its place against a boot
	// elsewhere, and gives way to the first claim elsewhere of an
	// evacuation, which moves the group's members.
	if _, err := l.SetHostDown(ctx, "h3", "fenced"); err != nil {
		t.Fatal(err)
	}
	member(t, l, "late", "loose")
	var rule *GroupRuleError
	for _, kind := range []ClaimKind{KindBoot, KindUnshelve, KindMigrationDest, KindResizeDest} {
		spec := memberSpec(t, "op-late", "h2", "late")
		spec.Kind = kind
		_, err := l.Claim(ctx, spec)
		if !errors.As(err, &rule) || !rule.BoundDown || !strings.Contains(err.Error(), "host h3, which is down: evacuate them first") {
			t.Errorf("%s claim elsewhere while the group's host is down = %v, want refused naming h3 and the way out", kind, err)
		}
	}
	if g, _ := l.Group(ctx, "loose"); g.Host != "h3" {
		t.Errorf("group's host %q after the refused claims, want h3 still", g.Host)
	}
	late := memberSpec(t, "evac-late", "h2", "late")
	late.Kind = KindEvacuationDest
	if _, err := l.Claim(ctx, late); err != nil {
		t.Fatalf("claim elsewhere once the group's host is down: %v", err)
	}
	if g, _ := l.Group(ctx, "loose"); g.Host != "h2" {
		t.Errorf("group's host %q after the evacuation's claim, want h2", g.Host)
	}
}

// TestGroupMembershipForLife: a group with members cannot be deleted; a
// member's delete takes it out, and the last one out frees an affinity
// group's host.
func TestGroupMembershipForLife(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(1, 8))
	createGroup(t, l, Group{Name: "web", Policy: PolicyAffinity})
	member(t, l, "a", "web")
	if inst, err := l.Instance(ctx, "a"); err != nil || inst.Group != "web" {
		t.Fatalf("record of a member: %+v %v, want group web", inst, err)
	}
	if _, err := l.Claim(ctx, memberSpec(t, "boot-a", "h1", "a")); err != nil {
		t.Fatal(err)
	}
	err := l.DeleteGroup(ctx, "web")
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "a") {
		t.Fatalf("DeleteGroup with a member = %v, want a conflict naming it", err)
	}
	if err := l.Release(ctx, "h1", "boot-a"); err != nil {
		t.Fatal(err)
	}
	if err := l.DeleteInstance(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	g, err := l.Group(ctx, "web")
	if err != nil || len(g.Members) != 0 || g.Host != "" {
		t.Fatalf("group after its last member was deleted: %+v %v, want no members and no host", g, err)
	}
	if err := l.DeleteGroup(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if gs, err := l.Groups(ctx); err != nil || len(gs) != 0 {
		t.Errorf("Groups after the delete: %+v %v", gs, err)
	}
	if err := l.DeleteGroup(ctx, "web"); err != nil {
		t.Errorf("deleting a deleted group: %v", err)
	}
}

// dump reads every key in Redis with its content, for checks that input
// refused changed nothing.
func dump(t testing.TB, rdb *redis.Client) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range keys {
		switch typ := rdb.Type(ctx, k).Val(); typ {
		case "hash":
			out[k] = fmt.Sprint(rdb.HGetAll(ctx, k).Val())
		case "set":
			m := rdb.SMembers(ctx, k).Val()
			slices.Sort(m)
			out[k] = fmt.Sprint(m)
		default:
			out[k] = typ + ":" + rdb.Dump(ctx, k).Val()
		}
	}
	return out
}

func dumpDiff(before, after map[string]string) string {
	var b strings.Builder
	for k, v := range before {
		if after[k] != v {
			fmt.Fprintf(&b, "%s: %s -> %s\n", k, v, after[k])
		}
	}
	for k, v := range after {
		if _, ok := before[k]; !ok {
			fmt.Fprintf(&b, "%s: new %s\n", k, v)
		}
	}
	return b.String()
}

// TestDisruptionBudget: at most MaxUnavailable members hold a slot at
// once; a holder renews its own, an evacuation's is counted past the
// budget, a slot given back frees room, one whose lease ran out counts
// until the taker has judged its operation, and a member of a group
// without a budget, or no member, needs none.
func TestDisruptionBudget(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	createGroup(t, l, Group{Name: "db", Policy: PolicyAntiAffinity, MaxUnavailable: 2})
	createGroup(t, l, Group{Name: "free", Policy: PolicyAffinity})
	for _, u := range []string{"a", "b", "c", "d"} {
		member(t, l, u, "db")
	}
	member(t, l, "e", "free")
	take := func(u string, force bool) Budget {
		t.Helper()
		b, err := l.TakeGroupSlot(ctx, u, time.Minute, force)
		if err != nil {
			t.Fatalf("TakeGroupSlot(%s): %v", u, err)
		}
		return b
	}
	if b := take("a", false); !b.Taken || b.Max != 2 || b.Group != "db" {
		t.Fatalf("first slot: %+v", b)
	}
	take("b", false)
	if b := take("c", false); b.Taken || !slices.Equal(b.Moving, []string{"a", "b"}) || b.Max != 2 {
		t.Fatalf("third member past a budget of 2: %+v, want refused naming a and b", b)
	}
	if b := take("a", false); !b.Taken {
		t.Fatalf("a renewing its own slot: %+v", b)
	}
	if b := take("c", true); !b.Taken {
		t.Fatalf("an evacuation's forced slot: %+v", b)
	}
	if moving, err := l.GroupMoving(ctx, "db"); err != nil || !slices.Equal(moving, []string{"a", "b", "c"}) {
		t.Fatalf("GroupMoving = %v %v, want a, b, c", moving, err)
	}
	if err := l.GiveGroupSlot(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := l.GiveGroupSlot(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if b := take("d", false); !b.Taken {
		t.Fatalf("a slot given back: %+v", b)
	}
	// A slot whose holder stopped renewing still counts: the taker is
	// told whose leases ran out, and judges each one's operation.
	if _, err := l.TakeGroupSlot(ctx, "c", time.Millisecond, true); err != nil {
		t.Fatal(err)
	}
	if ok, err := l.RenewGroupSlot(ctx, "b", time.Millisecond); err != nil || !ok {
		t.Fatalf("RenewGroupSlot(b) = %v %v", ok, err)
	}
	var b Budget
	for {
		if b = take("a", false); len(b.Expired) == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if b.Taken || !slices.Equal(b.Expired, []string{"b", "c"}) {
		t.Fatalf("a past a full budget with two leases run out: %+v, want refused naming b and c as expired", b)
	}
	if moving, err := l.GroupMoving(ctx, "db"); err != nil || !slices.Equal(moving, []string{"b", "c", "d"}) {
		t.Fatalf("GroupMoving = %v %v, want b, c and d: a slot past its lease counts until judged", moving, err)
	}
	// b's operation is open (its workers were away), c's ended.
	if err := l.KeepGroupSlot(ctx, "db", "b", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := l.DropGroupSlot(ctx, "db", "c"); err != nil {
		t.Fatal(err)
	}
	if b := take("a", false); b.Taken || !slices.Equal(b.Moving, []string{"b", "d"}) {
		t.Fatalf("a with b kept and d moving: %+v, want refused naming b and d", b)
	}
	// A drop is refused while the lease runs.
	if err := l.DropGroupSlot(ctx, "db", "b"); err != nil {
		t.Fatal(err)
	}
	if moving, _ := l.GroupMoving(ctx, "db"); !slices.Equal(moving, []string{"b", "d"}) {
		t.Errorf("GroupMoving after dropping a running lease = %v, want b and d still", moving)
	}
	// An open operation whose slot was dropped takes it again, past the
	// budget: its guest is moving.
	if ok, err := l.RenewGroupSlot(ctx, "c", time.Minute); err != nil || !ok {
		t.Errorf("renewing a dropped slot = %v %v, want held again", ok, err)
	}
	if moving, _ := l.GroupMoving(ctx, "db"); !slices.Equal(moving, []string{"b", "c", "d"}) {
		t.Errorf("GroupMoving after c's renewal = %v, want b, c and d", moving)
	}
	for _, u := range []string{"e", "nobody"} {
		if b := take(u, false); !b.Taken || b.Max != 0 {
			t.Errorf("TakeGroupSlot(%s) without a budget = %+v, want taken, no budget", u, b)
		}
	}
}
