package activities_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/xmlpatch"
)

// TestStepsOfAnOvertakenOperationChangeNothing: a step of an operation
// that ended (a frozen worker's, resumed) after another operation took
// the guest's claim is refused at its fence, whichever step it is, and
// the guest runs on as it did. The world's driver is hypervisor.Guarded,
// so a step that changed a domain without a fence would fail here too.
func TestStepsOfAnOvertakenOperationChangeNothing(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddDeviceHost(t, "a")
	w.AddDeviceHost(t, "b")
	u := simcloud.UUID(40)
	f := simcloud.DeviceFlavor(false)
	c := w.BootFlavor(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"}, f)
	dst := w.ClaimFlavor(t, "b", "migration-dest-1", u, ledger.KindMigrationDest, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "mig-1"}, f)
	// The ended operation knew both claims by the tokens they had when
	// it began; a later operation (or the audit's settle) took them.
	for _, cl := range []activities.ClaimResult{c, dst} {
		if err := w.Ledger.Take(ctx, cl.Host, cl.ClaimID, []string{cl.Token}, "run-later"); err != nil {
			t.Fatal(err)
		}
	}
	dom := activities.DomainInput{UUID: u, Host: "a", ClaimID: c.ClaimID, Token: c.Token}
	final := dom
	final.Final = true
	for _, tc := range []struct {
		step string
		err  error
	}{
		{"DestroyDomain", w.Acts.DestroyDomain(ctx, dom)},
		{"DestroyDomain as a compensation", w.Acts.DestroyDomain(ctx, final)},
		{"Offload", w.Acts.Offload(ctx, dom)},
		{"PowerOff", w.Acts.PowerOff(ctx, dom)},
		{"UnplugDevices", w.Acts.UnplugDevices(ctx, dom)},
		{"PlugDevices", w.Acts.PlugDevices(ctx, activities.PlugDevicesInput{UUID: u, Host: "a", ClaimID: c.ClaimID, Token: c.Token, Final: true})},
		{"RollbackMigration", func() error {
			_, err := w.Acts.RollbackMigration(ctx, activities.MigrateInput{UUID: u, Source: "a", Dest: "b", DestClaimID: dst.ClaimID, DestToken: dst.Token})
			return err
		}()},
	} {
		if !isType(tc.err, api.ErrTypeFenced) {
			t.Errorf("%s of the overtaken operation = %v, want refused at its fence (%s)", tc.step, tc.err, api.ErrTypeFenced)
		}
	}
	if d, err := w.Driver.Lookup(ctx, "a", u); err != nil || d.State != hypervisor.StateRunning {
		t.Errorf("guest on a after the refused steps = %+v, %v; want it running", d, err)
	} else if devs, err := xmlpatch.Devices(d.XML); err != nil || len(devs) != 1 {
		t.Errorf("guest on a passes through %v (%v) after the refused steps; want its one device still plugged in", devs, err)
	}
	if got, _ := w.Ledger.GetClaim(ctx, "a", c.ClaimID); got == nil || got.Token != "run-later" {
		t.Errorf("claim %s after the refused steps = %+v; want it still the later operation's", c.ClaimID, got)
	}
}

// TestCompensationOutranksItsForwardSteps: once a compensation has torn
// the destination copy down, a forward attempt of its own run that
// outlived the decision (a spawn held in a frozen worker) starts nothing
// there, and a RestoreDomain of the compensation still runs the guest on
// its source.
func TestCompensationOutranksItsForwardSteps(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	u := simcloud.UUID(41)
	c := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	owner := activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "unshelve-1"}
	dst := w.Claim(t, "b", "unshelve-1", u, ledger.KindUnshelve, owner)
	if err := w.Acts.DestroyDomain(ctx, activities.DomainInput{UUID: u, Host: "b", ClaimID: dst.ClaimID, Token: dst.Token, Final: true}); err != nil {
		t.Fatalf("the compensation's destroy: %v", err)
	}
	err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "b", Placement: dst.Placement, ClaimID: dst.ClaimID, Token: dst.Token})
	if !isType(err, api.ErrTypeFenced) && !errors.Is(err, hypervisor.ErrFenced) {
		t.Errorf("a forward spawn after its run's compensation = %v, want fenced", err)
	}
	if _, err := w.Driver.Lookup(ctx, "b", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("the spawn after the compensation left a domain on b (lookup error %v)", err)
	}
	restore := activities.DomainInput{UUID: u, Host: "a", ClaimID: c.ClaimID, Token: c.Token, Final: true}
	if err := w.Acts.RestoreDomain(ctx, restore); err != nil {
		t.Errorf("the compensation's restore on the source: %v", err)
	}
	if d, err := w.Driver.Lookup(ctx, "a", u); err != nil || d.State != hypervisor.StateRunning {
		t.Errorf("guest on a = %+v, %v; want it running", d, err)
	}
}

// TestUnfencedCallsAreRefused: the worker's driver refuses a call that
// changes a domain without a fence, so a step that forgot its fence fails
// in every test instead of acting after its operation ended.
func TestUnfencedCallsAreRefused(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	u := simcloud.UUID(42)
	w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	guarded := hypervisor.Guarded(w.Driver)
	if err := guarded.Stop(ctx, "a", u); !errors.Is(err, hypervisor.ErrUnfenced) {
		t.Errorf("Stop without a fence = %v, want ErrUnfenced", err)
	}
	if err := guarded.Undefine(hypervisor.WithFence(ctx, "a/boot-boot-1"), "a", u); !errors.Is(err, hypervisor.ErrUnfenced) {
		t.Errorf("Undefine fenced but with no deadline = %v, want ErrUnfenced", err)
	}
	if _, err := guarded.Lookup(ctx, "a", u); err != nil {
		t.Errorf("Lookup, a read, through the guard: %v", err)
	}
	if d, err := w.Driver.Lookup(ctx, "a", u); err != nil || d.State != hypervisor.StateRunning {
		t.Errorf("guest on a after the refused calls = %+v, %v; want it running", d, err)
	}
}

// TestOffloadKeepsTheRecordsDevices: a guest that runs without its
// device (a live migration terminated between its unplug and its plug)
// is offloaded with the device in the definition kept for its unshelve:
// the guest still owns it, and its claim holds it.
func TestOffloadKeepsTheRecordsDevices(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddDeviceHost(t, "a")
	u := simcloud.UUID(42)
	c := w.BootFlavor(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"}, simcloud.DeviceFlavor(false))
	dom := activities.DomainInput{UUID: u, Host: "a", ClaimID: c.ClaimID, Token: c.Token}
	if err := w.Acts.UnplugDevices(ctx, dom); err != nil {
		t.Fatal(err)
	}
	if d, err := w.Driver.Lookup(ctx, "a", u); err != nil {
		t.Fatal(err)
	} else if devs, _ := xmlpatch.Devices(d.XML); len(devs) != 0 {
		t.Fatalf("guest passes through %v after the unplug; the test needs it without its device", devs)
	}
	if err := w.Acts.Offload(ctx, dom); err != nil {
		t.Fatalf("Offload: %v", err)
	}
	inst, err := w.Ledger.Instance(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if devs, err := xmlpatch.Devices(inst.DomainXML); err != nil || len(devs) != 1 {
		t.Errorf("the offloaded guest's kept definition passes through %v (%v); want its one device", devs, err)
	}
}
