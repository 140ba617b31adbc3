package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
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
	// started, closed longer ago than the namespace's retention, or run
	// in another namespace or on another server).
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
	// Retention is how long the namespace keeps a closed run: a workflow
	// not found may have closed longer ago only.
	Retention(ctx context.Context) (time.Duration, error)
}

// TemporalOwners is the OwnerChecker of a real Temporal server: one
// DescribeWorkflow of the id's latest run per question.
type TemporalOwners struct {
	Client client.Client
	// Namespace is the Client's namespace.
	Namespace string
}

// Retention reads the namespace's workflow execution retention.
func (t TemporalOwners) Retention(ctx context.Context) (time.Duration, error) {
	d, err := t.Client.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: t.Namespace})
	if err != nil {
		return 0, fmt.Errorf("audit: describe namespace %q: %w", t.Namespace, err)
	}
	ttl := d.GetConfig().GetWorkflowExecutionRetentionTtl()
	if ttl == nil {
		return 0, fmt.Errorf("audit: describe namespace %q: the reply has no retention", t.Namespace)
	}
	return ttl.AsDuration(), nil
}

// OwnerStatus describes the latest run of workflowID.
func (t TemporalOwners) OwnerStatus(ctx context.Context, workflowID string) (OwnerStatus, error) {
	d, err := t.Client.DescribeWorkflow(ctx, workflowID, "")
	if err != nil {
		var nf *serviceerror.NotFound
		if errors.As(err, &nf) {
			return OwnerStatus{State: OwnerNotFound}, nil
		}
		return OwnerStatus{}, fmt.Errorf("audit: describe workflow %s: %w", workflowID, err)
	}
	info := d.RawResponse.GetWorkflowExecutionInfo()
	if info == nil {
		return OwnerStatus{}, fmt.Errorf("audit: describe workflow %s: the reply has no execution info", workflowID)
	}
	st := OwnerStatus{FirstRunID: info.GetFirstRunId()}
	switch info.GetStatus() {
	case enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING:
		st.State = OwnerRunning
		st.Since = info.GetStartTime().AsTime()
	case enumspb.WORKFLOW_EXECUTION_STATUS_UNSPECIFIED:
		return OwnerStatus{}, fmt.Errorf("audit: describe workflow %s: status unspecified", workflowID)
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
		return OwnerStatus{}, fmt.Errorf("audit: describe workflow %s: the server reports no first run id", workflowID)
	}
	return st, nil
}

// HeldClaimsQuery is the query every operation that claims answers with
// the claims it made ([]HeldClaim), so that a recovery can make a lost
// one again exactly as its workflow knows it.
const HeldClaimsQuery = "pinflow-held-claims"

// HeldClaim is a claim an operation made, as its workflow knows it: the
// token its fenced steps prove themselves with, and the placement.
type HeldClaim struct {
	Host       string           `json:"host"`
	ClaimID    string           `json:"claim_id"`
	Kind       ledger.ClaimKind `json:"kind"`
	Token      string           `json:"token"`
	OwnerRunID string           `json:"owner_run_id"`
	Placement  numa.Placement   `json:"placement"`
}

// ClaimHolders asks an open operation which claims it made.
type ClaimHolders interface {
	HeldClaims(ctx context.Context, workflowID string) ([]HeldClaim, error)
}

// HeldClaims queries the open run of workflowID; every operation answers.
func (t TemporalOwners) HeldClaims(ctx context.Context, workflowID string) ([]HeldClaim, error) {
	v, err := t.Client.QueryWorkflow(ctx, workflowID, "", HeldClaimsQuery)
	if err != nil {
		return nil, fmt.Errorf("audit: query %s of workflow %s: %w", HeldClaimsQuery, workflowID, err)
	}
	var held []HeldClaim
	if err := v.Get(&held); err != nil {
		return nil, fmt.Errorf("audit: query %s of workflow %s: %w", HeldClaimsQuery, workflowID, err)
	}
	return held, nil
}
