package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guestxml"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/xmlpatch"
)

// The hypervisor steps that have a compensation (prepare, migrate, spawn,
// offload) heartbeat, so that a workflow's cancel reaches their context
// and the workflow, which waits for them, compensates only once they have
// ended. A step that acts on a claim's pCPUs fences first: it renews the
// claim's fence lease (ledger.Fence) right before it acts, and is refused
// if the claim is gone or was made again. An attempt that outlived its
// workflow (terminated, timed out, partitioned away) therefore cannot
// start a guest or switch a migration over onto pCPUs the audit has freed,
// and the audit cannot free them between the fence and the act.

// DefaultFenceLease is how long a fenced step may take to act after its
// fence unless Activities.FenceLease says otherwise.
const DefaultFenceLease = time.Minute

func (a *Activities) lease() time.Duration {
	if a.FenceLease > 0 {
		return a.FenceLease
	}
	return DefaultFenceLease
}

func fenced(err error) error {
	return temporal.NewNonRetryableApplicationError(fmt.Sprintf("%v: %v", hypervisor.ErrFenced, err), api.ErrTypeFenced, err)
}

// needsClaim refuses a step that acts on pCPUs but names no claim to
// fence on, or not its token: it could not prove that the claim is still
// the one made for it. It refuses before the step does anything.
func needsClaim(step, uuid, claimID, token string) error {
	switch {
	case claimID == "":
		return BadRequest(fmt.Sprintf("%s of instance %s names no claim: a step that acts on pCPUs needs the claim it acts for, to fence on", step, uuid))
	case token == "":
		return BadRequest(fmt.Sprintf("%s of instance %s names claim %s without its token: a step that acts on pCPUs fences with the claim's token", step, uuid, claimID))
	}
	return nil
}

// heartbeating runs step while heartbeating every ProgressEvery, so that a
// cancel of the workflow reaches step's context. Outside an activity (a
// direct call in a test) it just runs step.
func (a *Activities) heartbeating(ctx context.Context, step func(ctx context.Context) error) error {
	if !activity.IsActivity(ctx) {
		return step(ctx)
	}
	done := make(chan error, 1)
	go func() { done <- step(ctx) }()
	// The first heartbeat goes out beside the step, not before it: the
	// step need not wait for its round trip and its write to the history.
	beating(ctx)
	tick := time.NewTicker(a.beat())
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			beating(ctx)
		}
	}
}

// Running is the heartbeat detail of a step that has no progress to
// report. The first heartbeat goes out as the attempt starts: a heartbeat
// timeout with no detail is an attempt no worker received (the workflows'
// lostDispatch).
const Running = "running"

func beating(ctx context.Context) { activity.RecordHeartbeat(ctx, Running) }

func (a *Activities) beat() time.Duration {
	if a.ProgressEvery > 0 {
		return a.ProgressEvery
	}
	return time.Second
}

// PrepareMigration rewrites the guest's domain XML, as the source
// hypervisor has it, for the destination placement, and has the
// destination check it can take the guest. It stages the destination XML
// in the instance's record for the destination claim, where Migrate and
// CommitMigration read it: the document stays out of workflow history.
func (a *Activities) PrepareMigration(ctx context.Context, in PrepareMigrationInput) error {
	if in.DestClaimID == "" {
		return BadRequest(fmt.Sprintf("prepare of instance %s names no destination claim: the destination XML is staged for it", in.UUID))
	}
	return a.heartbeating(ctx, func(ctx context.Context) error {
		dom, err := a.Driver.Lookup(ctx, in.Source, in.UUID)
		if err != nil {
			return classify(err)
		}
		// The guest's devices were unplugged (UnplugDevices): the domain
		// moves without them.
		bare := in.Placement
		bare.Devices = nil
		destXML, err := xmlpatch.Patch(dom.XML, &bare)
		if err != nil {
			return classify(err)
		}
		if err := a.Driver.PrepareMigration(ctx, in.Dest, in.UUID, destXML); err != nil {
			return classify(err)
		}
		staged, err := a.withDestDevices(ctx, in, destXML)
		if err != nil {
			return err
		}
		return a.stage(ctx, in.UUID, in.DestClaimID, staged)
	})
}

// withDestDevices adds to destXML the device elements of the guest's
// devices on the destination: its record's, rewritten for the devices
// the placement takes there. That is the guest's XML once they are
// plugged in after the switchover (PlugDevices reads them from it).
func (a *Activities) withDestDevices(ctx context.Context, in PrepareMigrationInput, destXML string) (string, error) {
	if len(in.Placement.Devices) == 0 {
		return destXML, nil
	}
	var inst *ledger.Instance
	if err := waitLedger(ctx, func(ctx context.Context) (err error) { inst, err = a.Ledger.Instance(ctx, in.UUID); return err }); err != nil {
		return "", classify(err)
	}
	full, err := xmlpatch.Patch(inst.DomainXML, &in.Placement)
	if err != nil {
		return "", classify(err)
	}
	elements, err := deviceElements(full)
	if err != nil {
		return "", classify(err)
	}
	out, err := xmlpatch.WithDevices(destXML, elements)
	return out, classify(err)
}

// withoutDevices is the domain XML a live migration sends: the staged
// one without the devices pinflow passes through, which are plugged in
// once the guest runs on the destination.
func withoutDevices(staged string) (string, error) {
	devs, err := xmlpatch.Devices(staged)
	if err != nil || len(devs) == 0 {
		return staged, classify(err)
	}
	aliases := make([]string, len(devs))
	for i, d := range devs {
		aliases[i] = d.Alias
	}
	out, err := xmlpatch.WithoutDevices(staged, aliases)
	return out, classify(err)
}

// stage keeps xml, made for the instance's claim claimID, in its record
// (ledger.StageDomainXML), waiting out a ledger that does not answer.
func (a *Activities) stage(ctx context.Context, uuid, claimID, xml string) error {
	return classify(waitLedger(ctx, func(ctx context.Context) error { return a.Ledger.StageDomainXML(ctx, uuid, claimID, xml) }))
}

// stagedXML returns the XML staged for the instance's claim claimID.
func (a *Activities) stagedXML(ctx context.Context, uuid, claimID string) (string, error) {
	var xml string
	err := a.heartbeating(ctx, func(ctx context.Context) error {
		return classify(waitLedger(ctx, func(ctx context.Context) (err error) {
			xml, err = a.Ledger.StagedDomainXML(ctx, uuid, claimID)
			return err
		}))
	})
	return xml, err
}

// Migrate live-migrates the guest, heartbeating its progress. A cancel of
// the workflow cancels it through the heartbeat and the driver aborts,
// leaving the guest on its source; a migration past its point of no
// return completes, and its success is the workflow's to commit. The
// driver fences on the destination claim before it starts and before the
// switchover, renewing the lease with every heartbeat.
//
// A worker that stops (a rolling restart) does not abort the migration:
// the attempt ends with a retryable error and the hypervisor goes on, and
// the next attempt, on another worker, follows it to its end.
//
// The migration runs under a.MigrationPolicy. One that a timeout of the
// policy aborts fails with the non-retryable api.ErrTypeMigrationTimeout: the
// guest runs on its source, and the same migration would time out again,
// so the workflow compensates.
func (a *Activities) Migrate(ctx context.Context, in MigrateInput) error {
	if err := needsClaim("migration", in.UUID, in.DestClaimID, in.DestToken); err != nil {
		return err
	}
	// The driver's context ends on a cancel or timeout of this attempt,
	// but not when the worker stops. The migration fences itself on the
	// destination claim (req.Fence).
	driverCtx, abort := context.WithCancel(hypervisor.WithFence(context.WithoutCancel(ctx), in.Dest+"/"+in.DestClaimID))
	defer abort()
	var stopping <-chan struct{}
	if activity.IsActivity(ctx) {
		stopping = activity.GetWorkerStopChannel(ctx)
		beating(ctx)
	}
	staged, err := a.stagedXML(ctx, in.UUID, in.DestClaimID)
	if err != nil {
		return err
	}
	destXML, err := withoutDevices(staged)
	if err != nil {
		return err
	}
	lease := a.claimLease(in.Dest, in.DestClaimID, in.DestToken)
	req := hypervisor.MigrateRequest{UUID: in.UUID, Source: in.Source, Dest: in.Dest, DestXML: destXML, Policy: a.MigrationPolicy,
		Fence: func(ctx context.Context) error {
			_, err := lease.renew(ctx)
			return err
		}}
	// Keep the lease running while the migration does, past the driver's
	// last fence: the audit cannot free the claim under it.
	stopKeeping := lease.keep(driverCtx, a.beat())
	defer stopKeeping()
	progress := make(chan hypervisor.Progress, 1)
	done := make(chan error, 1)
	go func() {
		done <- a.Driver.Migrate(driverCtx, req, func(p hypervisor.Progress) {
			select {
			case <-progress:
			default:
			}
			progress <- p
		})
	}()
	last := hypervisor.Progress{Phase: "starting"}
	tick := time.NewTicker(a.beat())
	defer tick.Stop()
	attempt := ctx
	for {
		select {
		case err := <-done:
			// The migration is over, whichever way: it holds nothing back.
			stopKeeping()
			lease.end(ctx)
			// A fence the ledger refused is final; one that failed for the
			// ledger's silence aborted the migration, and a retry starts it
			// again once the ledger answers.
			if errors.Is(err, hypervisor.ErrFenced) && refused(err) {
				return fenced(err)
			}
			if err != nil && attempt.Err() != nil {
				return attempt.Err()
			}
			return classify(err)
		case <-stopping:
			// Leave the hypervisor to it; the next attempt follows it.
			return handedOver()
		case <-ctx.Done():
			select {
			case <-stopping:
				return handedOver()
			default:
			}
			// Cancelled or timed out: abort, and report what the driver
			// says (a migration past its point of no return completes).
			abort()
			ctx = context.WithoutCancel(ctx)
		case p := <-progress:
			last = p
		case <-tick.C:
			if activity.IsActivity(ctx) {
				activity.RecordHeartbeat(ctx, last)
			}
		}
	}
}

// handedOver is the end of a Migrate attempt whose worker stops: the
// hypervisor goes on with the migration, and the next attempt follows it.
func handedOver() error {
	return temporal.NewApplicationError("the worker is stopping; the migration goes on and the next attempt follows it", api.ErrTypeWorkerStopping)
}

// RollbackMigration undoes a failed or cancelled migration on the
// hypervisors: the guest runs on its source and the destination holds no
// trace of it. It looks first: a guest that runs on the destination only
// completed its migration, and nothing is undone (OnDest); the workflow
// then commits. A running guest is never destroyed to roll back.
func (a *Activities) RollbackMigration(ctx context.Context, in MigrateInput) (RollbackResult, error) {
	var res RollbackResult
	err := a.heartbeating(ctx, func(ctx context.Context) error {
		var err error
		res, err = a.rollback(ctx, in)
		return err
	})
	return res, err
}

func (a *Activities) rollback(ctx context.Context, in MigrateInput) (RollbackResult, error) {
	onDest, err := a.migratedAlready(ctx, in)
	if err != nil || onDest {
		return RollbackResult{OnDest: onDest}, err
	}
	// Under the destination claim, taken for the operation: a migration
	// attempt that outlived this decision switches over in vain.
	f, err := a.fenceDomain(ctx, DomainInput{UUID: in.UUID, Host: in.Dest, ClaimID: in.DestClaimID, Token: in.DestToken, Final: true}, true)
	if err != nil {
		return RollbackResult{}, err
	}
	err = f.do(ctx, func(ctx context.Context) error { return a.Driver.Rollback(ctx, in.Source, in.Dest, in.UUID) })
	if errors.Is(err, hypervisor.ErrNotFound) {
		// The guest is on neither host and no migration of it between them
		// is recorded: it never left, because it was never there (a record
		// that an interrupted operation left behind its guest). There is
		// nothing to roll back.
		return RollbackResult{}, nil
	}
	return RollbackResult{}, classify(err)
}

// migratedAlready says whether the guest runs on the migration's
// destination and not on its source.
func (a *Activities) migratedAlready(ctx context.Context, in MigrateInput) (bool, error) {
	dst, err := a.Driver.Lookup(ctx, in.Dest, in.UUID)
	switch {
	case errors.Is(err, hypervisor.ErrNotFound):
		return false, nil
	case err != nil:
		return false, classify(err)
	case dst.State != hypervisor.StateRunning:
		return false, nil
	}
	src, err := a.Driver.Lookup(ctx, in.Source, in.UUID)
	switch {
	case errors.Is(err, hypervisor.ErrNotFound):
		return true, nil
	case err != nil:
		return false, classify(err)
	}
	return src.State != hypervisor.StateRunning, nil
}

// Offload asks the guest to power itself off, waits up to ShutdownTimeout
// for it, then powers it off for good, keeps its domain XML in its record
// for a later unshelve, and removes it from the host. It takes the
// guest's claim there first, so an attempt whose operation ended changes
// nothing.
func (a *Activities) Offload(ctx context.Context, in DomainInput) error {
	return a.heartbeating(ctx, func(ctx context.Context) error {
		f, err := a.fenceDomain(ctx, in, true)
		if err != nil {
			return err
		}
		if err := a.shutdown(ctx, f, in.Host, in.UUID); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			return classify(err)
		}
		if err := f.do(ctx, func(ctx context.Context) error { return a.Driver.Stop(ctx, in.Host, in.UUID) }); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			return err
		}
		dom, err := a.Driver.Lookup(ctx, in.Host, in.UUID)
		switch {
		case errors.Is(err, hypervisor.ErrNotFound):
			// A retry after the undefine below: the XML is saved already.
			return nil
		case err != nil:
			return classify(err)
		}
		saved, err := a.withRecordDevices(ctx, in.UUID, dom.XML)
		if err != nil {
			return err
		}
		if err := waitLedger(ctx, func(ctx context.Context) error { return a.Ledger.SetDomainXML(ctx, in.UUID, saved) }); err != nil {
			return classify(err)
		}
		return f.do(ctx, func(ctx context.Context) error { return a.Driver.Undefine(ctx, in.Host, in.UUID) })
	})
}

// withRecordDevices is domainXML with the devices of the guest's record
// that it lacks put back: a guest that runs without them (a migration
// stopped between its unplug and its plug) still owns them, and the
// definition kept for its unshelve must pass them through.
func (a *Activities) withRecordDevices(ctx context.Context, uuid, domainXML string) (string, error) {
	var inst *ledger.Instance
	if err := waitLedger(ctx, func(ctx context.Context) (err error) { inst, err = a.Ledger.Instance(ctx, uuid); return err }); err != nil {
		return "", classify(err)
	}
	if inst.DomainXML == "" {
		return domainXML, nil
	}
	elements, err := deviceElements(inst.DomainXML)
	if err != nil || len(elements) == 0 {
		return domainXML, classify(err)
	}
	out, err := xmlpatch.WithDevices(domainXML, elements)
	return out, classify(err)
}

// deviceElements is the text of each device a domain XML passes through.
func deviceElements(domainXML string) ([]string, error) {
	devs, err := xmlpatch.Devices(domainXML)
	if err != nil {
		return nil, err
	}
	elements := make([]string, len(devs))
	for i, d := range devs {
		elements[i] = d.Element
	}
	return elements, nil
}

// shutdown asks the guest to power off (under f) and waits until it has,
// or until ShutdownTimeout has passed; the caller destroys what is still
// running.
func (a *Activities) shutdown(ctx context.Context, f *claimFence, host, uuid string) error {
	if a.ShutdownTimeout <= 0 {
		return nil
	}
	if err := f.do(ctx, func(ctx context.Context) error { return a.Driver.Shutdown(ctx, host, uuid) }); err != nil {
		return err
	}
	deadline := time.Now().Add(a.ShutdownTimeout)
	poll := min(a.ShutdownTimeout/10, 500*time.Millisecond)
	for {
		dom, err := a.Driver.Lookup(ctx, host, uuid)
		if err != nil {
			return err
		}
		if dom.State == hypervisor.StateShutoff || !time.Now().Before(deadline) {
			return nil
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// RestoreDomain runs the guest on its host again after an offload or a
// resize that did not finish, or in a resize's revert: started if it was
// powered off (unless LeaveOff), defined again from its record's domain
// XML if it was removed. The claim it runs on is its resident claim: an
// offload releases it only once done, and a resize holds it. A host an
// operator marked down or returning is refused (api.ErrTypeHostDown): its
// guests are the evacuation's, and one started there may run beside its
// rebuilt copy on the same disks.
func (a *Activities) RestoreDomain(ctx context.Context, in DomainInput) error {
	return a.heartbeating(ctx, func(ctx context.Context) error { return a.restore(ctx, in) })
}

func (a *Activities) restore(ctx context.Context, in DomainInput) error {
	if err := a.takesGuests(ctx, in.Host); err != nil {
		return err
	}
	f, err := a.fenceDomain(ctx, in, false)
	if err != nil {
		return err
	}
	inst, err := a.Ledger.Instance(ctx, in.UUID)
	if err != nil {
		return classify(err)
	}
	define := func(ctx context.Context) error { return a.Driver.Define(ctx, in.Host, inst.DomainXML) }
	dom, err := a.Driver.Lookup(ctx, in.Host, in.UUID)
	switch {
	case errors.Is(err, hypervisor.ErrNotFound):
		if inst.DomainXML == "" {
			return BadState(fmt.Sprintf("instance %s is gone from %s and its record keeps no domain XML to define it again", in.UUID, in.Host))
		}
		if err := f.do(ctx, define); err != nil {
			return err
		}
	case err != nil:
		return classify(err)
	case inst.DomainXML != "" && !samePins(dom.XML, inst.DomainXML):
		// Not the definition the guest runs on here: an attempt of the
		// step being undone that outlived it defined its own (a resize's
		// new flavor, on claims about to be freed). The record's goes
		// back in its place.
		if err := f.do(ctx, func(ctx context.Context) error { return a.Driver.Stop(ctx, in.Host, in.UUID) }); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			return err
		}
		if err := f.do(ctx, define); err != nil {
			return err
		}
	case dom.State == hypervisor.StateRunning:
		return nil
	}
	if in.LeaveOff {
		return nil
	}
	return f.do(ctx, func(ctx context.Context) error { return a.Driver.Start(ctx, in.Host, in.UUID) })
}

// samePins says whether two domain XMLs pin the guest to the same host
// CPUs; one that cannot be read pins it nowhere known, so not the same.
func samePins(x, y string) bool {
	a, err := xmlpatch.Read(x)
	if err != nil {
		return false
	}
	b, err := xmlpatch.Read(y)
	return err == nil && a.HostCPUs().Equal(b.HostCPUs())
}

// takesGuests refuses, as api.ErrTypeHostDown, a host that is down or
// returning: no guest is defined or started there.
func (a *Activities) takesGuests(ctx context.Context, host string) error {
	var st HostStatus
	if err := waitLedger(ctx, func(ctx context.Context) (err error) { st, err = a.Ledger.HostStatus(ctx, host); return err }); err != nil {
		return classify(err)
	}
	if st.State == ledger.HostDown || st.State == ledger.HostReturning {
		return classify(fmt.Errorf("%w: host %s is %s; no guest starts there until it is up", ledger.ErrHostDown, host, st.State))
	}
	return nil
}

// Spawn defines and starts the guest on the host with its domain XML
// patched for the placement: the XML it had when it was shelved, or a new
// one for a boot. It fences on the claim right before each of the two, so
// an attempt whose claim was freed starts nothing. It stages the XML it
// defines for the claim, where Attach reads it.
func (a *Activities) Spawn(ctx context.Context, in SpawnInput) error {
	if err := needsClaim("spawn", in.UUID, in.ClaimID, in.Token); err != nil {
		return err
	}
	return a.heartbeating(ctx, func(ctx context.Context) error {
		var inst *ledger.Instance
		if err := waitLedger(ctx, func(ctx context.Context) (err error) { inst, err = a.Ledger.Instance(ctx, in.UUID); return err }); err != nil {
			return classify(err)
		}
		base := inst.DomainXML
		if base == "" {
			req, err := inst.Request.Request()
			if err != nil {
				return classify(err)
			}
			if base, err = guestxml.New(inst.Name, inst.UUID, req, &in.Placement, a.Domain); err != nil {
				return classify(fmt.Errorf("%w: %v", ledger.ErrInvalid, err))
			}
		}
		xml, err := xmlpatch.Patch(base, &in.Placement)
		if err != nil {
			return classify(err)
		}
		if err := a.stage(ctx, in.UUID, in.ClaimID, xml); err != nil {
			return err
		}
		return a.defineAndStart(ctx, in.Host, in.UUID, xml, in.ClaimID, in.Token, true)
	})
}

// defineAndStart defines the guest on host from xml and, when start is
// set, starts it, fencing on the claim right before each of the two: an
// attempt whose claim was freed defines and starts nothing more.
func (a *Activities) defineAndStart(ctx context.Context, host, uuid, xml, claimID, token string, start bool) error {
	acts := []func(ctx context.Context) error{func(ctx context.Context) error { return a.Driver.Define(ctx, host, xml) }}
	if start {
		acts = append(acts, func(ctx context.Context) error { return a.Driver.Start(ctx, host, uuid) })
	}
	for _, act := range acts {
		// A host marked down is final too (api.ErrTypeHostDown).
		if err := a.act(ctx, host, claimID, token, false, act); err != nil {
			return err
		}
	}
	return nil
}
