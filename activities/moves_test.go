package activities_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
)

// TestResizeRevertKeepsThePins: a revert makes the source hold resident
// again, the same pCPUs, the old flavor and domain, the destination gone.
func TestResizeRevertKeepsThePins(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	u := simcloud.UUID(20)
	src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	bigger := simcloud.Flavor()
	bigger.VCPUs = 3
	dst := w.ResizeTo(t, u, "a", src.ClaimID, "b", bigger)
	w.RunsPinned(t, u, "b", dst, 3)
	if c, err := w.Ledger.GetClaim(ctx, "a", src.ClaimID); err != nil || c.State != ledger.StateHeld {
		t.Fatalf("source claim in VERIFY_RESIZE = %+v, %v; want held", c, err)
	}

	if err := w.Acts.DestroyDomain(ctx, activities.DomainInput{UUID: u, Host: "b"}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := w.Acts.RevertRecord(ctx, activities.RevertRecordInput{UUID: u, Source: "a", SourceClaimID: src.ClaimID}); err != nil {
			t.Fatalf("RevertRecord: %v", err)
		}
	}
	if err := w.Acts.RestoreDomain(ctx, activities.DomainInput{UUID: u, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.ReleaseClaim(ctx, activities.ReleaseInput{Host: "b", ClaimID: dst.ClaimID}); err != nil {
		t.Fatal(err)
	}
	inst, err := w.Ledger.Instance(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Host != "a" || inst.ClaimID != src.ClaimID || inst.Request.VCPUs != 2 || inst.Resize != nil {
		t.Errorf("record after the revert = host %s claim %s %d vCPUs resize %+v; want a, %s, 2, none", inst.Host, inst.ClaimID, inst.Request.VCPUs, inst.Resize, src.ClaimID)
	}
	w.RunsPinned(t, u, "a", src, 2)
	if c, err := w.Ledger.GetClaim(ctx, "a", src.ClaimID); err != nil || c.State != ledger.StateCommitted || c.Token != src.Token {
		t.Errorf("source claim after the revert = %+v, %v; want the same claim, committed", c, err)
	}
	if w.HasClaim(t, "b", dst.ClaimID) {
		t.Errorf("the destination claim is still held after the revert")
	}
}

// TestRevertRefusedBeforeItDestroys: a revert whose hold cannot become
// resident again, its host fenced or the hold gone, is refused by the
// step that comes before the destroy, and changes nothing: the guest
// runs on its destination and the record names it. No guest is restored
// on the fenced host either.
func TestRevertRefusedBeforeItDestroys(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	u := simcloud.UUID(21)
	src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	dst := w.ResizeTo(t, u, "a", src.ClaimID, "b", simcloud.Flavor())
	back := activities.RevertRecordInput{UUID: u, Source: "a", SourceClaimID: src.ClaimID}
	unchanged := func(when string) {
		t.Helper()
		w.RunsPinned(t, u, "b", dst, simcloud.Flavor().VCPUs)
		if inst, err := w.Ledger.Instance(ctx, u); err != nil || inst.Host != "b" || inst.ClaimID != dst.ClaimID || inst.Resize == nil {
			t.Errorf("record %s = %+v, %v; want it on b's claim %s, in its resize", when, inst, err, dst.ClaimID)
		}
	}

	if _, err := w.Ledger.SetHostDown(ctx, "a", "power supply failed"); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.RevertRecord(ctx, back); !isType(err, api.ErrTypeHostDown) {
		t.Errorf("RevertRecord to a fenced host: error = %v, want type %s", err, api.ErrTypeHostDown)
	}
	if err := w.Acts.RestoreDomain(ctx, activities.DomainInput{UUID: u, Host: "a"}); !isType(err, api.ErrTypeHostDown) {
		t.Errorf("RestoreDomain on a fenced host: error = %v, want type %s", err, api.ErrTypeHostDown)
	}
	if c, err := w.Ledger.GetClaim(ctx, "a", src.ClaimID); err != nil || c.State != ledger.StateHeld {
		t.Errorf("hold after the refused revert = %+v, %v; want it held", c, err)
	}
	if _, err := w.Driver.Lookup(ctx, "a", u); err == nil {
		t.Errorf("the refused revert left a domain of %s on the fenced host", u)
	}
	unchanged("after a revert to a fenced host")

	if err := w.Ledger.Release(ctx, "a", src.ClaimID); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.RevertRecord(ctx, back); !isType(err, api.ErrTypeBadState) || !strings.Contains(err.Error(), "is gone") {
		t.Errorf("RevertRecord with its hold gone: error = %v, want a %s saying the hold is gone", err, api.ErrTypeBadState)
	}
	unchanged("after a revert whose hold is gone")
}

// TestMoveClearsAnInterruptedResize: a resize interrupted before its guest
// moved leaves a resize record naming the resident claim; a migration
// that then moves the guest drops it, so a later resize is not refused.
func TestMoveClearsAnInterruptedResize(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	u := simcloud.UUID(23)
	src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	bigger := simcloud.Flavor()
	bigger.VCPUs = 3
	if err := w.Acts.BeginResize(ctx, activities.BeginResizeInput{UUID: u, NewFlavor: bigger}); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.HoldClaim(ctx, activities.ClaimRef{Host: "a", ClaimID: src.ClaimID}); err != nil {
		t.Fatal(err)
	}
	// Terminated here. A live migration moves the guest to b.
	dst := w.Claim(t, "b", "migration-dest-1", u, ledger.KindMigrationDest, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "mig-1"})
	if err := w.Acts.PrepareMigration(ctx, activities.PrepareMigrationInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement, DestClaimID: dst.ClaimID}); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.Migrate(ctx, activities.MigrateInput{UUID: u, Source: "a", Dest: "b", DestClaimID: dst.ClaimID, DestToken: dst.Token}); err != nil {
		t.Fatal(err)
	}
	commit := activities.CommitMigrationInput{UUID: u, Source: "a", Dest: "b", SourceClaimID: src.ClaimID, DestClaimID: dst.ClaimID}
	if err := w.Acts.CommitMigration(ctx, commit); err != nil {
		t.Fatal(err)
	}
	inst, err := w.Ledger.Instance(ctx, u)
	if err != nil || inst.Resize != nil || inst.Host != "b" {
		t.Fatalf("record after the migration = %+v, %v; want it on b with no resize", inst, err)
	}
	if w.HasClaim(t, "a", src.ClaimID) {
		t.Errorf("the stale hold on a is still held after the migration")
	}
	if err := w.Acts.BeginResize(ctx, activities.BeginResizeInput{UUID: u, NewFlavor: bigger}); err != nil {
		t.Errorf("BeginResize after the migration: %v", err)
	}
}

// TestResizeOfAVanishedClaim: a record naming a claim the ledger does not
// hold (an interrupted shelve released it) is refused at once, not
// retried forever.
func TestResizeOfAVanishedClaim(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	u := simcloud.UUID(24)
	src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	if err := w.Ledger.Release(ctx, "a", src.ClaimID); err != nil {
		t.Fatal(err)
	}
	err := w.Acts.BeginResize(ctx, activities.BeginResizeInput{UUID: u, NewFlavor: simcloud.Flavor()})
	if !isType(err, api.ErrTypeBadState) {
		t.Errorf("BeginResize of a record naming a released claim = %v, want a BadState", err)
	}
	if err := w.Acts.HoldClaim(ctx, activities.ClaimRef{Host: "a", ClaimID: src.ClaimID}); !isType(err, api.ErrTypeBadState) {
		t.Errorf("HoldClaim of a released claim = %v, want a BadState", err)
	}
}

// TestResizeAfterAnInterruptedOne: the hold left by a resize interrupted
// before its guest moved does not stop the next resize.
func TestResizeAfterAnInterruptedOne(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	u := simcloud.UUID(25)
	src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	if err := w.Acts.BeginResize(ctx, activities.BeginResizeInput{UUID: u, NewFlavor: simcloud.Flavor()}); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.HoldClaim(ctx, activities.ClaimRef{Host: "a", ClaimID: src.ClaimID}); err != nil {
		t.Fatal(err)
	}
	// Terminated here; a new resize starts.
	bigger := simcloud.Flavor()
	bigger.VCPUs = 3
	dst := w.ResizeTo(t, u, "a", src.ClaimID, "b", bigger)
	w.RunsPinned(t, u, "b", dst, 3)
}

// TestKeepMovedKeepsOnlyAMovedGuest: a move undone with its hold gone
// keeps the guest on its destination when the move defined it there, and
// refuses, changing nothing, when it did not get that far.
func TestKeepMovedKeepsOnlyAMovedGuest(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	u := simcloud.UUID(22)
	src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	if err := w.Acts.BeginResize(ctx, activities.BeginResizeInput{UUID: u, NewFlavor: simcloud.Flavor()}); err != nil {
		t.Fatal(err)
	}
	c, err := w.Acts.Claim(ctx, activities.ClaimInput{Host: "b", ClaimID: "resize-dest-1", UUID: u, Kind: ledger.KindResizeDest,
		Owner: activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "resize-1"}, Flavor: simcloud.Flavor()})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.HoldClaim(ctx, activities.ClaimRef{Host: "a", ClaimID: src.ClaimID}); err != nil {
		t.Fatal(err)
	}
	if err := w.Ledger.Release(ctx, "a", src.ClaimID); err != nil {
		t.Fatal(err)
	}
	keep := activities.FinishResizeInput{UUID: u, Dest: "b", DestClaimID: c.ClaimID}

	if err := w.Acts.KeepMoved(ctx, keep); !isType(err, api.ErrTypeBadState) || !strings.Contains(err.Error(), "no domain on b") {
		t.Errorf("KeepMoved before the move: error = %v, want a %s saying there is no domain on b", err, api.ErrTypeBadState)
	}
	if inst, err := w.Ledger.Instance(ctx, u); err != nil || inst.Host != "a" || inst.Resize == nil {
		t.Errorf("record after a refused KeepMoved = %+v, %v; want it on a, in its resize", inst, err)
	}

	if err := w.Acts.PowerOff(ctx, activities.DomainInput{UUID: u, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.MoveResized(ctx, activities.MoveResizedInput{UUID: u, Source: "a", Dest: "b", ClaimID: c.ClaimID, Token: c.Token,
		Placement: c.Placement, Start: true}); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.KeepMoved(ctx, keep); err != nil {
		t.Fatalf("KeepMoved after the move: %v", err)
	}
	w.RunsPinned(t, u, "b", c, simcloud.Flavor().VCPUs)
	if inst, err := w.Ledger.Instance(ctx, u); err != nil || inst.Host != "b" || inst.ClaimID != c.ClaimID || inst.DomainXML == "" {
		t.Errorf("record after KeepMoved = %+v, %v; want it on b's claim %s with its domain XML", inst, err, c.ClaimID)
	}
}

// TestRestoreReplacesAStrayDefinition: when the guest's host runs a
// definition of it that is not its record's (an attempt of the resize
// being undone outlived it and started the new flavor's domain again),
// RestoreDomain puts the record's in its place instead of taking the
// running guest as restored: its pins belong to a claim about to be
// freed.
func TestRestoreReplacesAStrayDefinition(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	u := simcloud.UUID(21)
	src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	bigger := simcloud.Flavor()
	bigger.VCPUs = 3
	dst := w.ResizeTo(t, u, "a", src.ClaimID, "a", bigger)
	w.RunsPinned(t, u, "a", dst, 3)
	if err := w.Acts.RevertRecord(ctx, activities.RevertRecordInput{UUID: u, Source: "a", SourceClaimID: src.ClaimID}); err != nil {
		t.Fatal(err)
	}
	// The new flavor's domain still runs: RestoreDomain must not take it.
	if err := w.Acts.RestoreDomain(ctx, activities.DomainInput{UUID: u, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	w.RunsPinned(t, u, "a", src, 2)
}
