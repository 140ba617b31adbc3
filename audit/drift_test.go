package audit_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
)

func TestAuditHostDrift(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.AddHost(t, "a")
	// X runs on a at 0,1 but its claim is lost; Y's pending claim then
	// takes 0,1: X is pinned to Y's pCPUs.
	x, y, z := simcloud.UUID(301), simcloud.UUID(302), simcloud.UUID(303)
	cx := w.Boot(t, "a", x, activities.Owner{WorkflowID: guest.InstanceWorkflowID(x), FirstRunID: "run-x"})
	if err := w.Ledger.Release(ctx, "a", cx.ClaimID); err != nil {
		t.Fatal(err)
	}
	cy := w.Claim(t, "a", "c-y", y, ledger.KindUnshelve, activities.Owner{WorkflowID: guest.InstanceWorkflowID(y), FirstRunID: "run-y"})
	w.owners.set(guest.InstanceWorkflowID(y), audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "run-y", Since: time.Now()})
	// Z is resident but its domain is gone.
	cz := w.Boot(t, "a", z, activities.Owner{WorkflowID: guest.InstanceWorkflowID(z), FirstRunID: "run-z"})
	if err := w.Acts.DestroyDomain(ctx, activities.DomainInput{UUID: z, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	before, err := w.Ledger.Snapshot(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	want := []audit.Drift{
		{Kind: audit.DriftPinnedToOther, Instance: x, CPUs: claimedCPUs(cy)},
		{Kind: audit.DriftDomainWithoutClaim, Instance: x, CPUs: "0-1"},
		{Kind: audit.DriftClaimWithoutDomain, Instance: z, ClaimID: cz.ClaimID, CPUs: "2-3"},
	}
	got := make([]audit.Drift, len(res.Drift))
	for i, d := range res.Drift {
		got[i] = d
		got[i].Detail = ""
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("AuditHost(a) drift (-want +got):\n%s", diff)
	}
	after, err := w.Ledger.Snapshot(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before.Pins, after.Pins); diff != "" {
		t.Errorf("AuditHost(a) changed the pins while only reporting drift (-before +after):\n%s", diff)
	}
	doms, err := w.Driver.Domains(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(doms) != 1 || doms[0].UUID != x {
		t.Errorf("domains on a after the audit: %+v, want X's alone, untouched", doms)
	}

	// Y's workflow is open: drift about Y would be marked in flight. Make
	// Z's instance workflow open too and check the mark.
	w.owners.set(guest.InstanceWorkflowID(z), audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "del-z", Since: time.Now()})
	res = w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	for _, d := range res.Drift {
		if wantFlight := d.Instance == z; d.InFlight != wantFlight {
			t.Errorf("drift %s of %s: in flight %v, want %v", d.Kind, d.Instance, d.InFlight, wantFlight)
		}
	}
}
