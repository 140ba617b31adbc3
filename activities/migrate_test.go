package activities

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/xmlpatch"
)

// preparedMigration boots guest n on host a and prepares its migration to
// b (both registered): the destination claim, and the destination XML
// staged for it. It returns the migration's input and the source and
// destination claims.
func preparedMigration(t *testing.T, w *world, n int) (MigrateInput, ClaimResult, ClaimResult) {
	t.Helper()
	u := uuidN(n)
	src := w.boot(t, "a", u, Owner{guest.InstanceWorkflowID(u), "boot-1"})
	dst := w.claim(t, "b", "migration-dest-1", u, ledger.KindMigrationDest, Owner{guest.InstanceWorkflowID(u), "mig-1"})
	prep := PrepareMigrationInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement, DestClaimID: dst.ClaimID}
	if err := w.acts.PrepareMigration(context.Background(), prep); err != nil {
		t.Fatal(err)
	}
	return MigrateInput{UUID: u, Source: "a", Dest: "b", DestClaimID: dst.ClaimID, DestToken: dst.Token}, src, dst
}

// twoHostWorld is a world with hosts a and b.
func twoHostWorld(t *testing.T) *world {
	t.Helper()
	w := newWorld(t)
	w.addHost(t, "a")
	w.addHost(t, "b")
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
	if err := w.drv.SetLatency(ctx, "a", sim.OpMigrate, time.Minute); err != nil {
		t.Fatal(err)
	}
	w.acts.MigrationPolicy = hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: time.Second, TimeoutAction: hypervisor.TimeoutAbort}
	err := w.acts.Migrate(ctx, in)
	var app *temporal.ApplicationError
	if !errors.As(err, &app) || app.Type() != ErrTypeMigrationTimeout || !app.NonRetryable() {
		t.Fatalf("Migrate slower than its timeout = %v; want a non-retryable %s error", err, ErrTypeMigrationTimeout)
	}
	if !strings.Contains(err.Error(), "aborted: not completed within 1s") {
		t.Errorf("Migrate slower than its timeout = %q; want it to say which timeout fired", err)
	}
	found := false
	for _, typ := range NonRetryableErrorTypes {
		found = found || typ == ErrTypeMigrationTimeout
	}
	if !found {
		t.Errorf("NonRetryableErrorTypes %v lacks %s, so retry policies would retry it", NonRetryableErrorTypes, ErrTypeMigrationTimeout)
	}
	if dom, err := w.drv.Lookup(ctx, "a", u); err != nil || dom.State != hypervisor.StateRunning {
		t.Errorf("guest on its source after the timeout = %+v, %v; want running", dom, err)
	}
	if _, err := w.drv.Lookup(ctx, "b", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("guest on the destination after the timeout: lookup error %v, want ErrNotFound", err)
	}
	// The compensation finds nothing to undo.
	res, err := w.acts.RollbackMigration(ctx, in)
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
	staged, err := w.led.StagedDomainXML(ctx, u, dst.ClaimID)
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
	if err := w.acts.Migrate(ctx, in); err != nil {
		t.Fatal(err)
	}
	w.runsPinned(t, u, "b", dst, testFlavor.VCPUs)
	commit := CommitMigrationInput{UUID: u, Source: "a", Dest: "b", SourceClaimID: src.ClaimID, DestClaimID: dst.ClaimID}
	if err := w.acts.CommitMigration(ctx, commit); err != nil {
		t.Fatal(err)
	}
	inst, err := w.led.Instance(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if inst.ClaimID != dst.ClaimID || inst.DomainXML != staged {
		t.Errorf("record after the commit: claim %s with %d bytes of XML; want %s with the destination XML (%d bytes)",
			inst.ClaimID, len(inst.DomainXML), dst.ClaimID, len(staged))
	}
	if _, err := w.led.StagedDomainXML(ctx, u, dst.ClaimID); !errors.Is(err, ledger.ErrConflict) {
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
	if err := w.led.StageDomainXML(ctx, u, "another-claim", "<domain/>"); err != nil {
		t.Fatal(err)
	}
	err := w.acts.Migrate(ctx, in)
	if !errors.Is(err, ledger.ErrConflict) {
		t.Fatalf("Migrate with nothing staged for its claim = %v, want ErrConflict", err)
	}
	if dom, err := w.drv.Lookup(ctx, "a", u); err != nil || dom.State != hypervisor.StateRunning {
		t.Errorf("guest on a after the refused migration: %+v, %v; want it running", dom, err)
	}
	if _, err := w.drv.Lookup(ctx, "b", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("guest on b after the refused migration: %v, want none", err)
	}
}
