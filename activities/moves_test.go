package activities

import (
	"context"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/xmlpatch"
)

// resizeTo runs a resize of uuid from host src to dst up to VERIFY_RESIZE,
// the way the Resize workflow does, and returns the destination claim.
func (w *world) resizeTo(t *testing.T, uuid, src, srcClaim, dst string, f guest.Flavor) ClaimResult {
	t.Helper()
	ctx := context.Background()
	step := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	step("BeginResize", w.acts.BeginResize(ctx, BeginResizeInput{UUID: uuid, NewFlavor: f}))
	c, err := w.acts.Claim(ctx, ClaimInput{Host: dst, ClaimID: "resize-dest-1", UUID: uuid, Kind: ledger.KindResizeDest,
		Owner: Owner{guest.InstanceWorkflowID(uuid), "resize-1"}, Flavor: f})
	step("Claim", err)
	step("HoldClaim", w.acts.HoldClaim(ctx, ClaimRef{Host: src, ClaimID: srcClaim}))
	step("PowerOff", w.acts.PowerOff(ctx, DomainInput{UUID: uuid, Host: src}))
	step("MoveResized", w.acts.MoveResized(ctx, MoveResizedInput{UUID: uuid, Source: src, Dest: dst, ClaimID: c.ClaimID, Token: c.Token,
		Placement: c.Placement, Start: true}))
	step("FinishResize", w.acts.FinishResize(ctx, FinishResizeInput{UUID: uuid, Dest: dst, DestClaimID: c.ClaimID}))
	return c
}

// runsPinned checks that uuid's only running domain is on host, pinned to
// the claim, with vcpus vCPUs.
func (w *world) runsPinned(t *testing.T, uuid, host string, c ClaimResult, vcpus int) {
	t.Helper()
	dom, err := w.drv.Lookup(context.Background(), host, uuid)
	if err != nil || dom.State != hypervisor.StateRunning {
		t.Fatalf("domain of %s on %s = %+v, %v; want it running", uuid, host, dom, err)
	}
	pins, err := xmlpatch.Read(dom.XML)
	if err != nil {
		t.Fatal(err)
	}
	want, err := xmlpatch.PinsFor(&c.Placement)
	if err != nil {
		t.Fatal(err)
	}
	if got := pins.HostCPUs(); !got.Equal(want.HostCPUs()) || len(pins.VCPUPins) != vcpus {
		t.Errorf("domain of %s on %s pinned to %s with %d vCPUs, want %s with %d", uuid, host, got, len(pins.VCPUPins), want.HostCPUs(), vcpus)
	}
}

// TestResizeRevertKeepsThePins: a revert makes the source hold resident
// again, the same pCPUs, the old flavor and domain, the destination gone.
func TestResizeRevertKeepsThePins(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	w.addHost(t, "b")
	u := uuidN(20)
	src := w.boot(t, "a", u, Owner{guest.InstanceWorkflowID(u), "boot-1"})
	bigger := testFlavor
	bigger.VCPUs = 3
	dst := w.resizeTo(t, u, "a", src.ClaimID, "b", bigger)
	w.runsPinned(t, u, "b", dst, 3)
	if c, err := w.led.GetClaim(ctx, "a", src.ClaimID); err != nil || c.State != ledger.StateHeld {
		t.Fatalf("source claim in VERIFY_RESIZE = %+v, %v; want held", c, err)
	}

	if err := w.acts.DestroyDomain(ctx, DomainInput{UUID: u, Host: "b"}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := w.acts.RevertRecord(ctx, RevertRecordInput{UUID: u, Source: "a", SourceClaimID: src.ClaimID}); err != nil {
			t.Fatalf("RevertRecord: %v", err)
		}
	}
	if err := w.acts.RestoreDomain(ctx, DomainInput{UUID: u, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := w.acts.ReleaseClaim(ctx, ReleaseInput{Host: "b", ClaimID: dst.ClaimID}); err != nil {
		t.Fatal(err)
	}
	inst, err := w.led.Instance(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Host != "a" || inst.ClaimID != src.ClaimID || inst.Request.VCPUs != 2 || inst.Resize != nil {
		t.Errorf("record after the revert = host %s claim %s %d vCPUs resize %+v; want a, %s, 2, none", inst.Host, inst.ClaimID, inst.Request.VCPUs, inst.Resize, src.ClaimID)
	}
	w.runsPinned(t, u, "a", src, 2)
	if c, err := w.led.GetClaim(ctx, "a", src.ClaimID); err != nil || c.State != ledger.StateCommitted || c.Token != src.Token {
		t.Errorf("source claim after the revert = %+v, %v; want the same claim, committed", c, err)
	}
	if w.hasClaim(t, "b", dst.ClaimID) {
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
	w := newWorld(t)
	w.addHost(t, "a")
	w.addHost(t, "b")
	u := uuidN(21)
	src := w.boot(t, "a", u, Owner{guest.InstanceWorkflowID(u), "boot-1"})
	dst := w.resizeTo(t, u, "a", src.ClaimID, "b", testFlavor)
	back := RevertRecordInput{UUID: u, Source: "a", SourceClaimID: src.ClaimID}
	unchanged := func(when string) {
		t.Helper()
		w.runsPinned(t, u, "b", dst, testFlavor.VCPUs)
		if inst, err := w.led.Instance(ctx, u); err != nil || inst.Host != "b" || inst.ClaimID != dst.ClaimID || inst.Resize == nil {
			t.Errorf("record %s = %+v, %v; want it on b's claim %s, in its resize", when, inst, err, dst.ClaimID)
		}
	}

	if _, err := w.led.SetHostDown(ctx, "a", "power supply failed"); err != nil {
		t.Fatal(err)
	}
	if err := w.acts.RevertRecord(ctx, back); !isType(err, ErrTypeHostDown) {
		t.Errorf("RevertRecord to a fenced host: error = %v, want type %s", err, ErrTypeHostDown)
	}
	if err := w.acts.RestoreDomain(ctx, DomainInput{UUID: u, Host: "a"}); !isType(err, ErrTypeHostDown) {
		t.Errorf("RestoreDomain on a fenced host: error = %v, want type %s", err, ErrTypeHostDown)
	}
	if c, err := w.led.GetClaim(ctx, "a", src.ClaimID); err != nil || c.State != ledger.StateHeld {
		t.Errorf("hold after the refused revert = %+v, %v; want it held", c, err)
	}
	if _, err := w.drv.Lookup(ctx, "a", u); err == nil {
		t.Errorf("the refused revert left a domain of %s on the fenced host", u)
	}
	unchanged("after a revert to a fenced host")

	if err := w.led.Release(ctx, "a", src.ClaimID); err != nil {
		t.Fatal(err)
	}
	if err := w.acts.RevertRecord(ctx, back); !isType(err, ErrTypeBadState) || !strings.Contains(err.Error(), "is gone") {
		t.Errorf("RevertRecord with its hold gone: error = %v, want a %s saying the hold is gone", err, ErrTypeBadState)
	}
	unchanged("after a revert whose hold is gone")
}

// TestMoveClearsAnInterruptedResize: a resize interrupted before its guest
// moved leaves a resize record naming the resident claim; a migration
// that then moves the guest drops it, so a later resize is not refused.
func TestMoveClearsAnInterruptedResize(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	w.addHost(t, "b")
	u := uuidN(23)
	src := w.boot(t, "a", u, Owner{guest.InstanceWorkflowID(u), "boot-1"})
	bigger := testFlavor
	bigger.VCPUs = 3
	if err := w.acts.BeginResize(ctx, BeginResizeInput{UUID: u, NewFlavor: bigger}); err != nil {
		t.Fatal(err)
	}
	if err := w.acts.HoldClaim(ctx, ClaimRef{Host: "a", ClaimID: src.ClaimID}); err != nil {
		t.Fatal(err)
	}
	// Terminated here. A live migration moves the guest to b.
	dst := w.claim(t, "b", "migration-dest-1", u, ledger.KindMigrationDest, Owner{guest.InstanceWorkflowID(u), "mig-1"})
	if err := w.acts.PrepareMigration(ctx, PrepareMigrationInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement, DestClaimID: dst.ClaimID}); err != nil {
		t.Fatal(err)
	}
	if err := w.acts.Migrate(ctx, MigrateInput{UUID: u, Source: "a", Dest: "b", DestClaimID: dst.ClaimID, DestToken: dst.Token}); err != nil {
		t.Fatal(err)
	}
	commit := CommitMigrationInput{UUID: u, Source: "a", Dest: "b", SourceClaimID: src.ClaimID, DestClaimID: dst.ClaimID}
	if err := w.acts.CommitMigration(ctx, commit); err != nil {
		t.Fatal(err)
	}
	inst, err := w.led.Instance(ctx, u)
	if err != nil || inst.Resize != nil || inst.Host != "b" {
		t.Fatalf("record after the migration = %+v, %v; want it on b with no resize", inst, err)
	}
	if w.hasClaim(t, "a", src.ClaimID) {
		t.Errorf("the stale hold on a is still held after the migration")
	}
	if err := w.acts.BeginResize(ctx, BeginResizeInput{UUID: u, NewFlavor: bigger}); err != nil {
		t.Errorf("BeginResize after the migration: %v", err)
	}
}

// TestResizeOfAVanishedClaim: a record naming a claim the ledger does not
// hold (an interrupted shelve released it) is refused at once, not
// retried forever.
func TestResizeOfAVanishedClaim(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	u := uuidN(24)
	src := w.boot(t, "a", u, Owner{guest.InstanceWorkflowID(u), "boot-1"})
	if err := w.led.Release(ctx, "a", src.ClaimID); err != nil {
		t.Fatal(err)
	}
	err := w.acts.BeginResize(ctx, BeginResizeInput{UUID: u, NewFlavor: testFlavor})
	if !isType(err, ErrTypeBadState) {
		t.Errorf("BeginResize of a record naming a released claim = %v, want a BadState", err)
	}
	if err := w.acts.HoldClaim(ctx, ClaimRef{Host: "a", ClaimID: src.ClaimID}); !isType(err, ErrTypeBadState) {
		t.Errorf("HoldClaim of a released claim = %v, want a BadState", err)
	}
}

// TestResizeAfterAnInterruptedOne: the hold left by a resize interrupted
// before its guest moved does not stop the next resize.
func TestResizeAfterAnInterruptedOne(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	w.addHost(t, "b")
	u := uuidN(25)
	src := w.boot(t, "a", u, Owner{guest.InstanceWorkflowID(u), "boot-1"})
	if err := w.acts.BeginResize(ctx, BeginResizeInput{UUID: u, NewFlavor: testFlavor}); err != nil {
		t.Fatal(err)
	}
	if err := w.acts.HoldClaim(ctx, ClaimRef{Host: "a", ClaimID: src.ClaimID}); err != nil {
		t.Fatal(err)
	}
	// Terminated here; a new resize starts.
	bigger := testFlavor
	bigger.VCPUs = 3
	dst := w.resizeTo(t, u, "a", src.ClaimID, "b", bigger)
	w.runsPinned(t, u, "b", dst, 3)
}

// TestKeepMovedKeepsOnlyAMovedGuest: a move undone with its hold gone
// keeps the guest on its destination when the move defined it there, and
// refuses, changing nothing, when it did not get that far.
func TestKeepMovedKeepsOnlyAMovedGuest(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	w.addHost(t, "b")
	u := uuidN(22)
	src := w.boot(t, "a", u, Owner{guest.InstanceWorkflowID(u), "boot-1"})
	if err := w.acts.BeginResize(ctx, BeginResizeInput{UUID: u, NewFlavor: testFlavor}); err != nil {
		t.Fatal(err)
	}
	c, err := w.acts.Claim(ctx, ClaimInput{Host: "b", ClaimID: "resize-dest-1", UUID: u, Kind: ledger.KindResizeDest,
		Owner: Owner{guest.InstanceWorkflowID(u), "resize-1"}, Flavor: testFlavor})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.acts.HoldClaim(ctx, ClaimRef{Host: "a", ClaimID: src.ClaimID}); err != nil {
		t.Fatal(err)
	}
	if err := w.led.Release(ctx, "a", src.ClaimID); err != nil {
		t.Fatal(err)
	}
	keep := FinishResizeInput{UUID: u, Dest: "b", DestClaimID: c.ClaimID}

	if err := w.acts.KeepMoved(ctx, keep); !isType(err, ErrTypeBadState) || !strings.Contains(err.Error(), "no domain on b") {
		t.Errorf("KeepMoved before the move: error = %v, want a %s saying there is no domain on b", err, ErrTypeBadState)
	}
	if inst, err := w.led.Instance(ctx, u); err != nil || inst.Host != "a" || inst.Resize == nil {
		t.Errorf("record after a refused KeepMoved = %+v, %v; want it on a, in its resize", inst, err)
	}

	if err := w.acts.PowerOff(ctx, DomainInput{UUID: u, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := w.acts.MoveResized(ctx, MoveResizedInput{UUID: u, Source: "a", Dest: "b", ClaimID: c.ClaimID, Token: c.Token,
		Placement: c.Placement, Start: true}); err != nil {
		t.Fatal(err)
	}
	if err := w.acts.KeepMoved(ctx, keep); err != nil {
		t.Fatalf("KeepMoved after the move: %v", err)
	}
	w.runsPinned(t, u, "b", c, testFlavor.VCPUs)
	if inst, err := w.led.Instance(ctx, u); err != nil || inst.Host != "b" || inst.ClaimID != c.ClaimID || inst.DomainXML == "" {
		t.Errorf("record after KeepMoved = %+v, %v; want it on b's claim %s with its domain XML", inst, err, c.ClaimID)
	}
}
