package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
)

// a names the activities; the nil pointer is never called, it lets the
// compiler check activity names and signatures.
var a *activities.Activities

// Timeouts of the activity kinds. Ledger and record steps are short and
// retried until they succeed; hypervisor steps may be slow.
const (
	ledgerTimeout  = 30 * time.Second
	driverTimeout  = 10 * time.Minute
	migrateTimeout = 6 * time.Hour
	// heartbeatEvery is the migrate step's heartbeat timeout: a worker that
	// dies mid-migration is noticed this long after its last heartbeat.
	heartbeatEvery = 10 * time.Second
)

// retry is for steps that must eventually succeed: ledger and record
// changes, compensations, and everything past a commit point.
var retry = &temporal.RetryPolicy{
	InitialInterval:    500 * time.Millisecond,
	BackoffCoefficient: 2,
	MaximumInterval:    30 * time.Second,
	// Errors that retrying cannot fix; activities also mark them
	// non-retryable themselves.
	NonRetryableErrorTypes: activities.NonRetryableErrorTypes,
}

// driverAttempts bounds the tries of a hypervisor step that has a
// compensation (prepare, migrate, spawn, offload): a hypervisor that fails
// it three times, a worker crash included, fails the operation, which then
// rolls back instead of holding its claims forever.
const driverAttempts = 3

var driverRetry = &temporal.RetryPolicy{
	InitialInterval:        time.Second,
	BackoffCoefficient:     2,
	MaximumInterval:        30 * time.Second,
	MaximumAttempts:        driverAttempts,
	NonRetryableErrorTypes: activities.NonRetryableErrorTypes,
}

// run carries one operation's status and the bookkeeping every workflow
// here shares: phases shown in the UI and the status query, activity
// options, and the compensation stack.
type run struct {
	ctx    workflow.Context
	status Status
	steps  int // total steps, for Progress
	done   int
	undo   []compensation
}

type compensation struct {
	summary string
	do      func(ctx workflow.Context) error
}

func newRun(ctx workflow.Context, op Operation, uuid string, steps int) (*run, error) {
	r := &run{ctx: ctx, steps: steps, status: Status{Operation: op, Instance: uuid, Phase: PhaseStarted}}
	if err := workflow.SetQueryHandler(ctx, StatusQuery, func() (Status, error) { return r.status, nil }); err != nil {
		return nil, err
	}
	attrs := []temporal.SearchAttributeUpdate{AttrOperation.ValueSet(string(op)), AttrPhase.ValueSet(string(PhaseStarted))}
	if uuid != "" {
		attrs = append(attrs, AttrInstance.ValueSet(uuid))
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx, attrs...); err != nil {
		return nil, err
	}
	return r, nil
}

// phase records a new phase in the status, the search attributes and the
// UI's current details.
func (r *run) phase(p Phase, detail string) {
	r.status.Phase, r.status.Detail = p, detail
	if p == PhaseCompleted {
		r.status.Progress = 100
	}
	// Upserting can only fail on a bad key, which the constants rule out.
	_ = workflow.UpsertTypedSearchAttributes(r.ctx, AttrPhase.ValueSet(string(p)))
	workflow.SetCurrentDetails(r.ctx, r.details())
}

func (r *run) setHosts(src, dst string) {
	var attrs []temporal.SearchAttributeUpdate
	if src != "" && src != r.status.Source {
		r.status.Source = src
		attrs = append(attrs, AttrSourceHost.ValueSet(src))
	}
	if dst != "" && dst != r.status.Dest {
		r.status.Dest = dst
		attrs = append(attrs, AttrDestHost.ValueSet(dst))
	}
	if len(attrs) > 0 {
		_ = workflow.UpsertTypedSearchAttributes(r.ctx, attrs...)
	}
}

// details renders the status as the markdown the Web UI shows.
func (r *run) details() string {
	s := fmt.Sprintf("**%s**: phase **%s** (%d%%)", r.status.Operation, r.status.Phase, r.status.Progress)
	if r.status.Instance != "" {
		s = fmt.Sprintf("**%s** of `%s`: phase **%s** (%d%%)", r.status.Operation, r.status.Instance, r.status.Phase, r.status.Progress)
	}
	if r.status.Source != "" || r.status.Dest != "" {
		s += fmt.Sprintf("\n\nsource `%s` → destination `%s`", r.status.Source, r.status.Dest)
	}
	if r.status.Detail != "" {
		s += "\n\n" + r.status.Detail
	}
	if r.status.Error != "" {
		s += "\n\nerror: " + r.status.Error
	}
	return s
}

// step counts a finished step towards Progress.
func (r *run) step() {
	r.done++
	if r.steps > 0 {
		r.status.Progress = min(99, r.done*100/r.steps)
	}
}

// short returns a context for a ledger or record activity.
func (r *run) short(ctx workflow.Context, summary string) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: ledgerTimeout, RetryPolicy: retry, Summary: summary,
	})
}

// driver returns a context for a hypervisor activity that is retried
// until it succeeds (a compensation, or a step past the commit point).
func (r *run) driver(ctx workflow.Context, summary string) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: driverTimeout, RetryPolicy: retry, Summary: summary,
	})
}

// attempt returns a context for a hypervisor step that may fail the
// operation: it is tried driverAttempts times.
func (r *run) attempt(ctx workflow.Context, summary string) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: driverTimeout, RetryPolicy: driverRetry, Summary: summary,
	})
}

// onFailure registers a compensation before the step it undoes runs: the
// step may have taken effect even when it reports an error.
func (r *run) onFailure(summary string, do func(ctx workflow.Context) error) {
	r.undo = append(r.undo, compensation{summary: summary, do: do})
}

// commit drops the compensations: past this point the operation finishes
// forwards.
func (r *run) commit() { r.undo = nil }

// fail runs the compensations in reverse order in a disconnected context
// (so a cancelled workflow still compensates), records the error phase and
// returns cause, joined with any compensation error.
func (r *run) fail(cause error) error {
	if len(r.undo) > 0 {
		r.phase(PhaseRollingBack, "undoing: "+cause.Error())
	}
	ctx, _ := workflow.NewDisconnectedContext(r.ctx)
	var errs []error
	for i := len(r.undo) - 1; i >= 0; i-- {
		c := r.undo[i]
		if err := c.do(ctx); err != nil {
			errs = append(errs, fmt.Errorf("compensation %q: %w", c.summary, err))
		}
	}
	r.undo = nil
	r.status.Error = cause.Error()
	r.phase(PhaseError, "")
	if len(errs) > 0 {
		return errors.Join(append([]error{cause}, errs...)...)
	}
	return cause
}

// claimID is the id of a claim this run makes; it stays the same when the
// claiming activity is retried and differs between runs.
func claimID(ctx workflow.Context, kind string) string {
	return kind + "-" + workflow.GetInfo(ctx).FirstRunID
}

// owner names this run as a claim's owner.
func owner(ctx workflow.Context) activities.Owner {
	info := workflow.GetInfo(ctx)
	return activities.Owner{WorkflowID: info.WorkflowExecution.ID, FirstRunID: info.FirstRunID}
}
