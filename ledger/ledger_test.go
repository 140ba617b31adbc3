package ledger

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/numa"
)

// testHost is a host of cells cells with cpus pinnable pCPUs each (SMT
// pairs), 8 GiB per cell in 4 KiB pages plus 512 2 MiB pages.
func testHost(cells, cpus int) *numa.Host {
	h := &numa.Host{}
	for i := range cells {
		lo := i * cpus
		c := numa.Cell{ID: i, PCPUs: numa.Range(lo, lo+cpus-1), MemoryMB: 8192, Socket: i,
			Pages: []numa.PagePool{{SizeKB: 4, Total: 8192 * 256}, {SizeKB: 2048, Total: 512}}}
		for s := lo; s < lo+cpus; s += 2 {
			c.Siblings = append(c.Siblings, numa.Range(s, min(s+1, lo+cpus-1)))
		}
		h.Cells = append(h.Cells, c)
	}
	return h
}

// dedicated is a request for vcpus pinned vCPUs and memoryMB in one cell,
// with extra specs added.
func dedicated(t testing.TB, vcpus int, memoryMB int64, extra ...string) *numa.Request {
	t.Helper()
	specs := map[string]string{"hw:cpu_policy": "dedicated"}
	for i := 0; i+1 < len(extra); i += 2 {
		specs[extra[i]] = extra[i+1]
	}
	r, err := numa.NewRequest(vcpus, memoryMB, specs, nil)
	if err != nil {
		t.Fatalf("numa.NewRequest(%d, %d, %v): %v", vcpus, memoryMB, specs, err)
	}
	return r
}

func newLedger(t testing.TB, opts ...testenv.RedisOption) (*Ledger, *redis.Client, *testenv.Redis) {
	t.Helper()
	srv := testenv.StartRedis(t, opts...)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 128})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := New(rdb, Options{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return l, rdb, srv
}

func register(t testing.TB, l *Ledger, name string, h *numa.Host) int64 {
	t.Helper()
	gen, err := l.RegisterHost(context.Background(), name, h)
	if err != nil {
		t.Fatalf("RegisterHost(%s): %v", name, err)
	}
	return gen
}

func spec(id, host string, r *numa.Request) ClaimSpec {
	return ClaimSpec{ID: id, Host: host, InstanceUUID: "inst-" + id, Kind: KindBoot,
		OwnerWorkflowID: "instance-inst-" + id, OwnerRunID: "run-1", Request: r}
}

func snapshot(t testing.TB, l *Ledger, host string) *Snapshot {
	t.Helper()
	s, err := l.Snapshot(context.Background(), host)
	if err != nil {
		t.Fatalf("Snapshot(%s): %v", host, err)
	}
	if err := s.Verify(); err != nil {
		t.Fatalf("Snapshot(%s).Verify: %v", host, err)
	}
	return s
}

// cpuSetCmp compares CPUSets by their members.
var cpuSetCmp = cmp.Comparer(func(a, b numa.CPUSet) bool { return a.Equal(b) })

func TestClaimCommitRelease(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	if gen := register(t, l, "h1", testHost(2, 8)); gen != 1 {
		t.Errorf("RegisterHost(h1) generation = %d, want 1", gen)
	}
	c, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 4, 1024, "hw:mem_page_size", "2048")))
	if err != nil {
		t.Fatalf("Claim(c1): %v", err)
	}
	if c.State != StatePending || len(c.Token) != 32 || c.Generation != 1 {
		t.Errorf("Claim(c1) = state %q token %q generation %d, want pending, 32 hex digits, 1", c.State, c.Token, c.Generation)
	}
	wantUsage := []numa.CellUsage{{Cell: 0, PinnedCPUs: numa.MustParse("0-3"), MemoryMB: 1024, PageSizeKB: 2048, Pages: 512, Dedicated: true, StrictPages: true}}
	if diff := cmp.Diff(wantUsage, c.Usage, cpuSetCmp); diff != "" {
		t.Errorf("Claim(c1) usage (-want +got):\n%s", diff)
	}

	s := snapshot(t, l, "h1")
	wantPins := []Pin{}
	for cpu := range 4 {
		wantPins = append(wantPins, Pin{CPU: cpu, Cell: 0, ClaimID: "c1", InstanceUUID: "inst-c1", State: StatePending})
	}
	if diff := cmp.Diff(wantPins, s.Pins); diff != "" {
		t.Errorf("Snapshot pins (-want +got):\n%s", diff)
	}
	wantLoad := []CellLoad{{Cell: 0, MemoryMB: 1024, Pages: map[int64]int64{2048: 512}}}
	if diff := cmp.Diff(wantLoad, s.Usage); diff != "" {
		t.Errorf("Snapshot usage (-want +got):\n%s", diff)
	}
	if got := s.Topology.Cell(0).PinnedCPUs; !got.Equal(numa.MustParse("0-3")) {
		t.Errorf("Snapshot topology cell 0 pinned = %s, want 0-3", got)
	}

	// The host as fitting elsewhere sees it.
	h, err := l.Host(ctx, "h1")
	if err != nil {
		t.Fatalf("Host(h1): %v", err)
	}
	if got := h.Cell(0).FreePCPUs(); !got.Equal(numa.MustParse("4-7")) {
		t.Errorf("Host(h1) cell 0 free pCPUs = %s, want 4-7", got)
	}

	committed, err := l.Commit(ctx, "h1", "c1")
	if err != nil {
		t.Fatalf("Commit(c1): %v", err)
	}
	if committed.State != StateCommitted || committed.CommittedAt == nil {
		t.Errorf("Commit(c1) = state %q committed_at %v, want committed with a time", committed.State, committed.CommittedAt)
	}
	again, err := l.Commit(ctx, "h1", "c1")
	if err != nil {
		t.Fatalf("Commit(c1) again: %v", err)
	}
	if diff := cmp.Diff(committed, again, cpuSetCmp, cmpopts.IgnoreUnexported(numa.CPUSet{})); diff != "" {
		t.Errorf("Commit(c1) again changed the claim (-first +second):\n%s", diff)
	}
	got, err := l.GetClaim(ctx, "h1", "c1")
	if err != nil {
		t.Fatalf("GetClaim(c1): %v", err)
	}
	if got.State != StateCommitted || got.Placement.String() != c.Placement.String() {
		t.Errorf("GetClaim(c1) = %q %s, want committed %s", got.State, got.Placement, c.Placement)
	}
	if _, err := l.Commit(ctx, "h1", "nope"); !errors.Is(err, ErrUnknownClaim) {
		t.Errorf("Commit(nope) error = %v, want ErrUnknownClaim", err)
	}

	if err := l.Release(ctx, "h1", "c1"); err != nil {
		t.Fatalf("Release(c1): %v", err)
	}
	s = snapshot(t, l, "h1")
	if len(s.Pins) != 0 || len(s.Usage) != 0 || len(s.Claims) != 0 {
		t.Errorf("Snapshot after Release = pins %v usage %v claims %v, want all empty", s.Pins, s.Usage, s.Claims)
	}
	hosts, err := l.Hosts(ctx)
	if err != nil || !cmp.Equal(hosts, []string{"h1"}) {
		t.Errorf("Hosts() = %v, %v; want [h1]", hosts, err)
	}
}

func TestClaimSharedGuestCountsSharedCPUs(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	h := testHost(1, 4)
	h.Cells[0].CPUs = numa.MustParse("4-7")
	h.Cells[0].Siblings = nil
	register(t, l, "h1", h)
	r, err := numa.NewRequest(3, 512, map[string]string{"hw:numa_nodes": "1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, spec("s1", "h1", r)); err != nil {
		t.Fatalf("Claim(s1): %v", err)
	}
	s := snapshot(t, l, "h1")
	want := []CellLoad{{Cell: 0, MemoryMB: 512, SharedCPUs: 3, Pages: map[int64]int64{4: 512 * 256}}}
	if diff := cmp.Diff(want, s.Usage); diff != "" {
		t.Errorf("Snapshot usage of a shared guest (-want +got):\n%s", diff)
	}
	if err := l.Release(ctx, "h1", "s1"); err != nil {
		t.Fatal(err)
	}
	if s := snapshot(t, l, "h1"); len(s.Usage) != 0 {
		t.Errorf("Snapshot usage after release = %v, want none", s.Usage)
	}
}

func TestClaimNoFit(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(1, 4))
	before := snapshot(t, l, "h1")
	_, err := l.Claim(ctx, spec("big", "h1", dedicated(t, 6, 1024)))
	var nofit *numa.NoFitError
	if !errors.As(err, &nofit) {
		t.Fatalf("Claim(6 pCPUs on 4) error = %v, want a *numa.NoFitError", err)
	}
	if diff := cmp.Diff(before, snapshot(t, l, "h1"), cpuSetCmp, cmpopts.IgnoreUnexported(numa.CPUSet{})); diff != "" {
		t.Errorf("Claim without fit changed the ledger (-before +after):\n%s", diff)
	}
}

// TestClaimFillsHost claims until nothing fits: the pCPUs, memory and
// pages the scripts check are those Fit computes, so the host fills up
// exactly.
func TestClaimFillsHost(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 8))
	n := 0
	for ; ; n++ {
		_, err := l.Claim(ctx, spec(fmt.Sprintf("c%d", n), "h1", dedicated(t, 2, 384, "hw:mem_page_size", "2048")))
		var nofit *numa.NoFitError
		if errors.As(err, &nofit) {
			break
		}
		if err != nil {
			t.Fatalf("Claim(c%d): %v", n, err)
		}
	}
	// 512 2 MiB pages per cell hold 2 guests of 384 MiB, before the 8
	// pCPUs (4 guests of 2) run out: 4 guests on 2 cells.
	if n != 4 {
		t.Errorf("claims of 2 pCPUs and 384 MiB in 2 MiB pages on 2 cells of 8 pCPUs and 512 pages: %d fit, want 4", n)
	}
	snapshot(t, l, "h1")
}

func itoa(n int) string { return fmt.Sprint(n) }
