package activities

import (
	"context"
	"errors"
	"fmt"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/guestxml"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// A resize (or a cold migration, a resize to the same flavor) keeps the
// guest's resident claim as a source hold while it claims the new
// placement, so that a revert gets the very same pCPUs back without a
// fit: no other claim can take them in between, and nothing has to be
// rebuilt from a stashed flavor. The record keeps what a revert needs
// (ledger.ResizeRecord) from the first step, while it still names the
// source.

// ClaimRef names one claim.
type ClaimRef struct {
	Host    string `json:"host"`
	ClaimID string `json:"claim_id"`
}

// BeginResizeInput starts a resize's record keeping.
type BeginResizeInput struct {
	UUID string `json:"uuid"`
	// NewFlavor is the flavor the guest is resized to (its own for a cold
	// migration).
	NewFlavor guest.Flavor `json:"new_flavor"`
	Cold      bool         `json:"cold,omitempty"`
}

// BeginResize stores in the instance's record where it comes from and
// what it was (its host, claim, flavor and domain XML), before anything
// moves. It refuses an instance already in a resize.
func (a *Activities) BeginResize(ctx context.Context, in BeginResizeInput) error {
	inst, err := a.Ledger.Instance(ctx, in.UUID)
	if err != nil {
		return classify(err)
	}
	if r := inst.Resize; r != nil && (r.SourceClaimID != inst.ClaimID || r.SourceHost != inst.Host) {
		return BadState(fmt.Sprintf("instance %s is in a resize from %s already: confirm or revert it (one whose workflow ended is confirmed by the next audit)", in.UUID, r.SourceHost))
	}
	// A resize record that still names the resident claim is this
	// resize's own (a retry), or one of a resize that was interrupted
	// before its guest moved: the workflow lock on the instance means
	// none is open, so this resize replaces it.
	if inst.Host == "" || inst.ClaimID == "" {
		return BadState(fmt.Sprintf("instance %s is on no host; only a guest on a host can be resized or cold-migrated", in.UUID))
	}
	c, err := a.Ledger.GetClaim(ctx, inst.Host, inst.ClaimID)
	switch {
	case errors.Is(err, ledger.ErrUnknownClaim):
		// An interrupted operation released it and never detached the
		// record: there is nothing to hold, and retrying cannot help.
		return BadState(fmt.Sprintf("instance %s's record names claim %s on %s, which the ledger does not hold (an interrupted shelve or delete released it); delete the instance, or run an audit", in.UUID, inst.ClaimID, inst.Host))
	case err != nil:
		return classify(err)
	case c.State == ledger.StateHeld:
		// The hold of a resize interrupted before its guest moved (or
		// this one's, on a retry): resident again until this one holds it.
		if _, err := a.Ledger.Unhold(ctx, inst.Host, c.ID); err != nil {
			return classify(err)
		}
	case c.State != ledger.StateCommitted:
		return BadState(fmt.Sprintf("instance %s's claim %s on %s is %s, not resident", in.UUID, c.ID, inst.Host, c.State))
	}
	xml := inst.DomainXML
	if inst.Resize != nil && inst.Resize.OldDomainXML != "" {
		xml = inst.Resize.OldDomainXML
	}
	if xml == "" {
		// A move that found no XML staged for its claim cleared the
		// record's (ledger.Move): what the hypervisor has is the guest's
		// definition.
		dom, err := a.Driver.Lookup(ctx, inst.Host, in.UUID)
		if err != nil {
			return classify(err)
		}
		xml = dom.XML
		if err := a.Ledger.SetDomainXML(ctx, in.UUID, xml); err != nil {
			return classify(err)
		}
	}
	rec := &ledger.ResizeRecord{SourceHost: inst.Host, SourceClaimID: inst.ClaimID, OldFlavor: inst.Request,
		NewFlavor: &in.NewFlavor, OldDomainXML: xml, Cold: in.Cold}
	return classify(a.Ledger.MoveInstance(ctx, in.UUID, ledger.Move{Host: inst.Host, ClaimID: inst.ClaimID, Resize: rec}))
}

// EndResize forgets a resize's record keeping (a resize undone before
// the guest moved, or a confirm's last step).
func (a *Activities) EndResize(ctx context.Context, uuid string) error {
	return classify(a.Ledger.ClearResize(ctx, uuid))
}

// HoldClaim turns the guest's resident claim into a source hold.
func (a *Activities) HoldClaim(ctx context.Context, in ClaimRef) error {
	_, err := a.Ledger.Hold(ctx, in.Host, in.ClaimID)
	if errors.Is(err, ledger.ErrUnknownClaim) || errors.Is(err, ledger.ErrConflict) {
		return BadState(err.Error())
	}
	return classify(err)
}

// UnholdClaim turns a source hold back into the resident claim; a claim
// that is gone has nothing to undo.
func (a *Activities) UnholdClaim(ctx context.Context, in ClaimRef) error {
	_, err := a.Ledger.Unhold(ctx, in.Host, in.ClaimID)
	if errors.Is(err, ledger.ErrUnknownClaim) {
		return nil
	}
	return classify(err)
}

// PowerOff asks the guest to power itself off, waits up to
// ShutdownTimeout, then powers it off for good; its definition stays. It
// takes the guest's claim on the host first.
func (a *Activities) PowerOff(ctx context.Context, in DomainInput) error {
	return a.heartbeating(ctx, func(ctx context.Context) error {
		f, err := a.fenceDomain(ctx, in, true)
		if err != nil {
			return err
		}
		if err := a.shutdown(ctx, f, in.Host, in.UUID); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			return classify(err)
		}
		if err := f.do(ctx, func(ctx context.Context) error { return a.Driver.Stop(ctx, in.Host, in.UUID) }); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			return err
		}
		return nil
	})
}

// MoveResizedInput is the move of a powered-off guest to its new claim.
type MoveResizedInput struct {
	UUID      string         `json:"uuid"`
	Source    string         `json:"source"`
	Dest      string         `json:"dest"`
	ClaimID   string         `json:"claim_id"`
	Token     string         `json:"token"`
	Placement numa.Placement `json:"placement"`
	// SourceToken is the source hold's token as the operation found it.
	SourceToken string `json:"source_token,omitempty"`
	// Start the guest on the destination (it was running before).
	Start bool `json:"start,omitempty"`
}

// MoveResized removes the powered-off guest's definition from the source
// and defines it on the destination with the new flavor's domain XML
// pinned to the destination claim, then starts it there when asked. The
// source's definition is kept in the record (BeginResize), so a revert
// defines it again. Disks are on shared storage: only the definition
// moves. It fences on the destination claim before the define and the
// start. It stages the XML it defines for the claim, where FinishResize
// reads it.
func (a *Activities) MoveResized(ctx context.Context, in MoveResizedInput) error {
	if err := needsClaim("move", in.UUID, in.ClaimID, in.Token); err != nil {
		return err
	}
	return a.heartbeating(ctx, func(ctx context.Context) error {
		var inst *ledger.Instance
		if err := waitLedger(ctx, func(ctx context.Context) (err error) { inst, err = a.Ledger.Instance(ctx, in.UUID); return err }); err != nil {
			return classify(err)
		}
		if inst.Resize == nil || inst.Resize.NewFlavor == nil {
			return BadState(fmt.Sprintf("instance %s has no resize under way", in.UUID))
		}
		xml, err := resizedXML(inst.Resize, &in.Placement, a.Domain)
		if err != nil {
			return err
		}
		src, err := a.Driver.Lookup(ctx, in.Source, in.UUID)
		switch {
		case errors.Is(err, hypervisor.ErrNotFound):
			// Undefined by an earlier attempt.
		case err != nil:
			return classify(err)
		case src.State == hypervisor.StateShutoff:
			// Under the source hold, which PowerOff took for the operation.
			f, err := a.fenceDomain(ctx, DomainInput{UUID: in.UUID, Host: in.Source, ClaimID: inst.Resize.SourceClaimID, Token: in.SourceToken}, true)
			if err != nil {
				return err
			}
			if err := f.do(ctx, func(ctx context.Context) error { return a.Driver.Undefine(ctx, in.Source, in.UUID) }); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
				return err
			}
		case in.Source != in.Dest:
			return BadState(fmt.Sprintf("instance %s is %s on %s; it must be powered off before it moves", in.UUID, src.State, in.Source))
		default:
			// On the same host, a running guest was started with its new
			// definition by an earlier attempt: PowerOff stopped the old.
		}
		if err := a.stage(ctx, in.UUID, in.ClaimID, xml); err != nil {
			return err
		}
		return a.defineAndStart(ctx, in.Dest, in.UUID, xml, in.ClaimID, in.Token, in.Start)
	})
}

// resizedXML is the domain XML of the guest with its new flavor, pinned
// to p: the old definition with the new vCPUs, memory and guest cells (a
// resize), or the old one as it was (a cold migration), patched for p.
func resizedXML(r *ledger.ResizeRecord, p *numa.Placement, o guestxml.Options) (string, error) {
	base := r.OldDomainXML
	if !r.Cold {
		req, err := r.NewFlavor.Request()
		if err != nil {
			return "", classify(err)
		}
		if base, err = guestxml.Resize(base, req, p, o); err != nil {
			return "", classify(fmt.Errorf("%w: %v", ledger.ErrInvalid, err))
		}
	}
	xml, err := xmlpatch.Patch(base, p)
	return xml, classify(err)
}

// FinishResizeInput makes a moved guest's destination claim resident.
type FinishResizeInput struct {
	UUID        string `json:"uuid"`
	Dest        string `json:"dest"`
	DestClaimID string `json:"dest_claim_id"`
}

// FinishResize commits the destination claim, points the record at it
// with the new flavor and the domain XML staged for it (the resize
// record stays, for a revert), and marks the instance resized:
// VERIFY_RESIZE, both claims held until a confirm or a revert.
func (a *Activities) FinishResize(ctx context.Context, in FinishResizeInput) error {
	inst, err := a.Ledger.Instance(ctx, in.UUID)
	if err != nil {
		return classify(err)
	}
	if inst.Resize == nil || inst.Resize.NewFlavor == nil {
		return BadState(fmt.Sprintf("instance %s has no resize under way", in.UUID))
	}
	if _, err := a.Ledger.Commit(ctx, in.Dest, in.DestClaimID); err != nil {
		return classify(err)
	}
	m := ledger.Move{Host: in.Dest, ClaimID: in.DestClaimID, StagedXML: true, Flavor: inst.Resize.NewFlavor}
	if err := a.Ledger.MoveInstance(ctx, in.UUID, m); err != nil {
		return classify(err)
	}
	return classify(a.Ledger.SetState(ctx, in.UUID, ledger.Transition{VM: guest.VMResized, Task: guest.TaskNone}))
}

// KeepMoved commits a move that is not to be undone (its source hold is
// gone or its host down) when the guest's domain is defined on in.Dest,
// as FinishResize does; a move that defined none there is
// api.ErrTypeBadState: nothing of the guest is on the destination to keep.
func (a *Activities) KeepMoved(ctx context.Context, in FinishResizeInput) error {
	if _, err := a.Driver.Lookup(ctx, in.Dest, in.UUID); err != nil {
		if errors.Is(err, hypervisor.ErrNotFound) {
			return BadState(fmt.Sprintf("instance %s has no domain on %s: its move did not get that far", in.UUID, in.Dest))
		}
		return classify(err)
	}
	return a.FinishResize(ctx, in)
}

// ConfirmResizeInput ends a resize by keeping its destination.
type ConfirmResizeInput struct {
	UUID string `json:"uuid"`
	// Source and SourceClaimID name the source hold.
	Source        string        `json:"source"`
	SourceClaimID string        `json:"source_claim_id"`
	VMState       guest.VMState `json:"vm_state"`
}

// ConfirmResize frees the source hold, then forgets the resize and
// marks the instance with its state from before the resize. Its guest
// left the source when it moved (MoveResized).
func (a *Activities) ConfirmResize(ctx context.Context, in ConfirmResizeInput) error {
	if err := a.Ledger.Release(ctx, in.Source, in.SourceClaimID); err != nil {
		return classify(err)
	}
	if err := a.Ledger.ClearResize(ctx, in.UUID); err != nil {
		return classify(err)
	}
	return classify(a.Ledger.SetState(ctx, in.UUID, ledger.Transition{VM: in.VMState, Task: guest.TaskNone}))
}

// RevertRecordInput points a resized instance back at its source hold.
type RevertRecordInput struct {
	UUID          string `json:"uuid"`
	Source        string `json:"source"`
	SourceClaimID string `json:"source_claim_id"`
	// KeepResize keeps the resize info, for the workflow to forget once
	// the guest's copy on the destination is gone: until then the audit,
	// finding the guest still there, settles it forwards with the new
	// flavor, never with the old one the record now names.
	KeepResize bool `json:"keep_resize,omitempty"`
}

// RevertRecord turns the source hold back into the resident claim (the
// same pCPUs, never re-fitted) and points the record at it with the old
// flavor and domain XML, forgetting the resize unless in.KeepResize. It
// comes before the destination's guest is destroyed, so that a revert
// that cannot have its hold back leaves the guest running: a source host
// that is down or returning is api.ErrTypeHostDown, a hold that is gone
// api.ErrTypeBadState.
func (a *Activities) RevertRecord(ctx context.Context, in RevertRecordInput) error {
	inst, err := a.Ledger.Instance(ctx, in.UUID)
	if err != nil {
		return classify(err)
	}
	_, err = a.Ledger.Reinstate(ctx, in.Source, in.SourceClaimID)
	switch {
	case errors.Is(err, ledger.ErrUnknownClaim):
		return BadState(fmt.Sprintf("instance %s's source hold %s on %s is gone (released by another operation or an operator); its resize cannot be reverted",
			in.UUID, in.SourceClaimID, in.Source))
	case err != nil:
		return classify(err)
	}
	if inst.Resize == nil {
		if inst.Host == in.Source && inst.ClaimID == in.SourceClaimID {
			return nil // a retry
		}
		return BadState(fmt.Sprintf("instance %s has no resize to revert", in.UUID))
	}
	m := ledger.Move{Host: in.Source, ClaimID: in.SourceClaimID, DomainXML: inst.Resize.OldDomainXML,
		Flavor: &inst.Resize.OldFlavor, ClearResize: !in.KeepResize}
	return classify(a.Ledger.MoveInstance(ctx, in.UUID, m))
}
