package workflows

import (
	"errors"
	"strings"

	"go.temporal.io/sdk/temporal"
)

// RootCause says in one line why an operation failed: the message of
// the error the failed step itself returned, which names what it did and
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
