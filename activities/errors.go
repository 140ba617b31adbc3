package activities

import (
	"context"
	"errors"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// NonRetryableErrorTypes lists the error types retrying cannot fix, for
// retry policies.
var NonRetryableErrorTypes = []string{api.ErrTypeNoFit, api.ErrTypeInvalidRequest, api.ErrTypeUnknownInstance,
	api.ErrTypeUnknownHost, api.ErrTypeBadState, api.ErrTypeRejected, api.ErrTypeHostDown, api.ErrTypeMigrationTimeout, api.ErrTypeConflict, api.ErrTypePostCopyFailed, api.ErrTypeGroupRule}

// BadState is the error of an operation the instance's state forbids.
func BadState(msg string) error {
	return temporal.NewNonRetryableApplicationError(msg, api.ErrTypeBadState, nil)
}

// BadRequest is the error of an operation that can never succeed as asked.
func BadRequest(msg string) error {
	return temporal.NewNonRetryableApplicationError(msg, api.ErrTypeInvalidRequest, nil)
}

// conflict is classify for the steps where a lost race or a claim gone is
// final, not retried: a reservation and its adoption.
func conflict(err error) error {
	if errors.Is(err, ledger.ErrConflict) || errors.Is(err, ledger.ErrUnknownClaim) {
		return temporal.NewNonRetryableApplicationError(err.Error(), api.ErrTypeConflict, err)
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
		typ = api.ErrTypeGroupRule
	case errors.Is(err, ledger.ErrUnknownGroup):
		typ = api.ErrTypeInvalidRequest
	case errors.As(err, &noFit):
		typ = api.ErrTypeNoFit
	case errors.As(err, &invalid), errors.Is(err, ledger.ErrInvalid), errors.Is(err, xmlpatch.ErrMalformed), errors.Is(err, xmlpatch.ErrMismatch):
		typ = api.ErrTypeInvalidRequest
	case errors.Is(err, ledger.ErrUnknownInstance):
		typ = api.ErrTypeUnknownInstance
	case errors.Is(err, ledger.ErrUnknownHost), errors.Is(err, hypervisor.ErrUnknownHost):
		typ = api.ErrTypeUnknownHost
	case errors.Is(err, hypervisor.ErrRejected):
		typ = api.ErrTypeRejected
	case errors.Is(err, hypervisor.ErrUnfenced):
		typ = api.ErrTypeFenced
	case errors.Is(err, ledger.ErrHostDown):
		typ = api.ErrTypeHostDown
	case errors.Is(err, hypervisor.ErrMigrationTimeout):
		typ = api.ErrTypeMigrationTimeout
	case errors.Is(err, hypervisor.ErrPostCopyFailed):
		typ = api.ErrTypePostCopyFailed
	case errors.Is(err, context.Canceled):
		return err
	default:
		return err
	}
	// The details let a client say which hosts refused a guest, or which
	// rule a claim broke, without parsing the message.
	var details []any
	switch typ {
	case api.ErrTypeNoFit:
		details = []any{noFit.Hosts, noFit.More}
	case api.ErrTypeGroupRule:
		details = []any{rule}
	}
	return temporal.NewApplicationErrorWithOptions(err.Error(), typ, temporal.ApplicationErrorOptions{
		NonRetryable: true, Cause: err, Details: details})
}
