package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/pinflow/pinflow/numa"
)

// reservedHost is smallHost(2, 1.5) with 512 MiB reserved for the host:
// its guests may take 4096×1.5−512 = 5632 MiB and 4×2 = 8 shared vCPUs
// together.
func reservedHost() *numa.Host {
	h := smallHost(2, 1.5)
	h.Limits.ReservedHostMemoryMB = 512
	return h
}

// wantHostUsage checks a snapshot's host-level usage.
func wantHostUsage(t *testing.T, s *Snapshot, want numa.HostUsage, why string) {
	t.Helper()
	if s.HostUsage != want {
		t.Errorf("host %s: host usage %+v, want %+v: %s", s.Host, s.HostUsage, want, why)
	}
}

// TestHostLevelLimits claims guests without a NUMA topology, which take no
// cell's resources, and pinned guests on one host: both take their memory
// of the host as a whole, so together they never exceed its limits.
func TestHostLevelLimits(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h", reservedHost())
	floating := request(t, 2, 2048)
	var nf *numa.NoFitError
	if _, err := l.Claim(ctx, spec("huge", "h", request(t, 2, 1<<30))); !errors.As(err, &nf) {
		t.Errorf("Claim(huge) of 1 TiB without a NUMA topology on a 4 GiB host = %v, want a *numa.NoFitError", err)
	}
	for _, id := range []string{"f1", "f2"} {
		if _, err := l.Claim(ctx, spec(id, "h", floating)); err != nil {
			t.Fatalf("Claim(%s) of 2 vCPUs and 2048 MiB: %v", id, err)
		}
	}
	if _, err := l.Claim(ctx, spec("f3", "h", floating)); !errors.As(err, &nf) {
		t.Errorf("Claim(f3): a third 2048 MiB past the host's 5632 MiB = %v, want a *numa.NoFitError", err)
	}
	wantHostUsage(t, snapshot(t, l, "h"), numa.HostUsage{MemoryMB: 4096, VCPUs: 4}, "two floating guests of 2 vCPUs and 2048 MiB")

	// The cell itself has all its memory free: only the host's limit
	// stops the second pinned guest.
	pinned := dedicated(t, 2, 1024)
	if _, err := l.Claim(ctx, spec("p1", "h", pinned)); err != nil {
		t.Fatalf("Claim(p1) of 2 pinned vCPUs and 1024 MiB: %v", err)
	}
	if _, err := l.Claim(ctx, spec("p2", "h", pinned)); !errors.As(err, &nf) {
		t.Errorf("Claim(p2): 1024 MiB more past the host's 5632 MiB = %v, want a *numa.NoFitError", err)
	}
	s := snapshot(t, l, "h")
	wantHostUsage(t, s, numa.HostUsage{MemoryMB: 5120, VCPUs: 4}, "pinned vCPUs take pCPUs, not shared vCPUs")

	// An explicit placement is held to the host's limits too.
	var f1 *Claim
	for i := range s.Claims {
		if s.Claims[i].ID == "f1" {
			f1 = &s.Claims[i]
		}
	}
	again := spec("f1-again", "h", nil)
	again.Request, again.Placement = nil, f1.Placement
	if _, err := l.Claim(ctx, again); !errors.Is(err, ErrConflict) {
		t.Errorf("Claim(f1-again) of f1's placement, 2048 MiB past the host's limit = %v, want ErrConflict", err)
	}
	if err := l.Release(ctx, "h", "f1"); err != nil {
		t.Fatal(err)
	}
	wantHostUsage(t, snapshot(t, l, "h"), numa.HostUsage{MemoryMB: 3072, VCPUs: 2}, "f1 released")
}

// TestHostLevelLimitsUnderRace has three Ledgers (three processes, each
// with its own cache) claim floating, shared and pinned guests onto one
// host all at once, far more than it holds: every landed claim is within
// the host's limits, the cell's and the host's, and the host ends full.
func TestHostLevelLimitsUnderRace(t *testing.T) {
	ctx := context.Background()
	l0, _, srv := newLedger(t)
	ledgers := []*Ledger{l0, ledgerOn(t, srv.Addr, Options{}), ledgerOn(t, srv.Addr, Options{})}
	register(t, l0, "h", reservedHost())
	guests := []*numa.Request{
		request(t, 1, 256),
		request(t, 2, 512),
		request(t, 1, 256, "hw:numa_nodes", "1"),
		dedicated(t, 1, 256),
	}
	// Warm every cache while the host is empty, so the claims race on
	// views that go stale.
	for _, l := range ledgers {
		if _, err := l.Host(ctx, "h"); err != nil {
			t.Fatal(err)
		}
	}
	const n = 64
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := ledgers[i%len(ledgers)].Claim(ctx, spec(fmt.Sprintf("g%d", i), "h", guests[i%len(guests)]))
			var nf *numa.NoFitError
			if err != nil && !errors.As(err, &nf) && !errors.Is(err, ErrConflict) {
				errs <- fmt.Errorf("Claim(g%d): %w", i, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	s := snapshot(t, l0, "h") // Verify holds the host-level counters to the limits
	var want numa.HostUsage
	for _, c := range s.Claims {
		want.MemoryMB += c.HostUsage.MemoryMB
		want.VCPUs += c.HostUsage.VCPUs
	}
	wantHostUsage(t, s, want, "the sum of the claims'")
	if s.HostUsage.MemoryMB > 5632 || s.HostUsage.VCPUs > 8 {
		t.Errorf("host usage %+v is past the limits of 5632 MiB and 8 shared vCPUs", s.HostUsage)
	}
	// 64 guests of at least 256 MiB want 4 times the host: it must be
	// full, so the limits were what stopped them.
	if s.HostUsage.MemoryMB+256 <= 5632 && s.HostUsage.VCPUs+1 <= 8 {
		t.Errorf("host usage %+v leaves room for another guest after 64 claims: the limits were not reached", s.HostUsage)
	}
	t.Logf("%d of %d claims landed: %+v", len(s.Claims), n, s.HostUsage)
}

// TestHostLevelUsageThroughResize resizes a guest without a NUMA topology
// to another host as a cold migration does: the destination claim and the
// source hold each count on their own host until the resize is confirmed
// (the hold released) or reverted (the destination released, the hold
// resident again).
func TestHostLevelUsageThroughResize(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "src", reservedHost())
	register(t, l, "dst", reservedHost())
	for _, outcome := range []string{"confirm", "revert"} {
		boot := spec("boot-"+outcome, "src", request(t, 2, 2048))
		if _, err := l.Claim(ctx, boot); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Commit(ctx, "src", boot.ID); err != nil {
			t.Fatal(err)
		}
		dest := spec("resize-"+outcome, "dst", request(t, 4, 3072))
		dest.Kind = KindResizeDest
		if _, err := l.Claim(ctx, dest); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Hold(ctx, "src", boot.ID); err != nil {
			t.Fatal(err)
		}
		wantHostUsage(t, snapshot(t, l, "src"), numa.HostUsage{MemoryMB: 2048, VCPUs: 2}, outcome+": the source hold keeps the old flavor")
		wantHostUsage(t, snapshot(t, l, "dst"), numa.HostUsage{MemoryMB: 3072, VCPUs: 4}, outcome+": the destination claims the new flavor")
		var err error
		if outcome == "confirm" {
			if err = l.Release(ctx, "src", boot.ID); err == nil {
				_, err = l.Commit(ctx, "dst", dest.ID)
			}
			wantAfter := map[string]numa.HostUsage{"src": {}, "dst": {MemoryMB: 3072, VCPUs: 4}}
			for h, want := range wantAfter {
				wantHostUsage(t, snapshot(t, l, h), want, "confirmed")
			}
			if err == nil {
				err = l.Release(ctx, "dst", dest.ID)
			}
		} else {
			if err = l.Release(ctx, "dst", dest.ID); err == nil {
				_, err = l.Unhold(ctx, "src", boot.ID)
			}
			wantAfter := map[string]numa.HostUsage{"src": {MemoryMB: 2048, VCPUs: 2}, "dst": {}}
			for h, want := range wantAfter {
				wantHostUsage(t, snapshot(t, l, h), want, "reverted")
			}
			if err == nil {
				err = l.Release(ctx, "src", boot.ID)
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", outcome, err)
		}
	}
}
