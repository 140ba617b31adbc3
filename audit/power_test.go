package audit_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
)

// TestAuditRecordsPowerState: a guest whose domain is shut off while its
// record says active (its host crashed and came back) is reported and
// recorded stopped, and recorded active again once it runs; a dry run and
// a guest whose operation is open are reported only; the audit starts or
// stops no guest.
func TestAuditRecordsPowerState(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddHost(t, "a")
	u := simcloud.UUID(700)
	w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-1"})
	w.owners.set(guest.InstanceWorkflowID(u), longClosed)
	if err := w.Driver.Stop(ctx, "a", u); err != nil {
		t.Fatal(err)
	}
	vm := func() guest.VMState {
		t.Helper()
		inst, err := w.Ledger.Instance(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		return inst.VMState
	}
	powerDrift := func(res audit.HostAudit) string {
		for _, d := range res.Drift {
			if d.Kind == audit.DriftPowerState && d.Instance == u {
				return d.Detail
			}
		}
		return ""
	}

	if got := powerDrift(w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0), DryRun: true})); !strings.Contains(got, "would record stopped") {
		t.Errorf("dry run: power-state drift %q, want it reported as would record stopped", got)
	}
	if vm() != guest.VMActive {
		t.Errorf("a dry run changed the record to %s", vm())
	}

	w.owners.set(guest.InstanceWorkflowID(u), audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "run-2"})
	if got := powerDrift(w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})); !strings.Contains(got, "not recorded") {
		t.Errorf("with an operation open: power-state drift %q, want it reported, not recorded", got)
	}
	if vm() != guest.VMActive {
		t.Errorf("the audit recorded %s while an operation of the guest was open", vm())
	}

	w.owners.set(guest.InstanceWorkflowID(u), longClosed)
	if got := powerDrift(w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})); !strings.Contains(got, "recorded stopped") {
		t.Errorf("power-state drift %q, want it recorded stopped", got)
	}
	if vm() != guest.VMStopped {
		t.Errorf("record after the audit says %s, want stopped", vm())
	}
	if d, err := w.Driver.Lookup(ctx, "a", u); err != nil || d.State != "shutoff" {
		t.Errorf("domain after the audit = %+v, %v; the audit must not start it", d, err)
	}
	if got := powerDrift(w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})); got != "" {
		t.Errorf("a second audit reported %q; the record says what the hypervisor shows", got)
	}

	// Started through the hypervisor: recorded active again.
	if err := w.Driver.Start(ctx, "a", u); err != nil {
		t.Fatal(err)
	}
	if got := powerDrift(w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})); !strings.Contains(got, "recorded active") {
		t.Errorf("power-state drift %q after a start, want it recorded active", got)
	}
	if vm() != guest.VMActive {
		t.Errorf("record after the start says %s, want active", vm())
	}
}
