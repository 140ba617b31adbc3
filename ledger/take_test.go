package ledger

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestTakeRefusesTheOldToken checks what an operation that takes over a
// claim gets: every fence with the claim's old token is refused from then
// on, the record and the undo entry carry the new token, the pins and
// usage stay as they were, and a caller that knows the claim by a token
// it no longer has cannot take it back.
func TestTakeRefusesTheOldToken(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 8))
	c, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatalf("Claim(c1): %v", err)
	}
	before := snapshot(t, l, "h1")
	if err := l.Take(ctx, "h1", "c1", []string{c.Token}, "run-b"); err != nil {
		t.Fatalf("Take(c1): %v", err)
	}
	if _, err := l.Fence(ctx, "h1", "c1", c.Token, time.Second); !errors.Is(err, ErrConflict) {
		t.Errorf("Fence(c1) with the token from before the take = %v, want ErrConflict", err)
	}
	if _, err := l.Fence(ctx, "h1", "c1", "run-b", time.Second); err != nil {
		t.Errorf("Fence(c1) with the new token: %v", err)
	}
	got, err := l.GetClaim(ctx, "h1", "c1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Token != "run-b" {
		t.Errorf("claim record token = %q after Take, want run-b", got.Token)
	}
	after := snapshot(t, l, "h1")
	if diff := cmp.Diff(before.Claims[0].Placement, after.Claims[0].Placement); diff != "" {
		t.Errorf("Take changed the claim's placement (-before +after):\n%s", diff)
	}
	if err := after.Verify(); err != nil {
		t.Errorf("Verify after Take: %v", err)
	}
	// The undo entry carries the new token: a conditional release with
	// the old one frees nothing, with the new one it frees the claim.
	if ok, err := l.ReleaseIfUnchanged(ctx, "h1", "c1", c.Token, StatePending); err != nil || ok {
		t.Errorf("ReleaseIfUnchanged with the old token = %v, %v; want false, nil", ok, err)
	}
	// Taking it again with the token it has is no change.
	if err := l.Take(ctx, "h1", "c1", []string{c.Token}, "run-b"); err != nil {
		t.Errorf("Take(c1) again with its own token: %v", err)
	}
	// A step of the operation it was taken from knows it by its old
	// token only: it cannot take it back.
	if err := l.Take(ctx, "h1", "c1", []string{c.Token}, "run-a"); !errors.Is(err, ErrConflict) {
		t.Errorf("Take(c1) from the token it had before = %v, want ErrConflict", err)
	}
	if got, _ := l.GetClaim(ctx, "h1", "c1"); got.Token != "run-b" {
		t.Errorf("a refused Take changed the token to %q", got.Token)
	}
	// From any token: the audit's settle, which judges the claim, once
	// the step that fenced above has acted.
	if err := l.Unfence(ctx, "h1", "c1", "run-b"); err != nil {
		t.Fatal(err)
	}
	if err := l.Take(ctx, "h1", "c1", nil, "settle"); err != nil {
		t.Errorf("Take(c1) from any token: %v", err)
	}
	if err := l.Take(ctx, "h1", "c2", nil, "run-b"); !errors.Is(err, ErrUnknownClaim) {
		t.Errorf("Take of a claim never made = %v, want ErrUnknownClaim", err)
	}
	for _, bad := range []string{"", "a|b", `a"b`} {
		if err := l.Take(ctx, "h1", "c1", nil, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("Take(c1, %q) = %v, want ErrInvalid", bad, err)
		}
	}
}

// TestTakeWaitsOutAnotherLease checks that no claim is taken from under a
// step that passed its fence: while the lease of another token runs Take
// refuses with the lease's end and changes nothing, and TakeOver waits
// until it ends.
func TestTakeWaitsOutAnotherLease(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 8))
	c, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatalf("Claim(c1): %v", err)
	}
	const lease = 1500 * time.Millisecond
	if _, err := l.Fence(ctx, "h1", "c1", c.Token, lease); err != nil {
		t.Fatalf("Fence(c1): %v", err)
	}
	err = l.Take(ctx, "h1", "c1", []string{c.Token}, "run-b")
	var leased *LeasedError
	if !errors.As(err, &leased) || !errors.Is(err, ErrConflict) {
		t.Fatalf("Take(c1) under another token's lease = %v, want a *LeasedError matching ErrConflict", err)
	}
	if got, _ := l.GetClaim(ctx, "h1", "c1"); got.Token != c.Token {
		t.Errorf("a refused Take changed the token to %q", got.Token)
	}
	if _, err := l.Fence(ctx, "h1", "c1", c.Token, lease); err != nil {
		t.Errorf("the lease holder's fence after a refused Take: %v", err)
	}
	// TakeOver returns only once the holder's lease has run out: its
	// renewal is then refused.
	if err := l.TakeOver(ctx, "h1", "c1", []string{c.Token}, "run-b"); err != nil {
		t.Fatalf("TakeOver(c1): %v", err)
	}
	if _, err := l.Fence(ctx, "h1", "c1", c.Token, lease); !errors.Is(err, ErrConflict) {
		t.Errorf("the former holder's fence after TakeOver = %v, want ErrConflict", err)
	}
	// A lease of the taker's own token does not hold it back.
	if _, err := l.Fence(ctx, "h1", "c1", "run-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := l.Take(ctx, "h1", "c1", []string{"run-b"}, "run-b"); err != nil {
		t.Errorf("Take under its own token's lease: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := l.TakeOver(cctx, "h1", "c1", []string{"run-b"}, "run-c"); !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &leased) {
		t.Errorf("TakeOver ended by its context under a lease = %v, want the deadline and the *LeasedError", err)
	}
}

// TestFenceTeardownOnAFencedHost checks that a step that only tears a
// guest down may act on a host marked down or returning, where a step
// that starts one is refused.
func TestFenceTeardownOnAFencedHost(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 8))
	c, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatalf("Claim(c1): %v", err)
	}
	if _, err := l.SetHostDown(ctx, "h1", "test fencing"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Fence(ctx, "h1", "c1", c.Token, time.Second); !errors.Is(err, ErrHostDown) {
		t.Errorf("Fence on a host marked down = %v, want ErrHostDown", err)
	}
	if _, err := l.FenceTeardown(ctx, "h1", "c1", c.Token, time.Second); err != nil {
		t.Errorf("FenceTeardown on a host marked down: %v", err)
	}
	if _, err := l.FenceTeardown(ctx, "h1", "c1", "other", time.Second); !errors.Is(err, ErrConflict) {
		t.Errorf("FenceTeardown with another token = %v, want ErrConflict", err)
	}
}

// TestUnfenceEndsItsOwnLease checks that a step that has acted holds
// nothing back: its lease ends, and Take goes through at once, while a
// lease of another token is left to run.
func TestUnfenceEndsItsOwnLease(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 8))
	c, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatalf("Claim(c1): %v", err)
	}
	if _, err := l.Fence(ctx, "h1", "c1", c.Token, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := l.Unfence(ctx, "h1", "c1", "other"); err != nil {
		t.Fatal(err)
	}
	var leased *LeasedError
	if err := l.Take(ctx, "h1", "c1", []string{c.Token}, "run-b"); !errors.As(err, &leased) {
		t.Fatalf("Take after another token's Unfence = %v, want the lease still running", err)
	}
	if err := l.Unfence(ctx, "h1", "c1", c.Token); err != nil {
		t.Fatal(err)
	}
	if err := l.Take(ctx, "h1", "c1", []string{c.Token}, "run-b"); err != nil {
		t.Errorf("Take after the holder's Unfence: %v", err)
	}
	if ok, err := l.ReleaseIfUnchanged(ctx, "h1", "c1", "run-b", StatePending); err != nil || !ok {
		t.Errorf("ReleaseIfUnchanged after Unfence = %v, %v; want the claim freed", ok, err)
	}
}
