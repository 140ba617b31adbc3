package activities_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/xmlpatch"
)

// preparedMigration boots guest n on host a and prepares its migration to
// b (both registered): the destination claim, and the destination XML
// staged for it. It returns the migration's input and the source and
// destination claims.
func preparedMigration(t *testing.T, w *simcloud.World, n int) (activities.MigrateInput, activities.ClaimResult, activities.ClaimResult) {
	t.Helper()
	u := simcloud.UUID(n)
	src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	dst := w.Claim(t, "b", "migration-dest-1", u, ledger.KindMigrationDest, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "mig-1"})
	prep := activities.PrepareMigrationInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement, DestClaimID: dst.ClaimID}
	if err := w.Acts.PrepareMigration(context.Background(), prep); err != nil {
		t.Fatal(err)
	}
	return activities.MigrateInput{UUID: u, Source: "a", Dest: "b", DestClaimID: dst.ClaimID, DestToken: dst.Token}, src, dst
}

// twoHostWorld is a world with hosts a and b.
func twoHostWorld(t *testing.T) *simcloud.World {
	t.Helper()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	return w
}

// TestMigrateTimeoutIsNotRetried: a migration that outlasts its timeout is
// aborted by the policy the activities run with, the guest stays on its
// source, and the error is non-retryable with its own type, so that the
// workflow compensates instead of trying the same migration again.
func TestMigrateTimeoutIsNotRetried(t *testing.T) {
	ctx := context.Background()
	w := twoHostWorld(t)
	in, _, _ := preparedMigration(t, w, 40)
	u := in.UUID
	// The copy would take a minute; the policy allows the guest (under
	// 1 GiB) one second.
	if err := w.Driver.SetLatency(ctx, "a", sim.OpMigrate, time.Minute); err != nil {
		t.Fatal(err)
	}
	w.Acts.MigrationPolicy = hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: time.Second, TimeoutAction: hypervisor.TimeoutAbort}
	err := w.Acts.Migrate(ctx, in)
	var app *temporal.ApplicationError
	if !errors.As(err, &app) || app.Type() != api.ErrTypeMigrationTimeout || !app.NonRetryable() {
		t.Fatalf("Migrate slower than its timeout = %v; want a non-retryable %s error", err, api.ErrTypeMigrationTimeout)
	}
	if !strings.Contains(err.Error(), "aborted: not completed within 1s") {
		t.Errorf("Migrate slower than its timeout = %q; want it to say which timeout fired", err)
	}
	found := false
	for _, typ := range activities.NonRetryableErrorTypes {
		found = found || typ == api.ErrTypeMigrationTimeout
	}
	if !found {
		t.Errorf("NonRetryableErrorTypes %v lacks %s, so retry policies would retry it", activities.NonRetryableErrorTypes, api.ErrTypeMigrationTimeout)
	}
	if dom, err := w.Driver.Lookup(ctx, "a", u); err != nil || dom.State != hypervisor.StateRunning {
		t.Errorf("guest on its source after the timeout = %+v, %v; want running", dom, err)
	}
	if _, err := w.Driver.Lookup(ctx, "b", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("guest on the destination after the timeout: lookup error %v, want ErrNotFound", err)
	}
	// The compensation finds nothing to undo.
	res, err := w.Acts.RollbackMigration(ctx, in)
	if err != nil || res.OnDest {
		t.Errorf("RollbackMigration after the timeout = %+v, %v; want the guest on its source, no error", res, err)
	}
}

// TestMigrationStagesItsXML: the destination XML PrepareMigration makes
// is kept in the record for the destination claim, not returned; Migrate
// defines the guest from it and the commit makes it the record's XML.
func TestMigrationStagesItsXML(t *testing.T) {
	ctx := context.Background()
	w := twoHostWorld(t)
	in, src, dst := preparedMigration(t, w, 41)
	u := in.UUID
	staged, err := w.Ledger.StagedDomainXML(ctx, u, dst.ClaimID)
	if err != nil {
		t.Fatalf("StagedDomainXML after PrepareMigration: %v, want the destination XML", err)
	}
	claimed, err := xmlpatch.PinsFor(&dst.Placement)
	if err != nil {
		t.Fatal(err)
	}
	if pins, err := xmlpatch.Read(staged); err != nil || !pins.HostCPUs().Equal(claimed.HostCPUs()) {
		t.Fatalf("staged destination XML pins %v (%v), want the claim's %s", pins, err, claimed.HostCPUs())
	}
	if err := w.Acts.Migrate(ctx, in); err != nil {
		t.Fatal(err)
	}
	w.RunsPinned(t, u, "b", dst, simcloud.Flavor().VCPUs)
	commit := activities.CommitMigrationInput{UUID: u, Source: "a", Dest: "b", SourceClaimID: src.ClaimID, DestClaimID: dst.ClaimID}
	if err := w.Acts.CommitMigration(ctx, commit); err != nil {
		t.Fatal(err)
	}
	inst, err := w.Ledger.Instance(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if inst.ClaimID != dst.ClaimID || inst.DomainXML != staged {
		t.Errorf("record after the commit: claim %s with %d bytes of XML; want %s with the destination XML (%d bytes)",
			inst.ClaimID, len(inst.DomainXML), dst.ClaimID, len(staged))
	}
	if _, err := w.Ledger.StagedDomainXML(ctx, u, dst.ClaimID); !errors.Is(err, ledger.ErrConflict) {
		t.Errorf("staged XML after the commit: %v, want none", err)
	}
}

// TestMigrateWithoutItsStagedXML: a migration whose staged XML is gone
// (Redis lost it) fails before it touches the guest, which stays on its
// source.
func TestMigrateWithoutItsStagedXML(t *testing.T) {
	ctx := context.Background()
	w := twoHostWorld(t)
	in, _, _ := preparedMigration(t, w, 42)
	u := in.UUID
	if err := w.Ledger.StageDomainXML(ctx, u, "another-claim", "<domain/>"); err != nil {
		t.Fatal(err)
	}
	err := w.Acts.Migrate(ctx, in)
	if !errors.Is(err, ledger.ErrConflict) {
		t.Fatalf("Migrate with nothing staged for its claim = %v, want ErrConflict", err)
	}
	if dom, err := w.Driver.Lookup(ctx, "a", u); err != nil || dom.State != hypervisor.StateRunning {
		t.Errorf("guest on a after the refused migration: %+v, %v; want it running", dom, err)
	}
	if _, err := w.Driver.Lookup(ctx, "b", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("guest on b after the refused migration: %v, want none", err)
	}
}
