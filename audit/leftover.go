package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
)

// leftover reports a shut-off domain whose instance has no claim on the
// host, and cleans it when nothing else will. A boot that stopped after
// its define (terminated, or its worker lost for good) leaves one: its
// pending claim is freed, but the domain stays defined and its record
// stays building with no host, and no operation will end either.
//
// The audit cleans only a domain its record places on no host or another
// one, when no workflow of the instance has been open for the grace
// period (its last attempts may still run; MinGrace at least): it marks
// a record still building as failed first, vm_state error with no task,
// which is what a boot's own compensation leaves (as Nova leaves a failed
// build in ERROR, not deleted: the guest the user asked for stays listed,
// with its failure, until the user deletes it), and then undefines the
// domain if it is still shut off. In that order a crash in between leaves
// the domain for the next audit to find. A domain pinflow has no record
// of may be an operator's: it is only reported.
func (au *pass) leftover(ctx context.Context, host string, d hypervisor.Domain) Drift {
	f := Drift{Kind: DriftLeftoverDomain, Instance: d.UUID,
		Detail: fmt.Sprintf("domain %s is shut off with no claim on %s", d.Name, host)}
	rec, err := au.a.Ledger.Instance(ctx, d.UUID)
	switch {
	case errors.Is(err, ledger.ErrUnknownInstance):
		f.Detail += ", and no instance record names it; left for an operator"
		return f
	case err != nil:
		f.Detail += fmt.Sprintf("; its record could not be read: %v", err)
		return f
	case rec.Host == host:
		f.Detail += ", but its record places it here; left for an operator"
		return f
	}
	f.Detail += fmt.Sprintf(", and its record (%s) places it %s", rec.VMState, orNowhere(rec.Host))
	if why := au.instanceBusy(ctx, d.UUID); why != "" {
		f.Detail += "; " + why
		return f
	}
	if au.res.DryRun {
		f.Detail += "; its operation is over, so it would be cleaned"
		return f
	}
	if rec.VMState == guest.VMBuilding && rec.Host == "" {
		if err := au.a.markBuildFailed(ctx, d.UUID); err != nil {
			f.Detail += fmt.Sprintf("; marking its build failed: %v", err)
			return f
		}
		f.Detail += "; its build marked failed (vm_state error)"
	}
	f.Detail += au.undefineLeftover(ctx, host, d.UUID)
	return f
}

// markBuildFailed marks a record still building as failed, vm_state
// error with no task, as a boot's own compensation leaves it.
func (a *Auditor) markBuildFailed(ctx context.Context, uuid string) error {
	return a.Ledger.SetState(ctx, uuid, ledger.Transition{FromVM: []guest.VMState{guest.VMBuilding}, VM: guest.VMError, Task: guest.TaskNone})
}

// instanceBusy says why a workflow of the instance may still act on its
// domain: one is open, or closed within the grace period; "" when none.
func (au *pass) instanceBusy(ctx context.Context, uuid string) string {
	st, err := au.a.Owners.OwnerStatus(ctx, guest.InstanceWorkflowID(uuid))
	switch {
	case err != nil:
		au.fail("leftover domain of %s: instance workflow: %v", uuid, err)
		return fmt.Sprintf("its workflow could not be read: %v", err)
	case st.State == OwnerRunning:
		return "an operation of the instance is open; left to it"
	}
	if wait := max(au.grace, au.minGrace); wait > 0 && st.State != OwnerNotFound && time.Since(st.Since) < wait {
		return fmt.Sprintf("its operation closed less than %s ago; left for a later audit", wait)
	}
	return ""
}

// undefineLeftover undefines the domain if it is still shut off, and
// says what came of it.
func (au *pass) undefineLeftover(ctx context.Context, host, uuid string) string {
	dom, err := au.a.Driver.Lookup(ctx, host, uuid)
	switch {
	case errors.Is(err, hypervisor.ErrNotFound):
		return "; the domain is gone since"
	case err != nil:
		au.fail("leftover domain of %s: %v", uuid, err)
		return fmt.Sprintf("; not undefined: %v", err)
	case dom.State != hypervisor.StateShutoff:
		return fmt.Sprintf("; not undefined: it is %s now", dom.State)
	}
	// No claim names the domain: it holds no pCPU another guest could
	// lose, and undefining a shut-off domain stops nothing.
	uctx, cancel := context.WithTimeout(hypervisor.Unclaimed(ctx, "a shut-off leftover no claim names"), settleLease/2)
	defer cancel()
	if err := au.a.Driver.Undefine(uctx, host, uuid); err != nil {
		au.fail("leftover domain of %s: undefine: %v", uuid, err)
		return fmt.Sprintf("; not undefined: %v", err)
	}
	return "; undefined"
}

func orNowhere(host string) string {
	if host == "" {
		return "on no host"
	}
	return "on " + host
}
