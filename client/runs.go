package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/api"
)

// query asks the run of workflow id (runID empty: its latest) the query
// name, into v. A run that does not answer within seconds (no worker, a
// history to replay) is an error, not a hang.
func (c *Client) query(ctx context.Context, id, runID, name string, v any) error {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := c.temporal.QueryWorkflow(qctx, id, runID, name)
	if err != nil {
		return err
	}
	return res.Get(v)
}

// follow waits for the run's result into result, calling poll every
// interval until the run ends or poll says to stop following (the run
// goes on). The error is the run's outcome (a *temporal.WorkflowExecutionError),
// ctx's, or why Temporal could not say.
func (c *Client) follow(ctx context.Context, id, runID string, result any, every time.Duration, poll func() (stop bool)) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.result(wctx, id, runID, result) }()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if poll() {
				return nil
			}
		}
	}
}

// resultTries bounds the tries of a wait for a run's result that the
// connection, not the run, ended.
const resultTries = 4

// result waits for the run's result into result. An error that is not
// the run's outcome is tried again while ctx lasts: the server cuts a
// long poll (RST_STREAM) a moment before the caller's deadline, which is
// no failure of the run and, then, ends as ctx's error.
func (c *Client) result(ctx context.Context, id, runID string, result any) error {
	for try := 1; ; try++ {
		err := c.temporal.GetWorkflow(ctx, id, runID).Get(ctx, result)
		var outcome *temporal.WorkflowExecutionError
		if err == nil || errors.As(err, &outcome) || try == resultTries {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(try) * 250 * time.Millisecond):
		}
	}
}

// waitError is the error of a wait for a run of op on subject that ended
// with err: nil, the run's failure (*OperationError), the caller's
// context that cut the wait (the run goes on), or why Temporal could not
// say how the run ended.
func waitError(ctx context.Context, op api.Operation, subject, id, runID string, err error) error {
	var outcome *temporal.WorkflowExecutionError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &outcome):
		return runFailed(op, subject, id, runID, err)
	case ctx.Err() != nil:
		return notWaited(op, subject, id, ctx.Err())
	}
	return fmt.Errorf("%s %s: following workflow %s: %w", op, subject, id, err)
}
