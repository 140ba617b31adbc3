package placement

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// compareChoosers asks Exhaustive and ix for n random requests and fails
// on any difference of host or error.
func compareChoosers(t *testing.T, c *cloud, ix *Index, led *ledger.Ledger, n int) (chosen []string) {
	t.Helper()
	ctx := context.Background()
	fits := 0
	for i := range n {
		r := c.randomPlacement(t, i)
		want := outcome(Exhaustive(ctx, led, r))
		got := outcome(ix.Choose(ctx, r))
		if got != want {
			t.Fatalf("request %d %+v excluding %v:\nindex chose      %s\nExhaustive chose %s", i, *r.Request, r.Exclude, got, want)
		}
		if err := ix.check(); err != nil {
			t.Fatal(err)
		}
		if h, ok := strings.CutPrefix(got, "host "); ok {
			fits++
			chosen = append(chosen, h)
		}
	}
	t.Logf("%d of %d requests fit", fits, n)
	if fits == 0 || fits == n {
		t.Fatalf("%d of %d requests fit: the cloud tells nothing apart", fits, n)
	}
	return chosen
}

// TestIndexChoosesAsExhaustive: on random clouds (topologies with and
// without SMT, shared sets, huge pages, ratios; random fill; hosts down
// or returning), for random dedicated, mixed, shared and NUMA-less guests
// with exclusions, the index chooses the host Exhaustive chooses, or fails
// with its error. Then another ledger (another worker) claims, releases,
// marks, registers and removes hosts, and once the index's polls caught up
// the choices agree again.
func TestIndexChoosesAsExhaustive(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			ctx := context.Background()
			mine, other, _ := newLedgers(t)
			c := newCloud(t, other, 40, seed)
			ix := NewIndex(mine, Options{})
			if err := ix.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			chosen := compareChoosers(t, c, ix, mine, 150)
			for round := range 4 {
				c.mutate(t, chosen, round)
				caughtUp(t, ix, mine)
				chosen = compareChoosers(t, c, ix, mine, 100)
			}
		})
	}
}

// mutate changes the cloud the way other workers would: guests land on
// some of the hosts chosen, others leave, hosts go down and come back, a
// host is registered and an empty one removed.
func (c *cloud) mutate(t *testing.T, chosen []string, round int) {
	t.Helper()
	ctx := context.Background()
	for _, h := range chosen[:len(chosen)/2] {
		_, _ = c.claim(ctx, h, randomRequest(t, c.rng))
	}
	c.mu.Lock()
	c.rng.Shuffle(len(c.made), func(i, j int) { c.made[i], c.made[j] = c.made[j], c.made[i] })
	gone := c.made[:len(c.made)/5]
	c.made = c.made[len(c.made)/5:]
	c.mu.Unlock()
	for _, m := range gone {
		if err := c.led.Release(ctx, m[0], m[1]); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		c.mark(t, c.hosts[c.rng.IntN(len(c.hosts))])
	}
	name := fmt.Sprintf("new%d", round)
	if _, err := c.led.RegisterHost(ctx, name, randomHost(t, c.rng)); err != nil {
		t.Fatal(err)
	}
	c.hosts = append(c.hosts, name)
	if round > 0 {
		old := fmt.Sprintf("new%d", round-1)
		_, err := c.led.RemoveHost(ctx, old)
		switch {
		case err == nil:
			c.hosts = slices.DeleteFunc(c.hosts, func(h string) bool { return h == old })
		case !errors.Is(err, ledger.ErrConflict): // a guest landed there
			t.Fatal(err)
		}
	}
}

// entryFree is what the index holds of a host's free pCPUs; -1 if it
// holds nothing.
func entryFree(ix *Index, host string) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if e := ix.entries[host]; e != nil {
		return e.free
	}
	return -1
}

func dedicated(t testing.TB, vcpus int, memMB int64, extra ...string) *numa.Request {
	t.Helper()
	specs := map[string]string{"hw:cpu_policy": "dedicated"}
	for i := 0; i+1 < len(extra); i += 2 {
		specs[extra[i]] = extra[i+1]
	}
	r, err := numa.NewRequest(vcpus, memMB, specs, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func uniform(t testing.TB, cells, cores, threads int) *numa.Host {
	t.Helper()
	h, err := numa.Uniform(numa.UniformSpec{Cells: cells, Cores: cores, Threads: threads, MemoryMB: 16384})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestIndexSeesAnotherLedgersChanges: claims, releases, registrations and
// removals made through another ledger on the same Redis reach the index
// at its next poll, and not before.
func TestIndexSeesAnotherLedgersChanges(t *testing.T) {
	ctx := context.Background()
	mine, other, _ := newLedgers(t)
	for _, h := range []string{"a", "b"} {
		if _, err := other.RegisterHost(ctx, h, uniform(t, 2, 4, 2)); err != nil {
			t.Fatal(err)
		}
	}
	ix := NewIndex(mine, Options{})
	if err := ix.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if got := entryFree(ix, "a"); got != 16 {
		t.Fatalf("index holds %d free pCPUs of a, want 16", got)
	}
	c := &cloud{led: other}
	if _, err := c.claim(ctx, "a", dedicated(t, 4, 1024)); err != nil {
		t.Fatal(err)
	}
	if got := entryFree(ix, "a"); got != 16 {
		t.Fatalf("before any poll the index holds %d free pCPUs of a, want the 16 it read", got)
	}
	waitFor(t, ix, "the claim on a", func() bool { return entryFree(ix, "a") == 12 })

	if _, err := other.RegisterHost(ctx, "c", uniform(t, 1, 4, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ix, "registered host c", func() bool { return entryFree(ix, "c") == 4 })
	if _, err := other.RemoveHost(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ix, "removed host b", func() bool { return entryFree(ix, "b") == -1 })
	if err := other.Release(ctx, "a", c.made[0][1]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ix, "the release on a", func() bool { return entryFree(ix, "a") == 16 })
	if got := ix.Len(); got != 2 {
		t.Errorf("index holds %d hosts, want a and c", got)
	}
}

// waitFor polls ix until ok, and fails the test after a few seconds.
func waitFor(t *testing.T, ix *Index, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s of polls the index has not seen %s", what)
		}
		time.Sleep(10 * time.Millisecond)
		if err := ix.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSweepRepairsLostHint: a change whose hint was lost (its process
// died between the change and the hint) stays unseen by polls, and the
// next sweep reads it.
func TestSweepRepairsLostHint(t *testing.T) {
	ctx := context.Background()
	mine, other, rdb := newLedgers(t)
	if _, err := other.RegisterHost(ctx, "a", uniform(t, 1, 8, 1)); err != nil {
		t.Fatal(err)
	}
	ix := NewIndex(mine, Options{})
	if err := ix.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	before, err := other.LastChange(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &cloud{led: other}
	if _, err := c.claim(ctx, "a", dedicated(t, 3, 1024)); err != nil {
		t.Fatal(err)
	}
	// Wait for the claim's hint, then lose it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		changes, err := other.ChangedSince(ctx, before)
		if err != nil {
			t.Fatal(err)
		}
		if len(changes) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the claim's change hint never came")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := rdb.ZRem(ctx, ledger.DefaultKeyPrefix+":placement:changed", "a").Err(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := ix.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := entryFree(ix, "a"); got != 8 {
		t.Fatalf("after polls without the hint the index holds %d free pCPUs of a, want the 8 it read first", got)
	}
	if err := ix.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if got := entryFree(ix, "a"); got != 5 {
		t.Errorf("after a sweep the index holds %d free pCPUs of a, want 5", got)
	}
}

// TestStaleIndexChoosesOnlyHostsThatTakeTheGuest: with an index that
// never polls while another ledger fills hosts, marks them down and frees
// others, every host it chooses is up, not excluded and takes the guest
// on a fresh read (the claim on it succeeds).
func TestStaleIndexChoosesOnlyHostsThatTakeTheGuest(t *testing.T) {
	ctx := context.Background()
	mine, other, _ := newLedgers(t)
	c := newCloud(t, other, 30, 11)
	ix := NewIndex(mine, Options{})
	if err := ix.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	chose, differed := 0, 0
	for i := range 300 {
		if i%10 == 0 {
			// Behind the index's back.
			h := c.hosts[c.rng.IntN(len(c.hosts))]
			if err := c.fill(t, h, 1, uint64(i)); err != nil {
				t.Fatal(err)
			}
			c.mark(t, c.hosts[c.rng.IntN(len(c.hosts))])
		}
		r := c.randomPlacement(t, i)
		host, err := ix.Choose(ctx, r)
		var nofit *numa.NoFitError
		if errors.As(err, &nofit) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		chose++
		if want, _ := Exhaustive(ctx, other, r); want != host {
			differed++
		}
		for _, x := range r.Exclude {
			if x == host {
				t.Fatalf("request %d chose %s, which it excludes", i, host)
			}
		}
		if st, err := other.HostStatus(ctx, host); err != nil || st.State != ledger.HostUp {
			t.Fatalf("request %d chose %s, which is %+v, %v; want up", i, host, st, err)
		}
		if _, err := c.claim(ctx, host, r.Request); err != nil {
			t.Fatalf("request %d chose %s, where the claim fails: %v", i, host, err)
		}
	}
	t.Logf("%d choices, %d of them not Exhaustive's (the stale index's best guesses)", chose, differed)
	if chose < 50 {
		t.Fatalf("only %d of 300 requests chose a host", chose)
	}
}

// TestStaleIndexFindsAFreedHost: when the index believes every host full
// but one was emptied behind its back, the fresh reads for the error find
// it, and the choice is that host.
func TestStaleIndexFindsAFreedHost(t *testing.T) {
	ctx := context.Background()
	mine, other, _ := newLedgers(t)
	c := &cloud{led: other}
	for _, h := range []string{"a", "b", "c"} {
		if _, err := other.RegisterHost(ctx, h, uniform(t, 1, 4, 1)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.claim(ctx, h, dedicated(t, 4, 1024)); err != nil {
			t.Fatal(err)
		}
	}
	ix := NewIndex(mine, Options{})
	if err := ix.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	r := Request{UUID: "g", Request: dedicated(t, 2, 1024)}
	if _, err := ix.Choose(ctx, r); err == nil || !strings.Contains(err.Error(), "no host can take instance g") {
		t.Fatalf("Choose on full hosts: %v, want no host can take it", err)
	}
	if err := other.Release(ctx, "b", c.made[1][1]); err != nil {
		t.Fatal(err)
	}
	if got, err := ix.Choose(ctx, r); got != "b" || err != nil {
		t.Errorf("Choose after b was freed behind the index's back = %q, %v; want b", got, err)
	}
}

// TestNoFitErrors: when no host takes the guest, both choosers give the
// same error: the first hosts by name and why, and a count of the rest.
func TestNoFitErrors(t *testing.T) {
	ctx := context.Background()
	mine, other, _ := newLedgers(t)
	for i := range 12 {
		if _, err := other.RegisterHost(ctx, fmt.Sprintf("h%02d", i), uniform(t, 1, 4, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.SetHostDown(ctx, "h01", "psu"); err != nil {
		t.Fatal(err)
	}
	ix := NewIndex(mine, Options{})
	all := []string{}
	for i := range 12 {
		all = append(all, fmt.Sprintf("h%02d", i))
	}
	for _, tc := range []struct {
		name    string
		r       Request
		want    string
		parts   int // hosts named
		counted string
	}{
		{"too big", Request{UUID: "g1", Request: dedicated(t, 6, 1024)},
			"no host can take instance g1: no NUMA cell with enough free pCPUs: h00 (no fit: a guest cell fits no host cell: guest cell 0 on host cell 0: needs 6 pCPUs, the cell has 4), h02, h03, h04; host down (takes no new guests): h01 (psu)",
			5, "; 7 more hosts cannot take it either ('pinflow explain' lists every host)"},
		{"all excluded", Request{UUID: "g2", Request: dedicated(t, 2, 1024), Exclude: all},
			"no host can take instance g2: there are no other hosts", 0, ""},
		{"few left", Request{UUID: "g3", Request: dedicated(t, 6, 1024), Exclude: all[2:]},
			"no host can take instance g3: no NUMA cell with enough free pCPUs: h00 (no fit", 2, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, want := Exhaustive(ctx, mine, tc.r)
			_, got := ix.Choose(ctx, tc.r)
			var nofit *numa.NoFitError
			if !errors.As(got, &nofit) {
				t.Fatalf("Choose error %v, want a *numa.NoFitError", got)
			}
			if want == nil {
				t.Fatalf("Exhaustive found a host; Choose error %v", got)
			}
			if diff := cmp.Diff(want.Error(), got.Error()); diff != "" {
				t.Fatalf("Choose error differs from Exhaustive's (-Exhaustive +Choose):\n%s", diff)
			}
			msg := nofit.Reason
			if !strings.HasPrefix(msg, tc.want) || !strings.HasSuffix(msg, tc.counted) {
				t.Errorf("error %q, want it to start %q and end %q", msg, tc.want, tc.counted)
			}
			if n := len(hostNamed.FindAllString(msg, -1)); n != tc.parts {
				t.Errorf("error %q names %d hosts, want %d", msg, n, tc.parts)
			}
		})
	}
}

// hostNamed matches a host named in a no-fit error.
var hostNamed = regexp.MustCompile(`h\d\d\b`)

// TestRunKeepsTheIndexCurrent: Run polls and sweeps on its own, and
// returns when its context ends.
func TestRunKeepsTheIndexCurrent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	mine, other, _ := newLedgers(t)
	if _, err := other.RegisterHost(ctx, "a", uniform(t, 1, 8, 1)); err != nil {
		t.Fatal(err)
	}
	ix := NewIndex(mine, Options{PollInterval: 10 * time.Millisecond, SweepInterval: time.Hour})
	done := make(chan error, 1)
	go func() { done <- ix.Run(ctx) }()
	c := &cloud{led: other}
	deadline := time.Now().Add(5 * time.Second)
	for entryFree(ix, "a") != 8 {
		if time.Now().After(deadline) {
			t.Fatal("Run made no first sweep")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := c.claim(ctx, "a", dedicated(t, 2, 1024)); err != nil {
		t.Fatal(err)
	}
	for entryFree(ix, "a") != 6 {
		if time.Now().After(deadline) {
			t.Fatal("Run's polls did not see the claim")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// TestCluster: on a three-master Redis Cluster, where hosts' keys and the
// change hints live in different slots, the index built and kept by one
// ledger chooses as Exhaustive does after another ledger's changes.
func TestCluster(t *testing.T) {
	cluster := testenv.StartRedisCluster(t, 3)
	open := func() *ledger.Ledger {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
		t.Cleanup(func() { _ = rdb.Close() })
		l, err := ledger.New(rdb, ledger.Options{KeyPrefix: "pf"})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	mine, other := open(), open()
	c := newCloud(t, other, 30, 5)
	ix := NewIndex(mine, Options{})
	chosen := compareChoosers(t, c, ix, mine, 100)
	c.mutate(t, chosen, 0)
	caughtUp(t, ix, mine)
	compareChoosers(t, c, ix, mine, 100)
}

// TestQueryBounds: on random hosts, partly used, a guest that fits pins
// no fewer pCPUs than the query's need and no more than its most (the
// order's and the stop's premises), and the cheap bounds never rule out
// a host it fits.
func TestQueryBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	checked := 0
	for i := range 5000 {
		h := randomHost(t, rng)
		for range rng.IntN(4) {
			// Some usage, so that cells and cores differ.
			if p, err := numa.Fit(h, randomRequest(t, rng)); err == nil {
				us, err := numa.Usage(h, p)
				if err != nil {
					t.Fatal(err)
				}
				if err := h.Add(us); err != nil {
					t.Fatal(err)
				}
			}
		}
		r := randomRequest(t, rng)
		q, err := newQuery(Request{UUID: "g", Request: r})
		if err != nil {
			t.Fatal(err)
		}
		p, err := numa.Fit(h, r)
		if err != nil {
			continue
		}
		checked++
		var rooms []room
		for i := range h.Cells {
			rooms = append(rooms, roomOf(&h.Cells[i]))
		}
		if q.cells > 0 && !q.roomFor(rooms) {
			t.Fatalf("case %d: %+v fits, but the bounds say the cells %+v have no room for %+v", i, *r, rooms, q.rooms)
		}
		threads := 1
		before := 0
		for _, c := range h.Cells {
			threads = max(threads, c.ThreadsPerCore())
			before += c.FreePCPUs().Len()
		}
		after := FreeAfter(h, p)
		if pinned := before - after; pinned < q.need || pinned > q.most(threads) {
			t.Fatalf("case %d: %+v pins %d pCPUs, want %d to %d", i, *r, pinned, q.need, q.most(threads))
		}
	}
	if checked < 1000 {
		t.Fatalf("only %d of 5000 random requests fit their host", checked)
	}
}
