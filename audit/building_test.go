package audit_test

import (
	"context"
	"testing"
	"time"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
)

// TestSweepBuildingFailsAStuckBoot: a boot that stopped after it created
// its record and before its define leaves the record building with no
// domain. The sweep marks it failed once the instance's workflow is
// provably over (closed for the grace, or unknown and older than the
// retention), and leaves it while that workflow may still end the build.
func TestSweepBuildingFailsAStuckBoot(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	record := func(n int, at time.Time, st *audit.OwnerStatus) string {
		u := simcloud.UUID(n)
		w.At(at)
		if _, err := w.Acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: u, Name: "vm", Flavor: simcloud.Flavor()}); err != nil {
			t.Fatal(err)
		}
		if st != nil {
			w.owners.set(guest.InstanceWorkflowID(u), *st)
		}
		return u
	}
	now := time.Now()
	closed := record(70, now, &longClosed)
	open := record(71, now, &audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "run-1"})
	justClosed := record(72, now, &audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "run-1", Since: now.Add(-time.Second)})
	unseen := record(73, now, nil)
	forgotten := record(74, now.Add(-2*testRetention), nil)
	states := func(when string, want map[string]guest.VMState) {
		t.Helper()
		for u, vm := range want {
			if inst, err := w.Ledger.Instance(ctx, u); err != nil || inst.VMState != vm {
				t.Errorf("record %s %s = %+v, %v; want vm_state %s", u, when, inst, err, vm)
			}
		}
	}

	res, err := w.auditor.SweepBuilding(ctx, audit.SweepBuildingInput{DryRun: true})
	if err != nil || res.Tally.Drift.Of(audit.DriftStuckBuild) != 2 {
		t.Errorf("SweepBuilding dry run = %+v, %v; want two %s", res, err, audit.DriftStuckBuild)
	}
	states("after a dry run", map[string]guest.VMState{closed: guest.VMBuilding, forgotten: guest.VMBuilding})

	res, err = w.auditor.SweepBuilding(ctx, audit.SweepBuildingInput{})
	if err != nil || res.Tally.Drift.Of(audit.DriftStuckBuild) != 2 || len(res.Errors) != 0 {
		t.Errorf("SweepBuilding = %+v, %v; want two %s and no error", res, err, audit.DriftStuckBuild)
	}
	states("after the sweep", map[string]guest.VMState{
		closed: guest.VMError, forgotten: guest.VMError,
		open: guest.VMBuilding, justClosed: guest.VMBuilding, unseen: guest.VMBuilding,
	})
	if inst, err := w.Ledger.Instance(ctx, closed); err != nil || inst.TaskState != guest.TaskNone {
		t.Errorf("failed build's record = %+v, %v; want no task", inst, err)
	}
}
