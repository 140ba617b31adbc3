package workflows

import (
	"fmt"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/drain"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
)

// drainGuest is one guest of a drain as the workflow keeps it: its row
// of the status and what only the workflow needs to move it.
type drainGuest struct {
	*api.DrainGuest
	placement *drain.Move
	slot      *activities.MoveSlotInput // held while it moves
	// retryAt is when a move held back by its group's budget tries again.
	retryAt time.Time
}

// drainRun is one drain's state.
type drainRun struct {
	s  *saga
	in api.DrainInput
	st api.DrainStatus
	// guests are st.Guests, row by row, once the drain has planned them.
	guests  []*drainGuest
	inbound map[string]int
	// planned: the guests to move are known, so a drain whose guests have
	// all settled has no move left to start.
	planned bool
	// budget: each move takes a slot of its guest's group's disruption
	// budget before it starts (changeDrainBudget).
	budget bool
	// report is the progress the UI shows, when the moves are part of a
	// larger operation (a defrag); nil for the drain's own.
	report func() string
}

// Drain empties a host for maintenance. It plans every guest onto the
// other hosts first (NUMA-cell exact, hardest first) and fails, changing
// nothing, when one fits nowhere, or when a claim there is still no guest
// at rest (an operation in flight) once Settle has passed. It
// then disables the host, so no new guest lands there, and reserves each
// guest's planned capacity with claims of its own, which concurrent boots
// cannot take. Then it moves the guests as child workflows under each
// instance's own workflow id (so it never races another operation on a
// guest), each adopting its reservation, at most Parallel at once and
// PerTarget onto one target. A guest whose move fails is planned again
// without the targets it failed on, up to Attempts targets, and is then
// left on the host with the reason. A pause stops new moves until a
// resume (Updates, refused where they do not apply); a cancel
// cancels the running ones (they roll back) and releases the reservations
// no move adopted. The host stays disabled: an operator enables it after
// the maintenance.
func Drain(ctx workflow.Context, input api.DrainInput) (*api.DrainResult, error) {
	s, err := newSaga(ctx, api.OpDrain, "", 3)
	if err != nil {
		return nil, err
	}
	in := input.WithDefaults()
	if err := in.Check(); err != nil {
		return nil, s.fail(activities.BadRequest(err.Error()))
	}
	d := &drainRun{s: s, in: in, st: api.DrainStatus{Host: in.Host, Guests: []api.DrainGuest{}}, inbound: map[string]int{}}
	if err := workflow.SetQueryHandler(ctx, api.DrainStatusQuery, func() (api.DrainStatus, error) { return d.st, nil }); err != nil {
		return nil, err
	}
	if err := d.handleControls(ctx, d.controlAllowed); err != nil {
		return nil, err
	}
	s.setHosts(in.Host, "")
	s.about = in.Limits()
	workflow.Go(ctx, d.renewSlots)

	plan, err := d.plan(ctx)
	if err != nil {
		return nil, s.fail(err)
	}
	if !plan.Complete() {
		return nil, s.fail(activities.BadState(incomplete(&plan)))
	}
	s.steps += len(plan.Moves)
	s.step()

	if err := s.ledger(ctx, "disable "+in.Host, a.DisableHost,
		activities.DisableHostInput{Host: in.Host, Reason: in.DisableReason()}).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.step()

	s.onFailure("release the reservations no move adopted", d.releaseAll)
	s.phase(api.PhaseAccepted, fmt.Sprintf("reserving the targets of %d guests", len(plan.Moves)))
	if err := d.reserveAll(ctx, plan.Moves); err != nil {
		return nil, d.fail(err)
	}
	s.step()

	s.phase(api.PhaseRunning, d.progress())
	if err := d.moveAll(ctx); err != nil {
		return nil, d.fail(err)
	}
	d.st.Done = true
	res := &api.DrainResult{Host: in.Host, Guests: d.st.Guests}
	for _, g := range d.st.Guests {
		switch g.State {
		case api.GuestMoved:
			res.Moved++
		case api.GuestFailed:
			res.Failed++
		}
	}
	detail := fmt.Sprintf("%d guests moved off %s, %d left there", res.Moved, in.Host, res.Failed)
	if res.Failed == 0 {
		detail += "; it stays disabled until 'pinflow host enable " + in.Host + "'"
	}
	s.phase(api.PhaseCompleted, detail+"\n\n"+d.st.Table())
	return res, nil
}

// fail fails a drain that planned its guests, and keeps their table in
// the Web UI's details under the error: what moved and what did not.
func (d *drainRun) fail(err error) error {
	err = d.s.fail(err)
	d.s.status.Detail = d.st.Table()
	workflow.SetCurrentDetails(d.s.ctx, d.s.details())
	return err
}

// settleRetry is how often a drain plans again while operations in flight
// on its host keep it from planning every guest.
const settleRetry = 3 * time.Second

// plan plans the drain, again every settleRetry while only claims of
// operations in flight stand in the way, until in.Settle has passed.
func (d *drainRun) plan(ctx workflow.Context) (drain.Plan, error) {
	deadline := workflow.Now(ctx).Add(d.in.Settle)
	d.s.phase(api.PhaseScheduling, "planning where every guest of "+d.in.Host+" goes")
	for {
		var plan drain.Plan
		if err := d.s.ledger(ctx, "plan the drain of "+d.in.Host, a.PlanDrain, activities.PlanDrainInput{Host: d.in.Host, Policy: string(d.in.Policy)}).Get(ctx, &plan); err != nil {
			return plan, err
		}
		if plan.Complete() || len(plan.Unplaceable) > 0 || len(plan.NotLive) > 0 || !workflow.Now(ctx).Before(deadline) {
			return plan, nil
		}
		d.s.phase(api.PhaseScheduling, fmt.Sprintf("waiting up to %s for %d claims in flight on %s to settle: %s", d.in.SettleText(), len(plan.Blocked), d.in.Host, plan.Blocked[0].Reason))
		if err := workflow.Sleep(ctx, settleRetry); err != nil {
			return plan, err
		}
	}
}

// incomplete says why a plan cannot be carried out.
func incomplete(p *drain.Plan) string {
	var parts []string
	for _, u := range p.Unplaceable {
		parts = append(parts, fmt.Sprintf("%s (%s) fits nowhere: %s", u.UUID, u.Name, u.Reason))
	}
	for _, n := range p.NotLive {
		parts = append(parts, fmt.Sprintf("%s (%s) cannot move live: %s", n.UUID, n.Name, n.Reason))
	}
	for _, b := range p.Blocked {
		parts = append(parts, fmt.Sprintf("%s blocks it: %s", b.UUID, b.Reason))
	}
	return fmt.Sprintf("the drain of %s cannot complete, so nothing moved: %s", p.Source, strings.Join(parts, "; "))
}

// slotRetry is how long a move that found a cloud-wide limit full waits
// before it asks again; slotRenew is how often the drain renews the slots
// of its running moves, well within activities.MoveSlotLease.
const (
	slotRetry = 5 * time.Second
	slotRenew = 20 * time.Second
)

// renewSlots keeps the leases of the running moves' slots for the
// drain's lifetime.
func (d *drainRun) renewSlots(ctx workflow.Context) {
	for workflow.Sleep(ctx, slotRenew) == nil {
		var held []activities.MoveSlotInput
		for _, g := range d.guests {
			if g.slot != nil {
				held = append(held, *g.slot)
			}
		}
		if len(held) > 0 {
			_ = d.s.ledger(ctx, "renew the move slots", a.RenewMoveSlots, held).Get(ctx, nil)
		}
	}
}

// handleControls takes the pause and resume Updates, which allowed
// refuses where they do not apply. A handler only sets whether new moves
// start and returns: a running move may take hours, and the operator's
// answer must not wait for it.
func (d *drainRun) handleControls(ctx workflow.Context, allowed func(pause bool) error) error {
	for _, c := range []struct {
		name  string
		pause bool
	}{{api.DrainPauseUpdate, true}, {api.DrainResumeUpdate, false}} {
		pause := c.pause
		if err := workflow.SetUpdateHandlerWithOptions(ctx, c.name,
			func(ctx workflow.Context) error {
				d.st.Paused = pause
				// Before the moves, the phase says how planning goes;
				// the running phase's progress shows the pause.
				if d.s.status.Phase == api.PhaseRunning {
					d.s.phase(api.PhaseRunning, d.progress())
				}
				return nil
			},
			workflow.UpdateHandlerOptions{Validator: func(ctx workflow.Context) error {
				return allowed(pause)
			}},
		); err != nil {
			return err
		}
	}
	return nil
}

// controlAllowed says why a pause (pause) or a resume is refused now, or
// nil.
func (d *drainRun) controlAllowed(pause bool) error {
	host := d.in.Host
	if why := d.ending(); why != "" {
		return fmt.Errorf("the drain of %s is ending (%s): no move is left to start", host, why)
	}
	if pause && d.st.Paused {
		return fmt.Errorf("the drain of %s is paused already; 'pinflow host drain resume %s' resumes it", host, host)
	}
	if !pause && !d.st.Paused {
		return fmt.Errorf("the drain of %s is not paused; 'pinflow host drain pause %s' pauses it", host, host)
	}
	return nil
}

// ending says why the drain starts no more moves, or "" while it may.
func (d *drainRun) ending() string {
	switch {
	case d.s.ctx.Err() != nil:
		return "it was cancelled"
	case d.s.status.Phase == api.PhaseRollingBack || d.s.status.Phase == api.PhaseError:
		return "it failed"
	case d.planned && d.settled():
		return "every guest has moved or failed"
	}
	return ""
}

// settled says whether every guest has moved or failed.
func (d *drainRun) settled() bool {
	for _, g := range d.st.Guests {
		if g.State != api.GuestMoved && g.State != api.GuestFailed {
			return false
		}
	}
	return true
}

// progress is the detail the UI shows: the summary and each guest.
func (d *drainRun) progress() string {
	if d.report != nil {
		return d.report()
	}
	if t := d.st.Table(); t != "" {
		return d.st.Summary() + "\n\n" + t
	}
	return d.st.Summary()
}

// reserve holds the guest's planned placement on its target; a lost race
// plans the guest again elsewhere, up to the attempts allowed.
func (d *drainRun) reserve(ctx workflow.Context, g *drainGuest) error {
	for g.Reservation == nil && g.State != api.GuestFailed {
		in := activities.ReserveInput{Host: g.Target, ClaimID: fmt.Sprintf("%s-%s-%d", claimID(ctx, string(ledger.KindReservation)), g.UUID, g.Attempts),
			UUID: g.UUID, Owner: owner(ctx), Placement: *g.placement.Placement}
		var r api.Reservation
		err := d.s.ledger(ctx, "reserve "+g.Target+" for "+g.UUID, a.Reserve, in).Get(ctx, &r)
		if err == nil {
			g.Reservation, g.State = &r, api.GuestReserved
			return nil
		}
		if !isConflict(err) {
			return err
		}
		if err := d.replan(ctx, g, "its reservation on "+g.Target+" lost a race: "+api.RootCause(err)); err != nil {
			return err
		}
	}
	return nil
}

// reserveAll takes the planned moves as the guests to move and reserves
// each one's target.
func (d *drainRun) reserveAll(ctx workflow.Context, moves []drain.Move) error {
	for i := range moves {
		m := moves[i]
		d.st.Guests = append(d.st.Guests, api.DrainGuest{UUID: m.UUID, Name: m.Name, Target: m.Target})
		d.guests = append(d.guests, &drainGuest{placement: &m})
	}
	for i, g := range d.guests {
		g.DrainGuest = &d.st.Guests[i]
	}
	d.planned = true
	for _, g := range d.guests {
		if err := d.reserve(ctx, g); err != nil {
			return err
		}
	}
	return nil
}

// replan marks the guest's target tried and plans it again without every
// target tried so far, or leaves it failed once its attempts are spent or
// nothing else takes it.
func (d *drainRun) replan(ctx workflow.Context, g *drainGuest, why string) error {
	g.Tried, g.Attempts, g.Error, g.Reservation = append(g.Tried, g.Target), g.Attempts+1, why, nil
	if g.Attempts >= d.in.Attempts {
		g.State, g.Target = api.GuestFailed, ""
		g.Error = fmt.Sprintf("tried %d targets (%s); last: %s", g.Attempts, strings.Join(g.Tried, ", "), why)
		return nil
	}
	var plan drain.Plan
	in := activities.PlanGuestInput{Host: d.in.Host, UUID: g.UUID, Exclude: g.Tried}
	if err := d.s.ledger(ctx, "plan "+g.UUID+" again", a.PlanGuest, in).Get(ctx, &plan); err != nil {
		return err
	}
	if len(plan.Moves) == 0 {
		g.State, g.Target = api.GuestFailed, ""
		g.Error = fmt.Sprintf("%s; and no other target takes it: %s", why, plan.Unplaceable[0].Reason)
		return nil
	}
	g.Target, g.placement = plan.Moves[0].Target, &plan.Moves[0]
	return nil
}

// moveAll starts the reserved guests' moves within the limits, each as
// soon as a slot is free and the drain is not paused, and returns once
// every guest has moved or failed. A cancel ends it early, once the
// running moves, cancelled with the drain, have rolled back, so that what
// they did not adopt can be released.
func (d *drainRun) moveAll(ctx workflow.Context) error {
	err := d.startMoves(ctx)
	if err != nil {
		dctx, _ := workflow.NewDisconnectedContext(ctx)
		_ = workflow.Await(dctx, func() bool { return d.st.Moving == 0 })
	}
	return err
}

// startMoves is moveAll without the wait for the cancelled moves.
func (d *drainRun) startMoves(ctx workflow.Context) error {
	d.budget = workflow.GetVersion(ctx, changeDrainBudget, workflow.DefaultVersion, 1) == 1
	next := func() *drainGuest {
		if d.st.Paused || d.st.Moving >= d.in.Parallel {
			return nil
		}
		now := workflow.Now(ctx)
		for _, g := range d.guests {
			// A guest whose failed move still gives its slot back waits:
			// its next move takes a slot of the same name.
			if g.State == api.GuestReserved && g.slot == nil && d.inbound[g.Target] < d.in.PerTarget && !g.retryAt.After(now) {
				return g
			}
		}
		return nil
	}
	// heldBack is how long until the first move its group's budget holds
	// back tries again; 0 when none is.
	heldBack := func() time.Duration {
		var first time.Time
		for _, g := range d.guests {
			if g.State == api.GuestReserved && g.Waiting != "" && (first.IsZero() || g.retryAt.Before(first)) {
				first = g.retryAt
			}
		}
		if first.IsZero() {
			return 0
		}
		return max(first.Sub(workflow.Now(ctx)), time.Millisecond)
	}
	for {
		var g *drainGuest
		// Done once every guest has moved or failed and every move has
		// given its slot back.
		ready := func() bool { g = next(); return g != nil || d.settled() && d.st.Moving == 0 }
		if wait := heldBack(); wait > 0 {
			if _, err := workflow.AwaitWithTimeout(ctx, wait, ready); err != nil {
				return err
			}
			if g == nil && !ready() {
				continue
			}
		} else if err := workflow.Await(ctx, ready); err != nil {
			return err
		}
		if g == nil {
			return nil
		}
		if d.budget {
			var b activities.GroupSlot
			if err := d.s.ledger(ctx, "take a slot of "+g.UUID+"'s disruption budget", a.TakeGroupSlot, activities.GroupSlotInput{UUID: g.UUID}).Get(ctx, &b); err != nil {
				return err
			}
			if !b.Taken {
				g.Waiting = fmt.Sprintf("the disruption budget of group %s: %d of its members are moving (%s), and it allows %d",
					b.Group, len(b.Moving), strings.Join(b.Moving, ", "), b.Max)
				g.retryAt = workflow.Now(ctx).Add(slotRetry)
				d.s.phase(api.PhaseRunning, d.progress())
				continue
			}
			g.Waiting = ""
		}
		// The limits of the whole cloud, shared by every drain.
		slot := activities.MoveSlotInput{Move: fmt.Sprintf("drain-%s-%s", firstRunID(ctx), g.UUID), Target: g.Target, PerTarget: d.in.PerTarget}
		var took activities.MoveSlotResult
		if err := d.s.ledger(ctx, "take a move slot onto "+g.Target, a.TakeMoveSlot, slot).Get(ctx, &took); err != nil {
			return err
		}
		if !took.Taken {
			if d.st.Waiting != took.Full {
				d.st.Waiting = took.Full
				d.s.phase(api.PhaseRunning, d.progress())
			}
			if err := workflow.Sleep(ctx, slotRetry); err != nil {
				return err
			}
			continue
		}
		d.st.Waiting, g.slot = "", &slot
		g.State, d.st.Moving = api.GuestMoving, d.st.Moving+1
		d.inbound[g.Target]++
		d.st.MaxMoving = max(d.st.MaxMoving, d.st.Moving)
		d.st.MaxPerTarget = max(d.st.MaxPerTarget, d.inbound[g.Target])
		d.s.phase(api.PhaseRunning, d.progress())
		workflow.Go(ctx, func(ctx workflow.Context) { d.move(ctx, g) })
	}
}

// move runs one guest's move as a child workflow under its instance's
// workflow id, adopting its reservation; a failure releases what it did
// not adopt and plans the guest again.
func (d *drainRun) move(ctx workflow.Context, g *drainGuest) {
	target, slot := g.Target, *g.slot
	defer func() {
		// Given back even when cancelled; a slot left behind ends with its
		// lease.
		dctx, _ := workflow.NewDisconnectedContext(ctx)
		_ = d.s.ledger(dctx, "give the move slot back", a.GiveMoveSlots, []activities.MoveSlotInput{slot}).Get(dctx, nil)
		if d.budget {
			_ = d.s.ledger(dctx, "give back the disruption budget slot", a.GiveGroupSlot, g.UUID).Get(dctx, nil)
		}
		g.slot = nil
		d.st.Moving--
		d.inbound[target]--
		d.s.phase(api.PhaseRunning, d.progress())
	}()
	err := d.runChild(ctx, g)
	if err == nil {
		g.State, g.Error, g.Reservation = api.GuestMoved, "", nil
		d.s.step()
		return
	}
	if ctx.Err() != nil {
		g.State = api.GuestReserved // the drain's compensation releases what is left
		return
	}
	// The move rolled back and released the claim it adopted; a
	// reservation it never adopted is still the drain's to release.
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	if rerr := d.s.ledger(dctx, "release the reservation on "+target, a.ReleaseReservation, *g.Reservation).Get(dctx, nil); rerr != nil {
		g.State, g.Error = api.GuestFailed, fmt.Sprintf("its move failed (%s) and its reservation could not be released: %s", api.RootCause(err), api.RootCause(rerr))
		return
	}
	if rerr := d.replan(ctx, g, fmt.Sprintf("its move to %s failed: %s", target, api.RootCause(err))); rerr != nil {
		g.State, g.Error = api.GuestFailed, fmt.Sprintf("%s; planning it again failed: %s", api.RootCause(err), api.RootCause(rerr))
		return
	}
	if g.State != api.GuestFailed {
		if rerr := d.reserve(ctx, g); rerr != nil {
			g.State, g.Error = api.GuestFailed, fmt.Sprintf("%s; reserving a new target failed: %s", api.RootCause(err), api.RootCause(rerr))
		}
	}
	if g.State == api.GuestFailed {
		d.s.step()
	}
}

// runChild moves the guest with the drain's policy and waits for it.
func (d *drainRun) runChild(ctx workflow.Context, g *drainGuest) error {
	cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID:        guest.InstanceWorkflowID(g.UUID),
		ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_REQUEST_CANCEL,
		// A cancelled drain waits for each move to roll back.
		WaitForCancellation: true,
		StaticSummary:       fmt.Sprintf("%s %s: move %s to %s", d.s.status.Operation, d.in.Host, g.UUID, g.Target),
	})
	// Under live-then-cold, a guest whose devices cannot be unplugged
	// falls back to a cold migration before anything moves; before
	// changeDrainLiveDevices, every guest with devices was cold-migrated.
	devices := g.placement != nil && g.placement.Placement != nil && len(g.placement.Placement.Devices) > 0
	coldDevices := devices && d.in.Policy == api.DrainLiveThenCold &&
		workflow.GetVersion(ctx, changeDrainLiveDevices, workflow.DefaultVersion, 1) == workflow.DefaultVersion
	var f workflow.ChildWorkflowFuture
	switch {
	case d.in.Policy == api.DrainCold, coldDevices:
		f = workflow.ExecuteChildWorkflow(cctx, Resize, api.ResizeInput{UUID: g.UUID, Reservation: g.Reservation, AutoConfirm: true})
	default:
		f = workflow.ExecuteChildWorkflow(cctx, LiveMigration, api.LiveMigrationInput{UUID: g.UUID, Reservation: g.Reservation,
			ColdFallback: d.in.Policy == api.DrainLiveThenCold, AutoConfirm: true})
	}
	return f.Get(ctx, nil)
}

// releaseAll releases every reservation the drain still holds (a move
// that adopted one changed its token, so it is not released).
func (d *drainRun) releaseAll(ctx workflow.Context) error {
	for i := range d.st.Guests {
		g := &d.st.Guests[i]
		if g.Reservation == nil || g.State == api.GuestMoved {
			continue
		}
		if err := d.s.ledger(ctx, "release the reservation on "+g.Target, a.ReleaseReservation, *g.Reservation).Get(ctx, nil); err != nil {
			return err
		}
		g.Reservation = nil
	}
	return nil
}

// isConflict says whether a step failed because its claim lost a race.
func isConflict(err error) bool {
	return isType(err, api.ErrTypeConflict, api.ErrTypeNoFit)
}
