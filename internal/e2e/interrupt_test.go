package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

// TestInterruptedOperations cancels and terminates boots, migrations,
// offloads, unshelves, deletes and host drains of pinned, floating and
// mixed guests, on hosts with and without shared CPUs, at random points of
// slow, faulty hypervisor steps while an audit with no grace runs every
// second, and operators fence hosts and bring them back, recover healthy
// hosts' ledgers, release quarantines and start a worker of another
// namespace. No pCPU a guest pins may ever be within reach of another
// guest's running or paused domain, and once everything has settled every
// running guest sits on exactly its record's committed claim and no claim
// is left that no record names.
func TestInterruptedOperations(t *testing.T) {
	t.Parallel()
	// Room enough that a drain can often plan its host's guests.
	c := newChaos(t, 4, 4, false, true)
	c.slots, c.ops, c.window = 8, 80, 60*time.Second
	c.drainEvery, c.idle = 2*time.Second, 2*time.Second
	c.fenceEvery, c.recoverEvery, c.foreignWorkerEvery = 5*time.Second, 3*time.Second, 15*time.Second
	c.interrupt = func(rng *rand.Rand) string {
		switch n := rng.IntN(10); {
		case n < 4:
			return "cancel"
		case n < 7:
			return "terminate"
		}
		return ""
	}
	c.run()
}

// TestWorkerKilledUnderInterruptions kills the worker every few seconds
// while operations are cancelled at random points, with the same checks.
func TestWorkerKilledUnderInterruptions(t *testing.T) {
	t.Parallel()
	c := newChaos(t, 4, 3, false, false)
	c.slots, c.ops, c.window = 6, 48, 45*time.Second
	c.killEvery = 7 * time.Second
	c.interrupt = func(rng *rand.Rand) string {
		if rng.IntN(10) < 4 {
			return "cancel"
		}
		return ""
	}
	c.run()
}

// TestWorkersFrozenUnderInterruptions freezes a worker (SIGSTOP) now and
// then for longer than the fence lease, with a new worker beside it,
// while operations are cancelled and terminated at random points and at
// the gates of the steps that change domains, and the audit settles what
// they leave; each frozen worker then resumes inside whatever step it was
// in. With the same checks: a resumed step of an operation that ended
// must change nothing.
func TestWorkersFrozenUnderInterruptions(t *testing.T) {
	t.Parallel()
	c := newChaos(t, 4, 3, false, false)
	c.slots, c.ops, c.window = 6, 48, 40*time.Second
	// Past the fence lease (10 s) and the steps' heartbeat timeout (5 s).
	c.freezeEvery, c.freezeFor = 5*time.Second, 13*time.Second
	c.interrupt = func(rng *rand.Rand) string {
		switch rng.IntN(10) {
		case 0, 1, 2:
			return "terminate"
		case 3, 4:
			return "cancel"
		}
		return ""
	}
	c.run()
	if c.freezes.Load() == 0 {
		t.Errorf("no worker was frozen: the run tested nothing of it")
	}
}

// TestSoak is everything at once, for long: boots, migrations, offloads,
// unshelves and deletes on many pinned, floating and mixed guests, host
// drains, a third of them cancelled or terminated at random points,
// hypervisor faults and latencies, the worker killed with SIGKILL and
// Redis restarted now and then, hosts fenced and brought back, ledgers
// recovered, quarantines released and workers of another namespace
// started, an audit every second, with the same checks. `make soak` runs
// it long (PINFLOW_SOAK_OPS=10000 on 8 hosts and 40 guests); make test
// runs a short one.
func TestSoak(t *testing.T) {
	t.Parallel()
	ops, hosts, guests := envInt("PINFLOW_SOAK_OPS", 240), envInt("PINFLOW_SOAK_HOSTS", 8), envInt("PINFLOW_SOAK_GUESTS", 16)
	window := time.Duration(envInt("PINFLOW_SOAK_MINUTES", 2)) * time.Minute
	c := newChaos(t, hosts, 6, true, true)
	c.slots, c.ops, c.window = guests, ops, window
	c.killEvery = time.Duration(envInt("PINFLOW_SOAK_KILL_SECONDS", 10)) * time.Second
	c.restartRedisEvery = time.Duration(envInt("PINFLOW_SOAK_REDIS_SECONDS", 15)) * time.Second
	c.drainEvery = time.Duration(envInt("PINFLOW_SOAK_DRAIN_SECONDS", 5)) * time.Second
	c.fenceEvery = time.Duration(envInt("PINFLOW_SOAK_FENCE_SECONDS", 8)) * time.Second
	c.recoverEvery = time.Duration(envInt("PINFLOW_SOAK_RECOVER_SECONDS", 6)) * time.Second
	c.foreignWorkerEvery = time.Duration(envInt("PINFLOW_SOAK_FOREIGN_SECONDS", 20)) * time.Second
	c.interrupt = func(rng *rand.Rand) string {
		switch n := rng.IntN(6); n {
		case 0:
			return "cancel"
		case 1:
			return "terminate"
		}
		return ""
	}
	c.run()
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		var n int
		if _, err := fmt.Sscan(v, &n); err == nil && n > 0 {
			return n
		}
	}
	return def
}
