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

// DriftStuckBuild: an instance record is building with no domain, and no
// operation of the instance will end its build (SweepBuilding).
const DriftStuckBuild = "stuck-build"

// SweepBuildingInput asks for a sweep of the records stuck in building.
type SweepBuildingInput struct {
	// Grace is how long the instance's workflow must have been closed, as
	// AuditHostInput.Grace; never less than the worker's MinGrace.
	Grace *time.Duration `json:"grace,omitempty"`
	// DryRun reports but marks nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// RecordSweep is what a sweep of the instance records found.
type RecordSweep struct {
	DryRun bool     `json:"dry_run,omitempty"`
	Tally  Tally    `json:"tally"`
	Drift  []Drift  `json:"drift,omitempty"`
	Errors []string `json:"errors,omitempty"`
}

// SweepBuilding finds the instance records still building with no domain
// (on no host, or on a host that has none of them): a boot that stopped
// after it created its record and before its define leaves one, which no
// host's audit reaches. It marks such a record failed (vm_state error, no
// task; see leftover) once the instance's workflow is provably over: closed
// for the grace period, or unknown to Temporal while the record is older
// than the namespace's retention (unseen); anything else is left, in
// doubt, for a later sweep.
func (a *Auditor) SweepBuilding(ctx context.Context, in SweepBuildingInput) (RecordSweep, error) {
	res := RecordSweep{DryRun: in.DryRun}
	wait := max(a.Grace, a.MinGrace)
	if in.Grace != nil {
		if *in.Grace < 0 {
			return res, invalid(fmt.Sprintf("grace %s: must be 0 or more", *in.Grace))
		}
		wait = max(*in.Grace, a.MinGrace)
	}
	if a.Owners == nil {
		return res, errors.New("audit: sweep building records: no owner checker configured")
	}
	insts, err := a.Ledger.Instances(ctx)
	if err != nil {
		return res, err
	}
	sw := &buildSweep{a: a, res: &res, wait: wait}
	for _, inst := range insts {
		if inst.VMState == guest.VMBuilding {
			sw.judge(ctx, inst)
		}
	}
	return res, nil
}

// buildSweep is one sweep's state.
type buildSweep struct {
	a         *Auditor
	res       *RecordSweep
	wait      time.Duration
	retention *time.Duration // the namespace's, read when first needed
}

func (sw *buildSweep) fail(format string, args ...any) {
	sw.res.Errors = append(sw.res.Errors, fmt.Sprintf(format, args...))
	sw.res.Tally.Errors++
}

func (sw *buildSweep) keep(reason string) { sw.res.Tally.Kept.Add(reason, 1) }

// judge marks inst failed when its build is stuck and over.
func (sw *buildSweep) judge(ctx context.Context, inst *ledger.Instance) {
	if inst.Host != "" {
		_, err := sw.a.Driver.Lookup(ctx, inst.Host, inst.UUID)
		switch {
		case err == nil:
			return // the host's audit judges a defined guest
		case !errors.Is(err, hypervisor.ErrNotFound):
			sw.fail("building record %s: its domain on %s: %v", inst.UUID, inst.Host, err)
			return
		}
	}
	f := Drift{Kind: DriftStuckBuild, Instance: inst.UUID,
		Detail: fmt.Sprintf("instance %s is building with no domain %s", inst.UUID, orNowhere(inst.Host))}
	why, err := sw.busy(ctx, inst)
	switch {
	case err != nil:
		sw.fail("building record %s: %v", inst.UUID, err)
		return
	case why != "":
		sw.keep(why)
		return
	case sw.res.DryRun:
		f.Detail += "; its operation is over, so its build would be marked failed"
	default:
		if err := sw.a.markBuildFailed(ctx, inst.UUID); err != nil {
			sw.fail("building record %s: marking its build failed: %v", inst.UUID, err)
			return
		}
		f.Detail += "; its operation is over: its build marked failed (vm_state error)"
	}
	sw.res.Drift = append(sw.res.Drift, f)
	sw.res.Tally.Drift.Add(DriftStuckBuild, 1)
}

// busy says why the instance's workflow may still end the build itself,
// as the host audit's rules for a claim's owner (decide, unseen): open,
// closed within the grace, or unknown while the record is younger than
// the namespace's retention; "" when none.
func (sw *buildSweep) busy(ctx context.Context, inst *ledger.Instance) (string, error) {
	st, err := sw.a.Owners.OwnerStatus(ctx, guest.InstanceWorkflowID(inst.UUID))
	if err != nil {
		return "", fmt.Errorf("instance workflow: %w", err)
	}
	switch st.State {
	case OwnerRunning:
		return KeptInstanceBusy, nil
	case OwnerNotFound:
		if sw.retention == nil {
			d, err := sw.a.Owners.Retention(ctx)
			if err != nil {
				return "", fmt.Errorf("retention: %w", err)
			}
			sw.retention = &d
		}
		// The record's last change bounds when its workflow ran: it would
		// be known still, had it run here within the retention.
		if time.Since(inst.UpdatedAt) <= *sw.retention {
			return KeptOwnerUnseen, nil
		}
	default:
		if time.Since(st.Since) < sw.wait {
			return KeptRecentlyClosed, nil
		}
	}
	return "", nil
}
