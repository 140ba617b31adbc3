package audit_test

import (
	"context"
	"strings"
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

// TestAuditReportsBrokenGroupRules: two members of a 1-per-host
// anti-affinity group run on one host (the second started there outside
// the group's claims, as an operator could through the hypervisor): the
// audit reports the rule broken and frees nothing for it.
func TestAuditReportsBrokenGroupRules(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.AddHost(t, "a")
	if err := w.Ledger.CreateGroup(ctx, ledger.Group{Name: "db", Policy: ledger.PolicyAntiAffinity}); err != nil {
		t.Fatal(err)
	}
	m1, m2 := simcloud.UUID(311), simcloud.UUID(312)
	for i, u := range []string{m1, m2} {
		if _, err := w.Ledger.CreateMember(ctx, u, "db-"+u[len(u)-3:], simcloud.Flavor(), guest.VMBuilding, "", "db"); err != nil {
			t.Fatal(err)
		}
		kind := ledger.KindBoot
		if i == 1 {
			kind = ledger.KindQuarantine // neither counted nor refused
		}
		owner := activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-" + u}
		c := w.Claim(t, "a", "c-"+u, u, kind, owner)
		w.owners.set(owner.WorkflowID, audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: owner.FirstRunID, Since: time.Now()})
		if err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
			t.Fatal(err)
		}
	}
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if res.Tally.Drift.Of(audit.DriftGroupRule) != 1 || res.Tally.Freed.Total() != 0 {
		t.Fatalf("AuditHost(a) drift %+v freed %+v, want one broken group rule and nothing freed", res.Drift, res.Freed)
	}
	for _, d := range res.Drift {
		if d.Kind == audit.DriftGroupRule && (!strings.Contains(d.Detail, m1) || !strings.Contains(d.Detail, m2) || !strings.Contains(d.Detail, "anti-affinity group db")) {
			t.Errorf("group drift %q does not name the group and both members", d.Detail)
		}
	}
}
