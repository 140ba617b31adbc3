package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
)

// OwnerState is what Temporal says of the workflow that owns a claim.
type OwnerState string

// Owner states.
const (
	// OwnerRunning: the workflow id has an open run.
	OwnerRunning OwnerState = "running"
	// OwnerClosed: the latest run of the workflow id is closed.
	OwnerClosed OwnerState = "closed"
	// OwnerNotFound: the server knows no run of the workflow id (never
	// started, or closed longer ago than the namespace's retention).
	OwnerNotFound OwnerState = "not-found"
)

// OwnerStatus is one strongly consistent answer about a workflow id.
type OwnerStatus struct {
	State OwnerState `json:"state"`
	// FirstRunID is the first run id of the latest run's chain: it stays
	// the same across retries and continue-as-new. Empty when not found.
	FirstRunID string `json:"first_run_id,omitempty"`
	// Since bounds when the state began: the close time of a closed run,
	// or the start of the running run (any older chain of the id closed
	// before it). Zero when not found.
	Since time.Time `json:"since,omitzero"`
}

// OwnerChecker answers whether a claim's owning workflow is still open.
// Implementations must be strongly consistent (DescribeWorkflow, never a
// visibility list or count: those lag without bound), and return an
// error, never a guess, when they cannot tell.
type OwnerChecker interface {
	OwnerStatus(ctx context.Context, workflowID string) (OwnerStatus, error)
}

// TemporalOwners is the OwnerChecker of a real Temporal server: one
// DescribeWorkflow of the id's latest run per question.
type TemporalOwners struct {
	Client client.Client
}

// OwnerStatus describes the latest run of workflowID.
func (t TemporalOwners) OwnerStatus(ctx context.Context, workflowID string) (OwnerStatus, error) {
	d, err := t.Client.DescribeWorkflow(ctx, workflowID, "")
	if err != nil {
		var nf *serviceerror.NotFound
		if errors.As(err, &nf) {
			return OwnerStatus{State: OwnerNotFound}, nil
		}
		return OwnerStatus{}, fmt.Errorf("activities: describe workflow %s: %w", workflowID, err)
	}
	info := d.RawResponse.GetWorkflowExecutionInfo()
	if info == nil {
		return OwnerStatus{}, fmt.Errorf("activities: describe workflow %s: the reply has no execution info", workflowID)
	}
	st := OwnerStatus{FirstRunID: info.GetFirstRunId()}
	switch info.GetStatus() {
	case enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING:
		st.State = OwnerRunning
		st.Since = info.GetStartTime().AsTime()
	case enumspb.WORKFLOW_EXECUTION_STATUS_UNSPECIFIED:
		return OwnerStatus{}, fmt.Errorf("activities: describe workflow %s: status unspecified", workflowID)
	default:
		// Completed, failed, cancelled, terminated, timed out, or (for a
		// run id given explicitly, which we never do) continued as new.
		st.State = OwnerClosed
		if info.GetCloseTime() != nil {
			st.Since = info.GetCloseTime().AsTime()
		}
	}
	if st.FirstRunID == "" {
		// Servers older than first run ids cannot tell a new chain from
		// the claim's own; doubt keeps the claim.
		return OwnerStatus{}, fmt.Errorf("activities: describe workflow %s: the server reports no first run id", workflowID)
	}
	return st, nil
}
