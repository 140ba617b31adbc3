package activities

import (
	"context"
	"errors"
	"testing"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
)

// TestSpawnFencedOutStartsNothing: a spawn attempt whose claim the audit
// freed (its workflow long gone) defines and starts no guest.
func TestSpawnFencedOutStartsNothing(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	u := uuidN(5)
	if _, err := w.acts.CreateInstance(ctx, CreateInstanceInput{UUID: u, Name: "vm", Flavor: testFlavor}); err != nil {
		t.Fatal(err)
	}
	c := w.claim(t, "a", "boot-run-1", u, ledger.KindBoot, Owner{guest.InstanceWorkflowID(u), "run-1"})
	if err := w.led.Release(ctx, "a", c.ClaimID); err != nil {
		t.Fatal(err)
	}
	err := w.acts.Spawn(ctx, SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token})
	if !errors.Is(err, hypervisor.ErrFenced) && !isType(err, ErrTypeFenced) {
		t.Fatalf("Spawn on a released claim error = %v, want fenced", err)
	}
	if _, err := w.drv.Lookup(ctx, "a", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Spawn on a released claim left a domain (lookup error %v)", err)
	}
}

// TestFencedStepsNeedTheirClaim: a step that acts on pCPUs and names no
// claim, or not its token, is refused as bad input, for good, before it
// stages, defines or starts anything.
func TestFencedStepsNeedTheirClaim(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	w.addHost(t, "b")
	u := uuidN(10)
	w.boot(t, "a", u, Owner{guest.InstanceWorkflowID(u), "boot-1"})
	dst := w.claim(t, "b", "migration-dest-1", u, ledger.KindMigrationDest, Owner{guest.InstanceWorkflowID(u), "mig-1"})
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"Spawn without a claim", w.acts.Spawn(ctx, SpawnInput{UUID: u, Host: "b", Placement: dst.Placement})},
		{"Spawn without the token", w.acts.Spawn(ctx, SpawnInput{UUID: u, Host: "b", Placement: dst.Placement, ClaimID: dst.ClaimID})},
		{"MoveResized without a claim", w.acts.MoveResized(ctx, MoveResizedInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement, Start: true})},
		{"PrepareMigration without a claim", w.acts.PrepareMigration(ctx, PrepareMigrationInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement})},
		{"Migrate without a claim", w.acts.Migrate(ctx, MigrateInput{UUID: u, Source: "a", Dest: "b"})},
		{"Migrate without the token", w.acts.Migrate(ctx, MigrateInput{UUID: u, Source: "a", Dest: "b", DestClaimID: dst.ClaimID})},
	} {
		var app *temporal.ApplicationError
		if !errors.As(tc.err, &app) || app.Type() != ErrTypeInvalidRequest || !app.NonRetryable() {
			t.Errorf("%s = %v, want a non-retryable %s error", tc.name, tc.err, ErrTypeInvalidRequest)
		}
	}
	if _, err := w.drv.Lookup(ctx, "b", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("the refused steps left a domain on b (lookup error %v)", err)
	}
	if dom, err := w.drv.Lookup(ctx, "a", u); err != nil || dom.State != hypervisor.StateRunning {
		t.Errorf("guest on a after the refused steps = %+v, %v; want it running", dom, err)
	}
	if _, err := w.led.StagedDomainXML(ctx, u, dst.ClaimID); !errors.Is(err, ledger.ErrConflict) {
		t.Errorf("the refused steps staged XML for the claim (%v), want none", err)
	}
}

func isType(err error, typ string) bool {
	var app interface{ Type() string }
	return errors.As(err, &app) && app.Type() == typ
}

// TestRollbackOfAGuestThatIsNowhere: a migration whose prepare found no
// guest on the source (a record left behind by an interrupted move) has
// nothing to roll back, and says so without error.
func TestRollbackOfAGuestThatIsNowhere(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	w.addHost(t, "b")
	res, err := w.acts.RollbackMigration(ctx, MigrateInput{UUID: uuidN(8), Source: "a", Dest: "b"})
	if err != nil || res.OnDest {
		t.Errorf("RollbackMigration of a guest on neither host = %+v, %v; want nothing done, no error", res, err)
	}
}
