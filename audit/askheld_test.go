package audit

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.temporal.io/api/serviceerror"
)

// scriptedOwner is an open (or closed) operation that answers its query
// with errs, one per question, and then with its claims.
type scriptedOwner struct {
	state   OwnerState
	errs    []error
	asked   int
	claimed []HeldClaim
}

func (o *scriptedOwner) OwnerStatus(context.Context, string) (OwnerStatus, error) {
	return OwnerStatus{State: o.state, FirstRunID: "r"}, nil
}

func (o *scriptedOwner) Retention(context.Context) (time.Duration, error) { return time.Hour, nil }

func (o *scriptedOwner) HeldClaims(context.Context, string) ([]HeldClaim, error) {
	o.asked++
	if len(o.errs) > 0 {
		err := o.errs[0]
		o.errs = o.errs[1:]
		return nil, err
	}
	return o.claimed, nil
}

// TestAskHeld: a recovery asks an open operation again while its answer
// is late, so a worker slow on a loaded machine does not get its guest
// quarantined; a query the workflow refused, or an operation that ended,
// is asked no more.
func TestAskHeld(t *testing.T) {
	claim := HeldClaim{Host: "a", ClaimID: "migration-dest-1", Token: "t"}
	late := serviceerror.NewDeadlineExceeded("query timed out")
	tests := []struct {
		name      string
		owner     scriptedOwner
		wantOK    bool
		wantAsked int
	}{
		{"answers at once", scriptedOwner{state: OwnerRunning, claimed: []HeldClaim{claim}}, true, 1},
		{"answers after two late replies", scriptedOwner{state: OwnerRunning, errs: []error{late, errors.New("unavailable")}, claimed: []HeldClaim{claim}}, true, 3},
		{"refuses the query", scriptedOwner{state: OwnerRunning, errs: []error{serviceerror.NewQueryFailed("no handler")}}, false, 1},
		{"has ended", scriptedOwner{state: OwnerClosed, claimed: []HeldClaim{claim}}, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.owner
			a := &Auditor{Owners: &o, Holders: &o}
			held, ok := a.askHeld(context.Background(), "instance-x")
			if ok != tt.wantOK || o.asked != tt.wantAsked {
				t.Fatalf("askHeld = %v, %v after %d questions; want ok %v after %d", held, ok, o.asked, tt.wantOK, tt.wantAsked)
			}
			if ok && (len(held) != 1 || held[0].ClaimID != claim.ClaimID) {
				t.Errorf("askHeld = %v, want [%v]", held, claim)
			}
		})
	}
}

// TestAskHeldLeavesTimeToQuarantine: an operation that never answers is
// asked only while the caller's deadline leaves time for the quarantine
// that follows, so a recovery run in a short activity does not lose its
// whole time to asking.
func TestAskHeldLeavesTimeToQuarantine(t *testing.T) {
	late := serviceerror.NewDeadlineExceeded("query timed out")
	errs := make([]error, 1000)
	for i := range errs {
		errs[i] = late
	}
	o := scriptedOwner{state: OwnerRunning, errs: errs}
	a := &Auditor{Owners: &o, Holders: &o}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if held, ok := a.askHeld(ctx, "instance-x"); ok {
		t.Fatalf("askHeld = %v, true from an operation that never answered", held)
	}
	if ctx.Err() != nil {
		t.Fatalf("askHeld used up the caller's deadline (%v); the quarantine has no time left", ctx.Err())
	}
	if o.asked < 2 {
		t.Errorf("askHeld asked %d times within its time; want it to ask again", o.asked)
	}
}
