package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/converter"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// Operation is a run of an operation on a guest, to follow.
type Operation struct {
	c    *Client
	Kind api.Operation
	// UUID is the guest's; WorkflowID and RunID name the run.
	UUID       string
	WorkflowID string
	RunID      string
	// decided: a confirm or revert was accepted, so the run goes past
	// VERIFY_RESIZE to its end.
	decided bool
}

// Status asks the running operation where it stands.
func (o *Operation) Status(ctx context.Context) (api.Status, error) {
	var st api.Status
	err := o.c.query(ctx, o.WorkflowID, o.RunID, api.StatusQuery, &st)
	if st.Operation != "" {
		o.Kind = st.Operation
	}
	return st, err
}

// Progress is where a followed operation stands.
type Progress struct {
	api.Status
	// Migrated is the share of a live migration's memory copied, 0-100,
	// while it runs; -1 otherwise.
	Migrated int
}

// Outcome is where an operation left the guest: at its end, or waiting
// in VERIFY_RESIZE for a confirm or revert.
type Outcome struct {
	Operation api.Operation `json:"operation"`
	UUID      string        `json:"uuid"`
	// Phase is completed, or verify-resize while a decision is awaited.
	Phase api.Phase `json:"phase"`
	// Host, Placement and PCPUs are where the guest runs now, as its
	// record says; empty when it runs nowhere (shelved, deleted).
	Host      string          `json:"host,omitempty"`
	Placement *numa.Placement `json:"placement,omitempty"`
	PCPUs     string          `json:"pcpus,omitempty"`
	VMState   guest.VMState   `json:"vm_state,omitempty"`
	// Source is where a resize in VERIFY_RESIZE came from; ConfirmBy is
	// when it confirms by itself (zero: it waits for an operator).
	Source    string    `json:"source,omitempty"`
	ConfirmBy time.Time `json:"confirm_by,omitzero"`
	// Result is the workflow's own result, once it ended.
	Result json.RawMessage `json:"result,omitempty"`
}

// AwaitingDecision says whether the operation waits in VERIFY_RESIZE.
func (o *Outcome) AwaitingDecision() bool { return o.Phase == api.PhaseVerifyResize }

// Wait follows the operation until the operator's next decision: its end,
// or VERIFY_RESIZE for a resize or cold migration (after a confirm or
// revert, the end). progress, when not nil, is called whenever the
// operation's progress changes. A failure is an *OperationError of one
// line saying what failed and why. When ctx ends first, the operation
// goes on and the error wraps ctx's (context.DeadlineExceeded or
// context.Canceled): the operation was not waited out, and may still
// succeed.
func (o *Operation) Wait(ctx context.Context, progress func(Progress)) (*Outcome, error) {
	return o.wait(ctx, progress, !o.decided)
}

// WaitEnd follows the operation to its end, through VERIFY_RESIZE.
func (o *Operation) WaitEnd(ctx context.Context, progress func(Progress)) (*Outcome, error) {
	return o.wait(ctx, progress, false)
}

func (o *Operation) wait(ctx context.Context, progress func(Progress), stopAtVerify bool) (*Outcome, error) {
	var raw json.RawMessage
	var last Progress
	var paused *Outcome // where it waits in VERIFY_RESIZE
	var pausedErr error
	err := o.c.follow(ctx, o.WorkflowID, o.RunID, &raw, 300*time.Millisecond, func() bool {
		st, err := o.Status(ctx)
		if err != nil {
			return false // closed meanwhile, or not yet at its first task
		}
		if stopAtVerify && st.Phase == api.PhaseVerifyResize {
			paused, pausedErr = o.outcome(ctx, api.PhaseVerifyResize)
			if paused != nil {
				paused.Source, paused.ConfirmBy = st.Source, st.ConfirmBy
			}
			return true
		}
		p := Progress{Status: st, Migrated: -1}
		if st.Phase == api.PhaseRunning {
			p.Migrated = o.migrated(ctx)
		}
		if progress != nil && p != last {
			progress(p)
		}
		last = p
		return false
	})
	if err := waitError(ctx, o.Kind, o.UUID, o.WorkflowID, o.RunID, err); err != nil {
		return nil, err
	}
	switch {
	case paused != nil || pausedErr != nil:
		return paused, pausedErr
	}
	out, err := o.outcome(ctx, api.PhaseCompleted)
	if out != nil {
		out.Result = raw
	}
	return out, err
}

// migrated reads a running migration's heartbeat progress, or -1.
func (o *Operation) migrated(ctx context.Context) int {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	d, err := o.c.temporal.DescribeWorkflow(qctx, o.WorkflowID, o.RunID)
	if err != nil {
		return -1
	}
	for _, pa := range d.RawResponse.GetPendingActivities() {
		var p hypervisor.Progress
		if pa.GetHeartbeatDetails() != nil && converter.GetDefaultDataConverter().FromPayloads(pa.GetHeartbeatDetails(), &p) == nil {
			return p.Percent
		}
	}
	return -1
}

// outcome reads where the guest is now.
func (o *Operation) outcome(ctx context.Context, phase api.Phase) (*Outcome, error) {
	out := &Outcome{Operation: o.Kind, UUID: o.UUID, Phase: phase}
	inst, err := o.c.led.Instance(ctx, o.UUID)
	switch {
	case errors.Is(err, ledger.ErrUnknownInstance):
		return out, nil // deleted
	case err != nil:
		return nil, fmt.Errorf("%s %s reached %s; reading where the guest is: %w", o.Kind, o.UUID, phase, err)
	}
	out.Host, out.Placement, out.VMState = inst.Host, inst.Placement, inst.VMState
	if inst.Placement != nil {
		out.PCPUs = PinnedPCPUs(inst.Placement).String()
	}
	return out, nil
}

// PinnedPCPUs is where a placement pins the guest: its vCPUs' pCPUs and
// an isolated emulator thread's. Siblings a claim keeps idle under thread
// policy isolate are not pins.
func PinnedPCPUs(p *numa.Placement) numa.CPUSet {
	var out numa.CPUSet
	for i := range p.Cells {
		c := &p.Cells[i]
		out = out.Union(c.PinnedPCPUs()).Union(c.Reserved)
	}
	return out
}

// RootMessage says in one line why an operation failed: an
// *OperationError's failure line, or api.RootCause of a Temporal
// error (the rule a drain records its guests' failures with too).
func RootMessage(err error) string {
	var failed *OperationError
	if errors.As(err, &failed) {
		return failed.Failure.Line()
	}
	return api.RootCause(err)
}
