package workflows

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
)

// fencingChange names the change that made hypervisor steps waited for
// and fenced and the end of each operation forward-only; runs started
// before it (version DefaultVersion) keep the command sequence they
// were recorded with.
const (
	fencingChange  = "fencing"
	fencingVersion = 1
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
	// heartbeatTimeout is the hypervisor steps' heartbeat timeout: a worker
	// that dies in a step is noticed this long after its last heartbeat,
	// and a cancel reaches the step within about as long (the SDK sends
	// heartbeats at most every 0.8 of it).
	heartbeatTimeout = 5 * time.Second
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
	ctx workflow.Context
	// version is the run's fencingChange version (see newRun).
	version workflow.Version
	status  Status
	steps   int // total steps, for Progress
	done    int
	undo    []compensation
}

type compensation struct {
	summary string
	do      func(ctx workflow.Context) error
}

func newRun(ctx workflow.Context, op Operation, uuid string, steps int) (*run, error) {
	r := &run{ctx: ctx, steps: steps, status: Status{Operation: op, Instance: uuid, Phase: PhaseStarted}}
	r.version = workflow.GetVersion(ctx, fencingChange, workflow.DefaultVersion, fencingVersion)
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
// operation: it is tried driverAttempts times. It heartbeats, so a cancel
// reaches it, and the workflow waits for it to end before compensating:
// compensations that ran while the step still acted would undo a step
// that then takes effect.
func (r *run) attempt(ctx workflow.Context, summary string) workflow.Context {
	opts := workflow.ActivityOptions{StartToCloseTimeout: driverTimeout, RetryPolicy: driverRetry, Summary: summary}
	if r.fenced() {
		opts.HeartbeatTimeout, opts.WaitForCancellation = heartbeatTimeout, true
	}
	return workflow.WithActivityOptions(ctx, opts)
}

// fenced says whether the run has the fencing change: waited-for
// hypervisor steps, fences, a forward-only end and compensations that
// stop at the first that fails. Runs started before it replay as they ran.
func (r *run) fenced() bool { return r.version >= fencingVersion }

// onFailure registers a compensation before the step it undoes runs: the
// step may have taken effect even when it reports an error.
func (r *run) onFailure(summary string, do func(ctx workflow.Context) error) {
	r.undo = append(r.undo, compensation{summary: summary, do: do})
}

// commit drops the compensations and returns the context for the rest of
// the operation: past this point it only goes forwards, so the rest runs
// in a disconnected context that a cancel cannot stop.
func (r *run) commit(ctx workflow.Context) workflow.Context {
	r.undo = nil
	if !r.fenced() {
		return ctx
	}
	ctx, _ = workflow.NewDisconnectedContext(ctx)
	return ctx
}

// errRolledForward is what a compensation returns when it finds the step
// it undoes complete and past undoing (a migration that switched over):
// the remaining compensations do not run, and the operation finishes
// forwards instead.
var errRolledForward = errors.New("the step had completed; finishing forwards")

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
		err := c.do(ctx)
		// Decided by the recorded result of the compensation, so runs of
		// any version replay it as they ran.
		if errors.Is(err, errRolledForward) {
			r.undo = nil
			return errRolledForward
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("compensation %q: %w", c.summary, err))
			if r.fenced() {
				// What the failed compensation did not undo may still
				// need what the earlier steps hold (a guest not rolled
				// back still runs on the destination claim): keep them.
				errs = append(errs, fmt.Errorf("kept for an operator: %s", r.remaining(i)))
				break
			}
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

// remaining names the compensations below index i, which a failed
// compensation left undone.
func (r *run) remaining(i int) string {
	var names []string
	for j := i - 1; j >= 0; j-- {
		names = append(names, r.undo[j].summary)
	}
	if len(names) == 0 {
		return "nothing"
	}
	return strings.Join(names, ", ")
}

// claimID is the id of a claim this run makes; it stays the same when the
// claiming activity is retried and differs between runs.
func claimID(ctx workflow.Context, kind string) string {
	return kind + "-" + firstRunID(ctx)
}

// firstRunID is the run's chain's first run id: the same across retries
// and continue-as-new. (The test environment leaves it empty.)
func firstRunID(ctx workflow.Context) string {
	info := workflow.GetInfo(ctx)
	if info.FirstRunID != "" {
		return info.FirstRunID
	}
	return info.WorkflowExecution.RunID
}

// owner names this run as a claim's owner.
func owner(ctx workflow.Context) activities.Owner {
	info := workflow.GetInfo(ctx)
	return activities.Owner{WorkflowID: info.WorkflowExecution.ID, FirstRunID: firstRunID(ctx)}
}
