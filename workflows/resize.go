package workflows

import (
	"fmt"
	"maps"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
)

// Resize changes a guest's flavor, or with no new flavor cold-migrates
// it. It claims the new placement on the destination while the guest's
// resident claim becomes a source hold of this operation, powers the
// guest off, moves its definition (the new flavor's domain XML, pinned
// to the new claim; disks are on shared storage) and starts it there.
// Then it waits in VERIFY_RESIZE with both claims held, for a confirm
// (the source hold is freed), a revert (the destination is stopped and
// freed, and the hold becomes the resident claim again: the same pCPUs,
// never re-fitted) or its confirm window. A cancel in VERIFY_RESIZE
// reverts. Any failure before the guest runs on the destination
// compensates: the guest runs on its source as before.
func Resize(ctx workflow.Context, in api.ResizeInput) (*api.ResizeResult, error) {
	op := api.OpResize
	if in.Flavor == nil {
		op = api.OpColdMigration
	}
	s, err := newSaga(ctx, op, in.UUID, 9)
	if err != nil {
		return nil, err
	}
	give, err := s.holdBudget(ctx, in.UUID, false)
	if err != nil {
		return nil, s.fail(err)
	}
	defer give()
	return s.resize(ctx, in)
}

// resize runs a resize or cold migration on the saga s (a Resize, or a
// LiveMigration falling back to a cold one).
func (s *saga) resize(ctx workflow.Context, in api.ResizeInput) (*api.ResizeResult, error) {
	r := &resizing{move: move{saga: s, uuid: in.UUID, reservation: in.Reservation, kind: ledger.KindResizeDest}, in: in,
		cold: s.status.Operation == api.OpColdMigration}
	if err := r.takeDecisions(ctx); err != nil {
		return nil, err
	}
	err := s.run(ctx,
		r.checkInstance,
		r.chooseDestination,
		r.taskState(guest.TaskResizePrep),
		s.undo("forget the resize", r.forget), r.recordSource,
		r.claimDestination,
		s.undo("make the source hold resident again", r.unholdSource), r.holdSource,
		r.powerOff,
		s.undo("remove the guest from the destination", r.removeFromDestination), r.moveToDestination,
	)
	if err != nil {
		return nil, s.fail(err)
	}
	// The guest runs on its new claim: the move is done, and only a
	// revert, which has its own steps, takes it back.
	verifyCtx := ctx
	ctx = s.commit(ctx)
	if err := r.commitDestination(ctx); err != nil {
		return nil, s.fail(err)
	}
	auto, err := r.awaitDecision(ctx, verifyCtx)
	if err != nil {
		return nil, s.fail(err)
	}
	var res *api.ResizeResult
	if r.decision == api.DecisionRevert {
		res, err = r.revert(ctx)
	} else {
		res, err = r.confirm(ctx, auto)
	}
	if err != nil {
		return nil, s.fail(err)
	}
	s.step()
	s.phase(api.PhaseCompleted, res.Outcome)
	return res, nil
}

// resizing is a resize's or cold migration's state, shared by its steps.
type resizing struct {
	move
	in   api.ResizeInput
	cold bool
	// source is the guest's resident claim, which the operation holds
	// while the guest moves.
	source activities.ClaimRef
	// vmState is the guest's, active or stopped, on either host.
	vmState guest.VMState
	// resident says an undo made the source hold resident already.
	resident bool
	// decision is the confirm or revert the Update asked for.
	decision string
}

// takeDecisions accepts the Update that confirms or reverts the resize.
func (r *resizing) takeDecisions(ctx workflow.Context) error {
	return workflow.SetUpdateHandlerWithOptions(ctx, api.ResizeDecisionUpdate,
		func(ctx workflow.Context, d string) (string, error) {
			r.decision = d
			return d, nil
		},
		workflow.UpdateHandlerOptions{Validator: func(ctx workflow.Context, d string) error {
			return r.decisionAllowed(d)
		}},
	)
}

// checkInstance loads the guest's record and refuses a guest that cannot
// be resized, the flavor it has or, for a cold migration, its own host.
func (r *resizing) checkInstance(ctx workflow.Context) (err error) {
	if r.inst, err = r.loadInstance(ctx, r.uuid, activities.InstanceInfo.CanResize); err != nil {
		return err
	}
	r.src, r.flavor = r.inst.Host, r.inst.Flavor
	if r.dst, err = reservedDest(r.in.Dest, r.reservation); err != nil {
		return err
	}
	if f := r.in.Flavor; f != nil {
		if sameFlavor(*f, r.flavor) {
			return activities.BadRequest(fmt.Sprintf("instance %s has that flavor already (%d vCPUs, %d MiB); a resize needs another", r.uuid, r.flavor.VCPUs, r.flavor.MemoryMB))
		}
		r.flavor = *f
	}
	if r.cold && r.dst == r.src {
		return activities.BadRequest(fmt.Sprintf("instance %s already runs on %s; a cold migration needs another host", r.uuid, r.src))
	}
	r.source = activities.ClaimRef{Host: r.src, ClaimID: r.inst.ClaimID}
	r.vmState = guest.VMStopped
	if r.inst.VMState == guest.VMActive {
		r.vmState = guest.VMActive
	}
	r.setHosts(r.src, r.dst)
	r.step()
	return nil
}

// chooseDestination has pinflow choose the destination when the input
// names none: for a resize, the guest's own host too.
func (r *resizing) chooseDestination(ctx workflow.Context) error {
	r.phase(api.PhaseScheduling, "choosing the destination")
	r.chosen = r.dst == ""
	r.choose = activities.ChooseHostInput{UUID: r.uuid, Flavor: r.flavor}
	if r.cold {
		r.choose.Exclude = []string{r.src}
	}
	if r.chosen {
		if err := r.ledger(ctx, "choose a destination host", a.ChooseHost, r.choose).Get(ctx, &r.dst); err != nil {
			return err
		}
	}
	r.setHosts(r.src, r.dst)
	return nil
}

// recordSource records in the guest's record where it comes from and
// its new flavor.
func (r *resizing) recordSource(ctx workflow.Context) error {
	begin := activities.BeginResizeInput{UUID: r.uuid, NewFlavor: r.flavor, Cold: r.cold}
	if err := r.ledger(ctx, "record where the guest comes from", a.BeginResize, begin).Get(ctx, nil); err != nil {
		return err
	}
	r.step()
	return nil
}

func (r *resizing) forget(ctx workflow.Context) error {
	return r.ledger(ctx, "forget the resize", a.EndResize, r.uuid).Get(ctx, nil)
}

// holdSource makes the guest's resident claim a hold of the operation,
// kept for a revert while the guest runs on the destination.
func (r *resizing) holdSource(ctx workflow.Context) error {
	if err := r.ledger(ctx, "hold the source claim on "+r.src, a.HoldClaim, r.source).Get(ctx, nil); err != nil {
		return err
	}
	r.step()
	return nil
}

func (r *resizing) unholdSource(ctx workflow.Context) error {
	if r.resident {
		return nil
	}
	return r.ledger(ctx, "unhold claim on "+r.src, a.UnholdClaim, r.source).Get(ctx, nil)
}

// powerOff powers the guest off on its source, where it runs again if
// the operation fails.
func (r *resizing) powerOff(ctx workflow.Context) error {
	r.phase(api.PhasePoweringOff, "powering the guest off on "+r.src)
	if err := r.setTask(ctx, r.uuid, guest.TaskResizeMigrating); err != nil {
		return err
	}
	r.onFailure("run the guest on its source again", func(ctx workflow.Context) error {
		return restoreOrLeave(ctx, r.saga, r.srcDom(true))
	})
	if err := r.hypervisorTry(ctx, "power off the guest on "+r.src, nil, a.PowerOff, r.srcDom(false)); err != nil {
		return err
	}
	r.step()
	return nil
}

// moveToDestination defines the guest on the destination, with the new
// flavor's domain XML pinned to its claim there, and starts it if it ran.
func (r *resizing) moveToDestination(ctx workflow.Context) error {
	r.phase(api.PhaseSpawning, "moving the guest to "+r.dst)
	in := activities.MoveResizedInput{UUID: r.uuid, Source: r.src, Dest: r.dst, ClaimID: r.destClaim, Token: r.claimed.Token, SourceToken: r.inst.ClaimToken,
		Placement: r.claimed.Placement, Start: r.vmState == guest.VMActive}
	if err := r.hypervisorTry(ctx, "move the guest to "+r.dst, nil, a.MoveResized, in); err != nil {
		return err
	}
	r.step()
	return nil
}

func (r *resizing) removeFromDestination(ctx workflow.Context) error {
	// The guest's way back comes first: with no hold to go back to, its
	// copy on the destination is all it has.
	if err := r.secureHold(ctx); err != nil {
		return err
	}
	r.resident = true
	return workflow.ExecuteActivity(r.hypervisorStep(ctx, "destroy the domain on "+r.dst), a.DestroyDomain, r.destDom()).Get(ctx, nil)
}

// commitDestination makes the destination claim the guest's resident
// claim; the source hold stays for a revert.
func (r *resizing) commitDestination(ctx workflow.Context) error {
	r.phase(api.PhaseCommitting, "making the destination claim resident")
	if err := r.setTask(ctx, r.uuid, guest.TaskResizeFinish); err != nil {
		return err
	}
	finish := activities.FinishResizeInput{UUID: r.uuid, Dest: r.dst, DestClaimID: r.destClaim}
	if err := r.ledger(ctx, "commit the destination", a.FinishResize, finish).Get(ctx, nil); err != nil {
		return err
	}
	r.step()
	return nil
}

// awaitDecision waits in VERIFY_RESIZE for a confirm or a revert, until
// the confirm window ends (auto) or, when verifyCtx is cancelled, reverts.
func (r *resizing) awaitDecision(ctx, verifyCtx workflow.Context) (auto bool, err error) {
	window := r.in.ConfirmWindow
	if window == 0 {
		window = api.DefaultConfirmWindow
	}
	if window > 0 && !r.in.AutoConfirm {
		r.status.ConfirmBy = workflow.Now(ctx).Add(window)
	}
	r.phase(api.PhaseVerifyResize, verifyDetail(r.src, r.dst, window))
	defer func() { r.status.ConfirmBy = time.Time{} }()
	decided := func() bool { return r.decision != "" || verifyCtx.Err() != nil }
	switch {
	case r.in.AutoConfirm:
		auto = true
	case window < 0:
		err = workflow.Await(ctx, decided)
	default:
		var ok bool
		ok, err = workflow.AwaitWithTimeout(ctx, window, decided)
		auto = !ok
	}
	if err == nil && r.decision == "" && verifyCtx.Err() != nil {
		r.decision = api.DecisionRevert
	}
	return auto, err
}

// confirm frees the source hold: the guest stays on the destination.
func (r *resizing) confirm(ctx workflow.Context, auto bool) (*api.ResizeResult, error) {
	r.phase(api.PhaseConfirming, "freeing the source hold on "+r.src)
	if err := r.setTask(ctx, r.uuid, guest.TaskResizeConfirming); err != nil {
		return nil, err
	}
	confirm := activities.ConfirmResizeInput{UUID: r.uuid, Source: r.src, SourceClaimID: r.inst.ClaimID, VMState: r.vmState}
	if err := r.ledger(ctx, "free the source hold on "+r.src, a.ConfirmResize, confirm).Get(ctx, nil); err != nil {
		return nil, err
	}
	outcome := "confirmed"
	if auto {
		outcome = "auto-confirmed"
	}
	return &api.ResizeResult{UUID: r.uuid, Source: r.src, Dest: r.dst, Host: r.dst, Placement: &r.claimed.Placement, Outcome: outcome}, nil
}

// revert takes the guest back to its source: the hold becomes the
// resident claim and the record points at it with the old flavor, then
// the destination guest goes (the disks are shared: it must never run
// beside the source), the guest runs on its source pins, and only then
// is the destination claim freed. A hold that cannot become resident
// (gone, or its host down or returning) stops the revert before anything
// is destroyed: the guest keeps running on its destination
// (keepDestination).
func (r *resizing) revert(ctx workflow.Context) (*api.ResizeResult, error) {
	r.phase(api.PhaseReverting, "stopping the guest on "+r.dst+" and running it on "+r.src+" again")
	if err := r.setTask(ctx, r.uuid, guest.TaskResizeReverting); err != nil {
		return nil, err
	}
	if err := r.reinstateHold(ctx); err != nil {
		if isType(err, api.ErrTypeHostDown, api.ErrTypeBadState) {
			return nil, r.keepDestination(ctx, "revert refused", err)
		}
		return nil, err
	}
	if err := workflow.ExecuteActivity(r.hypervisorStep(ctx, "destroy the domain on "+r.dst), a.DestroyDomain, r.destDom()).Get(ctx, nil); err != nil {
		return nil, err
	}
	if err := workflow.ExecuteActivity(r.hypervisorStep(ctx, "run the guest on "+r.src), a.RestoreDomain, r.srcDom(true)).Get(ctx, nil); err != nil {
		return nil, err
	}
	if err := r.ledger(ctx, "release claim on "+r.dst, a.ReleaseClaim,
		activities.ReleaseInput{Host: r.dst, ClaimID: r.destClaim}).Get(ctx, nil); err != nil {
		return nil, err
	}
	if r.keepsResize(ctx) {
		if err := r.forget(ctx); err != nil {
			return nil, err
		}
	}
	if err := r.endTask(ctx, r.uuid, r.vmState); err != nil {
		return nil, err
	}
	return &api.ResizeResult{UUID: r.uuid, Source: r.src, Dest: r.dst, Host: r.src, Placement: r.inst.Placement, Outcome: "reverted"}, nil
}

// reinstateHold makes the source hold the resident claim again, and
// points the record at it with the old flavor. The record keeps the
// resize info until the revert or undo forgets it, after the guest's copy
// on the destination is gone.
func (r *resizing) reinstateHold(ctx workflow.Context) error {
	back := activities.RevertRecordInput{UUID: r.uuid, Source: r.source.Host, SourceClaimID: r.source.ClaimID, KeepResize: r.keepsResize(ctx)}
	return r.ledger(ctx, "make the source hold resident", a.RevertRecord, back).Get(ctx, nil)
}

// keepsResize says whether the run keeps the resize info through its
// revert (changeRevertKeepsResize); a run that began before it forgets
// it as the record goes back to the source.
func (r *resizing) keepsResize(ctx workflow.Context) bool {
	return workflow.GetVersion(ctx, changeRevertKeepsResize, workflow.DefaultVersion, 1) == 1
}

// secureHold makes the source hold resident again before an undo
// destroys the guest's copy on the destination (the undo of a move that
// has not committed). A hold that is gone, or whose host is down or
// returning, keeps that copy instead: the move is committed (KeepMoved,
// which refuses when the move defined no domain there) and the resize
// ends on the destination (keepDestination). Either refusal stops the
// undo and says where the guest is.
func (r *resizing) secureHold(ctx workflow.Context) error {
	err := r.reinstateHold(ctx)
	if !isType(err, api.ErrTypeHostDown, api.ErrTypeBadState) {
		return err
	}
	keep := activities.FinishResizeInput{UUID: r.uuid, Dest: r.dst, DestClaimID: r.destClaim}
	if kept := workflow.ExecuteActivity(r.hypervisorStep(ctx, "keep the guest on "+r.dst), a.KeepMoved, keep).Get(ctx, nil); kept != nil {
		return activities.BadState(fmt.Sprintf("undo stopped: %s; instance %s runs on neither host: its copy on %s cannot be kept (%s)",
			appMessage(err), r.uuid, r.dst, appMessage(kept)))
	}
	return ended{r.keepDestination(ctx, "undo stopped", err)}
}

// keepDestination ends a resize whose revert or undo (what) cannot have
// its source hold back (why): the guest keeps running on the destination,
// its record forgets the resize and takes its state from before it, and
// the hold, when its host is down or returning, becomes a tombstone that
// host up clears with whatever the host kept of the guest. It returns the
// refusal, which says where the guest runs.
func (r *resizing) keepDestination(ctx workflow.Context, what string, why error) error {
	srcDown := isType(why, api.ErrTypeHostDown)
	if srcDown {
		if err := r.ledger(ctx, "tombstone the hold on "+r.src, a.TombstoneClaim, r.source).Get(ctx, nil); err != nil {
			return err
		}
	}
	if err := r.forget(ctx); err != nil {
		return err
	}
	if err := r.endTask(ctx, r.uuid, r.vmState); err != nil {
		return err
	}
	msg := fmt.Sprintf("%s: %s; instance %s keeps running on %s and its resize is over", what, appMessage(why), r.uuid, r.dst)
	if srcDown {
		msg += fmt.Sprintf("; its hold on %s is a tombstone that 'pinflow host up %s' clears", r.src, r.src)
	}
	return activities.BadState(msg)
}

// srcDom is the guest on its source, under its source hold; final for
// the steps that keep it there (a compensation, a revert).
func (r *resizing) srcDom(final bool) activities.DomainInput {
	return activities.DomainInput{UUID: r.uuid, Host: r.src, ClaimID: r.inst.ClaimID, Token: r.inst.ClaimToken, Final: final,
		LeaveOff: r.vmState != guest.VMActive}
}

// destDom is the guest on its destination, under the claim the resize
// made there, for the steps that tear it down.
func (r *resizing) destDom() activities.DomainInput {
	return activities.DomainInput{UUID: r.uuid, Host: r.dst, ClaimID: r.destClaim, Token: r.claimed.Token, Final: true}
}

// restoreOrLeave runs the guest on its host again (a compensation), or
// leaves it off there when the host is down or returning: its guests are
// then the evacuation's, and the record still names the host.
func restoreOrLeave(ctx workflow.Context, s *saga, dom activities.DomainInput) error {
	err := workflow.ExecuteActivity(s.hypervisorStep(ctx, "run the guest on "+dom.Host+" again"), a.RestoreDomain, dom).Get(ctx, nil)
	if isType(err, api.ErrTypeHostDown) {
		return nil
	}
	return err
}

// decisionAllowed says why a confirm or revert is refused now, or nil.
func (r *resizing) decisionAllowed(d string) error {
	if d != api.DecisionConfirm && d != api.DecisionRevert {
		return fmt.Errorf("decision %q: allowed are %s or %s", d, api.DecisionConfirm, api.DecisionRevert)
	}
	if r.decision != "" {
		return fmt.Errorf("the %s of instance %s is being %sed already", r.status.Operation, r.status.Instance, r.decision)
	}
	if r.status.Phase != api.PhaseVerifyResize {
		return fmt.Errorf("the %s of instance %s is %s, not awaiting confirmation (VERIFY_RESIZE)", r.status.Operation, r.status.Instance, r.status.Phase)
	}
	return nil
}

func verifyDetail(src, dst string, window time.Duration) string {
	d := fmt.Sprintf("VERIFY_RESIZE: the guest runs on %s and its source hold on %s is kept; confirm or revert", dst, src)
	if window > 0 {
		d += fmt.Sprintf(" (confirmed by itself after %s)", window)
	}
	return d
}

// sameFlavor says whether two flavors ask for the same guest. Comparing
// two maps does not depend on their order: it is deterministic.
//
//workflowcheck:ignore
func sameFlavor(x, y guest.Flavor) bool {
	return x.VCPUs == y.VCPUs && x.MemoryMB == y.MemoryMB && maps.Equal(x.ExtraSpecs, y.ExtraSpecs) && maps.Equal(x.ImageProps, y.ImageProps)
}
