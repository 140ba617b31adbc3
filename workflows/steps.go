package workflows

import (
	"errors"
	"reflect"
	"runtime"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
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
	// postCopyRetry is how long a live migration that failed past its
	// switch to post-copy waits before it resumes it again: the link
	// between the hosts must come back first.
	postCopyRetry = 10 * time.Second
)

// untilDone is for steps that must eventually succeed: ledger and record
// changes, compensations, and everything past a commit point.
var untilDone = &temporal.RetryPolicy{
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

var tries = &temporal.RetryPolicy{
	InitialInterval:        time.Second,
	BackoffCoefficient:     2,
	MaximumInterval:        30 * time.Second,
	MaximumAttempts:        driverAttempts,
	NonRetryableErrorTypes: activities.NonRetryableErrorTypes,
}

// untriedAttempts bounds the attempts of a step of driverAttempts tries
// that are no tries of it:
//   - lost: Temporal can record an attempt as started that no worker
//     received when its store is slow (docs/benchmarks.md, "Lost
//     dispatches"); such an attempt ends in a heartbeat timeout with no
//     heartbeat, and says nothing about the hypervisor.
//   - handed over: a stopping worker left the step to the next attempt
//     (a rolling restart of the workers during a long migration).
const untriedAttempts = 10

// ledger runs a ledger or record step: short, idempotent, and retried
// until it succeeds. It is a local activity, run by the worker inside the
// workflow task that asks for it: a step costs no round trip through a
// task queue, and its result is recorded as a marker. It runs again after
// a crash before its result was recorded, which its idempotence makes
// safe.
func (s *saga) ledger(ctx workflow.Context, summary string, step any, args ...any) workflow.Future {
	s.current = ""
	return workflow.ExecuteLocalActivity(workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: ledgerTimeout, RetryPolicy: untilDone, Summary: summary,
	}), step, args...)
}

// hypervisorStep returns a context for a hypervisor step that is retried
// until it succeeds (a compensation, or a step past the commit point).
func (s *saga) hypervisorStep(ctx workflow.Context, summary string) workflow.Context {
	s.current = summary
	// It heartbeats, so a dead worker's attempt is retried within the
	// heartbeat timeout instead of the step's.
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: driverTimeout, HeartbeatTimeout: heartbeatTimeout, RetryPolicy: untilDone, Summary: summary,
	})
}

// hypervisorTry runs step(in...), a hypervisor step that may fail the
// operation, storing its result in out: it is tried driverAttempts times
// (try). It heartbeats, so a cancel
// reaches it, and the workflow waits for it to end before compensating:
// compensations that ran while the step still acted would undo a step
// that then takes effect.
func (s *saga) hypervisorTry(ctx workflow.Context, summary string, out any, step any, in ...any) error {
	s.current = summary
	return s.try(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: driverTimeout, HeartbeatTimeout: heartbeatTimeout, WaitForCancellation: true, Summary: summary,
	}, out, step, in...)
}

// try runs a hypervisor step of driverAttempts tries with opts, and stores
// its result in out (nil for none). The tries are the attempts that
// reached a worker and failed there: an attempt lost on its way
// (lostDispatch) or handed over by a stopping worker is dispatched again
// at once, up to untriedAttempts times. A step that fails its tries
// returns its last error; s.tried says how many attempts it made.
func (s *saga) try(ctx workflow.Context, opts workflow.ActivityOptions, out any, step any, in ...any) error {
	s.tried = 0
	if workflow.GetVersion(ctx, changeDeliveredTries, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		opts.RetryPolicy = tries
		return workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, opts), step, in...).Get(ctx, out)
	}
	// Each attempt is its own activity, so that its heartbeat details are
	// its own.
	opts.RetryPolicy = &temporal.RetryPolicy{MaximumAttempts: 1}
	actx := workflow.WithActivityOptions(ctx, opts)
	redispatched := func(reason string) {
		workflow.GetMetricsHandler(ctx).WithTags(map[string]string{"activity": activityName(step), "reason": reason}).
			Counter(MetricStepRedispatched).Inc(1)
	}
	backoff := tries.InitialInterval
	attempts, ran, untried := 0, 0, 0
	for {
		err := workflow.ExecuteActivity(actx, step, in...).Get(ctx, out)
		attempts++
		var act *temporal.ActivityError
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			// Cancelled: no attempt after this one.
		case lostDispatch(err):
			if untried++; untried < untriedAttempts {
				redispatched("lost")
				continue
			}
		case isType(err, api.ErrTypeWorkerStopping):
			if untried++; untried < untriedAttempts {
				redispatched("handed-over")
				continue
			}
		case errors.As(err, &act) && retryable(act.Unwrap()):
			if ran++; ran < driverAttempts {
				redispatched("failed")
				if err := workflow.Sleep(ctx, backoff); err != nil {
					return err
				}
				backoff = min(time.Duration(float64(backoff)*tries.BackoffCoefficient), tries.MaximumInterval)
				continue
			}
		}
		s.tried = attempts
		return err
	}
}

// MetricStepRedispatched counts the attempts a step of tries dispatched
// again, by activity and reason: "lost" (no worker received the attempt),
// "handed-over" (its worker stopped) or "failed" (it failed and is tried
// again). Temporal's own retries of the other steps are
// pinflow.activity.retries.
const MetricStepRedispatched = "pinflow.step.redispatched"

// activityName is the activity type of step, a method value of
// *activities.Activities.
func activityName(step any) string {
	name := runtime.FuncForPC(reflect.ValueOf(step).Pointer()).Name()
	return strings.TrimSuffix(name[strings.LastIndex(name, ".")+1:], "-fm")
}

// lostDispatch says whether err ends an attempt that never reached a
// worker: its heartbeat timed out and no heartbeat of it arrived. Every
// step of tries heartbeats as it starts.
func lostDispatch(err error) bool {
	var timeout *temporal.TimeoutError
	return errors.As(err, &timeout) && timeout.TimeoutType() == enumspb.TIMEOUT_TYPE_HEARTBEAT && !timeout.HasLastHeartbeatDetails()
}
