package activities

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/ledger"
)

// TestMigrateTimeoutIsNotRetried: a migration that never converges is
// aborted by the policy the activities run with, the guest stays on its
// source, and the error is non-retryable with its own type, so that the
// workflow compensates instead of trying the same migration again.
func TestMigrateTimeoutIsNotRetried(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	w.addHost(t, "b")
	u := uuidN(40)
	w.boot(t, "a", u, Owner{InstanceWorkflowID(u), "boot-1"})
	dst := w.claim(t, "b", "migration-dest-1", u, ledger.KindMigrationDest, Owner{InstanceWorkflowID(u), "mig-1"})
	destXML, err := w.acts.PrepareMigration(ctx, PrepareMigrationInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement})
	if err != nil {
		t.Fatal(err)
	}
	// The guest dirties memory faster than the network sends it.
	if err := w.drv.SetRates(ctx, "a", sim.Rates{TransferMiBs: 100, DirtyMiBs: 200}); err != nil {
		t.Fatal(err)
	}
	w.acts.MigrationPolicy = hypervisor.MigrationPolicy{ProgressTimeout: time.Second, TimeoutAction: hypervisor.TimeoutAbort}
	in := MigrateInput{UUID: u, Source: "a", Dest: "b", DestXML: destXML, DestClaimID: dst.ClaimID, DestToken: dst.Token}
	err = w.acts.Migrate(ctx, in)
	var app *temporal.ApplicationError
	if !errors.As(err, &app) || app.Type() != ErrTypeMigrationTimeout || !app.NonRetryable() {
		t.Fatalf("Migrate that never converges = %v; want a non-retryable %s error", err, ErrTypeMigrationTimeout)
	}
	if !strings.Contains(err.Error(), "aborted: no progress for 1s") {
		t.Errorf("Migrate that never converges = %q; want it to say which timeout fired", err)
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
