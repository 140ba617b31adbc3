package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The failure tests of the distributed deployment: each runs boots,
// migrations, resizes, offloads, unshelves and deletes on six guests while
// an audit runs every second, on the cluster deploy/cluster.sh runs with
// three workers, and breaks one part of it. No operation is interrupted
// and the hypervisors make no faults, so every operation must complete;
// then the end checks of the chaos runs (no pCPU used by two running
// domains, every running guest on its record's committed claim, no claim
// that no record names) and `pinflow check` must hold.

// clusterChaos is a calm chaos run on a new cluster stack: four hosts of
// two cells of six cores, room for every guest to move at its largest.
func clusterChaos(t *testing.T, window time.Duration) *chaos {
	c := chaosOn(newClusterStack(t), 4, 6, false)
	c.calm = true
	c.slots, c.ops, c.window = 6, 10000, window
	c.interrupt = func(*rand.Rand) string { return "" }
	return c
}

// finish checks that every operation completed and the ledgers verify,
// and logs what the event at `at` cost.
func (c *chaos) finish(at time.Duration) {
	c.t.Helper()
	c.mu.Lock()
	var failed []string
	for k, n := range c.outcomes {
		if !strings.HasSuffix(k, "->ok") {
			failed = append(failed, fmt.Sprintf("%s: %d", k, n))
		}
	}
	c.mu.Unlock()
	sort.Strings(failed)
	for _, f := range failed {
		c.t.Errorf("operations that did not complete: %s", f)
	}
	c.s.ok("check")
	c.t.Log(c.cost(at))
}

// cost says how the operations fared around the event at `at`: the
// longest operation running at that moment against the median and
// longest of those that ended before it, and how many completed in the
// minute after it against the rate before it.
func (c *chaos) cost(at time.Duration) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	event := c.begun.Add(at)
	var before []time.Duration
	var across time.Duration
	spanning, after := 0, 0
	for _, s := range c.spans {
		d := s.end.Sub(s.start)
		switch {
		case s.end.Before(event):
			before = append(before, d)
		case s.start.Before(event):
			spanning++
			across = max(across, d)
		}
		if !s.end.Before(event) && s.end.Before(event.Add(time.Minute)) {
			after++
		}
	}
	if spanning == 0 {
		c.t.Errorf("no operation was running at %s: the event tested nothing", at)
	}
	sort.Slice(before, func(i, j int) bool { return before[i] < before[j] })
	p50, longest := time.Duration(0), time.Duration(0)
	if len(before) > 0 {
		p50, longest = before[len(before)/2], before[len(before)-1]
	}
	window := min(time.Minute, time.Since(event))
	return fmt.Sprintf("before the event: %d operations in %s (median %s, longest %s); "+
		"%d running at the event, the longest took %s; %d completed in the %s after it (%.1f/s, %.1f/s before)",
		len(before), at, p50.Round(time.Millisecond), longest.Round(time.Millisecond), spanning, across.Round(time.Millisecond),
		after, window.Round(time.Second), float64(after)/window.Seconds(), float64(len(before))/at.Seconds())
}

// TestClusterTemporalNodeKilled kills one of the two Temporal server
// nodes with SIGKILL and starts it again 35 s later: the workers and the
// test's client use both frontends, the other node takes over the dead
// one's history shards, and no operation is lost or run twice.
func TestClusterTemporalNodeKilled(t *testing.T) {
	t.Parallel()
	const at = 10 * time.Second
	c := clusterChaos(t, 75*time.Second)
	cl := c.s.cluster
	c.events = []chaosEvent{
		{at, "kill -9 Temporal node 1", func() { c.check(cl.Do("kill", "temporal", "1")) }},
		{at + 35*time.Second, "start Temporal node 1 again", func() { c.check(cl.Do("start", "temporal", "1")) }},
	}
	c.run()
	c.finish(at)
}

// TestClusterRedisMasterFailover kills, with SIGKILL, the Redis master that
// serves host h0's keys; its replica takes over. Every change the ledger
// acknowledged waited for that replica (WAIT 1), so no acknowledged claim
// is lost; while the new master has no replica of its own, changes on its
// slots wait, and retry, until the old master is back as its replica.
func TestClusterRedisMasterFailover(t *testing.T) {
	t.Parallel()
	const at = 10 * time.Second
	c := clusterChaos(t, 45*time.Second)
	rdb := c.s.redisClient()
	node, err := rdb.(*redis.ClusterClient).MasterForKey(context.Background(), "{h0}")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(node.Options().Addr, ":")
	cl := c.s.cluster
	c.events = []chaosEvent{
		{at, "kill -9 the Redis master of h0, port " + port, func() { c.check(cl.Do("kill", "redis", port)) }},
		{at + 10*time.Second, "start the old master again, as a replica", func() { c.check(cl.Do("start", "redis", port)) }},
	}
	c.run()
	c.finish(at)
}

// TestClusterWorkerKilled kills one of the three workers with SIGKILL and
// does not replace it: the others pick up its workflow and activity tasks
// once their timeouts run out.
func TestClusterWorkerKilled(t *testing.T) {
	t.Parallel()
	const at = 10 * time.Second
	c := clusterChaos(t, 40*time.Second)
	c.events = []chaosEvent{{at, "kill -9 worker 1 of 3", func() {
		w := c.s.workers[0]
		c.check(w.Process.Kill())
		_ = w.Wait()
	}}}
	c.run()
	c.finish(at)
}

// TestClusterRollingRestart stops two of the three workers gracefully, one
// after the other, each replaced by a new one, as a rolling upgrade does:
// a stopping worker hands its work over, and no migration is aborted.
func TestClusterRollingRestart(t *testing.T) {
	t.Parallel()
	const at = 10 * time.Second
	c := clusterChaos(t, 40*time.Second)
	restart := func(i int) func() {
		return func() {
			w := c.s.workers[i]
			c.check(w.Process.Signal(syscall.SIGTERM))
			_ = w.Wait()
			c.s.startWorker()
		}
	}
	c.events = []chaosEvent{
		{at, "stop worker 1 of 3 (SIGTERM) and start a new one", restart(0)},
		{at + 10*time.Second, "stop worker 2 of 3 (SIGTERM) and start a new one", restart(1)},
	}
	c.run()
	c.finish(at)
}

// check reports an error an event met.
func (c *chaos) check(err error) {
	if err != nil {
		c.report("%v", err)
	}
}
