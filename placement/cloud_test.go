package placement

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// newLedgers starts a redis-server and returns two ledgers on it, as two
// workers would have, and a client for the test's own commands.
func newLedgers(t testing.TB) (*ledger.Ledger, *ledger.Ledger, *redis.Client) {
	t.Helper()
	srv := testenv.StartRedis(t)
	return ledgerOn(t, srv.Addr), ledgerOn(t, srv.Addr), client(t, srv.Addr)
}

func client(t testing.TB, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func ledgerOn(t testing.TB, addr string) *ledger.Ledger {
	t.Helper()
	l, err := ledger.New(client(t, addr), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// randomHost is a host of 1 to 4 cells of 2 to 10 cores, with or without
// SMT, huge pages, a cpu_shared_set, allocation ratios and cell packing.
func randomHost(t testing.TB, rng *rand.Rand) *numa.Host {
	t.Helper()
	s := numa.UniformSpec{Cells: 1 + rng.IntN(4), Cores: 2 + rng.IntN(9), Threads: 1 + rng.IntN(2),
		MemoryMB: int64(4096 * (1 + rng.IntN(4)))}
	if rng.IntN(2) == 0 {
		s.HugePages = map[int64]int64{2048: int64(256 * rng.IntN(5))}
		if rng.IntN(3) == 0 {
			s.HugePages[1048576] = 1
		}
	}
	if rng.IntN(3) == 0 {
		// The first core of each cell runs shared vCPUs, the rest are
		// pinnable.
		per := s.Cores * s.Threads
		for c := range s.Cells {
			s.Shared = s.Shared.Union(numa.Range(c*per, c*per+s.Threads-1))
			s.Dedicated = s.Dedicated.Union(numa.Range(c*per+s.Threads, (c+1)*per-1))
		}
	}
	h, err := numa.Uniform(s)
	if err != nil {
		t.Fatalf("Uniform(%+v): %v", s, err)
	}
	if rng.IntN(3) == 0 {
		h.Limits = &numa.Limits{CPUAllocationRatio: 2, RAMAllocationRatio: 1.5}
	}
	h.PackCells = rng.IntN(4) == 0
	return h
}

// randomRequest is a dedicated, mixed, shared or NUMA-less guest, with
// thread and emulator policies, page sizes and guest cells drawn at
// random; one Nova refuses is drawn again.
func randomRequest(t testing.TB, rng *rand.Rand) *numa.Request {
	for {
		vcpus := 1 + rng.IntN(8)
		mem := int64(1024 * (1 + rng.IntN(6)))
		specs := map[string]string{}
		switch rng.IntN(5) {
		case 0, 1:
			specs["hw:cpu_policy"] = "dedicated"
		case 2:
			specs["hw:cpu_policy"] = "mixed"
			vcpus = max(vcpus, 2)
			specs["hw:cpu_dedicated_mask"] = "^0"
		case 3:
			specs["hw:cpu_policy"] = "shared"
			specs["hw:numa_nodes"] = "1"
		}
		if p := specs["hw:cpu_policy"]; p == "dedicated" || p == "mixed" {
			specs["hw:cpu_thread_policy"] = []string{"prefer", "isolate", "require", "prefer"}[rng.IntN(4)]
			if rng.IntN(4) == 0 {
				specs["hw:emulator_threads_policy"] = "isolate"
			}
		}
		if specs["hw:cpu_policy"] != "" {
			if rng.IntN(3) == 0 && vcpus%2 == 0 && mem%2048 == 0 {
				specs["hw:numa_nodes"] = "2"
			}
			if rng.IntN(3) == 0 {
				specs["hw:mem_page_size"] = []string{"small", "large", "2048", "any", "1048576"}[rng.IntN(5)]
			}
		}
		// NewRequest's only errors are the combinations Nova refuses.
		if req, err := numa.NewRequest(vcpus, mem, specs, nil); err == nil {
			return req
		}
	}
}

// cloud is a ledger's hosts, filled and marked at random.
type cloud struct {
	led   *ledger.Ledger
	rng   *rand.Rand
	hosts []string
	n     atomic.Int64 // claims made, for their ids

	mu   sync.Mutex
	made [][2]string // host and id of each claim made
}

// fill claims random guests on a host until about fraction of its
// pinnable CPUs are taken, or guests keep not fitting.
func (c *cloud) fill(t testing.TB, host string, fraction float64, seed uint64) error {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 7))
	for misses := 0; misses < 4; {
		h, err := c.led.Host(ctx, host)
		if err != nil {
			return err
		}
		free, total := 0, 0
		for _, cell := range h.Cells {
			free += cell.FreePCPUs().Len()
			total += cell.PCPUs.Len()
		}
		if float64(total-free) >= fraction*float64(total) {
			return nil
		}
		_, err = c.claim(ctx, host, randomRequest(t, rng))
		var nofit *numa.NoFitError
		switch {
		case errors.As(err, &nofit):
			misses++
		case errors.Is(err, ledger.ErrHostDown):
			return nil
		case err != nil:
			return err
		}
	}
	return nil
}

func (c *cloud) claim(ctx context.Context, host string, req *numa.Request) (*ledger.Claim, error) {
	id := "c" + strconv.FormatInt(c.n.Add(1), 10)
	cl, err := c.led.Claim(ctx, ledger.ClaimSpec{ID: id, Host: host, InstanceUUID: "u-" + id, Kind: ledger.KindBoot,
		OwnerWorkflowID: "instance-u-" + id, OwnerRunID: "run-1", Request: req})
	if err == nil {
		c.mu.Lock()
		c.made = append(c.made, [2]string{host, id})
		c.mu.Unlock()
	}
	return cl, err
}

// newCloud registers n random hosts, fills them to random fractions and
// marks about a tenth of them down or returning.
func newCloud(t testing.TB, led *ledger.Ledger, n int, seed uint64) *cloud {
	t.Helper()
	ctx := context.Background()
	c := &cloud{led: led, rng: rand.New(rand.NewPCG(seed, 1))}
	for i := range n {
		name := fmt.Sprintf("h%03d", i)
		if _, err := led.RegisterHost(ctx, name, randomHost(t, c.rng)); err != nil {
			t.Fatal(err)
		}
		c.hosts = append(c.hosts, name)
	}
	var wg sync.WaitGroup
	for i, h := range c.hosts {
		fraction := c.rng.Float64()
		wg.Go(func() {
			if err := c.fill(t, h, fraction, seed+uint64(i)); err != nil {
				t.Errorf("filling %s: %v", h, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, h := range c.hosts {
		c.mark(t, h)
	}
	return c
}

// mark sets a host down or returning one time in ten, up otherwise.
func (c *cloud) mark(t testing.TB, h string) {
	t.Helper()
	ctx := context.Background()
	st, err := c.led.HostStatus(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	want := ledger.HostUp
	switch c.rng.IntN(20) {
	case 0:
		want = ledger.HostDown
	case 1:
		want = ledger.HostReturning
	}
	if st.State == want {
		return
	}
	// Up is reached through returning, returning through down.
	if st.State == ledger.HostUp || want == ledger.HostDown {
		if _, err := c.led.SetHostDown(ctx, h, "test"); err != nil {
			t.Fatal(err)
		}
	}
	if want == ledger.HostDown {
		return
	}
	if _, err := c.led.SetHostReturning(ctx, h); err != nil {
		t.Fatal(err)
	}
	if want == ledger.HostUp {
		if _, err := c.led.SetHostUp(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
}

// randomPlacement is a request with a few excluded hosts now and then.
func (c *cloud) randomPlacement(t testing.TB, i int) Request {
	r := Request{UUID: fmt.Sprintf("guest-%d", i), Request: randomRequest(t, c.rng)}
	for range c.rng.IntN(3) {
		r.Exclude = append(r.Exclude, c.hosts[c.rng.IntN(len(c.hosts))])
	}
	return r
}

// outcome is a choice or its error, to compare two choosers by.
func outcome(host string, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return "host " + host
}

// caughtUp polls ix until it holds every host at the version the ledger
// has, and fails the test if that takes more than a few seconds.
func caughtUp(t testing.TB, ix *Index, led *ledger.Ledger) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := ix.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		stale, err := staleHosts(ix, led)
		if err != nil {
			t.Fatal(err)
		}
		if len(stale) == 0 {
			if err := ix.check(); err != nil {
				t.Fatal(err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 5s of polls the index is stale on %v", stale)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// staleHosts lists the hosts the index holds at another version than the
// ledger's, or holds and the ledger does not, or lacks.
func staleHosts(ix *Index, led *ledger.Ledger) ([]string, error) {
	ctx := context.Background()
	names, err := led.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	vers, err := led.HostVersions(ctx, names)
	if err != nil {
		return nil, err
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var stale []string
	seen := map[string]bool{}
	for i, n := range names {
		seen[n] = true
		e := ix.entries[n]
		if (e == nil) != (vers[i].Gen == 0) || e != nil && e.ver != vers[i] {
			stale = append(stale, n)
		}
	}
	for n := range ix.entries {
		if !seen[n] {
			stale = append(stale, n)
		}
	}
	return stale, nil
}

// check says what is wrong with the index's lists: each entry once in
// the list of its free pCPUs, in name order, and in the names.
func (ix *Index) check() error {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	listed := 0
	for free, l := range ix.byFree {
		for i, e := range l {
			if ix.entries[e.name] != e || e.free != free || i > 0 && l[i-1].name >= e.name {
				return fmt.Errorf("index: %s listed among %d free, at %d of %d: out of place", e.name, free, i, len(l))
			}
		}
		listed += len(l)
	}
	names := slices.Sorted(maps.Keys(ix.entries))
	if listed != len(ix.entries) || !slices.Equal(names, ix.names) {
		return fmt.Errorf("index: %d hosts listed by free pCPUs and names %v, for entries %v", listed, ix.names, names)
	}
	return nil
}
