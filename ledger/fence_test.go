package ledger

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestFenceGuardsAuditRelease checks the fence's promise: while a lease
// runs the audit's compare-and-delete keeps the claim, and a step whose
// claim is gone, or was made again, is refused.
func TestFenceGuardsAuditRelease(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 8))
	c, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatalf("Claim(c1): %v", err)
	}
	until, err := l.Fence(ctx, "h1", "c1", c.Token, 300*time.Millisecond)
	if err != nil {
		t.Fatalf("Fence(c1): %v", err)
	}
	if !until.After(time.Now().Add(-time.Minute)) {
		t.Errorf("Fence(c1) lease ends %v, want about now+300ms", until)
	}
	before := snapshot(t, l, "h1")
	if ok, err := l.ReleaseIfUnchanged(ctx, "h1", "c1", c.Token, StatePending); err != nil || ok {
		t.Fatalf("ReleaseIfUnchanged(c1) under a lease = %v, %v; want false, nil", ok, err)
	}
	if diff := cmp.Diff(before, snapshot(t, l, "h1"), snapOpts...); diff != "" {
		t.Errorf("ReleaseIfUnchanged under a lease changed the ledger (-before +after):\n%s", diff)
	}
	// The lease runs out: the claim is judged like any other.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := l.ReleaseIfUnchanged(ctx, "h1", "c1", c.Token, StatePending)
		if err != nil {
			t.Fatalf("ReleaseIfUnchanged(c1): %v", err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ReleaseIfUnchanged(c1) still refused 10s after a 300ms lease")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := l.Fence(ctx, "h1", "c1", c.Token, time.Second); !errors.Is(err, ErrUnknownClaim) {
		t.Errorf("Fence(c1) after its release error = %v, want ErrUnknownClaim", err)
	}
	again, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatalf("Claim(c1) again: %v", err)
	}
	if _, err := l.Fence(ctx, "h1", "c1", c.Token, time.Second); !errors.Is(err, ErrConflict) {
		t.Errorf("Fence(c1) with the first claim's token error = %v, want ErrConflict", err)
	}
	if _, err := l.Fence(ctx, "h1", "c1", "", time.Second); !errors.Is(err, ErrInvalid) {
		t.Errorf("Fence(c1) with no token error = %v, want ErrInvalid", err)
	}
	if _, err := l.Fence(ctx, "h1", "c1", again.Token, time.Second); err != nil {
		t.Errorf("Fence(c1) made again, its own token: %v", err)
	}
	// A plain release ends the lease with the claim: the next claim of the
	// same id starts without one.
	if err := l.Release(ctx, "h1", "c1"); err != nil {
		t.Fatalf("Release(c1): %v", err)
	}
	third, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatalf("Claim(c1) a third time: %v", err)
	}
	if ok, err := l.ReleaseIfUnchanged(ctx, "h1", "c1", third.Token, StatePending); err != nil || !ok {
		t.Errorf("ReleaseIfUnchanged(c1) of a claim never fenced = %v, %v; want true, nil", ok, err)
	}
}

// TestConditionalReleases: a compensation frees only a pending claim, and
// the audit only a claim still in the state it judged.
func TestConditionalReleases(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 8))
	c, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatalf("Claim(c1): %v", err)
	}
	if _, err := l.Commit(ctx, "h1", "c1"); err != nil {
		t.Fatalf("Commit(c1): %v", err)
	}
	before := snapshot(t, l, "h1")
	if ok, err := l.ReleasePending(ctx, "h1", "c1"); err != nil || ok {
		t.Errorf("ReleasePending(committed c1) = %v, %v; want false, nil", ok, err)
	}
	if ok, err := l.ReleaseIfUnchanged(ctx, "h1", "c1", c.Token, StatePending); err != nil || ok {
		t.Errorf("ReleaseIfUnchanged(c1, pending) of a committed claim = %v, %v; want false, nil", ok, err)
	}
	if diff := cmp.Diff(before, snapshot(t, l, "h1"), snapOpts...); diff != "" {
		t.Errorf("refused releases changed the ledger (-before +after):\n%s", diff)
	}
	if _, err := l.ReleaseIfUnchanged(ctx, "h1", "c1", c.Token, "resident"); !errors.Is(err, ErrInvalid) {
		t.Errorf("ReleaseIfUnchanged(c1, state resident) error = %v, want ErrInvalid", err)
	}
	if ok, err := l.ReleaseIfUnchanged(ctx, "h1", "c1", c.Token, StateCommitted); err != nil || !ok {
		t.Errorf("ReleaseIfUnchanged(c1, committed) = %v, %v; want true, nil", ok, err)
	}
	if _, err := l.Claim(ctx, spec("c2", "h1", dedicated(t, 2, 512))); err != nil {
		t.Fatalf("Claim(c2): %v", err)
	}
	if ok, err := l.ReleasePending(ctx, "h1", "c2"); err != nil || !ok {
		t.Errorf("ReleasePending(pending c2) = %v, %v; want true, nil", ok, err)
	}
	if ok, err := l.ReleasePending(ctx, "h1", "c2"); err != nil || ok {
		t.Errorf("ReleasePending(c2) again = %v, %v; want false, nil", ok, err)
	}
	if err := snapshot(t, l, "h1").Verify(); err != nil {
		t.Errorf("Verify after the releases: %v", err)
	}
}
