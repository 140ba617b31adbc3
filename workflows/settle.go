package workflows

import (
	"context"
	"errors"
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
)

// SettleResult says what Settle did.
type SettleResult = audit.SettleResult

// Settle finishes forwards an operation that was interrupted after its
// guest started on a new claim (a terminated migration, boot or
// unshelve): when the hypervisors say without doubt that the guest runs
// there, the claim becomes the instance's resident claim and the one its
// record named is released. The audit starts it, under the instance's
// workflow id, so it never runs beside another operation on the guest.
func Settle(ctx workflow.Context, in audit.SettleInput) (*SettleResult, error) {
	s, err := newSaga(ctx, api.OpSettle, in.UUID, 1)
	if err != nil {
		return nil, err
	}
	s.setHosts("", in.Host)
	s.phase(api.PhaseCommitting, fmt.Sprintf("making claim %s on %s resident", in.ClaimID, in.Host))
	ctx = s.commit(ctx)
	var res SettleResult
	if err := s.ledger(ctx, "settle claim "+in.ClaimID, a.SettleClaim, in).Get(ctx, &res); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	detail := "settled"
	if !res.Settled {
		detail = "left as it is: " + res.Reason
	}
	s.phase(api.PhaseCompleted, detail)
	return &res, nil
}

// Replug plugs in again the devices of a guest that runs without them on
// its resident claim: a live migration unplugged them and was terminated
// before it plugged them in. The audit starts it, under the instance's
// workflow id. Forwards only: the devices are the claim's already.
func Replug(ctx workflow.Context, in audit.SettleInput) error {
	s, err := newSaga(ctx, api.OpReplug, in.UUID, 1)
	if err != nil {
		return err
	}
	s.setHosts("", in.Host)
	s.phase(api.PhasePlugging, "plugging the guest's PCI devices in again on "+in.Host)
	ctx = s.commit(ctx)
	plug := activities.PlugDevicesInput{UUID: in.UUID, Host: in.Host, ClaimID: in.ClaimID}
	if err := workflow.ExecuteActivity(s.hypervisorStep(ctx, "plug the devices in on "+in.Host), a.PlugDevices, plug).Get(ctx, nil); err != nil {
		return s.fail(err)
	}
	s.step()
	s.phase(api.PhaseCompleted, "")
	return nil
}

// AuditStarter starts the workflows the audit asks for under an
// instance's own workflow id: Settle and Replug (audit.Settler) and
// Evacuate (audit.Evacuator).
type AuditStarter struct {
	Client    client.Client
	TaskQueue string
}

// StartSettle starts Settle for in under the instance's workflow id; it
// fails while another workflow of the instance is open.
func (s AuditStarter) StartSettle(ctx context.Context, in audit.SettleInput) error {
	_, err := s.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                                       guest.InstanceWorkflowID(in.UUID),
		TaskQueue:                                s.TaskQueue,
		WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowIDReusePolicy:                    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		TypedSearchAttributes:                    temporal.NewSearchAttributes(api.StartAttributes(api.OpSettle, in.UUID)...),
		StaticSummary:                            fmt.Sprintf("settle %s on claim %s of %s", in.UUID, in.ClaimID, in.Host),
	}, Settle, in)
	if err != nil {
		return fmt.Errorf("workflows: start settle of %s: %w", in.UUID, err)
	}
	return nil
}

// StartReplug starts Replug for in under the instance's workflow id; it
// fails while another workflow of the instance is open.
func (s AuditStarter) StartReplug(ctx context.Context, in audit.SettleInput) error {
	_, err := s.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                                       guest.InstanceWorkflowID(in.UUID),
		TaskQueue:                                s.TaskQueue,
		WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowIDReusePolicy:                    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		TypedSearchAttributes:                    temporal.NewSearchAttributes(api.StartAttributes(api.OpReplug, in.UUID)...),
		StaticSummary:                            fmt.Sprintf("plug the devices of %s in again on %s", in.UUID, in.Host),
	}, Replug, in)
	if err != nil {
		return fmt.Errorf("workflows: start the replug of %s: %w", in.UUID, err)
	}
	return nil
}

// StartEvacuate starts Evacuate for a guest of the fenced host under the
// instance's workflow id (audit.Evacuator); started is false while
// another workflow of the instance is open.
func (s AuditStarter) StartEvacuate(ctx context.Context, uuid, host string) (bool, error) {
	_, err := s.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                                       guest.InstanceWorkflowID(uuid),
		TaskQueue:                                s.TaskQueue,
		WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowIDReusePolicy:                    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		TypedSearchAttributes:                    temporal.NewSearchAttributes(append(api.StartAttributes(api.OpEvacuation, uuid), api.AttrSourceHost.ValueSet(host))...),
		StaticSummary:                            fmt.Sprintf("evacuate %s from %s, started by the audit", uuid, host),
	}, Evacuate, api.EvacuateInput{UUID: uuid})
	var running *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &running) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("workflows: start evacuation of %s: %w", uuid, err)
	}
	return true, nil
}
