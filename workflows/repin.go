package workflows

import (
	"fmt"

	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/ledger"
)

// Repin moves a running guest's pinned vCPUs to other pCPUs of its host
// without moving the guest: it claims the target's new pCPUs beside the
// guest's resident claim, changes the running domain's pins and its
// persistent definition, and hands the new pCPUs to the resident claim,
// freeing those it leaves. A failure or a cancel before the first live
// pin call releases the re-pin claim; from that call on, the re-pin goes
// forwards.
func Repin(ctx workflow.Context, in api.RepinInput) (*api.RepinResult, error) {
	s, err := newSaga(ctx, api.OpRepin, in.UUID, 3)
	if err != nil {
		return nil, err
	}
	r := &repinning{saga: s, in: in}
	if err := s.run(ctx, r.checkInstance, r.claimTarget); err != nil {
		return nil, s.fail(err)
	}
	// The first live pin call is the point of no return: the guest may
	// run on some of the new pCPUs from then on.
	ctx = s.commit(ctx)
	if err := s.run(ctx, r.repinDomain, r.commitTarget); err != nil {
		return nil, s.fail(err)
	}
	s.phase(api.PhaseCompleted, "pinned to "+r.claimed.Placement.String())
	return &api.RepinResult{UUID: in.UUID, Host: r.inst.Host, Before: r.inst.Placement, After: &r.claimed.Placement}, nil
}

// repinning is a re-pin's state, shared by its steps.
type repinning struct {
	*saga
	in      api.RepinInput
	inst    activities.InstanceInfo
	claimed activities.ClaimResult
}

func (r *repinning) checkInstance(ctx workflow.Context) error {
	inst, err := r.loadInstance(ctx, r.in.UUID, activities.InstanceInfo.Running)
	if err != nil {
		return err
	}
	r.inst = inst
	r.setHosts(inst.Host, inst.Host)
	return nil
}

// claimTarget claims the target's new pCPUs; the undo releases them. The
// claim is not among the operation's held claims (HeldClaimsQuery): a
// recovery that made it again as a whole claim would take the guest's
// own pCPUs twice.
func (r *repinning) claimTarget(ctx workflow.Context) error {
	r.phase(api.PhaseScheduling, "claiming the pCPUs to re-pin the guest to on "+r.inst.Host)
	in := activities.ClaimRepinInput{UUID: r.in.UUID, Host: r.inst.Host, Resident: r.inst.ClaimID,
		ClaimID: claimID(ctx, string(ledger.KindRepin)), Owner: owner(ctx), PCPUs: r.in.PCPUs}
	r.onFailure("release the re-pin claim on "+r.inst.Host, func(ctx workflow.Context) error {
		return r.ledger(ctx, "release the re-pin claim on "+r.inst.Host, a.ReleaseClaim,
			activities.ReleaseInput{Host: r.inst.Host, ClaimID: in.ClaimID, OnlyPending: true}).Get(ctx, nil)
	})
	if err := r.ledger(ctx, "claim the re-pin on "+r.inst.Host, a.ClaimRepin, in).Get(ctx, &r.claimed); err != nil {
		return err
	}
	r.phase(api.PhaseAccepted, fmt.Sprintf("claim %s holds %s beside the guest's", r.claimed.ClaimID, r.claimed.Placement.String()))
	r.step()
	return nil
}

func (r *repinning) repinDomain(ctx workflow.Context) error {
	r.phase(api.PhaseRepinning, "pinning the running guest to "+r.claimed.Placement.String())
	in := activities.RepinDomainInput{UUID: r.in.UUID, Host: r.inst.Host, ClaimID: r.claimed.ClaimID, Token: r.claimed.Token,
		Target: r.claimed.Placement}
	if err := workflow.ExecuteActivity(r.hypervisorStep(ctx, "re-pin the guest on "+r.inst.Host), a.RepinDomain, in).Get(ctx, nil); err != nil {
		return err
	}
	r.step()
	return nil
}

func (r *repinning) commitTarget(ctx workflow.Context) error {
	r.phase(api.PhaseCommitting, "handing the new pCPUs to the guest's claim")
	in := activities.CommitRepinInput{UUID: r.in.UUID, Host: r.inst.Host, Resident: r.inst.ClaimID, ClaimID: r.claimed.ClaimID}
	if err := r.ledger(ctx, "commit the re-pin", a.CommitRepin, in).Get(ctx, nil); err != nil {
		return err
	}
	r.step()
	return nil
}
