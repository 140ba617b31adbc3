package client

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/defrag"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
)

// PlanDefrag plans the defragmentation of host (defrag.PlanHost): the
// re-pins, and only where no re-pin can make the room the live
// migrations, after which flavor fits on it, or, for a nil flavor, after
// which it keeps as many whole cores free as re-pins can make. It changes
// nothing, and needs only the ledger.
func (c *Client) PlanDefrag(ctx context.Context, host string, flavor *guest.Flavor) (defrag.Plan, error) {
	var req *numa.Request
	name := ""
	if flavor != nil {
		f, err := c.resolveAliases(*flavor)
		if err != nil {
			return defrag.Plan{}, fmt.Errorf("host plan-defrag %s: %v: %w", host, err, ErrInvalid)
		}
		if req, err = f.Request(); err != nil {
			return defrag.Plan{}, fmt.Errorf("host plan-defrag %s: %v: %w", host, err, ErrInvalid)
		}
		name = f.Summary()
	}
	if _, err := c.HostStatus(ctx, host); err != nil {
		return defrag.Plan{}, err
	}
	return defrag.PlanHost(ctx, c.led, host, req, name)
}

// Defrag starts the defragmentation of in.Host (api.WorkflowDefrag): the
// plan PlanDefrag makes, carried out. A flavor the plan makes no room for
// fails the workflow, changing nothing. A host that is unknown, down or
// returning, or that a defrag runs on already, is refused.
func (c *Client) Defrag(ctx context.Context, in api.DefragInput) (*DefragRun, error) {
	host := in.Host
	if err := ledger.CheckHostName(host); err != nil {
		return nil, fmt.Errorf("host defrag: %v: %w", err, ErrInvalid)
	}
	in = in.WithDefaults()
	if in.Flavor != nil {
		f, err := c.resolveAliases(*in.Flavor)
		if err != nil {
			return nil, fmt.Errorf("host defrag %s: %v: %w", host, err, ErrInvalid)
		}
		if _, err := f.Request(); err != nil {
			return nil, fmt.Errorf("host defrag %s: %v: %w", host, err, ErrInvalid)
		}
		in.Flavor = &f
	}
	if err := in.Check(); err != nil {
		return nil, fmt.Errorf("host defrag %s: %v: %w", host, err, ErrInvalid)
	}
	st, err := c.HostStatus(ctx, host)
	if err != nil {
		return nil, err
	}
	if st.State != ledger.HostUp && st.State != ledger.HostDisabled {
		return nil, fmt.Errorf("host defrag %s: the host is %s; a defrag re-pins guests of a running host: %w", host, st.State, ErrState)
	}
	goal := "whole cores"
	if in.Flavor != nil {
		goal = in.Flavor.Summary()
	}
	id := api.DefragWorkflowID(host)
	run, err := c.startWorkflow(ctx, id, plan{op: api.OpDefrag, workflow: api.WorkflowDefrag, input: in, summary: "defrag host " + host + " for " + goal, source: host}, "")
	switch {
	case alreadyRunning(err):
		return nil, fmt.Errorf("host defrag %s: a defrag of the host runs already (workflow %s): %w", host, id,
			&BusyError{Host: host, Operation: api.OpDefrag, WorkflowID: id})
	case err != nil:
		return nil, fmt.Errorf("host defrag %s: %w", host, err)
	}
	return &DefragRun{c: c, Host: host, WorkflowID: id, RunID: run.GetRunID()}, nil
}

// DefragRun is a run of a host's defrag, to follow.
type DefragRun struct {
	c          *Client
	Host       string
	WorkflowID string
	RunID      string
}

// Status asks the running defrag where it stands.
func (d *DefragRun) Status(ctx context.Context) (api.DefragStatus, error) {
	var st api.DefragStatus
	err := d.c.query(ctx, d.WorkflowID, d.RunID, api.DefragStatusQuery, &st)
	return st, err
}

// Wait follows the defrag to its end; progress, when not nil, is called
// whenever its status changes. A defrag that failed or was cancelled is
// an *OperationError of one line; the steps that failed in a completed
// one are in its result.
func (d *DefragRun) Wait(ctx context.Context, progress func(api.DefragStatus)) (*api.DefragResult, error) {
	var res api.DefragResult
	var last *api.DefragStatus
	err := d.c.follow(ctx, d.WorkflowID, d.RunID, &res, 500*time.Millisecond, func() bool {
		if progress == nil {
			return false
		}
		st, err := d.Status(ctx)
		if err != nil || last != nil && reflect.DeepEqual(*last, st) {
			return false
		}
		progress(st)
		last = &st
		return false
	})
	if err := waitError(ctx, api.OpDefrag, d.Host, d.WorkflowID, d.RunID, err); err != nil {
		return nil, err
	}
	return &res, nil
}

// ControlDefrag pauses, resumes or cancels (verb) the host's running
// defrag and returns its status as the control left it. A pause holds
// the next step, the running one finishes; a cancel cancels the running
// step, which rolls back or, past its point of no return, goes forward.
func (c *Client) ControlDefrag(ctx context.Context, host, verb string) (api.DefragStatus, error) {
	var st api.DefragStatus
	if _, err := c.HostStatus(ctx, host); err != nil {
		return st, err
	}
	id := api.DefragWorkflowID(host)
	desc, err := c.temporal.DescribeWorkflow(ctx, id, "")
	var nf *serviceerror.NotFound
	if errors.As(err, &nf) || err == nil && desc.Status != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
		return st, fmt.Errorf("host defrag %s %s: no defrag of %s is running: %w", verb, host, host, ErrState)
	}
	if err != nil {
		return st, fmt.Errorf("host defrag %s %s: %w", verb, host, err)
	}
	run := &DefragRun{c: c, Host: host, WorkflowID: id, RunID: desc.WorkflowExecution.RunID}
	switch verb {
	case "cancel":
		err = c.temporal.CancelWorkflow(ctx, id, run.RunID)
	case "pause":
		_, err = c.update(ctx, id, api.DrainPauseUpdate)
	case "resume":
		_, err = c.update(ctx, id, api.DrainResumeUpdate)
	default:
		return st, fmt.Errorf("host defrag %s %s: controls are pause, resume and cancel: %w", verb, host, ErrInvalid)
	}
	if err != nil {
		return st, fmt.Errorf("host defrag %s %s: %w", verb, host, refusal(err))
	}
	// The defrag took it; a run that ended meanwhile has no status to add.
	if after, err := run.Status(ctx); err == nil {
		st = after
	}
	return st, nil
}

// FollowDefrag is the host's running defrag, or the one that ended last.
func (c *Client) FollowDefrag(ctx context.Context, host string) (*DefragRun, error) {
	if _, err := c.HostStatus(ctx, host); err != nil {
		return nil, err
	}
	id := api.DefragWorkflowID(host)
	desc, err := c.temporal.DescribeWorkflow(ctx, id, "")
	var nf *serviceerror.NotFound
	switch {
	case errors.As(err, &nf):
		return nil, fmt.Errorf("host defrag status %s: no defrag of %s has run (or its last one is past the namespace's retention): %w", host, host, ErrState)
	case err != nil:
		return nil, fmt.Errorf("host defrag status %s: %w", host, err)
	}
	return &DefragRun{c: c, Host: host, WorkflowID: id, RunID: desc.WorkflowExecution.RunID}, nil
}
