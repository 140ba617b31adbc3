package audit_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
)

// noSharedDevices fails the test if two domains that run or are paused
// on host pass one PCI device through.
func (w *world) noSharedDevices(t testing.TB, host string) {
	t.Helper()
	doms, err := w.Driver.Domains(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := w.Ledger.Host(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	for _, d := range doms {
		devs, err := hypervisor.UsedDevices(d, topo)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range devs {
			if other, ok := owner[a]; ok {
				t.Errorf("PCI device %s on %s is used by %s and %s", a, host, other, d.UUID)
			}
			owner[a] = d.UUID
		}
	}
}

// claimDevices is what the ledger says claim id of host holds.
func (w *world) claimDevices(t testing.TB, host, id string) []string {
	t.Helper()
	c, err := w.Ledger.GetClaim(context.Background(), host, id)
	if err != nil {
		t.Fatal(err)
	}
	return c.Devices
}

// TestAuditGuardsDevicesInUse: the claim of a guest that floats over the
// host's CPUs and holds an SR-IOV VF is guarded by the VF as a pinned
// guest's is by its pCPUs: while the guest runs on it, the audit keeps a
// claim whose owner closed; once the guest is off, the claim goes.
func TestAuditGuardsDevicesInUse(t *testing.T) {
	ctx := context.Background()
	for _, stopped := range []bool{false, true} {
		w := newWorld(t)
		w.AddSharedHost(t, "a")
		// The spawn's lease lasts it on a loaded machine, and runs out
		// before the audit (waitLeaseEnds).
		w.Acts.FenceLease = 2 * time.Second
		u := simcloud.UUID(601)
		f := simcloud.DeviceFlavor(true)
		if _, err := w.Acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: u, Name: "vm", Flavor: f}); err != nil {
			t.Fatal(err)
		}
		owner := activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-1"}
		c := w.ClaimFlavor(t, "a", "boot-run-1", u, ledger.KindBoot, owner, f)
		if got := w.claimDevices(t, "a", c.ClaimID); len(got) != 1 || !strings.HasPrefix(got[0], "0000:81:10.") {
			t.Fatalf("the boot claim holds devices %v, want one VF", got)
		}
		if err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
			t.Fatal(err)
		}
		if stopped {
			if err := w.Driver.Stop(ctx, "a", u); err != nil {
				t.Fatal(err)
			}
		}
		w.owners.set(owner.WorkflowID, longClosed)
		w.waitLeaseEnds(t, "a", c.ClaimID)
		res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
		if stopped {
			if w.HasClaim(t, "a", c.ClaimID) {
				t.Errorf("a shut-off guest uses no device, but the audit kept its claim: kept %+v", res.Tally.Kept)
			}
			continue
		}
		if !w.HasClaim(t, "a", c.ClaimID) || res.Tally.Kept.Of(audit.KeptInUse) != 1 {
			t.Fatalf("AuditHost freed %+v, kept %+v: the claim whose VF a running guest uses must stay in use", res.Freed, res.Tally.Kept)
		}
		if len(res.Drift) != 1 || res.Drift[0].Kind != audit.DriftClaimInUse || len(res.Drift[0].Devices) != 1 ||
			!strings.Contains(res.Drift[0].Detail, "PCI devices "+res.Drift[0].Devices[0]) {
			t.Errorf("drift = %+v, want the claim in use naming its VF", res.Drift)
		}
	}
}

// TestAuditQuarantinesLostDevices: Redis lost the claim and record of a
// guest that runs with a VF. The audit quarantines the VF with its pCPUs,
// so the next guest takes the other VF and a third finds none; the
// quarantine is released only once the guest is gone, and then its VF is
// given out again.
func TestAuditQuarantinesLostDevices(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddDeviceHost(t, "a")
	x, y, z := simcloud.UUID(611), simcloud.UUID(612), simcloud.UUID(613)
	f := simcloud.DeviceFlavor(false)
	cx := w.BootFlavor(t, "a", x, activities.Owner{WorkflowID: guest.InstanceWorkflowID(x), FirstRunID: "run-x"}, f)
	vf := w.claimDevices(t, "a", cx.ClaimID)
	w.loseGuest(t, "a", x, cx.ClaimID)

	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	q := "quarantine-" + x
	if !w.HasClaim(t, "a", q) || !slices.Equal(w.claimDevices(t, "a", q), vf) {
		t.Fatalf("after the audit (drift %+v) quarantine %s holds %v; want X's VF %v", res.Drift, q, w.HasClaim(t, "a", q), vf)
	}
	cy := w.BootFlavor(t, "a", y, activities.Owner{WorkflowID: guest.InstanceWorkflowID(y), FirstRunID: "run-y"}, f)
	if got := w.claimDevices(t, "a", cy.ClaimID); slices.Equal(got, vf) {
		t.Fatalf("Y took X's quarantined VF %v", got)
	}
	w.noSharedDevices(t, "a")
	if _, err := w.Acts.Claim(ctx, activities.ClaimInput{Host: "a", ClaimID: "boot-z", UUID: z, Kind: ledger.KindBoot,
		Owner: activities.Owner{WorkflowID: guest.InstanceWorkflowID(z), FirstRunID: "run-z"}, Flavor: f}); err == nil {
		t.Fatalf("Z claimed a VF while X's is quarantined and Y holds the other")
	}

	_, err := w.auditor.ReleaseQuarantine(ctx, audit.ReleaseQuarantineInput{Host: "a", ClaimID: q})
	var refused *audit.RefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "PCI devices "+vf[0]) {
		t.Fatalf("ReleaseQuarantine while X runs = %v; want a refusal naming X's VF %s", err, vf[0])
	}
	if err := w.Acts.DestroyDomain(ctx, activities.DomainInput{UUID: x, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	rel, err := w.auditor.ReleaseQuarantine(ctx, audit.ReleaseQuarantineInput{Host: "a", ClaimID: q})
	if err != nil || !slices.Equal(rel.Devices, vf) {
		t.Fatalf("ReleaseQuarantine after X is gone = %+v, %v; want X's VF freed", rel, err)
	}
	cz := w.BootFlavor(t, "a", z, activities.Owner{WorkflowID: guest.InstanceWorkflowID(z), FirstRunID: "run-z"}, f)
	if got := w.claimDevices(t, "a", cz.ClaimID); !slices.Equal(got, vf) {
		t.Errorf("Z took %v, want the released %v", got, vf)
	}
	w.noSharedDevices(t, "a")
}

// TestRecoverHostRestoresDevices: Redis lost a running guest's claim but
// not its record; recovery makes the resident claim again with its VF,
// and a guest using a VF no record explains gets it quarantined.
func TestRecoverHostRestoresDevices(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddDeviceHost(t, "a")
	x, y := simcloud.UUID(621), simcloud.UUID(622)
	f := simcloud.DeviceFlavor(false)
	cx := w.BootFlavor(t, "a", x, activities.Owner{WorkflowID: guest.InstanceWorkflowID(x), FirstRunID: "run-x"}, f)
	cy := w.BootFlavor(t, "a", y, activities.Owner{WorkflowID: guest.InstanceWorkflowID(y), FirstRunID: "run-y"}, f)
	vfX, vfY := w.claimDevices(t, "a", cx.ClaimID), w.claimDevices(t, "a", cy.ClaimID)
	if err := w.Ledger.Release(ctx, "a", cx.ClaimID); err != nil {
		t.Fatal(err)
	}
	w.loseGuest(t, "a", y, cy.ClaimID)

	rec, err := w.auditor.RecoverHost(ctx, audit.RecoverHostInput{Host: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Restored) != 1 || rec.Restored[0].ClaimID != cx.ClaimID || !slices.Equal(rec.Restored[0].Devices, vfX) {
		t.Errorf("restored %+v, want X's claim %s with its VF %v", rec.Restored, cx.ClaimID, vfX)
	}
	if len(rec.Quarantined) != 1 || rec.Quarantined[0].Instance != y || !slices.Equal(rec.Quarantined[0].Devices, vfY) {
		t.Errorf("quarantined %+v, want Y's VF %v", rec.Quarantined, vfY)
	}
	if !slices.Equal(w.claimDevices(t, "a", cx.ClaimID), vfX) || !slices.Equal(w.claimDevices(t, "a", "quarantine-"+y), vfY) {
		t.Errorf("the ledger after recovery does not hold both guests' VFs")
	}
	if err := w.snapshot(t, "a").Verify(); err != nil {
		t.Error(err)
	}
}
