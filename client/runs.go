package client

import (
	"context"
	"time"
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
// goes on). The error is the run's failure, or ctx's.
func (c *Client) follow(ctx context.Context, id, runID string, result any, every time.Duration, poll func() (stop bool)) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.temporal.GetWorkflow(wctx, id, runID).Get(wctx, result) }()
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
