package audit

import (
	"context"
	"fmt"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
)

// recordStates are an instance record's vm and task states.
type recordStates struct {
	vm   guest.VMState
	task guest.TaskState
}

// powerDrift reports each guest whose domain on this host, where its
// record says it lives, is shut off while the record says active, or runs
// while it says stopped, and records the state the hypervisor shows (the
// power-state sync of Nova's compute manager). Only a guest with no task
// and no operation open, or closed within the grace, is recorded: an
// operation powers guests off and on as its steps go. The record changes
// by compare-and-set from the states read, so an operation that begins
// meanwhile wins. The audit never starts or stops a guest.
func (au *pass) powerDrift(ctx context.Context, host string, doms []hypervisor.Domain, j judged) []Drift {
	var found []Drift
	for _, d := range doms {
		rec, ok := j.states[d.UUID]
		if !ok || rec.task != guest.TaskNone {
			continue
		}
		var seen guest.VMState
		switch {
		case rec.vm == guest.VMActive && d.State == hypervisor.StateShutoff:
			seen = guest.VMStopped
		case rec.vm == guest.VMStopped && d.State == hypervisor.StateRunning:
			seen = guest.VMActive
		default:
			continue
		}
		f := Drift{Kind: DriftPowerState, Instance: d.UUID, ClaimID: j.residentClaim[d.UUID],
			Detail: fmt.Sprintf("domain %s is %s on %s while its record says %s", d.Name, d.State, host, rec.vm)}
		switch why := au.instanceBusy(ctx, d.UUID); {
		case au.res.DryRun:
			f.Detail += fmt.Sprintf("; would record %s", seen)
		case why != "":
			f.Detail += "; not recorded: " + why
		default:
			err := au.a.Ledger.SetState(ctx, d.UUID, ledger.Transition{FromVM: []guest.VMState{rec.vm}, FromTask: []guest.TaskState{guest.TaskNone}, VM: seen, Task: guest.TaskNone})
			if err != nil {
				au.fail("power state of %s: %v", d.UUID, err)
				f.Detail += fmt.Sprintf("; not recorded: %v", err)
				break
			}
			f.Detail += fmt.Sprintf("; recorded %s", seen)
		}
		found = append(found, f)
	}
	return found
}
