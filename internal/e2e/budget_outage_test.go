package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/pinflow/pinflow/ledger"
)

// TestBudgetHoldsThroughAWorkerOutage: a member's live migration, held
// in its copy, holds the group's one disruption slot; its only worker is
// killed and stays away until the slot's lease has run out by Redis'
// clock. With a new worker, group show still lists the member moving, and
// a second member's migration waits for the budget, naming the first;
// once the first move ends, the second goes.
func TestBudgetHoldsThroughAWorkerOutage(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	for _, h := range []string{"a", "b", "c"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	s.ok("group", "create", "db", "--policy", "soft-anti-affinity", "--max-unavailable", "1")
	boot := func(name, host string) string {
		out := s.ok("boot", "--name", name, "--group", "db", "--host", host, "--vcpus", "1", "--memory-mb", "512",
			"--spec", "hw:cpu_policy=dedicated", "--wait", "--json")
		return jsonField(t, out, "uuid")
	}
	m1, m2 := boot("m1", "a"), boot("m2", "b")

	s.ok("sim", "gate", "--at", "migrate", "--guest", m1, "--hold")
	s.ok("migrate", m1, "--dest", "c")
	s.ok("sim", "gate", "--at", "migrate", "--guest", m1, "--wait-arrived", "1")
	s.killWorker()
	s.waitSlotLeaseOut("db", m1)
	s.startWorker()

	var g struct {
		Moving []string `json:"moving"`
	}
	s.jsonOf(&g, "group", "show", "db")
	if len(g.Moving) != 1 || g.Moving[0] != m1 {
		t.Errorf("group show db after the outage: moving %v, want [%s]: its move is still open", g.Moving, m1)
	}
	s.ok("migrate", m2, "--dest", "c")
	s.statusDetail(m2, "waiting for the disruption budget of group db: 1 of its members are moving ("+m1+"), and it allows 1")
	if got := hostOf(s.guest(m2)); got != "b" {
		t.Fatalf("m2 moved to %q while m1's move was open", got)
	}
	s.ok("sim", "gate", "--at", "migrate", "--guest", m1, "--release")
	if g := s.waitClosed(m1); hostOf(g) != "c" {
		t.Errorf("m1 ended on %q, want c", hostOf(g))
	}
	if g := s.waitClosed(m2); hostOf(g) != "c" {
		t.Errorf("m2 ended on %q, want c once m1's move was done", hostOf(g))
	}
	s.noDoublePins("a", "b", "c")
	s.ok("check")
}

// waitSlotLeaseOut waits until member's slot in group's disruption budget
// has outlived its lease by Redis' clock: no worker renewed it.
func (s *stack) waitSlotLeaseOut(group, member string) {
	s.t.Helper()
	ctx := context.Background()
	rdb := s.redisClient()
	key := ledger.DefaultKeyPrefix + ":group:{" + group + "}:moving"
	s.eventually("the disruption slot of "+member+" outlives its lease", 5*time.Minute, func() bool {
		end, err := rdb.ZScore(ctx, key, member).Result()
		if err != nil {
			s.t.Fatalf("the slot of %s in %s: %v", member, group, err)
		}
		now, err := rdb.Time(ctx).Result()
		return err == nil && float64(now.UnixMilli()) > end
	})
}
