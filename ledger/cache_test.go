package ledger

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/numa"
)

// secondLedger is another process's Ledger on the same Redis: its own
// client, its own cache.
func secondLedger(t *testing.T, addr string) *Ledger {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := New(rdb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestStaleCacheRetries makes one ledger's cache stale both ways: pCPUs
// it thinks free were taken by the other ledger (the claim loses a race
// and retries on the state the script returned), and a host it thinks full
// was emptied (the claim must not report no fit from the cache).
func TestStaleCacheRetries(t *testing.T) {
	ctx := context.Background()
	l1, _, srv := newLedger(t)
	l2 := secondLedger(t, srv.Addr)
	register(t, l1, "h1", testHost(1, 8))
	req := dedicated(t, 2, 512)

	if _, err := l1.Claim(ctx, spec("a", "h1", req)); err != nil {
		t.Fatal(err)
	}
	// l2 takes the pCPUs l1's cache would choose next.
	b, err := l2.Claim(ctx, spec("b", "h1", req))
	if err != nil {
		t.Fatal(err)
	}
	if got := l1.cachedHost("h1").host().Cell(0).PinnedCPUs; got.Intersects(b.Usage[0].PinnedCPUs) {
		t.Fatalf("l1's cache already knows b's pCPUs %s (pinned %s): the test needs it stale", b.Usage[0].PinnedCPUs, got)
	}
	c, err := l1.Claim(ctx, spec("c", "h1", req))
	if err != nil {
		t.Fatalf("Claim(c) on a stale cache: %v", err)
	}
	if c.Usage[0].PinnedCPUs.Intersects(b.Usage[0].PinnedCPUs) {
		t.Errorf("Claim(c) pinned %s, which b owns (%s)", c.Usage[0].PinnedCPUs, b.Usage[0].PinnedCPUs)
	}
	if got := l1.cachedHost("h1").host().Cell(0).PinnedCPUs; !b.Usage[0].PinnedCPUs.IsSubsetOf(got) {
		t.Errorf("l1's cache after the lost race pins %s, want b's %s among them", got, b.Usage[0].PinnedCPUs)
	}
	snapshot(t, l1, "h1")

	// Fill the host through l1, then empty it through l2: l1's cache says
	// full, the ledger says empty.
	if _, err := l1.Claim(ctx, spec("d", "h1", req)); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		if err := l2.Release(ctx, "h1", id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := numa.Fit(l1.cachedHost("h1").host(), req); err == nil {
		t.Fatal("l1's cache still fits the request: the test needs it to think the host full")
	}
	if _, err := l1.Claim(ctx, spec("e", "h1", req)); err != nil {
		t.Errorf("Claim(e) on an empty host that l1's cache thinks full: %v", err)
	}
	snapshot(t, l1, "h1")
}

// TestTwoLedgersInterleaved interleaves claims and releases of two ledgers
// (two processes) on one host in a random order and checks the ledger
// after every step: no pCPU is ever owned twice, and neither stale cache
// makes a claim fail that the host has room for.
func TestTwoLedgersInterleaved(t *testing.T) {
	ctx := context.Background()
	l1, _, srv := newLedger(t)
	l2 := secondLedger(t, srv.Addr)
	h := testHost(2, 8)
	register(t, l1, "h1", h)
	requests := []*numa.Request{
		dedicated(t, 1, 256),
		dedicated(t, 2, 512),
		dedicated(t, 2, 256, "hw:cpu_thread_policy", "isolate"),
		dedicated(t, 3, 256, "hw:mem_page_size", "2048"),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var live []string
	for i := range 400 {
		l := l1
		if rng.IntN(2) == 1 {
			l = l2
		}
		if len(live) > 0 && rng.IntN(3) == 0 {
			j := rng.IntN(len(live))
			if err := l.Release(ctx, "h1", live[j]); err != nil {
				t.Fatalf("step %d: Release(%s): %v", i, live[j], err)
			}
			live = append(live[:j], live[j+1:]...)
		} else {
			id := fmt.Sprintf("c%d", i)
			req := requests[rng.IntN(len(requests))]
			// What the ledger itself says: the request fits on its state.
			fits := true
			if cur, err := l1.Host(ctx, "h1"); err != nil {
				t.Fatal(err)
			} else if _, err := numa.Fit(cur, req); err != nil {
				fits = false
			}
			_, err := l.Claim(ctx, spec(id, "h1", req))
			var nofit *numa.NoFitError
			switch {
			case err == nil:
				live = append(live, id)
			case errors.As(err, &nofit) && !fits:
			default:
				t.Fatalf("step %d: Claim(%s), which fits: %v", i, id, err)
			}
		}
		snapshot(t, l1, "h1")
	}
}

// TestReRegistrationInvalidatesCache changes a host's topology from
// another ledger: the cached generation is refused by the claim script,
// and the next attempt fits on the new topology.
func TestReRegistrationInvalidatesCache(t *testing.T) {
	ctx := context.Background()
	l1, _, srv := newLedger(t)
	l2 := secondLedger(t, srv.Addr)
	register(t, l1, "h1", testHost(1, 4))
	req := dedicated(t, 2, 512)
	for _, id := range []string{"a", "b"} {
		if _, err := l1.Claim(ctx, spec(id, "h1", req)); err != nil {
			t.Fatal(err)
		}
	}
	// l1's cache: generation 1, full. Another process grows the host.
	if gen := register(t, l2, "h1", testHost(2, 4)); gen != 2 {
		t.Fatalf("RegisterHost(grown) = generation %d, want 2", gen)
	}
	c, err := l1.Claim(ctx, spec("c", "h1", req))
	if err != nil {
		t.Fatalf("Claim(c) after another process grew the host: %v", err)
	}
	if c.Generation != 2 || c.Usage[0].Cell != 1 {
		t.Errorf("Claim(c) = generation %d on cell %d, want generation 2 on the new cell 1", c.Generation, c.Usage[0].Cell)
	}
	if hc := l1.cachedHost("h1"); hc == nil || hc.gen != 2 {
		t.Errorf("l1's cache after the claim is %+v, want generation 2", hc)
	}

	// The first topology again, once its claims fit it: a new generation
	// with the digest l1 cached before, which must still be refetched.
	for _, id := range []string{"a", "c"} {
		if err := l1.Release(ctx, "h1", id); err != nil {
			t.Fatal(err)
		}
	}
	if gen := register(t, l2, "h1", testHost(1, 4)); gen != 3 {
		t.Fatalf("RegisterHost(first topology again) = generation %d, want 3", gen)
	}
	d, err := l1.Claim(ctx, spec("d", "h1", req))
	if err != nil {
		t.Fatalf("Claim(d) after the topology went back: %v", err)
	}
	if d.Generation != 3 {
		t.Errorf("Claim(d) generation = %d, want 3", d.Generation)
	}
	snapshot(t, l1, "h1")

	// Registering in this process drops its own cache at once.
	if gen := register(t, l1, "h1", testHost(2, 4)); gen != 4 {
		t.Fatalf("RegisterHost from l1 = generation %d, want 4", gen)
	}
	if hc := l1.cachedHost("h1"); hc != nil {
		t.Errorf("l1 kept its cache of generation %d after registering generation 4", hc.gen)
	}
}

// TestReleaseRecordWithoutUndo: a claim's undo entry says what it took,
// token, pCPUs and counters. A record whose undo entry is gone is a
// damaged ledger: every release refuses it (ErrConflict) and changes
// nothing, since what the claim took is unknown, and its fence refuses
// it as gone.
func TestReleaseRecordWithoutUndo(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 8))
	k := l.hostKeys("h1")
	req := dedicated(t, 3, 1024, "hw:mem_page_size", "2048")
	c, err := l.Claim(ctx, spec("c1", "h1", req))
	if err != nil {
		t.Fatal(err)
	}
	entry, err := rdb.HGet(ctx, k.undo, "c1").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := c.Token + "|0,1,2|0:mem,1024,0:pages:2048,512,host:mem,1024"; entry != want {
		t.Errorf("undo entry of c1 = %q, want %q: token, pCPUs 0-2, 1024 MiB and 512 2 MiB pages of cell 0, 1024 MiB of the host", entry, want)
	}
	rec, err := jsonClaim(c)
	if err != nil {
		t.Fatal(err)
	}
	if stored, _ := rdb.HGet(ctx, k.claims, "c1").Result(); stored != rec {
		t.Errorf("stored record of c1 = %s, want the plain JSON %s", stored, rec)
	}
	if err := rdb.HDel(ctx, k.undo, "c1").Err(); err != nil {
		t.Fatal(err)
	}
	damaged, err := l.Snapshot(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range []struct {
		name string
		do   func() error
	}{
		{"Release", func() error { return l.Release(ctx, "h1", "c1") }},
		{"ReleasePending", func() error { _, err := l.ReleasePending(ctx, "h1", "c1"); return err }},
		{"ReleaseIfUnchanged", func() error { _, err := l.ReleaseIfUnchanged(ctx, "h1", "c1", c.Token, StatePending); return err }},
	} {
		if err := rel.do(); !errors.Is(err, ErrConflict) {
			t.Errorf("%s(c1 without its undo entry) = %v, want ErrConflict", rel.name, err)
		}
		after, err := l.Snapshot(ctx, "h1")
		if err != nil {
			t.Fatal(err)
		}
		if diff := diffSnapshots(damaged, after); diff != "" {
			t.Errorf("%s(c1 without its undo entry) changed the host (-before +after):\n%s", rel.name, diff)
		}
	}
	if _, err := l.Fence(ctx, "h1", "c1", c.Token, time.Minute); !errors.Is(err, ErrUnknownClaim) {
		t.Errorf("Fence(c1 without its undo entry) = %v, want ErrUnknownClaim", err)
	}
}

// host returns the host as the cache last observed it, pending claims
// left out. It is a copy.
func (hc *hostCache) host() *numa.Host {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	return hc.observed()
}

// TestClaimAfterRestoreOfOlderState puts a host's keys back to an older
// state (a restore from backup, writes lost in a failover): the host's
// revision goes backwards and pCPUs that the cache last saw free are owned
// again. The claim that fits on the cache loses its race, and the reply,
// older than anything the cache saw, makes it drop its view: the next
// attempt fits on state read afresh and lands, instead of losing the same
// race on every retry.
func TestClaimAfterRestoreOfOlderState(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	// Two attempts: the lost race and the one that must land.
	l2, err := New(rdb, Options{MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	register(t, l, "h1", testHost(1, 8))
	req := dedicated(t, 2, 512)
	for _, id := range []string{"a", "b"} {
		if _, err := l.Claim(ctx, spec(id, "h1", req)); err != nil {
			t.Fatal(err)
		}
	}
	// The older state: a and b own pCPUs 0-3, at revision 2.
	k := l.hostKeys("h1")
	keys := k.all()
	saved := map[string]string{}
	for _, key := range keys {
		d, err := rdb.Dump(ctx, key).Result()
		if err != nil && !isNil(err) {
			t.Fatal(err)
		}
		saved[key] = d
	}
	// Many changes later the host is empty, and l2's cache knows it.
	for i := range 6 {
		id := fmt.Sprintf("x%d", i)
		if _, err := l2.Claim(ctx, spec(id, "h1", req)); err != nil {
			t.Fatal(err)
		}
		if err := l2.Release(ctx, "h1", id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"a", "b"} {
		if err := l2.Release(ctx, "h1", id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l2.Host(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	for _, key := range keys {
		if saved[key] == "" {
			err = rdb.Del(ctx, key).Err()
		} else {
			err = rdb.RestoreReplace(ctx, key, 0, saved[key]).Err()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := l2.cachedHost("h1").host().Cell(0).PinnedCPUs; !got.IsEmpty() {
		t.Fatalf("l2's cache pins %s: the test needs it to show the host empty", got)
	}
	c, err := l2.Claim(ctx, spec("c", "h1", req))
	if err != nil {
		t.Fatalf("Claim(c) after the host went back to revision 2: %v", err)
	}
	if c.Usage[0].PinnedCPUs.Intersects(numa.Range(0, 3)) {
		t.Errorf("Claim(c) pinned %s, which a and b own again", c.Usage[0].PinnedCPUs)
	}
	snapshot(t, l, "h1")
	// And every later claim fits on the fresh view at once.
	if _, err := l2.Claim(ctx, spec("d", "h1", req)); err != nil {
		t.Errorf("Claim(d): %v", err)
	}
	snapshot(t, l, "h1")
}
