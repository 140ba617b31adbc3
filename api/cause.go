package api

import (
	"errors"
	"fmt"
	"strings"

	"go.temporal.io/sdk/temporal"
)

// RootCause says in one line why an operation failed: its Failure's
// line when the error carries one (every operation's does), else the
// message of the error the failed step itself returned, which names what it did and
// why it could not. That is the application error right below the
// innermost activity error, or the outermost one when no activity failed
// (a refusal of the workflow's own); the workflow, child workflow and
// activity errors around it (their event ids and types say nothing to an
// operator) and the fragments of the same message Temporal's conversion
// repeats below it are left out. A cancel or a termination says so; a
// chain without an application error (a child that could not start, a
// timeout) gives the message of the first error below those wrappers. It
// is the one rule for a failure's line: the CLI, the client and a drain's
// guests use it.
func RootCause(err error) string {
	if err == nil {
		return ""
	}
	if f, ok := FailureOf(err); ok {
		return f.Line()
	}
	var canceled *temporal.CanceledError
	if errors.As(err, &canceled) {
		return "cancelled; its steps were compensated"
	}
	var terminated *temporal.TerminatedError
	if errors.As(err, &terminated) {
		return "terminated; the audit frees what it left pending"
	}
	start := err
	for e := err; e != nil; e = errors.Unwrap(e) {
		if act, ok := e.(*temporal.ActivityError); ok {
			start = act.Unwrap()
		}
	}
	msg, below := "", ""
	for e := start; e != nil && msg == ""; e = errors.Unwrap(e) {
		switch t := e.(type) {
		case *temporal.ApplicationError:
			msg = t.Message()
		case *temporal.WorkflowExecutionError, *temporal.ChildWorkflowExecutionError, *temporal.ActivityError:
		default:
			if below == "" {
				below = e.Error()
			}
		}
	}
	if msg == "" {
		msg = below
	}
	if msg == "" {
		msg = err.Error()
	}
	// A message joined from several errors (a compensation that failed
	// too) is still one line.
	var lines []string
	for _, l := range strings.Split(msg, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}

// Failure is an operation's failure by its parts; its Line is the one
// line the CLI, the client, a drain's table and the Web UI show. An
// operation's error carries it as its application error's details.
type Failure struct {
	// Step is the hypervisor step that failed, as the history names it;
	// empty when a ledger step or the workflow itself refused.
	Step string `json:"step,omitempty"`
	// Attempts is how often the step was tried when its tries ran out.
	Attempts int `json:"attempts,omitempty"`
	// Reason is why, in the step's own words (RootCause).
	Reason string `json:"reason"`
	// Guest says where the guest is now, when the operation changed
	// something and knows: where it found the guest once every
	// compensation ran, or what a compensation that could not undo left.
	Guest string `json:"guest,omitempty"`
}

// Line says the failure in one line.
func (f Failure) Line() string {
	line := f.Reason
	switch {
	case f.Step != "" && f.Attempts > 1:
		line = fmt.Sprintf("%s failed after %d attempts: %s", f.Step, f.Attempts, f.Reason)
	case f.Step != "":
		line = fmt.Sprintf("%s failed: %s", f.Step, f.Reason)
	}
	if f.Guest != "" {
		line += "; " + f.Guest
	}
	return line
}

// FailureOf returns the failure an operation's error carries, if any: the
// outermost one, a drain's own over its moves'.
func FailureOf(err error) (Failure, bool) {
	for e := err; e != nil; e = errors.Unwrap(e) {
		app, ok := e.(*temporal.ApplicationError)
		if !ok || !app.HasDetails() {
			continue
		}
		var f Failure
		if app.Details(&f) == nil && f.Reason != "" {
			return f, true
		}
	}
	return Failure{}, false
}
