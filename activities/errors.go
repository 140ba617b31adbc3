package activities

import (
	"context"
	"errors"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// Error types of the failures that retrying cannot fix. Workflows fail at
// once on them; everything else is retried.
const (
	ErrTypeNoFit           = "NoFit"
	ErrTypeInvalidRequest  = "InvalidRequest"
	ErrTypeUnknownInstance = "UnknownInstance"
	ErrTypeUnknownHost     = "UnknownHost"
	ErrTypeBadState        = "BadState"
	ErrTypeRejected        = "Rejected"
	ErrTypeHostDown        = "HostDown"
	// ErrTypeConflict: a drain's reservation or its adoption found the
	// pCPUs or the claim taken or changed; the drain plans the guest again.
	ErrTypeConflict = "Conflict"
	// ErrTypeMigrationTimeout: a timeout of the migration policy aborted
	// the live migration, and the guest runs on its source.
	ErrTypeMigrationTimeout = "MigrationTimeout"
	// ErrTypePostCopyFailed: the migration failed past its switch to
	// post-copy; it can only be resumed, never rolled back.
	ErrTypePostCopyFailed = "PostCopyFailed"
	// ErrTypeGroupRule: a claim, or a host choice, would break the hard
	// rule of the guest's server group.
	ErrTypeGroupRule = "GroupRule"
)

// ErrTypeWorkerStopping: the worker stopped while its attempt of a step
// went on at the hypervisor; the next attempt follows it. A hand-over,
// not a failure: the step's tries do not count it.
const ErrTypeWorkerStopping = "WorkerStopping"

// NonRetryableErrorTypes lists the error types above, for retry policies.
var NonRetryableErrorTypes = []string{ErrTypeNoFit, ErrTypeInvalidRequest, ErrTypeUnknownInstance,
	ErrTypeUnknownHost, ErrTypeBadState, ErrTypeRejected, ErrTypeHostDown, ErrTypeMigrationTimeout, ErrTypeConflict, ErrTypePostCopyFailed, ErrTypeGroupRule}

// BadState is the error of an operation the instance's state forbids.
func BadState(msg string) error {
	return temporal.NewNonRetryableApplicationError(msg, ErrTypeBadState, nil)
}

// BadRequest is the error of an operation that can never succeed as asked.
func BadRequest(msg string) error {
	return temporal.NewNonRetryableApplicationError(msg, ErrTypeInvalidRequest, nil)
}

// conflict is classify for the steps where a lost race or a claim gone is
// final, not retried: a reservation and its adoption.
func conflict(err error) error {
	if errors.Is(err, ledger.ErrConflict) || errors.Is(err, ledger.ErrUnknownClaim) {
		return temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeConflict, err)
	}
	return classify(err)
}

// classify marks the errors that retrying cannot fix as non-retryable,
// with a type a workflow or the CLI can branch on. Other errors pass
// through and are retried.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var noFit *numa.NoFitError
	var invalid *numa.InvalidRequestError
	var rule *ledger.GroupRuleError
	typ := ""
	switch {
	case errors.As(err, &rule):
		typ = ErrTypeGroupRule
	case errors.Is(err, ledger.ErrUnknownGroup):
		typ = ErrTypeInvalidRequest
	case errors.As(err, &noFit):
		typ = ErrTypeNoFit
	case errors.As(err, &invalid), errors.Is(err, ledger.ErrInvalid), errors.Is(err, xmlpatch.ErrMalformed), errors.Is(err, xmlpatch.ErrMismatch):
		typ = ErrTypeInvalidRequest
	case errors.Is(err, ledger.ErrUnknownInstance):
		typ = ErrTypeUnknownInstance
	case errors.Is(err, ledger.ErrUnknownHost), errors.Is(err, hypervisor.ErrUnknownHost):
		typ = ErrTypeUnknownHost
	case errors.Is(err, hypervisor.ErrRejected):
		typ = ErrTypeRejected
	case errors.Is(err, hypervisor.ErrUnfenced):
		typ = ErrTypeFenced
	case errors.Is(err, ledger.ErrHostDown):
		typ = ErrTypeHostDown
	case errors.Is(err, hypervisor.ErrMigrationTimeout):
		typ = ErrTypeMigrationTimeout
	case errors.Is(err, hypervisor.ErrPostCopyFailed):
		typ = ErrTypePostCopyFailed
	case errors.Is(err, context.Canceled):
		return err
	default:
		return err
	}
	// The details let a client say which hosts refused a guest, or which
	// rule a claim broke, without parsing the message.
	var details []any
	switch typ {
	case ErrTypeNoFit:
		details = []any{noFit.Hosts, noFit.More}
	case ErrTypeGroupRule:
		details = []any{rule}
	}
	return temporal.NewApplicationErrorWithOptions(err.Error(), typ, temporal.ApplicationErrorOptions{
		NonRetryable: true, Cause: err, Details: details})
}
