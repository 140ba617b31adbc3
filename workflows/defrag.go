package workflows

import (
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/defrag"
	"github.com/pinflow/pinflow/guest"
)

// defragRun is one defrag's state: its migrations are a drain's moves.
type defragRun struct {
	s  *saga
	in api.DefragInput
	d  *drainRun
	st api.DefragStatus
}

// Defrag makes room on a host without a drain: it plans (defrag.PlanHost)
// the fewest re-pins of the host's running guests after which the flavor
// given fits there, or, without one, that leave the most whole cores
// free, and the live migrations of the fewest guests away where no re-pin
// can make the room. It fails, changing nothing, when even the plan
// leaves no room for the flavor. The migrations run first, with the
// drain's machinery: each target reserved, at most Parallel at once, each
// a LiveMigration under its instance's workflow id, a failed one planned
// again elsewhere. Then each re-pin runs, one after another, as a Repin
// under its instance's workflow id, to the pCPUs the plan gives. A failed
// step leaves the steps after it untried: they were planned on the room
// it was to make. The host stays up and takes boots meanwhile; a re-pin
// whose pCPUs a boot took fails. Pause and resume (the drain's Updates)
// hold the next step; a cancel cancels the running one, which rolls back
// or, past its point of no return, goes forward.
func Defrag(ctx workflow.Context, input api.DefragInput) (*api.DefragResult, error) {
	s, err := newSaga(ctx, api.OpDefrag, "", 1)
	if err != nil {
		return nil, err
	}
	in := input.WithDefaults()
	if err := in.Check(); err != nil {
		return nil, s.fail(activities.BadRequest(err.Error()))
	}
	f := &defragRun{s: s, in: in, st: api.DefragStatus{Host: in.Host, Migrations: []api.DrainGuest{}, Repins: []api.DefragRepin{}}}
	f.d = &drainRun{s: s, in: in.DrainInput(), st: api.DrainStatus{Host: in.Host, Guests: []api.DrainGuest{}}, inbound: map[string]int{}, report: f.progress}
	if err := workflow.SetQueryHandler(ctx, api.DefragStatusQuery, func() (api.DefragStatus, error) { return f.status(), nil }); err != nil {
		return nil, err
	}
	if err := f.d.handleControls(ctx, f.controlAllowed); err != nil {
		return nil, err
	}
	s.setHosts(in.Host, "")
	workflow.Go(ctx, f.d.renewSlots)

	plan, err := f.plan(ctx)
	if err != nil {
		return nil, s.fail(err)
	}
	if err := f.migrate(ctx, plan); err != nil {
		return nil, f.fail(err)
	}
	if err := f.repinAll(ctx); err != nil {
		return nil, f.fail(err)
	}
	f.st.Done = true
	res := &api.DefragResult{DefragStatus: f.status()}
	for _, g := range res.Migrations {
		if g.State == api.GuestFailed {
			res.Failed++
		}
	}
	for _, r := range res.Repins {
		if r.State != api.RepinDone {
			res.Failed++
		}
	}
	s.phase(api.PhaseCompleted, f.progress())
	return res, nil
}

// plan plans the defrag and refuses one that makes no room for its
// flavor.
func (f *defragRun) plan(ctx workflow.Context) (defrag.Plan, error) {
	host := f.in.Host
	f.s.phase(api.PhaseScheduling, "planning the defragmentation of "+host)
	var plan defrag.Plan
	if err := f.s.ledger(ctx, "plan the defragmentation of "+host, a.PlanDefrag,
		activities.PlanDefragInput{Host: host, Flavor: f.in.Flavor}).Get(ctx, &plan); err != nil {
		return plan, err
	}
	if f.in.Flavor != nil && !plan.Fits {
		return plan, activities.BadState(fmt.Sprintf("no defragmentation of %s makes room for %s, so nothing moved: %s", host, plan.For, plan.Reason))
	}
	f.st.For = plan.For
	for _, r := range plan.Repins {
		f.st.Repins = append(f.st.Repins, api.DefragRepin{UUID: r.UUID, Name: r.Name, From: r.From, To: r.To, State: api.RepinPlanned})
	}
	f.s.steps += plan.Moves()
	f.s.step()
	return plan, nil
}

// migrate runs the plan's migrations as a drain runs its moves.
func (f *defragRun) migrate(ctx workflow.Context, plan defrag.Plan) error {
	d := f.d
	if len(plan.Migrations) == 0 {
		return nil
	}
	f.s.onFailure("release the reservations no migration adopted", d.releaseAll)
	f.s.phase(api.PhaseAccepted, fmt.Sprintf("reserving the targets of %d migrations", len(plan.Migrations)))
	if err := d.reserveAll(ctx, plan.Migrations); err != nil {
		return err
	}
	f.s.phase(api.PhaseRunning, f.progress())
	return d.moveAll(ctx)
}

// repinAll runs the re-pins in order, each once the defrag is not
// paused; after a failed step the rest are not tried.
func (f *defragRun) repinAll(ctx workflow.Context) error {
	failed := ""
	for _, g := range f.d.st.Guests {
		if g.State == api.GuestFailed {
			failed = "the migration of " + g.UUID + " failed"
		}
	}
	for i := range f.st.Repins {
		r := &f.st.Repins[i]
		if failed != "" {
			r.State, r.Error = api.RepinNotTried, failed
			continue
		}
		f.s.phase(api.PhaseRunning, f.progress())
		if err := workflow.Await(ctx, func() bool { return !f.d.st.Paused }); err != nil {
			f.cancelFrom(i)
			return err
		}
		r.State = api.RepinRunning
		f.s.phase(api.PhaseRunning, f.progress())
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID:          guest.InstanceWorkflowID(r.UUID),
			ParentClosePolicy:   enumspb.PARENT_CLOSE_POLICY_REQUEST_CANCEL,
			WaitForCancellation: true,
			StaticSummary:       fmt.Sprintf("defrag %s: re-pin %s to %s", f.in.Host, r.UUID, r.To),
		})
		err := workflow.ExecuteChildWorkflow(cctx, Repin, api.RepinInput{UUID: r.UUID, PCPUs: r.To}).Get(ctx, nil)
		switch {
		case err != nil && ctx.Err() != nil:
			r.Error = api.RootCause(err)
			f.cancelFrom(i)
			return ctx.Err()
		case err != nil:
			r.State, r.Error = api.RepinFailed, api.RootCause(err)
			failed = "the re-pin of " + r.UUID + " failed"
		default:
			r.State = api.RepinDone
			f.s.step()
		}
	}
	return nil
}

// cancelFrom marks the re-pins from i on cancelled.
func (f *defragRun) cancelFrom(i int) {
	for j := i; j < len(f.st.Repins); j++ {
		f.st.Repins[j].State = api.RepinCancelled
	}
}

// status is the defrag's progress: its migrations are its drain's guests.
func (f *defragRun) status() api.DefragStatus {
	st := f.st
	st.Paused = f.d.st.Paused
	st.Migrations = f.d.st.Guests
	return st
}

// progress is the detail the UI shows: the summary and each step.
func (f *defragRun) progress() string {
	st := f.status()
	if t := st.Table(); t != "" {
		return st.Summary() + "\n\n" + t
	}
	return st.Summary()
}

// fail fails the defrag and keeps its steps in the Web UI's details.
func (f *defragRun) fail(err error) error {
	err = f.s.fail(err)
	st := f.status()
	f.s.status.Detail = st.Table()
	workflow.SetCurrentDetails(f.s.ctx, f.s.details())
	return err
}

// controlAllowed says why a pause (pause) or a resume is refused now, or
// nil.
func (f *defragRun) controlAllowed(pause bool) error {
	host := f.in.Host
	switch {
	case f.s.ctx.Err() != nil:
		return fmt.Errorf("the defrag of %s is ending (it was cancelled): no step is left to start", host)
	case f.s.status.Phase == api.PhaseRollingBack || f.s.status.Phase == api.PhaseError || f.st.Done:
		return fmt.Errorf("the defrag of %s is ending: no step is left to start", host)
	case pause && f.d.st.Paused:
		return fmt.Errorf("the defrag of %s is paused already; 'pinflow host defrag resume %s' resumes it", host, host)
	case !pause && !f.d.st.Paused:
		return fmt.Errorf("the defrag of %s is not paused; 'pinflow host defrag pause %s' pauses it", host, host)
	}
	return nil
}
