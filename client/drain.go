package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/drain"
	"github.com/pinflow/pinflow/ledger"
)

// PlanDrain plans where every guest of host would go, as a drain with
// policy ("" for live) started now would plan it, with the guests that
// fit nowhere, those the policy cannot move, and the claims of operations
// in flight that block it. It changes nothing, and needs only the ledger.
func (c *Client) PlanDrain(ctx context.Context, host string, policy api.DrainPolicy) (drain.Plan, error) {
	if err := (api.DrainInput{Host: host, Policy: policy}).WithDefaults().Check(); err != nil {
		return drain.Plan{}, fmt.Errorf("host plan-drain %s: %v: %w", host, err, ErrInvalid)
	}
	if _, err := c.HostStatus(ctx, host); err != nil {
		return drain.Plan{}, err
	}
	return drain.PlanHost(ctx, c.led, host, cmp.Or(policy, api.DrainLive) == api.DrainLive)
}

// DrainRun is a run of a host's drain, to follow.
type DrainRun struct {
	c          *Client
	Host       string
	WorkflowID string
	RunID      string
}

// Drain starts emptying in.Host for maintenance (api.WorkflowDrain). Zero
// limits and policy take the defaults; the limits are checked with
// DrainInput.Check. A host that is unknown, down or returning, or that a
// drain empties already, is refused.
func (c *Client) Drain(ctx context.Context, in api.DrainInput) (*DrainRun, error) {
	host := in.Host
	if err := ledger.CheckHostName(host); err != nil {
		return nil, fmt.Errorf("host drain: %v: %w", err, ErrInvalid)
	}
	in = in.WithDefaults()
	if err := in.Check(); err != nil {
		return nil, fmt.Errorf("host drain %s: %v: %w", host, err, ErrInvalid)
	}
	st, err := c.HostStatus(ctx, host)
	if err != nil {
		return nil, err
	}
	if st.State != ledger.HostUp && st.State != ledger.HostDisabled {
		return nil, fmt.Errorf("host drain %s: the host is %s; a drain moves guests off a running host (evacuate a fenced one): %w", host, st.State, ErrState)
	}
	id := api.DrainWorkflowID(host)
	run, err := c.startWorkflow(ctx, id, plan{op: api.OpDrain, workflow: api.WorkflowDrain, input: in, summary: "drain host " + host, source: host}, "")
	switch {
	case alreadyRunning(err):
		return nil, fmt.Errorf("host drain %s: the host is being drained already (workflow %s): %w", host, id,
			&BusyError{Host: host, Operation: api.OpDrain, WorkflowID: id})
	case err != nil:
		return nil, fmt.Errorf("host drain %s: %w", host, err)
	}
	return &DrainRun{c: c, Host: host, WorkflowID: id, RunID: run.GetRunID()}, nil
}

// Status asks the running drain where it stands.
func (d *DrainRun) Status(ctx context.Context) (api.DrainStatus, error) {
	var st api.DrainStatus
	err := d.c.query(ctx, d.WorkflowID, d.RunID, api.DrainStatusQuery, &st)
	return st, err
}

// Wait follows the drain to its end. progress, when not nil, is called
// whenever the drain's status changes. A drain that failed or was
// cancelled is an *OperationError of one line; the guests a completed
// drain left on the host are in its result. When ctx ends first, the
// drain goes on and the error wraps ctx's.
func (d *DrainRun) Wait(ctx context.Context, progress func(api.DrainStatus)) (*api.DrainResult, error) {
	var res api.DrainResult
	var last *api.DrainStatus
	err := d.c.follow(ctx, d.WorkflowID, d.RunID, &res, 500*time.Millisecond, func() bool {
		if progress == nil {
			return false
		}
		st, err := d.Status(ctx)
		if err != nil || last != nil && reflect.DeepEqual(*last, st) {
			return false // closed meanwhile, or nothing new
		}
		progress(st)
		last = &st
		return false
	})
	if err := waitError(ctx, api.OpDrain, d.Host, d.WorkflowID, d.RunID, err); err != nil {
		return nil, err
	}
	return &res, nil
}

// FollowDrain is the host's last drain, to follow: the running one, or
// the one that ended last, whose Wait says how it ended.
func (c *Client) FollowDrain(ctx context.Context, host string) (*DrainRun, error) {
	st, err := c.DrainStatus(ctx, host)
	if err != nil {
		return nil, err
	}
	return &DrainRun{c: c, Host: host, WorkflowID: st.WorkflowID, RunID: st.RunID}, nil
}

// DrainState is a host's last drain: where it stands while it runs, and
// how it ended once it has.
type DrainState struct {
	// DrainStatus is the drain's own status while it runs; once it
	// completed, its result's guests; once it failed or was cancelled,
	// its guests as they were at its end (none when no worker could
	// replay it).
	api.DrainStatus
	WorkflowID string `json:"workflow_id"`
	RunID      string `json:"run_id"`
	// Status is running, completed, failed, canceled, terminated or
	// timed_out.
	Status string    `json:"status"`
	Start  time.Time `json:"start"`
	Close  time.Time `json:"close,omitzero"`
	// Moved and Failed count the guests moved off the host and left on
	// it.
	Moved  int `json:"moved"`
	Failed int `json:"failed"`
	// Reason is why a drain that did not complete ended, in one line.
	Reason string `json:"reason,omitempty"`
}

// Running says whether the drain still runs.
func (s DrainState) Running() bool { return s.Status == "running" }

// Completed says whether the drain ran to its end: every guest moved or
// left on the host with its reason.
func (s DrainState) Completed() bool { return s.Status == "completed" }

// DrainStatus is the host's last drain: its progress while it runs, its
// guests once it completed, or why it failed or was cancelled.
func (c *Client) DrainStatus(ctx context.Context, host string) (*DrainState, error) {
	if _, err := c.HostStatus(ctx, host); err != nil {
		return nil, err
	}
	return c.lastDrain(ctx, "host drain status", host)
}

// lastDrain is DrainStatus for the command verb, which its errors name.
func (c *Client) lastDrain(ctx context.Context, verb, host string) (*DrainState, error) {
	id := api.DrainWorkflowID(host)
	// A drain that ends between the describe and its query is described
	// again.
	for try := 0; ; try++ {
		d, err := c.temporal.DescribeWorkflow(ctx, id, "")
		var nf *serviceerror.NotFound
		switch {
		case errors.As(err, &nf):
			return nil, fmt.Errorf("%s %s: no drain of %s has run (or its last one is past the namespace's retention): %w", verb, host, host, ErrState)
		case err != nil:
			return nil, fmt.Errorf("%s %s: %w", verb, host, err)
		}
		rec := c.record(ctx, d.RawResponse.GetWorkflowExecutionInfo())
		st := &DrainState{DrainStatus: api.DrainStatus{Host: host, Guests: []api.DrainGuest{}},
			WorkflowID: rec.WorkflowID, RunID: rec.RunID, Status: rec.Status, Start: rec.Start, Close: rec.Close, Reason: rec.Reason}
		switch d.Status {
		case enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING:
			run := &DrainRun{c: c, Host: host, WorkflowID: rec.WorkflowID, RunID: rec.RunID}
			if st.DrainStatus, err = run.Status(ctx); err != nil {
				if try == 0 {
					continue
				}
				return nil, fmt.Errorf("%s %s: %w", verb, host, err)
			}
		case enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED:
			var res api.DrainResult
			if err := c.temporal.GetWorkflow(ctx, id, rec.RunID).Get(ctx, &res); err != nil {
				return nil, fmt.Errorf("%s %s: %w", verb, host, err)
			}
			st.Guests, st.Done = res.Guests, true
		default:
			// A drain that failed or was cancelled returned no result: its
			// guests are its status at its end, which a worker replays.
			run := &DrainRun{c: c, Host: host, WorkflowID: rec.WorkflowID, RunID: rec.RunID}
			if ended, err := run.Status(ctx); err == nil {
				st.Guests = ended.Guests
			}
		}
		for _, g := range st.Guests {
			switch g.State {
			case api.GuestMoved:
				st.Moved++
			case api.GuestFailed:
				st.Failed++
			}
		}
		return st, nil
	}
}

// PauseDrain stops the host's running drain from starting new moves; the
// running ones finish. The status is the drain's once it took the pause.
func (c *Client) PauseDrain(ctx context.Context, host string) (api.DrainStatus, error) {
	return c.controlDrain(ctx, host, "pause", api.DrainPauseUpdate)
}

// ResumeDrain lets the host's paused drain start new moves again.
func (c *Client) ResumeDrain(ctx context.Context, host string) (api.DrainStatus, error) {
	return c.controlDrain(ctx, host, "resume", api.DrainResumeUpdate)
}

// CancelDrain cancels the host's running drain: its running moves roll
// back and the reservations no move adopted are released; the host stays
// disabled. The status is the drain's when the cancel was asked.
func (c *Client) CancelDrain(ctx context.Context, host string) (api.DrainStatus, error) {
	run, st, err := c.runningDrain(ctx, host, "cancel")
	if err != nil {
		return st, err
	}
	if err := c.temporal.CancelWorkflow(ctx, run.WorkflowID, run.RunID); err != nil {
		return st, fmt.Errorf("host drain cancel %s: %w", host, err)
	}
	return st, nil
}

// controlDrain sends the running drain the Update name, which the drain
// refuses where it does not apply, naming why.
func (c *Client) controlDrain(ctx context.Context, host, verb, name string) (api.DrainStatus, error) {
	run, st, err := c.runningDrain(ctx, host, verb)
	if err != nil {
		return st, err
	}
	_, err = c.update(ctx, run.WorkflowID, name)
	var nf *serviceerror.NotFound
	switch {
	case errors.As(err, &nf):
		return st, fmt.Errorf("host drain %s %s: no drain of %s is running: %w", verb, host, host, ErrState)
	case err != nil:
		return st, fmt.Errorf("host drain %s %s: %w", verb, host, refusal(err))
	}
	// The drain took it: its status says so now.
	if after, err := run.Status(ctx); err == nil {
		st = after
	}
	return st, nil
}

// runningDrain is the host's running drain and its status, or a refusal
// saying that none runs.
func (c *Client) runningDrain(ctx context.Context, host, verb string) (*DrainRun, api.DrainStatus, error) {
	var st api.DrainStatus
	if _, err := c.HostStatus(ctx, host); err != nil {
		return nil, st, err
	}
	id := api.DrainWorkflowID(host)
	d, err := c.temporal.DescribeWorkflow(ctx, id, "")
	var nf *serviceerror.NotFound
	if errors.As(err, &nf) || err == nil && d.Status != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
		return nil, st, fmt.Errorf("host drain %s %s: no drain of %s is running: %w", verb, host, host, ErrState)
	}
	if err != nil {
		return nil, st, fmt.Errorf("host drain %s %s: %w", verb, host, err)
	}
	run := &DrainRun{c: c, Host: host, WorkflowID: id, RunID: d.WorkflowExecution.RunID}
	if st, err = run.Status(ctx); err != nil {
		return nil, st, fmt.Errorf("host drain %s %s: %w", verb, host, err)
	}
	return run, st, nil
}

// MoveBack is one guest an undrain moves back to its host.
type MoveBack struct {
	UUID string `json:"uuid"`
	// From is where the drain moved it.
	From string `json:"from"`
	// Error says why it was not moved back; Done that it was.
	Error string `json:"error,omitempty"`
	Done  bool   `json:"done,omitempty"`
	// Op is its live migration back; nil when it did not start.
	Op *Operation `json:"-"`
}

// Undrain is an undrain of a host: its guests moving back.
type Undrain struct {
	Host  string
	Moves []MoveBack
}

// Undrain enables a host its last drain left disabled and live-migrates
// back, each under its own instance workflow id, every guest that drain
// moved and that still runs where the drain put it: a drain that failed
// or was cancelled too, for the guests it moved before it ended. A host
// that is down or returning, whose drain runs, or whose last drain never
// ran or cannot say what it moved, is refused.
func (c *Client) Undrain(ctx context.Context, host string) (*Undrain, error) {
	st, err := c.HostStatus(ctx, host)
	if err != nil {
		return nil, err
	}
	if st.State != ledger.HostUp && st.State != ledger.HostDisabled {
		return nil, fmt.Errorf("host undrain %s: the host is %s; a host marked down is undrained once it is back up: %w", host, st.State, ErrState)
	}
	last, err := c.lastDrain(ctx, "host undrain", host)
	if err != nil {
		return nil, err
	}
	switch {
	case last.Running():
		return nil, fmt.Errorf("host undrain %s: the host is being drained; cancel the drain first: %w", host,
			&BusyError{Host: host, Operation: api.OpDrain, WorkflowID: last.WorkflowID, RunID: last.RunID})
	case !last.Completed() && len(last.Guests) == 0:
		return nil, fmt.Errorf("host undrain %s: its last drain %s (%s) and no worker could replay what it moved; move guests back one by one: %w", host, last.Status, last.Reason, ErrState)
	}
	if st.State == ledger.HostDisabled {
		if _, err := c.EnableHost(ctx, host); err != nil {
			return nil, err
		}
	}
	u := &Undrain{Host: host, Moves: []MoveBack{}}
	for _, g := range last.Guests {
		if g.State != api.GuestMoved {
			continue
		}
		inst, err := c.led.Instance(ctx, g.UUID)
		if err != nil || inst.Host != g.Target {
			continue // gone, or moved again since
		}
		b := MoveBack{UUID: g.UUID, From: g.Target}
		if b.Op, err = c.Migrate(ctx, g.UUID, MigrateRequest{Dest: host}); err != nil {
			b.Error = err.Error()
		}
		u.Moves = append(u.Moves, b)
	}
	return u, nil
}

// Wait follows every move back that started to its end: each ends Done,
// or with its Error. Only ctx ending first is an error; the moves go on.
func (u *Undrain) Wait(ctx context.Context) error {
	for i := range u.Moves {
		b := &u.Moves[i]
		if b.Op == nil || b.Done || b.Error != "" {
			continue
		}
		if _, err := b.Op.Wait(ctx, nil); err != nil {
			if ctx.Err() != nil {
				return err
			}
			b.Error = RootMessage(err)
			continue
		}
		b.Done = true
	}
	return nil
}

// Failed counts the moves back that failed or did not start.
func (u *Undrain) Failed() int {
	n := 0
	for _, b := range u.Moves {
		if b.Error != "" {
			n++
		}
	}
	return n
}
