package workflows

import (
	"fmt"
	"maps"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// DefaultConfirmWindow is how long a resize waits in VERIFY_RESIZE for a
// confirm or a revert before it confirms itself: it bounds how long a
// guest holds pCPUs on two hosts. (Nova's resize_confirm_window is off
// by default, so its holds last until someone acts.)
const DefaultConfirmWindow = time.Hour

// ResizeDecisionUpdate is the Update that confirms or reverts a resize in
// VERIFY_RESIZE; its argument is DecisionConfirm or DecisionRevert.
const ResizeDecisionUpdate = "resize-decision"

// A resize's decisions.
const (
	DecisionConfirm = "confirm"
	DecisionRevert  = "revert"
)

// ResizeInput names the guest, its new flavor and, optionally, where.
type ResizeInput struct {
	UUID string `json:"uuid"`
	// Flavor is the new flavor; nil is a cold migration, which keeps the
	// guest's flavor and moves it to another host.
	Flavor *guest.Flavor `json:"flavor,omitempty"`
	// Dest is where to; empty lets pinflow choose (for a resize, the
	// guest's own host too, when it can hold both placements at once).
	Dest string `json:"dest,omitempty"`
	// ConfirmWindow is how long VERIFY_RESIZE waits before confirming by
	// itself: 0 takes DefaultConfirmWindow, a negative one waits for an
	// operator however long it takes.
	ConfirmWindow time.Duration `json:"confirm_window,omitempty"`
	// AutoConfirm confirms as soon as the guest runs on its destination,
	// with no VERIFY_RESIZE wait: a drain's cold migrations.
	AutoConfirm bool `json:"auto_confirm,omitempty"`
	// Reservation is a drain's claim for the guest on its destination,
	// which the operation adopts instead of claiming; Dest is its host.
	Reservation *activities.Reservation `json:"reservation,omitempty"`
}

// ResizeResult says where the guest ended and how the resize ended.
type ResizeResult struct {
	UUID      string          `json:"uuid"`
	Source    string          `json:"source"`
	Dest      string          `json:"dest"`
	Host      string          `json:"host"`
	Placement *numa.Placement `json:"placement"`
	// Outcome is confirmed, auto-confirmed or reverted.
	Outcome string `json:"outcome"`
}

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
func Resize(ctx workflow.Context, in ResizeInput) (*ResizeResult, error) {
	op := OpResize
	if in.Flavor == nil {
		op = OpColdMigration
	}
	s, err := newSaga(ctx, op, in.UUID, 9)
	if err != nil {
		return nil, err
	}
	return s.resize(ctx, in)
}

// resize runs a resize or cold migration on the saga s (a Resize, or a
// LiveMigration falling back to a cold one).
func (s *saga) resize(ctx workflow.Context, in ResizeInput) (*ResizeResult, error) {
	op := s.status.Operation
	decision := ""
	if err := workflow.SetUpdateHandlerWithOptions(ctx, ResizeDecisionUpdate,
		func(ctx workflow.Context, d string) (string, error) {
			decision = d
			return d, nil
		},
		workflow.UpdateHandlerOptions{Validator: func(ctx workflow.Context, d string) error {
			return s.decisionAllowed(d, decision)
		}},
	); err != nil {
		return nil, err
	}

	inst, err := s.loadInstance(ctx, in.UUID, activities.InstanceInfo.CanResize)
	if err != nil {
		return nil, s.fail(err)
	}
	flavor, src := inst.Flavor, inst.Host
	dst, err := reservedDest(in.Dest, in.Reservation)
	if err != nil {
		return nil, s.fail(err)
	}
	if in.Flavor != nil {
		if sameFlavor(*in.Flavor, inst.Flavor) {
			return nil, s.fail(activities.BadRequest(fmt.Sprintf("instance %s has that flavor already (%d vCPUs, %d MiB); a resize needs another", in.UUID, inst.Flavor.VCPUs, inst.Flavor.MemoryMB)))
		}
		flavor = *in.Flavor
	}
	if op == OpColdMigration && dst == src {
		return nil, s.fail(activities.BadRequest(fmt.Sprintf("instance %s already runs on %s; a cold migration needs another host", in.UUID, src)))
	}
	wasActive := inst.VMState == guest.VMActive
	s.setHosts(src, dst)
	s.step()

	s.phase(PhaseScheduling, "choosing the destination")
	chosen := dst == ""
	choose := activities.ChooseHostInput{UUID: in.UUID, Flavor: flavor}
	if op == OpColdMigration {
		choose.Exclude = []string{src}
	}
	if chosen {
		if err := s.ledger(ctx, "choose a destination host", a.ChooseHost, choose).Get(ctx, &dst); err != nil {
			return nil, s.fail(err)
		}
	}
	s.setHosts(src, dst)

	if err := s.startTask(ctx, in.UUID, guest.TaskResizePrep); err != nil {
		return nil, s.fail(err)
	}
	s.onFailure("forget the resize", func(ctx workflow.Context) error {
		return s.ledger(ctx, "forget the resize", a.EndResize, in.UUID).Get(ctx, nil)
	})
	begin := activities.BeginResizeInput{UUID: in.UUID, NewFlavor: flavor, Cold: op == OpColdMigration}
	if err := s.ledger(ctx, "record where the guest comes from", a.BeginResize, begin).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.step()

	claimIn := activities.ClaimInput{Host: dst, UUID: in.UUID, Kind: ledger.KindResizeDest, Owner: owner(ctx), Flavor: flavor}
	claim, err := s.claimMoveDest(ctx, src, &claimIn, in.Reservation, chosen, choose)
	if err != nil {
		return nil, s.fail(err)
	}
	dst, destClaim := claimIn.Host, claimIn.ClaimID
	s.step()
	s.phase(PhaseAccepted, "destination CPUs claimed: "+claim.Placement.String())

	source := activities.ClaimRef{Host: src, ClaimID: inst.ClaimID}
	resident := false // the undo made the hold resident already
	s.onFailure("make the source hold resident again", func(ctx workflow.Context) error {
		if resident {
			return nil
		}
		return s.ledger(ctx, "unhold claim on "+src, a.UnholdClaim, source).Get(ctx, nil)
	})
	if err := s.ledger(ctx, "hold the source claim on "+src, a.HoldClaim, source).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.step()

	s.phase(PhasePoweringOff, "powering the guest off on "+src)
	if err := s.setTask(ctx, in.UUID, guest.TaskResizeMigrating); err != nil {
		return nil, s.fail(err)
	}
	srcDom := activities.DomainInput{UUID: in.UUID, Host: src, LeaveOff: !wasActive}
	s.onFailure("run the guest on its source again", func(ctx workflow.Context) error {
		return restoreOrLeave(ctx, s, srcDom)
	})
	if err := workflow.ExecuteActivity(s.hypervisorTry(ctx, "power off the guest on "+src), a.PowerOff, srcDom).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.step()

	s.phase(PhaseSpawning, "moving the guest to "+dst)
	destDom := activities.DomainInput{UUID: in.UUID, Host: dst}
	vmState := guest.VMActive
	if !wasActive {
		vmState = guest.VMStopped
	}
	s.onFailure("remove the guest from the destination", func(ctx workflow.Context) error {
		// The guest's way back comes first: with no hold to go back to,
		// its copy on the destination is all it has.
		move := activities.FinishResizeInput{UUID: in.UUID, Dest: dst, DestClaimID: destClaim}
		if err := secureHold(ctx, s, in.UUID, source, move, vmState); err != nil {
			return err
		}
		resident = true
		return workflow.ExecuteActivity(s.hypervisorStep(ctx, "destroy the domain on "+dst), a.DestroyDomain, destDom).Get(ctx, nil)
	})
	move := activities.MoveResizedInput{UUID: in.UUID, Source: src, Dest: dst, ClaimID: destClaim, Token: claim.Token,
		Placement: claim.Placement, Start: wasActive}
	if err := workflow.ExecuteActivity(s.hypervisorTry(ctx, "move the guest to "+dst), a.MoveResized, move).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.step()

	// The guest runs on its new claim: the move is done, and only a
	// revert, which has its own steps, takes it back.
	verifyCtx := ctx
	ctx = s.commit(ctx)
	s.phase(PhaseCommitting, "making the destination claim resident")
	if err := s.setTask(ctx, in.UUID, guest.TaskResizeFinish); err != nil {
		return nil, s.fail(err)
	}
	finish := activities.FinishResizeInput{UUID: in.UUID, Dest: dst, DestClaimID: destClaim}
	if err := s.ledger(ctx, "commit the destination", a.FinishResize, finish).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.step()

	window := in.ConfirmWindow
	if window == 0 {
		window = DefaultConfirmWindow
	}
	s.phase(PhaseVerifyResize, verifyDetail(src, dst, window))
	decided := func() bool { return decision != "" || verifyCtx.Err() != nil }
	auto := false
	switch {
	case in.AutoConfirm:
		auto = true
	case window < 0:
		err = workflow.Await(ctx, decided)
	default:
		var ok bool
		ok, err = workflow.AwaitWithTimeout(ctx, window, decided)
		auto = !ok
	}
	if err != nil {
		return nil, s.fail(err)
	}
	if decision == "" && verifyCtx.Err() != nil {
		decision = DecisionRevert
	}
	res := &ResizeResult{UUID: in.UUID, Source: src, Dest: dst}
	if decision == DecisionRevert {
		s.phase(PhaseReverting, "stopping the guest on "+dst+" and running it on "+src+" again")
		if err := revertResize(ctx, s, in.UUID, source, destDom, srcDom, destClaim, vmState); err != nil {
			return nil, s.fail(err)
		}
		res.Host, res.Placement, res.Outcome = src, inst.Placement, "reverted"
	} else {
		s.phase(PhaseConfirming, "freeing the source hold on "+src)
		if err := s.setTask(ctx, in.UUID, guest.TaskResizeConfirming); err != nil {
			return nil, s.fail(err)
		}
		confirm := activities.ConfirmResizeInput{UUID: in.UUID, Source: src, SourceClaimID: inst.ClaimID, VMState: vmState}
		if err := s.ledger(ctx, "free the source hold on "+src, a.ConfirmResize, confirm).Get(ctx, nil); err != nil {
			return nil, s.fail(err)
		}
		res.Host, res.Placement, res.Outcome = dst, &claim.Placement, "confirmed"
		if auto {
			res.Outcome = "auto-confirmed"
		}
	}
	s.step()
	s.phase(PhaseCompleted, res.Outcome)
	return res, nil
}

// revertResize takes a resized guest back to its source: the hold
// becomes the resident claim and the record points at it with the old
// flavor, then the destination guest goes (the disks are shared: it must
// never run beside the source), the guest runs on its source pins, and
// only then is the destination claim freed. A hold that cannot become
// resident (gone, or its host down or returning) stops the revert before
// anything is destroyed: the guest keeps running on its destination
// (keepDestination).
func revertResize(ctx workflow.Context, s *saga, uuid string, source activities.ClaimRef, destDom, srcDom activities.DomainInput,
	destClaim string, vmState guest.VMState) error {
	if err := s.setTask(ctx, uuid, guest.TaskResizeReverting); err != nil {
		return err
	}
	back := activities.RevertRecordInput{UUID: uuid, Source: source.Host, SourceClaimID: source.ClaimID}
	if err := s.ledger(ctx, "make the source hold resident", a.RevertRecord, back).Get(ctx, nil); err != nil {
		if isType(err, activities.ErrTypeHostDown, activities.ErrTypeBadState) {
			return keepDestination(ctx, s, "revert refused", uuid, source, destDom.Host, vmState, err)
		}
		return err
	}
	if err := workflow.ExecuteActivity(s.hypervisorStep(ctx, "destroy the domain on "+destDom.Host), a.DestroyDomain, destDom).Get(ctx, nil); err != nil {
		return err
	}
	if err := workflow.ExecuteActivity(s.hypervisorStep(ctx, "run the guest on "+srcDom.Host), a.RestoreDomain, srcDom).Get(ctx, nil); err != nil {
		return err
	}
	if err := s.ledger(ctx, "release claim on "+destDom.Host, a.ReleaseClaim,
		activities.ReleaseInput{Host: destDom.Host, ClaimID: destClaim}).Get(ctx, nil); err != nil {
		return err
	}
	return s.endTask(ctx, uuid, vmState)
}

// secureHold makes a resize's source hold resident again before its undo
// destroys the guest's copy on move.Dest (the undo of a move that has not
// committed). A hold that is gone, or whose host is down or returning,
// keeps that copy instead: the move is committed (KeepMoved, which
// refuses when the move defined no domain there) and the resize ends on
// the destination (keepDestination). Either refusal stops the undo and
// says where the guest is.
func secureHold(ctx workflow.Context, s *saga, uuid string, source activities.ClaimRef, move activities.FinishResizeInput, vmState guest.VMState) error {
	back := activities.RevertRecordInput{UUID: uuid, Source: source.Host, SourceClaimID: source.ClaimID}
	err := s.ledger(ctx, "make the source hold resident", a.RevertRecord, back).Get(ctx, nil)
	if !isType(err, activities.ErrTypeHostDown, activities.ErrTypeBadState) {
		return err
	}
	if kept := workflow.ExecuteActivity(s.hypervisorStep(ctx, "keep the guest on "+move.Dest), a.KeepMoved, move).Get(ctx, nil); kept != nil {
		return activities.BadState(fmt.Sprintf("undo stopped: %s; instance %s runs on neither host: its copy on %s cannot be kept (%s)",
			appMessage(err), uuid, move.Dest, appMessage(kept)))
	}
	return ended{keepDestination(ctx, s, "undo stopped", uuid, source, move.Dest, vmState, err)}
}

// keepDestination ends a resize whose revert or undo (what) cannot have
// its source hold back (why): the guest keeps running on dest, its record
// forgets the resize and takes its state from before it, and the hold,
// when its host is down or returning, becomes a tombstone that host up
// clears with whatever the host kept of the guest. It returns the
// refusal, which says where the guest runs.
func keepDestination(ctx workflow.Context, s *saga, what, uuid string, source activities.ClaimRef, dest string, vmState guest.VMState, why error) error {
	srcDown := isType(why, activities.ErrTypeHostDown)
	if srcDown {
		if err := s.ledger(ctx, "tombstone the hold on "+source.Host, a.TombstoneClaim, source).Get(ctx, nil); err != nil {
			return err
		}
	}
	if err := s.ledger(ctx, "forget the resize", a.EndResize, uuid).Get(ctx, nil); err != nil {
		return err
	}
	if err := s.endTask(ctx, uuid, vmState); err != nil {
		return err
	}
	msg := fmt.Sprintf("%s: %s; instance %s keeps running on %s and its resize is over", what, appMessage(why), uuid, dest)
	if srcDown {
		msg += fmt.Sprintf("; its hold on %s is a tombstone that 'pinflow host up %s' clears", source.Host, source.Host)
	}
	return activities.BadState(msg)
}

// restoreOrLeave runs the guest on its host again (a compensation), or
// leaves it off there when the host is down or returning: its guests are
// then the evacuation's, and the record still names the host.
func restoreOrLeave(ctx workflow.Context, s *saga, dom activities.DomainInput) error {
	err := workflow.ExecuteActivity(s.hypervisorStep(ctx, "run the guest on "+dom.Host+" again"), a.RestoreDomain, dom).Get(ctx, nil)
	if isType(err, activities.ErrTypeHostDown) {
		return nil
	}
	return err
}

// decisionAllowed says why a confirm or revert is refused now, or nil.
func (s *saga) decisionAllowed(d, decided string) error {
	if d != DecisionConfirm && d != DecisionRevert {
		return fmt.Errorf("decision %q: allowed are %s or %s", d, DecisionConfirm, DecisionRevert)
	}
	if decided != "" {
		return fmt.Errorf("the %s of instance %s is being %sed already", s.status.Operation, s.status.Instance, decided)
	}
	if s.status.Phase != PhaseVerifyResize {
		return fmt.Errorf("the %s of instance %s is %s, not awaiting confirmation (VERIFY_RESIZE)", s.status.Operation, s.status.Instance, s.status.Phase)
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
