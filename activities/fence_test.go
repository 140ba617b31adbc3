package activities_test

import (
	"context"
	"errors"
	"testing"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
)

// TestSpawnFencedOutStartsNothing: a spawn attempt whose claim the audit
// freed (its workflow long gone) defines and starts no guest.
func TestSpawnFencedOutStartsNothing(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	u := simcloud.UUID(5)
	if _, err := w.Acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: u, Name: "vm", Flavor: simcloud.Flavor()}); err != nil {
		t.Fatal(err)
	}
	c := w.Claim(t, "a", "boot-run-1", u, ledger.KindBoot, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-1"})
	if err := w.Ledger.Release(ctx, "a", c.ClaimID); err != nil {
		t.Fatal(err)
	}
	err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token})
	if !errors.Is(err, hypervisor.ErrFenced) && !isType(err, api.ErrTypeFenced) {
		t.Fatalf("Spawn on a released claim error = %v, want fenced", err)
	}
	if _, err := w.Driver.Lookup(ctx, "a", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Spawn on a released claim left a domain (lookup error %v)", err)
	}
}

// TestFencedStepsNeedTheirClaim: a step that acts on pCPUs and names no
// claim, or not its token, is refused as bad input, for good, before it
// stages, defines or starts anything.
func TestFencedStepsNeedTheirClaim(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	u := simcloud.UUID(10)
	w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	dst := w.Claim(t, "b", "migration-dest-1", u, ledger.KindMigrationDest, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "mig-1"})
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"Spawn without a claim", w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "b", Placement: dst.Placement})},
		{"Spawn without the token", w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "b", Placement: dst.Placement, ClaimID: dst.ClaimID})},
		{"MoveResized without a claim", w.Acts.MoveResized(ctx, activities.MoveResizedInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement, Start: true})},
		{"PrepareMigration without a claim", w.Acts.PrepareMigration(ctx, activities.PrepareMigrationInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement})},
		{"Migrate without a claim", w.Acts.Migrate(ctx, activities.MigrateInput{UUID: u, Source: "a", Dest: "b"})},
		{"Migrate without the token", w.Acts.Migrate(ctx, activities.MigrateInput{UUID: u, Source: "a", Dest: "b", DestClaimID: dst.ClaimID})},
	} {
		var app *temporal.ApplicationError
		if !errors.As(tc.err, &app) || app.Type() != api.ErrTypeInvalidRequest || !app.NonRetryable() {
			t.Errorf("%s = %v, want a non-retryable %s error", tc.name, tc.err, api.ErrTypeInvalidRequest)
		}
	}
	if _, err := w.Driver.Lookup(ctx, "b", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("the refused steps left a domain on b (lookup error %v)", err)
	}
	if dom, err := w.Driver.Lookup(ctx, "a", u); err != nil || dom.State != hypervisor.StateRunning {
		t.Errorf("guest on a after the refused steps = %+v, %v; want it running", dom, err)
	}
	if _, err := w.Ledger.StagedDomainXML(ctx, u, dst.ClaimID); !errors.Is(err, ledger.ErrConflict) {
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
	w := simcloud.New(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	res, err := w.Acts.RollbackMigration(ctx, activities.MigrateInput{UUID: simcloud.UUID(8), Source: "a", Dest: "b"})
	if err != nil || res.OnDest {
		t.Errorf("RollbackMigration of a guest on neither host = %+v, %v; want nothing done, no error", res, err)
	}
}
