package audit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
)

// TestAuditCleansATerminatedBoot: a boot that stopped after its define
// leaves a shut-off domain and a record building, and its pending claim
// for an audit to free once its fence lease is over. Once its workflow is
// closed, the audit reports the domain, marks the build failed and
// undefines the domain; while it is open, the audit only reports.
func TestAuditCleansATerminatedBoot(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddHost(t, "a")
	w.Acts.FenceLease = 2 * time.Second
	bootDefinedOnly := func(n int) string {
		u := simcloud.UUID(n)
		if _, err := w.Acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: u, Name: "vm", Flavor: simcloud.Flavor()}); err != nil {
			t.Fatal(err)
		}
		c := w.Claim(t, "a", "boot-"+u, u, ledger.KindBoot, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-1"})
		if err := w.Driver.SetFault(ctx, "a", sim.OpStart, sim.Fault{Times: 1}); err != nil {
			t.Fatal(err)
		}
		if err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err == nil {
			t.Fatal("Spawn with a failing start = nil, want its error")
		}
		if dom, err := w.Driver.Lookup(ctx, "a", u); err != nil || dom.State != hypervisor.StateShutoff {
			t.Fatalf("guest after the failed start = %+v, %v; want defined, shut off", dom, err)
		}
		w.WaitLeaseOut(t, c)
		return u
	}
	closed, open := bootDefinedOnly(65), bootDefinedOnly(66)
	w.owners.set(guest.InstanceWorkflowID(closed), longClosed)
	w.owners.set(guest.InstanceWorkflowID(open), audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "run-2"})

	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if got := res.Tally.Drift.Of(audit.DriftLeftoverDomain); got != 2 {
		t.Errorf("AuditHost drift %+v, want two %s", res.Drift, audit.DriftLeftoverDomain)
	}
	if _, err := w.Driver.Lookup(ctx, "a", closed); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("the closed boot's domain is still defined (lookup error %v); want it undefined", err)
	}
	if in, err := w.Ledger.Instance(ctx, closed); err != nil || in.VMState != guest.VMError {
		t.Errorf("the closed boot's record = %+v, %v; want vm_state error", in, err)
	}
	if dom, err := w.Driver.Lookup(ctx, "a", open); err != nil || dom.State != hypervisor.StateShutoff {
		t.Errorf("the open boot's domain = %+v, %v; want it left defined", dom, err)
	}
	if in, err := w.Ledger.Instance(ctx, open); err != nil || in.VMState != guest.VMBuilding {
		t.Errorf("the open boot's record = %+v, %v; want it left building", in, err)
	}
}
