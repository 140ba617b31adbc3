package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
)

// Record is one run of an operation, as the history lists it.
type Record struct {
	Operation  api.Operation `json:"operation"`
	UUID       string        `json:"uuid,omitempty"`
	WorkflowID string        `json:"workflow_id"`
	RunID      string        `json:"run_id"`
	// Status is running, completed, failed, canceled, terminated or
	// timed_out; Phase the last phase it recorded.
	Status string    `json:"status"`
	Phase  api.Phase `json:"phase,omitempty"`
	Source string    `json:"source,omitempty"`
	Dest   string    `json:"dest,omitempty"`
	Start  time.Time `json:"start"`
	Close  time.Time `json:"close,omitzero"`
	// Reason is why a run that did not complete ended, in one line.
	Reason string `json:"reason,omitempty"`
}

// Ended says whether the run has ended.
func (r *Record) Ended() bool { return r.Status != "running" }

// HistoryFilter selects runs: of one guest, or touching one host (as
// source or destination); with neither, every operation's. The audit's
// runs come only when Audits is set.
type HistoryFilter struct {
	UUID   string
	Host   string
	Audits bool
	// Limit bounds how many of the newest runs come; 0 takes 50.
	Limit int
}

// History lists runs of operations, newest first, from Temporal's
// visibility store: what it lists may lag the last second behind.
func (c *Client) History(ctx context.Context, f HistoryFilter) ([]Record, error) {
	var where []string
	if f.UUID != "" {
		id, err := c.guestUUID(ctx, f.UUID)
		if err != nil {
			return nil, err
		}
		where = append(where, fmt.Sprintf("%s = %s", api.AttrInstance.GetName(), quote(id)))
	}
	if f.Host != "" {
		where = append(where, fmt.Sprintf("(%s = %s OR %s = %s)", api.AttrSourceHost.GetName(), quote(f.Host),
			api.AttrDestHost.GetName(), quote(f.Host)))
	}
	if !f.Audits {
		where = append(where, api.OperatorsView)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 50
	}
	var out []Record
	var token []byte
	for len(out) < limit {
		resp, err := c.temporal.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Query: strings.Join(where, " AND "), PageSize: int32(min(limit, 100)), NextPageToken: token})
		if err != nil {
			return nil, fmt.Errorf("history: %w", err)
		}
		for _, e := range resp.GetExecutions() {
			if len(out) == limit {
				break
			}
			out = append(out, c.record(ctx, e))
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			break
		}
	}
	return out, nil
}

// LastOperation is the newest run on the guest, read from the run itself
// (strongly consistent), or nil when none ran.
func (c *Client) LastOperation(ctx context.Context, uuid string) (*Record, error) {
	d, err := c.temporal.DescribeWorkflow(ctx, guest.InstanceWorkflowID(uuid), "")
	var nf *serviceerror.NotFound
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := c.record(ctx, d.RawResponse.GetWorkflowExecutionInfo())
	return &r, nil
}

// record reads a run's search attributes and, when it did not complete,
// why from its close event.
func (c *Client) record(ctx context.Context, e *workflowpb.WorkflowExecutionInfo) Record {
	r := Record{WorkflowID: e.GetExecution().GetWorkflowId(), RunID: e.GetExecution().GetRunId(), Status: statusWord(e.GetStatus()),
		Start: e.GetStartTime().AsTime()}
	if e.GetCloseTime() != nil {
		r.Close = e.GetCloseTime().AsTime()
	}
	if e.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
		r.Close = time.Time{}
	}
	fields := e.GetSearchAttributes().GetIndexedFields()
	str := func(k temporal.SearchAttributeKeyKeyword) string {
		var s string
		if p, ok := fields[k.GetName()]; ok {
			_ = converter.GetDefaultDataConverter().FromPayload(p, &s)
		}
		return s
	}
	r.Operation, r.UUID, r.Phase = api.Operation(str(api.AttrOperation)), str(api.AttrInstance), api.Phase(str(api.AttrPhase))
	r.Source, r.Dest = str(api.AttrSourceHost), str(api.AttrDestHost)
	if r.Operation == "" {
		r.Operation = api.Operation(e.GetType().GetName())
	}
	if r.Ended() && r.Status != "completed" {
		r.Reason = c.closeReason(ctx, r.WorkflowID, r.RunID)
	}
	return r
}

// closeReason says in one line why a run that did not complete ended.
func (c *Client) closeReason(ctx context.Context, id, runID string) string {
	it := c.temporal.GetWorkflowHistory(ctx, id, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_CLOSE_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return ""
		}
		switch {
		case ev.GetWorkflowExecutionFailedEventAttributes() != nil:
			f := ev.GetWorkflowExecutionFailedEventAttributes().GetFailure()
			return RootMessage(temporal.GetDefaultFailureConverter().FailureToError(f))
		case ev.GetWorkflowExecutionTerminatedEventAttributes() != nil:
			why := ev.GetWorkflowExecutionTerminatedEventAttributes().GetReason()
			if why == "" {
				why = "no reason given"
			}
			return "terminated: " + why + "; the audit frees what it left pending"
		case ev.GetWorkflowExecutionCanceledEventAttributes() != nil:
			return "cancelled; its steps were compensated"
		case ev.GetWorkflowExecutionTimedOutEventAttributes() != nil:
			return "timed out; the audit frees what it left pending"
		}
	}
	return ""
}

// quote makes s a visibility query string literal.
func quote(s string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}
