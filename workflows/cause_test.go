package workflows

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	failurepb "go.temporal.io/api/failure/v1"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/api"
)

// appFailure is an application failure with message msg and cause.
func appFailure(msg, typ string, cause *failurepb.Failure) *failurepb.Failure {
	return &failurepb.Failure{Message: msg, Cause: cause,
		FailureInfo: &failurepb.Failure_ApplicationFailureInfo{ApplicationFailureInfo: &failurepb.ApplicationFailureInfo{Type: typ}}}
}

// activityFailure is cause as a failed activity of type typ reports it.
func activityFailure(typ string, cause *failurepb.Failure) *failurepb.Failure {
	return &failurepb.Failure{Message: "activity error", Cause: cause,
		FailureInfo: &failurepb.Failure_ActivityFailureInfo{ActivityFailureInfo: &failurepb.ActivityFailureInfo{
			ActivityType: &commonpb.ActivityType{Name: typ}, ScheduledEventId: 13, StartedEventId: 14, Identity: "1@worker@",
			RetryState: enumspb.RETRY_STATE_MAXIMUM_ATTEMPTS_REACHED}}}
}

// childFailure is cause as a parent sees its failed child workflow.
func childFailure(cause *failurepb.Failure) *failurepb.Failure {
	return &failurepb.Failure{Message: "child workflow execution error", Cause: cause,
		FailureInfo: &failurepb.Failure_ChildWorkflowExecutionFailureInfo{ChildWorkflowExecutionFailureInfo: &failurepb.ChildWorkflowExecutionFailureInfo{
			WorkflowType: &commonpb.WorkflowType{Name: "LiveMigration"}, InitiatedEventId: 50, StartedEventId: 55,
			WorkflowExecution: &commonpb.WorkflowExecution{WorkflowId: "instance-x", RunId: "r"}}}}
}

func TestRootCause(t *testing.T) {
	toErr := temporal.GetDefaultFailureConverter().FailureToError
	// An activity's Go error wrapped twice with %w arrives as three
	// application errors, each message holding the ones below it.
	injected := appFailure("sim: prepare migration of x to c: injected fault (one of the counted failures)", "wrapError",
		appFailure("injected fault (one of the counted failures)", "wrapError", appFailure("injected fault", "errorString", nil)))
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"a plain error", errors.New("ledger: host a: unknown host"), "ledger: host a: unknown host"},
		{"a wrapped plain error keeps its context", fmt.Errorf("start: %w", errors.New("connection refused")), "start: connection refused"},
		{"an application error", temporal.NewApplicationError("no fit on b", "NoFit"), "no fit on b"},
		{"a failed activity", toErr(activityFailure("PrepareMigration", injected)), "sim: prepare migration of x to c: injected fault (one of the counted failures)"},
		{"a failed child's activity", toErr(childFailure(activityFailure("PrepareMigration", injected))), "sim: prepare migration of x to c: injected fault (one of the counted failures)"},
		{"a child's own refusal", toErr(childFailure(appFailure("instance x is shelved; it cannot be live-migrated", "BadState", nil))),
			"instance x is shelved; it cannot be live-migrated"},
		{"a child that could not start", &temporal.ChildWorkflowExecutionAlreadyStartedError{}, "child workflow execution already started"},
		{"a timeout", toErr(activityFailure("Migrate", &failurepb.Failure{Message: "activity StartToClose timeout",
			FailureInfo: &failurepb.Failure_TimeoutFailureInfo{TimeoutFailureInfo: &failurepb.TimeoutFailureInfo{TimeoutType: enumspb.TIMEOUT_TYPE_START_TO_CLOSE}}})),
			"activity StartToClose timeout (type: StartToClose)"},
		{"a cancelled child", toErr(childFailure(&failurepb.Failure{Message: "canceled",
			FailureInfo: &failurepb.Failure_CanceledFailureInfo{CanceledFailureInfo: &failurepb.CanceledFailureInfo{}}})),
			"cancelled; its steps were compensated"},
		{"a failure joined with its compensation's", toErr(childFailure(appFailure("no room on b\ncompensation \"release\": ledger down\n", "joinError", nil))),
			`no room on b; compensation "release": ledger down`},
	} {
		if got := api.RootCause(c.err); got != c.want {
			t.Errorf("%s: RootCause(%v) = %q, want %q", c.name, c.err, got, c.want)
		}
	}
}

// TestFailureCrossesTheWire: an operation's failure, converted to the
// failure a server stores and back (as the client and a drain read it),
// still carries its parts, its type and its cause, and RootCause says its
// line, also under a child's and a drain's wrapping.
func TestFailureCrossesTheWire(t *testing.T) {
	conv := temporal.GetDefaultFailureConverter()
	step := temporal.NewNonRetryableApplicationError("sim: prepare migration of x to b: injected fault", api.ErrTypeRejected, nil)
	f := api.Failure{Step: "prepare the destination b", Attempts: 3, Reason: "sim: prepare migration of x to b: injected fault", Guest: "instance x stays on a"}
	sent := asError(f, step)
	got := conv.FailureToError(childFailure(conv.ErrorToFailure(sent)))
	const line = "prepare the destination b failed after 3 attempts: sim: prepare migration of x to b: injected fault; instance x stays on a"
	if api.RootCause(got) != line {
		t.Errorf("RootCause after the wire = %q, want %q", api.RootCause(got), line)
	}
	if back, ok := api.FailureOf(got); !ok || back != f {
		t.Errorf("FailureOf after the wire = %+v, %v; want %+v", back, ok, f)
	}
	if !isType(got, api.ErrTypeRejected) {
		t.Errorf("the failure after the wire is not of its step's type %s: %v", api.ErrTypeRejected, got)
	}
	if !strings.Contains(got.Error(), "injected fault (type: Rejected") {
		t.Errorf("the failure after the wire lost its cause: %v", got)
	}
	// An application error with other details is not a failure.
	other := conv.FailureToError(conv.ErrorToFailure(temporal.NewApplicationError("x", "T", "details")))
	if _, ok := api.FailureOf(other); ok {
		t.Errorf("FailureOf(%v) found a failure in other details", other)
	}
}
