package workflows

import (
	"errors"
	"slices"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
)

// asError is the operation's error: an application error of the same
// type as cause's (the checks of a parent read it), saying f's line, with
// f as its details and cause below it.
func asError(f api.Failure, cause error) error {
	typ := failureType
	var app *temporal.ApplicationError
	if errors.As(cause, &app) {
		typ = app.Type()
	}
	return temporal.NewApplicationErrorWithOptions(f.Line(), typ, temporal.ApplicationErrorOptions{
		NonRetryable: true, Cause: cause, Details: []any{f},
	})
}

// failureType is the type of an operation's error whose cause has no
// application error (a timeout, a child that could not start).
const failureType = "OperationFailed"

// failure says which step cause failed and how often it was tried, and
// why; abort adds where the guest is.
func (s *saga) failure(cause error) api.Failure {
	f := api.Failure{Reason: api.RootCause(cause)}
	var act *temporal.ActivityError
	if s.current == "" || !errors.As(cause, &act) {
		return f
	}
	f.Step = s.current
	if retryable(act.Unwrap()) {
		// Only a step of driverAttempts tries fails with an error a retry
		// may clear: its tries ran out.
		f.Attempts = driverAttempts
		if s.tried > 0 {
			f.Attempts = s.tried
		}
	}
	return f
}

// retryable says whether an activity's error is one a retry may clear:
// an application error not marked non-retryable, or a timeout.
func retryable(err error) bool {
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		return !app.NonRetryable() && !slices.Contains(activities.NonRetryableErrorTypes, app.Type())
	}
	var timeout *temporal.TimeoutError
	return errors.As(err, &timeout)
}
