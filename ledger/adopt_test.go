package ledger

import (
	"context"
	"errors"
	"testing"
)

// TestAdopt: a drain's reservation changes hands to the guest's
// migration with its pCPUs and a new token: the drain's conditional
// release no longer reaches it, the migration's does, and a retry of the
// adoption returns the claim as adopted.
func TestAdopt(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h", testHost(1, 8))
	s := spec("resv", "h", dedicated(t, 2, 512))
	s.Kind, s.OwnerWorkflowID, s.OwnerRunID = KindReservation, "drain-src", "drain-run"
	resv, err := l.Claim(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	a := Adoption{Host: "h", ClaimID: "resv", InstanceUUID: s.InstanceUUID, FromWorkflowID: "drain-src",
		Kind: KindMigrationDest, OwnerWorkflowID: "instance-" + s.InstanceUUID, OwnerRunID: "mig-run"}
	for _, bad := range []struct {
		name string
		a    Adoption
		want error
	}{
		{"another owner's", func() Adoption { b := a; b.FromWorkflowID = "drain-other"; return b }(), ErrConflict},
		{"another instance's", func() Adoption { b := a; b.InstanceUUID = "someone"; return b }(), ErrConflict},
		{"unknown", func() Adoption { b := a; b.ClaimID = "nope"; return b }(), ErrUnknownClaim},
		{"no kind", func() Adoption { b := a; b.Kind = ""; return b }(), ErrInvalid},
	} {
		if _, err := l.Adopt(ctx, bad.a); !errors.Is(err, bad.want) {
			t.Errorf("Adopt of %s claim: %v, want %v", bad.name, err, bad.want)
		}
	}
	got, err := l.Adopt(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if got.Kind != KindMigrationDest || got.OwnerRunID != "mig-run" || got.Token == resv.Token || got.State != StatePending {
		t.Errorf("adopted claim = %+v, want a pending migration-dest of mig-run with a new token", got)
	}
	again, err := l.Adopt(ctx, a)
	if err != nil || again.Token != got.Token {
		t.Errorf("a retried Adopt = %+v, %v; want the same claim", again, err)
	}
	snap := snapshot(t, l, "h") // Verify: pins and usage unchanged, undo entry consistent
	if len(snap.Pins) != 2 || snap.Pins[0].ClaimID != "resv" {
		t.Errorf("pins after the adoption = %+v, want the reservation's 2", snap.Pins)
	}
	if freed, err := l.ReleaseIfUnchanged(ctx, "h", "resv", resv.Token, StatePending); err != nil || freed {
		t.Errorf("the drain's release with its old token = %v, %v; want nothing freed", freed, err)
	}
	if freed, err := l.ReleaseIfUnchanged(ctx, "h", "resv", got.Token, StatePending); err != nil || !freed {
		t.Errorf("the migration's release with the new token = %v, %v; want freed", freed, err)
	}
	if s := snapshot(t, l, "h"); len(s.Pins) != 0 {
		t.Errorf("pins after the release = %+v, want none", s.Pins)
	}

	// Only a pending claim changes hands.
	c, err := l.Claim(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Commit(ctx, "h", c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Adopt(ctx, a); !errors.Is(err, ErrConflict) {
		t.Errorf("Adopt of a committed claim: %v, want ErrConflict", err)
	}
}
