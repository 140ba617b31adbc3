package client

import (
	"errors"
	"fmt"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// The kinds of refusal and failure, for errors.Is. A request refused
// before anything started and an operation that failed are matched by
// the same ones: a boot whose named host is down and a boot that found
// every host down are both ErrHostDown.
var (
	// ErrInvalid marks a refusal caused by the request itself (a bad
	// value, a contradiction), not by the state of a guest or host.
	ErrInvalid = errors.New("invalid request")
	// ErrUnknownGuest is the error for a name that names no guest.
	ErrUnknownGuest = errors.New("unknown guest")
	// ErrUnknownHost is the error for a name that names no registered
	// host.
	ErrUnknownHost = errors.New("unknown host")
	// ErrUnknownGroup is the error for a name that names no server group.
	ErrUnknownGroup = errors.New("unknown server group")
	// ErrBusy: another operation is open on the guest, or another change
	// on the host (*BusyError says which).
	ErrBusy = errors.New("busy")
	// ErrNoHost: no host takes the guest (*NoHostError says why each
	// refused).
	ErrNoHost = errors.New("no host takes the guest")
	// ErrGroupRule: the request would break the hard rule of the guest's
	// server group (*GroupRuleError).
	ErrGroupRule = errors.New("server group rule")
	// ErrHostDown: the host is marked down (fenced) or otherwise takes no
	// guests now.
	ErrHostDown = errors.New("host down")
	// ErrState: the state of the guest or host forbids the request (a
	// guest shelved, a resize awaiting its decision, a host that is not
	// down for an evacuation).
	ErrState = errors.New("state forbids it")
)

// BusyError is a request refused because another operation holds the
// guest's workflow id (or another change the host's).
type BusyError struct {
	// UUID is the guest; Host the host when a change of a host is open.
	UUID string
	Host string
	// Operation is the open run's kind; WorkflowID and RunID name it.
	Operation  api.Operation
	WorkflowID string
	RunID      string
}

func (e *BusyError) Error() string {
	what := "another operation"
	if e.Operation != "" {
		what = "a " + string(e.Operation)
	}
	if e.Host != "" {
		return fmt.Sprintf("host %s is busy: %s is running on it as workflow %s", e.Host, what, e.WorkflowID)
	}
	return fmt.Sprintf("instance %s is busy: %s is running on it as workflow %s", e.UUID, what, e.WorkflowID)
}

// Is makes a BusyError ErrBusy.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// HostReason is why one host did not take a guest.
type HostReason struct {
	Host   string
	Reason string
}

// NoHostError is an operation that found no host to take its guest.
type NoHostError struct {
	// Reason is the whole explanation in one line.
	Reason string
	// Hosts are the first few hosts that refused, each with why; More
	// counts the others (Explain lists every one).
	Hosts []HostReason
	More  int
}

func (e *NoHostError) Error() string { return e.Reason }

// Is makes a NoHostError ErrNoHost.
func (e *NoHostError) Is(target error) bool { return target == ErrNoHost }

// GroupRuleError is a request refused, or an operation failed, because
// the guest's place would break its server group's hard rule.
type GroupRuleError struct {
	// Host is the host refused; empty when no host kept the rule.
	Host string
	// Reason says which rule and which members are in the way.
	Reason string
	// Rule is the ledger's refusal of a claim, when it was the ledger
	// that refused.
	Rule *ledger.GroupRuleError
}

func (e *GroupRuleError) Error() string {
	if e.Host != "" && e.Rule == nil {
		return "host " + e.Host + ": " + e.Reason
	}
	return e.Reason
}

// Is makes a GroupRuleError ErrGroupRule.
func (e *GroupRuleError) Is(target error) bool { return target == ErrGroupRule }

// Unwrap gives the ledger's refusal, for errors.As.
func (e *GroupRuleError) Unwrap() error {
	if e.Rule == nil {
		return nil
	}
	return e.Rule
}

// OperationError is an operation that failed (or was cancelled or
// terminated) on the workers. It matches, with errors.Is and errors.As,
// the kind of error its failure has (ErrNoHost, ErrGroupRule,
// ErrHostDown...), and unwraps to Temporal's error.
type OperationError struct {
	Operation api.Operation
	// Subject is the guest's UUID, or the host of a change of a host.
	Subject    string
	WorkflowID string
	RunID      string
	// Type is the failure's type, as the workers mark it
	// (api.ErrType*); empty for a cancel or termination.
	Type string
	// Failure is the failure by its parts; its Line says it in one line.
	Failure api.Failure
	kind    error
	err     error
}

func (e *OperationError) Error() string {
	if e.Subject == "" {
		return fmt.Sprintf("%s failed: %s", e.Operation, e.Failure.Line())
	}
	return fmt.Sprintf("%s %s failed: %s", e.Operation, e.Subject, e.Failure.Line())
}

// Unwrap gives the kind of error (a sentinel or a typed error) and
// Temporal's own.
func (e *OperationError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.err}
	}
	return []error{e.kind, e.err}
}

// runFailed is the error of a run of op on subject that ended with err.
func runFailed(op api.Operation, subject, workflowID, runID string, err error) error {
	e := &OperationError{Operation: op, Subject: subject, WorkflowID: workflowID, RunID: runID, err: err}
	if f, ok := api.FailureOf(err); ok {
		e.Failure = f
	} else {
		e.Failure = api.Failure{Reason: api.RootCause(err)}
	}
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		e.Type = app.Type()
	}
	e.kind = kindOf(e.Type, e.Failure.Reason, err)
	return e
}

// kindOf is the client's error for a failure of type typ.
func kindOf(typ, reason string, err error) error {
	switch typ {
	case api.ErrTypeInvalidRequest:
		return ErrInvalid
	case api.ErrTypeUnknownInstance:
		return ErrUnknownGuest
	case api.ErrTypeUnknownHost:
		return ErrUnknownHost
	case api.ErrTypeBadState:
		return ErrState
	case api.ErrTypeHostDown, api.ErrTypeFenced:
		return ErrHostDown
	case api.ErrTypeGroupRule:
		g := &GroupRuleError{Reason: reason}
		var rule ledger.GroupRuleError
		if details(err, typ, &rule) && rule.Group != "" {
			g.Rule, g.Host = &rule, rule.Host
		}
		return g
	case api.ErrTypeNoFit:
		nh := &NoHostError{Reason: reason}
		var hosts []numa.HostMiss
		if details(err, typ, &hosts, &nh.More) {
			for _, h := range hosts {
				nh.Hosts = append(nh.Hosts, HostReason{Host: h.Host, Reason: h.Reason})
			}
		}
		return nh
	}
	return nil
}

// details decodes into v the details of the innermost application error
// of type typ in err's chain that has them.
func details(err error, typ string, v ...any) bool {
	found := false
	for e := err; e != nil; e = errors.Unwrap(e) {
		app, ok := e.(*temporal.ApplicationError)
		if !ok || app.Type() != typ || !app.HasDetails() {
			continue
		}
		if app.Details(v...) == nil {
			found = true
		}
	}
	return found
}

// notWaited is the error of a wait for op on subject that ctx cut: the
// context's own error, and that the run goes on.
func notWaited(op api.Operation, subject, workflowID string, err error) error {
	return fmt.Errorf("%s %s: not waited out; it goes on as workflow %s: %w", op, subject, workflowID, err)
}

// refusal turns a refusal of the guest's rules (guest.Facts) or a
// workflow's application error into the client's: the same message,
// matching ErrState, ErrInvalid or the kind of its type.
func refusal(err error) error {
	switch {
	case errors.Is(err, guest.ErrState):
		return &refused{msg: err.Error(), kind: ErrState, err: err}
	case errors.Is(err, guest.ErrFixedDevices):
		return &refused{msg: err.Error(), kind: ErrInvalid, err: err}
	}
	var app *temporal.ApplicationError
	if !errors.As(err, &app) {
		return err
	}
	kind := kindOf(app.Type(), app.Message(), err)
	if kind == nil {
		return errors.New(app.Message())
	}
	return &refused{msg: app.Message(), kind: kind, err: err}
}

// refused is an error of one line that matches kind, and err below it.
type refused struct {
	msg       string
	kind, err error
}

func (e *refused) Error() string { return e.msg }

func (e *refused) Unwrap() []error { return []error{e.kind, e.err} }

// invalid marks err, a refusal of the request's values, ErrInvalid.
func invalid(err error) error {
	if errors.Is(err, ErrInvalid) {
		return err
	}
	return &refused{msg: err.Error(), kind: ErrInvalid, err: err}
}
