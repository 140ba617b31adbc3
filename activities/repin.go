package activities

import (
	"context"
	"errors"
	"fmt"

	"github.com/pinflow/pinflow/defrag"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// ClaimRepinInput asks for the claim of a running guest's re-pin on its
// host.
type ClaimRepinInput struct {
	UUID string `json:"uuid"`
	Host string `json:"host"`
	// Resident is the guest's resident claim, as the operation found it.
	Resident string `json:"resident"`
	ClaimID  string `json:"claim_id"`
	Owner    Owner  `json:"owner"`
	// PCPUs are the pCPUs asked for (api.RepinInput); empty packs the
	// guest onto the pCPUs of its cells free or its own that leave the
	// most whole cores free (defrag.Target).
	PCPUs numa.CPUSet `json:"pcpus,omitzero"`
}

// ClaimRepin makes the re-pin claim of the guest's target placement on
// its host (ledger.ClaimRepin): the pCPUs it is to run on that it does
// not hold already. A guest not on in.Host's in.Resident claim is a
// BadState; one without pinned vCPUs, or pCPUs it cannot take, an
// InvalidRequest; pCPUs another claim holds, a Conflict.
func (a *Activities) ClaimRepin(ctx context.Context, in ClaimRepinInput) (ClaimResult, error) {
	inst, err := a.Ledger.Instance(ctx, in.UUID)
	if err != nil {
		return ClaimResult{}, classify(err)
	}
	if inst.Host != in.Host || inst.ClaimID != in.Resident {
		return ClaimResult{}, BadState(fmt.Sprintf("instance %s is on claim %s of %q, not on claim %s of %s", in.UUID, inst.ClaimID, inst.Host, in.Resident, in.Host))
	}
	snap, err := a.Ledger.Snapshot(ctx, in.Host)
	if err != nil {
		return ClaimResult{}, classify(err)
	}
	target, err := defrag.Target(snap.Topology, inst.Placement, in.PCPUs)
	if err != nil {
		return ClaimResult{}, BadRequest(fmt.Sprintf("instance %s: %v", in.UUID, err))
	}
	c, err := a.Ledger.ClaimRepin(ctx, ledger.RepinSpec{ID: in.ClaimID, Host: in.Host, InstanceUUID: in.UUID, Resident: in.Resident,
		OwnerWorkflowID: in.Owner.WorkflowID, OwnerRunID: in.Owner.FirstRunID, Target: target})
	if err != nil {
		return ClaimResult{}, conflict(err)
	}
	return ClaimResult{Host: c.Host, ClaimID: c.ID, Token: c.Token, State: c.State, Placement: *c.Target}, nil
}

// RepinDomainInput is the live re-pin of a guest to its re-pin claim's
// target.
type RepinDomainInput struct {
	UUID    string         `json:"uuid"`
	Host    string         `json:"host"`
	ClaimID string         `json:"claim_id"`
	Token   string         `json:"token"`
	Target  numa.Placement `json:"target"`
}

// RepinDomain pins the running guest's vCPUs, emulator and I/O threads to
// the target and makes its persistent definition say so, fenced on the
// re-pin claim: an attempt whose operation ended changes nothing.
// Repinning a guest that has the target's pins already succeeds.
func (a *Activities) RepinDomain(ctx context.Context, in RepinDomainInput) error {
	return a.heartbeating(ctx, func(ctx context.Context) error {
		def, err := a.repinnedXML(ctx, in.Host, in.UUID, &in.Target)
		if err != nil {
			return err
		}
		f, err := a.fenceDomain(ctx, DomainInput{UUID: in.UUID, Host: in.Host, ClaimID: in.ClaimID, Token: in.Token}, false)
		if err != nil {
			return err
		}
		return f.do(ctx, func(ctx context.Context) error { return a.Driver.Repin(ctx, in.Host, in.UUID, def) })
	})
}

// repinnedXML is the guest's definition pinned to p: the one its record
// keeps, or the hypervisor's when the record keeps none.
func (a *Activities) repinnedXML(ctx context.Context, host, uuid string, p *numa.Placement) (string, error) {
	inst, err := a.Ledger.Instance(ctx, uuid)
	if err != nil {
		return "", classify(err)
	}
	base := inst.DomainXML
	if base == "" {
		dom, err := a.Driver.Lookup(ctx, host, uuid)
		if errors.Is(err, hypervisor.ErrNotFound) {
			return "", BadState(fmt.Sprintf("instance %s has no domain on %s to re-pin", uuid, host))
		}
		if err != nil {
			return "", classify(err)
		}
		base = dom.XML
	}
	xml, err := xmlpatch.Patch(base, p)
	return xml, classify(err)
}

// CommitRepinInput names a re-pin to commit.
type CommitRepinInput struct {
	UUID     string `json:"uuid"`
	Host     string `json:"host"`
	Resident string `json:"resident"`
	ClaimID  string `json:"claim_id"`
}

// CommitRepin makes the re-pin's target the guest's resident claim's
// (ledger.CommitRepin) and points the record at it with the re-pinned
// definition. Both are retried safely.
func (a *Activities) CommitRepin(ctx context.Context, in CommitRepinInput) error {
	c, err := a.Ledger.CommitRepin(ctx, in.Host, in.Resident, in.ClaimID)
	if err != nil {
		return classify(err)
	}
	xml, err := a.repinnedXML(ctx, in.Host, in.UUID, c.Placement)
	if err != nil {
		return err
	}
	return classify(a.Ledger.AttachInstance(ctx, in.UUID, in.Host, in.Resident, xml))
}
