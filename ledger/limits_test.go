package ledger

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/numa"
)

// smallHost is one cell with 4 shared CPUs (0-3), 8 pinnable pCPUs (4-11,
// SMT pairs), 4096 MiB of memory (3072 MiB of 4 KiB pages, 512 2 MiB
// pages of which 64 are reserved) and the given allocation ratios.
func smallHost(cpuRatio, ramRatio float64) *numa.Host {
	c := numa.Cell{ID: 0, CPUs: numa.Range(0, 3), PCPUs: numa.Range(4, 11), MemoryMB: 4096,
		Pages: []numa.PagePool{{SizeKB: 4, Total: 3072 * 256}, {SizeKB: 2048, Total: 512, Reserved: 64}}}
	for s := 0; s < 12; s += 2 {
		c.Siblings = append(c.Siblings, numa.Range(s, s+1))
	}
	return &numa.Host{Cells: []numa.Cell{c}, Limits: &numa.Limits{CPUAllocationRatio: cpuRatio, RAMAllocationRatio: ramRatio}}
}

// request is a request of vcpus and memoryMB under the given extra specs.
func request(t testing.TB, vcpus int, memoryMB int64, specs ...string) *numa.Request {
	t.Helper()
	m := map[string]string{}
	for i := 0; i+1 < len(specs); i += 2 {
		m[specs[i]] = specs[i+1]
	}
	r, err := numa.NewRequest(vcpus, memoryMB, m, nil)
	if err != nil {
		t.Fatalf("numa.NewRequest(%d, %d, %v): %v", vcpus, memoryMB, m, err)
	}
	return r
}

// ledgerOn is another process's Ledger on srv: its own client and cache.
func ledgerOn(t testing.TB, addr string, opts Options) *Ledger {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := New(rdb, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return l
}

// TestSharedLimitsAcrossProcesses is the reported bug: two processes,
// each with a cache that shows the cell empty, place a 3-vCPU / 3072 MiB
// shared guest on a cell of 4 shared CPUs and 4096 MiB with ratios 1.0.
// Only one of them may land: the claim script holds shared vCPUs and
// memory to the ratios whatever the caller's cache says.
func TestSharedLimitsAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	l1, _, srv := newLedger(t)
	l2 := ledgerOn(t, srv.Addr, Options{})
	register(t, l1, "h", smallHost(1.0, 1.0))
	// Both caches see the cell empty.
	for _, l := range []*Ledger{l1, l2} {
		if _, err := l.Host(ctx, "h"); err != nil {
			t.Fatal(err)
		}
	}
	guest := request(t, 3, 3072, "hw:numa_nodes", "1")
	if _, err := l1.Claim(ctx, spec("first", "h", guest)); err != nil {
		t.Fatalf("Claim(first): %v", err)
	}
	if _, err := numa.Fit(l2.cachedHost("h").host(), guest); err != nil {
		t.Fatalf("l2's cache refuses the guest already (%v): the test needs it stale", err)
	}
	_, err := l2.Claim(ctx, spec("second", "h", guest))
	var nofit *numa.NoFitError
	if !errors.As(err, &nofit) {
		t.Errorf("Claim(second) on a cell the first guest fills, from a stale cache = %v, want a *numa.NoFitError", err)
	}
	s := snapshot(t, l1, "h")
	if len(s.Claims) != 1 || s.Usage[0].SharedCPUs != 3 || s.Usage[0].MemoryMB != 3072 {
		t.Errorf("Snapshot after both claims: %d claims, usage %+v; want 1 claim, 3 shared vCPUs, 3072 MiB", len(s.Claims), s.Usage)
	}
}

// TestApplyHoldsEveryLimit sends claims that fit the caller's (wrong)
// view straight to a ledger whose host is already loaded, one limit at a
// time: each is refused by the script with the field it would take past
// its cap, and the next fit on fresh state reports no fit.
func TestApplyHoldsEveryLimit(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name         string
		cpu, ram     float64
		first, again *numa.Request
		field        string
	}{
		{"shared vCPUs over cpu ratio", 1.5, 4, request(t, 4, 256, "hw:numa_nodes", "1"), request(t, 3, 256, "hw:numa_nodes", "1"), "0:shared"},
		{"shared memory over ram ratio", 4, 0.5, request(t, 1, 1536, "hw:numa_nodes", "1"), request(t, 1, 1024, "hw:numa_nodes", "1"), "0:mem"},
		{"mixed memory over ram ratio", 4, 0.5,
			request(t, 2, 1536, "hw:cpu_policy", "mixed", "hw:cpu_dedicated_mask", "1"),
			request(t, 2, 1024, "hw:cpu_policy", "mixed", "hw:cpu_dedicated_mask", "1"), "0:mem"},
		{"mixed shared vCPUs over cpu ratio", 1, 4,
			request(t, 5, 256, "hw:cpu_policy", "mixed", "hw:cpu_dedicated_mask", "0"),
			request(t, 2, 256, "hw:cpu_policy", "mixed", "hw:cpu_dedicated_mask", "0"), "0:shared"},
		{"dedicated memory past the cell", 4, 4, request(t, 1, 3072, "hw:cpu_policy", "dedicated"), request(t, 1, 1536, "hw:cpu_policy", "dedicated"), "0:mem"},
		{"strict pages past the free ones", 4, 4,
			request(t, 1, 512, "hw:numa_nodes", "1", "hw:mem_page_size", "2048"),
			request(t, 1, 512, "hw:numa_nodes", "1", "hw:mem_page_size", "2048"), "0:pages:2048"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l1, _, srv := newLedger(t)
			l2 := ledgerOn(t, srv.Addr, Options{MaxAttempts: 1})
			register(t, l1, "h", smallHost(tc.cpu, tc.ram))
			if _, err := l2.Host(ctx, "h"); err != nil {
				t.Fatal(err)
			}
			// The first guest goes on the last pCPUs, which l2's fit, on a
			// cache that shows the cell empty, does not choose: the claim
			// must be refused for its counters, not for a taken pCPU.
			end := smallHost(tc.cpu, tc.ram)
			end.Cells[0].PinnedCPUs = numa.Range(4, 9)
			p, err := numa.Fit(end, tc.first)
			if err != nil {
				t.Fatal(err)
			}
			first := spec("first", "h", nil)
			first.Request, first.Placement = nil, p
			if _, err := l1.Claim(ctx, first); err != nil {
				t.Fatalf("Claim(first): %v", err)
			}
			// One attempt: the script's refusal itself is the answer.
			_, err = l2.Claim(ctx, spec("again", "h", tc.again))
			if !errors.Is(err, ErrConflict) || !strings.Contains(fmt.Sprint(err), describeField(tc.field)) {
				t.Errorf("Claim(again) past %s on a stale cache = %v, want ErrConflict naming %s", tc.field, err, describeField(tc.field))
			}
			l3 := ledgerOn(t, srv.Addr, Options{})
			var nofit *numa.NoFitError
			if _, err := l3.Claim(ctx, spec("again", "h", tc.again)); !errors.As(err, &nofit) {
				t.Errorf("Claim(again) on fresh state = %v, want a *numa.NoFitError", err)
			}
			snapshot(t, l1, "h")
		})
	}
}

// TestExplicitPlacementHeldToLimits claims an explicit placement that
// would take shared vCPUs past the cpu ratio: refused, nothing changed.
func TestExplicitPlacementHeldToLimits(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h", smallHost(1, 1))
	guest := request(t, 3, 1024, "hw:numa_nodes", "1")
	first, err := l.Claim(ctx, spec("first", "h", guest))
	if err != nil {
		t.Fatal(err)
	}
	s := spec("second", "h", nil)
	s.Request, s.Placement = nil, first.Placement
	if _, err := l.Claim(ctx, s); !errors.Is(err, ErrConflict) {
		t.Errorf("Claim(second) of the first's shared placement again on a cell of 4 shared CPUs at ratio 1 = %v, want ErrConflict", err)
	}
	if got := snapshot(t, l, "h"); len(got.Claims) != 1 {
		t.Errorf("Snapshot: %d claims, want 1", len(got.Claims))
	}
}

// TestLimitsHoldUnderRace has three Ledgers (three processes: their own
// clients and caches) race claims and releases of shared, mixed and
// dedicated guests on two small hosts with allocation ratios set, while a
// sampler reads each host's usage at many instants: no counter ever
// exceeds its limit, and every snapshot verifies.
func TestLimitsHoldUnderRace(t *testing.T) {
	ctx := context.Background()
	l0, _, srv := newLedger(t)
	ledgers := []*Ledger{l0, ledgerOn(t, srv.Addr, Options{}), ledgerOn(t, srv.Addr, Options{})}
	// a: every kind of guest, shared vCPUs overcommitted 1.5 times and
	// memory not at all. b: shared and mixed guests only, memory held to
	// half the cell.
	hosts := map[string]*numa.Host{"a": smallHost(1.5, 1.0), "b": smallHost(2.0, 0.5)}
	for name, h := range hosts {
		register(t, l0, name, h)
	}
	shared := []*numa.Request{
		request(t, 1, 512, "hw:numa_nodes", "1"),
		request(t, 2, 1024, "hw:numa_nodes", "1"),
		request(t, 3, 768, "hw:numa_nodes", "1"),
		request(t, 3, 768, "hw:cpu_policy", "mixed", "hw:cpu_dedicated_mask", "0"),
		request(t, 2, 1024, "hw:cpu_policy", "mixed", "hw:cpu_dedicated_mask", "1"),
		request(t, 1, 256, "hw:numa_nodes", "1", "hw:mem_page_size", "2048"),
	}
	all := append([]*numa.Request{
		request(t, 2, 1024, "hw:cpu_policy", "dedicated"),
		request(t, 1, 512, "hw:cpu_policy", "dedicated", "hw:mem_page_size", "2048"),
	}, shared...)
	guests := map[string][]*numa.Request{"a": all, "b": shared}

	// The race runs until it has exercised the limits, however fast the
	// machine: enough claims landed and a sample saw a cell at a limit.
	wantClaims := int64(100)
	if testing.Short() {
		wantClaims = 20
	}
	var claimed, refused, samples, nearFull atomic.Int64
	enough := func() bool { return claimed.Load() >= wantClaims && nearFull.Load() > 0 }
	stop := make(chan struct{})
	var workers sync.WaitGroup
	for w := range 24 {
		l := ledgers[w%len(ledgers)]
		host := []string{"a", "b"}[w/len(ledgers)%2]
		workers.Add(1)
		go func() {
			defer workers.Done()
			var held []string
			for i := 0; !enough(); i++ {
				select {
				case <-stop:
					return
				default:
				}
				reqs := guests[host]
				s := spec(fmt.Sprintf("w%d-%d", w, i), host, reqs[(w+i)%len(reqs)])
				_, err := l.Claim(ctx, s)
				var nf *numa.NoFitError
				switch {
				case err == nil:
					claimed.Add(1)
					held = append(held, s.ID)
				case errors.As(err, &nf), errors.Is(err, ErrConflict):
					refused.Add(1)
				default:
					t.Errorf("Claim(%s): %v", s.ID, err)
					return
				}
				// Hold up to two guests, so the cells stay near full.
				for len(held) > 2 || (len(held) > 0 && i%4 == 3) {
					if err := l.Release(ctx, host, held[0]); err != nil {
						t.Errorf("Release(%s): %v", held[0], err)
						return
					}
					held = held[1:]
				}
			}
		}()
	}
	var sampler sync.WaitGroup
	for name, h := range hosts {
		sampler.Add(1)
		go func() {
			defer sampler.Done()
			c := h.Cells[0]
			sharedCap := int64(math.Floor(float64(c.CPUs.Len()) * h.Limits.CPUAllocationRatio))
			memCap := min(c.MemoryMB, int64(math.Floor(float64(c.MemoryMB)*h.Limits.RAMAllocationRatio)))
			pageCap := c.Pages[1].Total - c.Pages[1].Reserved
			for {
				select {
				case <-stop:
					return
				default:
				}
				s, err := l0.Snapshot(ctx, name)
				if err != nil {
					t.Errorf("Snapshot(%s): %v", name, err)
					return
				}
				if err := s.Verify(); err != nil {
					t.Errorf("Snapshot(%s) %d: %v", name, samples.Load(), err)
					return
				}
				samples.Add(1)
				for _, u := range s.Usage {
					if u.SharedCPUs > sharedCap || u.MemoryMB > memCap || u.Pages[2048] > pageCap {
						t.Errorf("host %s cell %d: %d shared vCPUs (limit %d), %d MiB (limit %d), %d 2 MiB pages (limit %d); claims %d",
							name, u.Cell, u.SharedCPUs, sharedCap, u.MemoryMB, memCap, u.Pages[2048], pageCap, len(s.Claims))
						return
					}
					if u.SharedCPUs == sharedCap || u.MemoryMB > memCap*3/4 {
						nearFull.Add(1)
					}
				}
			}
		}()
	}
	// Only a hang reaches this deadline.
	hang := time.AfterFunc(2*time.Minute, func() { close(stop) })
	workers.Wait()
	if hang.Stop() {
		close(stop)
	}
	sampler.Wait()
	t.Logf("%d claims landed, %d refused; %d samples, %d near a limit", claimed.Load(), refused.Load(), samples.Load(), nearFull.Load())
	if !enough() {
		t.Errorf("%d claims landed and %d of %d samples were near a limit: the limits were not exercised", claimed.Load(), nearFull.Load(), samples.Load())
	}
}
