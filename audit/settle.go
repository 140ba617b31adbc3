package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// Settler starts the workflow that finishes an interrupted operation
// forwards (workflows.Settle) under the instance's own workflow id, so
// it can never run beside another operation on the guest. Starting it
// while another workflow of the instance is open fails, and the audit
// then keeps the claim for that workflow to settle.
type Settler interface {
	StartSettle(ctx context.Context, in SettleInput) error
	// StartReplug starts the workflow that plugs in again the devices a
	// live migration unplugged from the guest and ended without plugging
	// in (workflows.Replug); in names the guest's resident claim.
	StartReplug(ctx context.Context, in SettleInput) error
}

// SettleInput names a claim whose instance already runs on it, with no
// operation left to say so.
type SettleInput struct {
	UUID    string `json:"uuid"`
	Host    string `json:"host"`
	ClaimID string `json:"claim_id"`
	// Token is what the settle takes the claims it decides on with
	// (ledger.Take), so that a step of the interrupted operation fences
	// in vain after it; the settle's run sets it. Empty: settleToken.
	Token string `json:"token,omitempty"`
}

// settleToken is the token of a settle called without one (a test).
const settleToken = "audit-settle"

// settleLease is the fence lease of a settle's own calls on a domain.
const settleLease = time.Minute

func (in SettleInput) token() string {
	if in.Token == "" {
		return settleToken
	}
	return in.Token
}

// takeFor takes the claim for the settle: a step of the operation that
// held it, still able to act under its fence lease, is waited out, and
// every later one is refused at its fence.
func (a *Auditor) takeFor(ctx context.Context, in SettleInput, host, claimID string) error {
	return a.Ledger.TakeOver(ctx, host, claimID, nil, in.token())
}

// actFor runs call, which changes the guest's domain on host, for the
// claim: it takes the claim, fences on it and gives call half the lease
// as its deadline. A claim that is gone holds nothing call could take
// from another guest: call then runs unclaimed.
func (a *Auditor) actFor(ctx context.Context, in SettleInput, host, claimID string, call func(ctx context.Context) error) error {
	err := a.takeFor(ctx, in, host, claimID)
	if errors.Is(err, ledger.ErrUnknownClaim) {
		uctx, cancel := context.WithTimeout(hypervisor.Unclaimed(ctx, "the claim "+claimID+" is released"), settleLease/2)
		defer cancel()
		return call(uctx)
	}
	if err != nil {
		return err
	}
	sent := time.Now()
	if _, err := a.Ledger.FenceTeardown(ctx, host, claimID, in.token(), settleLease); err != nil {
		return err
	}
	actx, cancel := context.WithDeadline(hypervisor.WithFence(ctx, host+"/"+claimID), sent.Add(settleLease/2))
	defer cancel()
	err = call(actx)
	if actx.Err() == nil {
		_ = a.Ledger.Unfence(context.WithoutCancel(ctx), host, claimID, in.token())
	}
	return err
}

// SettleResult says what SettleClaim did.
type SettleResult struct {
	// Settled: the claim is the instance's resident claim now.
	Settled bool `json:"settled"`
	// Why nothing was settled, when not.
	Reason string `json:"reason,omitempty"`
	// The claim the record named before and that was released, if any.
	PreviousHost    string `json:"previous_host,omitempty"`
	PreviousClaimID string `json:"previous_claim_id,omitempty"`
}

// SettleClaim makes in.ClaimID the instance's resident claim when the
// hypervisors say, without doubt, that the guest already runs on it: the
// only running domain of the instance is on in.Host, pinned to exactly
// the claim's pCPUs. It then commits the claim, points the record at it
// with the running domain's XML, removes a shut-off leftover of the guest
// from the host the record named, releases the claim the record named,
// and marks the instance active. This is the end of a migration, boot or
// unshelve whose workflow was terminated after the guest started. An
// instance with no record any more was deleted: its guest is destroyed
// and the claim released instead (finishDelete). Every step is
// idempotent; anything less than certain changes nothing and says why.
func (a *Auditor) SettleClaim(ctx context.Context, in SettleInput) (SettleResult, error) {
	return a.settle(ctx, in, false)
}

// settle is SettleClaim; stopped also takes a guest whose domain on
// in.Host is shut off, pinned to exactly the claim, as on it: the record
// then says stopped (see settleStoppedResize).
func (a *Auditor) settle(ctx context.Context, in SettleInput, stopped bool) (SettleResult, error) {
	inst, err := a.Ledger.Instance(ctx, in.UUID)
	if errors.Is(err, ledger.ErrUnknownInstance) {
		return a.finishDelete(ctx, in)
	}
	if err != nil {
		return SettleResult{}, err
	}
	res := SettleResult{}
	vm := guest.VMActive
	if inst.Host == in.Host && inst.ClaimID == in.ClaimID {
		claim, err := a.Ledger.GetClaim(ctx, in.Host, in.ClaimID)
		if err != nil && !errors.Is(err, ledger.ErrUnknownClaim) {
			return SettleResult{}, err
		}
		if err == nil && claim.State == ledger.StateHeld {
			return a.settleStoppedResize(ctx, in, inst, claim)
		}
	}
	if inst.Host != in.Host || inst.ClaimID != in.ClaimID {
		claim, err := a.Ledger.GetClaim(ctx, in.Host, in.ClaimID)
		if errors.Is(err, ledger.ErrUnknownClaim) {
			return SettleResult{Reason: fmt.Sprintf("claim %s is gone from %s", in.ClaimID, in.Host)}, nil
		}
		if err != nil {
			return SettleResult{}, err
		}
		if claim.InstanceUUID != in.UUID {
			return SettleResult{}, invalid(fmt.Sprintf("claim %s on %s belongs to instance %s, not %s", in.ClaimID, in.Host, claim.InstanceUUID, in.UUID))
		}
		if claim.Kind == ledger.KindRepin {
			return a.settleRepin(ctx, in, inst, claim)
		}
		// Taken before the domain is judged: a step of the operation
		// that made the claim can no longer act after the judgement.
		if err := a.takeFor(ctx, in, in.Host, in.ClaimID); err != nil {
			return SettleResult{}, err
		}
		topo, err := a.Ledger.Host(ctx, in.Host)
		if err != nil {
			return SettleResult{}, err
		}
		dom, why, err := a.runsOn(ctx, in.Host, in.UUID, topo, claim, stopped)
		if err == nil && why != "" && claim.Kind == ledger.KindResizeDest && resizeAtHome(inst) {
			return a.settleUndoneResize(ctx, inst, in.Host, why)
		}
		if err != nil || why != "" {
			return SettleResult{Reason: why}, err
		}
		flavor := inst.Request
		if r := inst.Resize; r != nil && r.NewFlavor != nil && claim.Kind == ledger.KindResizeDest {
			flavor = *r.NewFlavor
		}
		if n, err := vcpuCount(dom); err != nil || n != flavor.VCPUs {
			// The domain is not the one the record would take: a record
			// must never name a flavor its guest does not run.
			return SettleResult{Reason: fmt.Sprintf("the guest runs on %s with %s, and its record would say %d", in.Host, vcpusOf(n, err), flavor.VCPUs)}, nil
		}
		if dom.State == hypervisor.StateShutoff {
			vm = guest.VMStopped
		}
		prevDown, err := a.hostDown(ctx, inst.Host)
		if err != nil {
			return SettleResult{}, err
		}
		if inst.Host != "" && inst.Host != in.Host && !prevDown {
			other, err := a.Driver.Lookup(ctx, inst.Host, in.UUID)
			switch {
			case errors.Is(err, hypervisor.ErrNotFound):
			case err != nil:
				return SettleResult{}, err
			case other.State != hypervisor.StateShutoff:
				return SettleResult{Reason: fmt.Sprintf("the guest is also %s on %s, where its record says it lives", other.State, inst.Host)}, nil
			default:
				// The source's shut-off copy that a migration leaves
				// until it confirms: the guest lives on in.Host now.
				undefine := func(ctx context.Context) error { return a.Driver.Undefine(ctx, inst.Host, in.UUID) }
				if err := a.actFor(ctx, in, inst.Host, inst.ClaimID, undefine); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
					return SettleResult{}, err
				}
			}
		}
		if _, err := a.Ledger.Commit(ctx, in.Host, in.ClaimID); err != nil {
			return SettleResult{}, err
		}
		m := ledger.Move{Host: in.Host, ClaimID: in.ClaimID, DomainXML: dom.XML}
		if a.stagedFits(ctx, in, dom) {
			// The XML the operation made for the claim, with the devices
			// a live migration plugs in after it moved the guest.
			m = ledger.Move{Host: in.Host, ClaimID: in.ClaimID, StagedXML: true}
		}
		if r := inst.Resize; r != nil && r.NewFlavor != nil && claim.Kind == ledger.KindResizeDest {
			// A resize whose guest runs on its new claim: confirmed, its
			// revert stopped before the guest left.
			m.Flavor, m.ClearResize = r.NewFlavor, true
		}
		if err := a.Ledger.MoveInstance(ctx, in.UUID, m); err != nil {
			return SettleResult{}, err
		}
		if inst.ClaimID != "" {
			res.PreviousHost, res.PreviousClaimID = inst.Host, inst.ClaimID
		}
	} else if r := inst.Resize; r != nil && (r.SourceHost != inst.Host || r.SourceClaimID != inst.ClaimID) {
		// A resize left in VERIFY_RESIZE with no workflow: the guest
		// lives on its new claim, so the resize is confirmed.
		res.PreviousHost, res.PreviousClaimID = r.SourceHost, r.SourceClaimID
		if err := a.Ledger.Release(ctx, r.SourceHost, r.SourceClaimID); err != nil {
			return SettleResult{}, err
		}
		if err := a.Ledger.ClearResize(ctx, in.UUID); err != nil {
			return SettleResult{}, err
		}
	}
	if res.PreviousClaimID != "" {
		down, err := a.hostDown(ctx, res.PreviousHost)
		if err != nil {
			return SettleResult{}, err
		}
		if down {
			// An evacuation's: the fenced host may still define the
			// guest, so its claim stays a tombstone until host up.
			if _, err := a.Ledger.Tombstone(ctx, res.PreviousHost, res.PreviousClaimID); err != nil && !errors.Is(err, ledger.ErrUnknownClaim) {
				return SettleResult{}, err
			}
		} else if err := a.Ledger.Release(ctx, res.PreviousHost, res.PreviousClaimID); err != nil {
			return SettleResult{}, err
		}
	}
	if err := a.Ledger.SetState(ctx, in.UUID, ledger.Transition{VM: vm, Task: guest.TaskNone}); err != nil {
		return SettleResult{}, err
	}
	res.Settled = true
	return res, nil
}

// settleStoppedResize ends a resize that was stopped after it held the
// guest's resident claim and before the guest moved: the guest never left,
// so its hold is resident again and the resize is forgotten. The record's
// vm state follows the guest's domain, which the resize may have powered
// off. A resize on the guest's own host that defined the new flavor's
// domain before it stopped did move the guest: the claim its domain is
// pinned to is settled instead, forwards.
func (a *Auditor) settleStoppedResize(ctx context.Context, in SettleInput, inst *ledger.Instance, hold *ledger.Claim) (SettleResult, error) {
	// Taken before the domain is judged, as in settle.
	if err := a.takeFor(ctx, in, inst.Host, inst.ClaimID); err != nil {
		return SettleResult{}, err
	}
	dom, err := a.Driver.Lookup(ctx, inst.Host, inst.UUID)
	if err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
		return SettleResult{}, err
	}
	if dom != nil {
		// A resize on the guest's own host that got as far as defining
		// the new flavor's domain: the guest did move, onto the new
		// claim, which settles it forwards.
		topo, err := a.Ledger.Host(ctx, inst.Host)
		if err != nil {
			return SettleResult{}, err
		}
		pins, err := xmlpatch.Read(dom.XML)
		if err != nil {
			return SettleResult{Reason: fmt.Sprintf("the guest's domain XML on %s cannot be read: %v", inst.Host, err)}, nil
		}
		if used, held := pins.PinnedCPUs().Intersection(pinnable(topo)), claimCPUs(hold); !used.Difference(held).IsEmpty() {
			claims, err := a.Ledger.Claims(ctx, inst.Host)
			if err != nil {
				return SettleResult{}, err
			}
			for _, c := range claims {
				if c.InstanceUUID == inst.UUID && c.Kind == ledger.KindResizeDest && claimCPUs(&c).Equal(used) {
					// Defined on the new claim and perhaps not started (a
					// start that failed after the workflow ended): the
					// guest is there all the same, stopped as the resize
					// left it, never started by the audit.
					return a.settle(ctx, SettleInput{UUID: inst.UUID, Host: inst.Host, ClaimID: c.ID, Token: in.Token}, true)
				}
			}
			return SettleResult{Reason: fmt.Sprintf("the guest's domain on %s is pinned to %s, outside its source hold's %s and not to a claim of its resize",
				inst.Host, orNone(used), orNone(held))}, nil
		}
	}
	if _, err := a.Ledger.Unhold(ctx, inst.Host, inst.ClaimID); err != nil {
		return SettleResult{}, err
	}
	if r := inst.Resize; r != nil && r.SourceHost == inst.Host && r.SourceClaimID == inst.ClaimID {
		if err := a.Ledger.ClearResize(ctx, inst.UUID); err != nil {
			return SettleResult{}, err
		}
	}
	switch {
	case dom == nil:
		// No domain where the record says: drift for the audit to report,
		// not a state to guess.
		return SettleResult{Settled: true, Reason: fmt.Sprintf("the guest has no domain on %s", inst.Host)}, nil
	case dom.State == hypervisor.StateRunning:
		err = a.Ledger.SetState(ctx, inst.UUID, ledger.Transition{VM: guest.VMActive, Task: guest.TaskNone})
	case dom.State == hypervisor.StateShutoff:
		err = a.Ledger.SetState(ctx, inst.UUID, ledger.Transition{VM: guest.VMStopped, Task: guest.TaskNone})
	}
	if err != nil {
		return SettleResult{}, err
	}
	return SettleResult{Settled: true}, nil
}

// settleRepin finishes a re-pin whose workflow ended after it changed the
// guest's pins: when the guest's running domain on the host is pinned to
// exactly the re-pin's target, the re-pin is committed (its pCPUs go to
// the resident claim, which frees those it left) and the record takes the
// running domain's definition. Anything else changes nothing: a guest
// still on its old pins leaves the re-pin claim to the audit to free.
func (a *Auditor) settleRepin(ctx context.Context, in SettleInput, inst *ledger.Instance, repin *ledger.Claim) (SettleResult, error) {
	if inst.Host != in.Host || inst.ClaimID != repin.Repins {
		return SettleResult{Reason: fmt.Sprintf("re-pin %s is of claim %s on %s, and the record names claim %q on %q", repin.ID, repin.Repins, in.Host, inst.ClaimID, inst.Host)}, nil
	}
	if err := a.takeFor(ctx, in, in.Host, in.ClaimID); err != nil {
		return SettleResult{}, err
	}
	dom, err := a.Driver.Lookup(ctx, in.Host, in.UUID)
	if errors.Is(err, hypervisor.ErrNotFound) {
		return SettleResult{Reason: fmt.Sprintf("the guest has no domain on %s", in.Host)}, nil
	}
	if err != nil {
		return SettleResult{}, err
	}
	pins, err := xmlpatch.Read(dom.XML)
	if err != nil {
		return SettleResult{Reason: fmt.Sprintf("the guest's domain XML on %s cannot be read: %v", in.Host, err)}, nil
	}
	topo, err := a.Ledger.Host(ctx, in.Host)
	if err != nil {
		return SettleResult{}, err
	}
	used, target := pins.PinnedCPUs().Intersection(pinnable(topo)), usageCPUs(repin.TargetUsage)
	if dom.State != hypervisor.StateRunning || !used.Equal(target) {
		return SettleResult{Reason: fmt.Sprintf("the guest is %s on %s pinned to %s, and re-pin %s's target is %s", dom.State, in.Host, orNone(used), repin.ID, orNone(target))}, nil
	}
	if _, err := a.Ledger.CommitRepin(ctx, in.Host, repin.Repins, repin.ID); err != nil {
		return SettleResult{}, err
	}
	if err := a.Ledger.AttachInstance(ctx, in.UUID, in.Host, repin.Repins, dom.XML); err != nil {
		return SettleResult{}, err
	}
	return SettleResult{Settled: true}, nil
}

// resizeAtHome says whether inst's record keeps a resize that names its
// resident claim: one whose revert or undo pointed the record back at its
// source, or one stopped before it held that claim.
func resizeAtHome(inst *ledger.Instance) bool {
	r := inst.Resize
	return r != nil && inst.ClaimID != "" && r.SourceHost == inst.Host && r.SourceClaimID == inst.ClaimID
}

// settleUndoneResize ends a resize whose guest does not run on its
// destination claim (on dest, for why) while the record is back on its
// source: a revert or undo stopped after it pointed the record there, or
// a resize stopped before its guest moved. The resize is forgotten, and
// the record's task ends, only when nothing of the new flavor is left
// where it could run: no domain of the guest on dest (another host), and
// on the record's host none, or one of the record's flavor within its
// resident claim. The destination claim is the audit's to free then.
func (a *Auditor) settleUndoneResize(ctx context.Context, inst *ledger.Instance, dest, why string) (SettleResult, error) {
	if dest != inst.Host {
		switch _, err := a.Driver.Lookup(ctx, dest, inst.UUID); {
		case err == nil:
			return SettleResult{Reason: why + "; its domain there is the resize's"}, nil
		case !errors.Is(err, hypervisor.ErrNotFound):
			return SettleResult{}, err
		}
	}
	home, err := a.Ledger.GetClaim(ctx, inst.Host, inst.ClaimID)
	if err != nil {
		return SettleResult{}, err
	}
	if home.State != ledger.StateCommitted {
		return SettleResult{Reason: why + fmt.Sprintf("; its claim %s on %s is %s", home.ID, inst.Host, home.State)}, nil
	}
	dom, err := a.Driver.Lookup(ctx, inst.Host, inst.UUID)
	if err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
		return SettleResult{}, err
	}
	vm := inst.VMState
	if vm == guest.VMResized {
		vm = guest.VMActive
	}
	if dom != nil {
		pins, err := xmlpatch.Read(dom.XML)
		if err != nil {
			return SettleResult{Reason: fmt.Sprintf("the guest's domain XML on %s cannot be read: %v", inst.Host, err)}, nil
		}
		topo, err := a.Ledger.Host(ctx, inst.Host)
		if err != nil {
			return SettleResult{}, err
		}
		used := pins.PinnedCPUs().Intersection(pinnable(topo))
		if pins.VCPUs != inst.Request.VCPUs || !used.Difference(claimCPUs(home)).IsEmpty() {
			return SettleResult{Reason: fmt.Sprintf("%s; its domain on %s has %d vCPUs on %s, not the record's %d on %s",
				why, inst.Host, pins.VCPUs, orNone(used), inst.Request.VCPUs, orNone(claimCPUs(home)))}, nil
		}
		switch dom.State {
		case hypervisor.StateRunning:
			vm = guest.VMActive
		case hypervisor.StateShutoff:
			vm = guest.VMStopped
		}
	}
	if err := a.Ledger.ClearResize(ctx, inst.UUID); err != nil {
		return SettleResult{}, err
	}
	if err := a.Ledger.SetState(ctx, inst.UUID, ledger.Transition{VM: vm, Task: guest.TaskNone}); err != nil {
		return SettleResult{}, err
	}
	return SettleResult{Settled: true, Reason: why + "; the resize is undone and forgotten"}, nil
}

// vcpuCount is the vCPU count of dom's definition.
func vcpuCount(dom *hypervisor.Domain) (int, error) {
	pins, err := xmlpatch.Read(dom.XML)
	if err != nil {
		return 0, err
	}
	return pins.VCPUs, nil
}

func vcpusOf(n int, err error) string {
	if err != nil {
		return fmt.Sprintf("a definition that cannot be read (%v)", err)
	}
	if n == 1 {
		return "1 vCPU"
	}
	return fmt.Sprintf("%d vCPUs", n)
}

// finishDelete removes the guest of a deleted instance from in.Host and
// releases its claim there: the record goes only in a Delete, and a claim
// is made only after the record, so a claim without a record belongs to a
// guest an operator deleted while an interrupted operation had started it
// (a delete runs where the record says the guest is, and an interrupted
// boot never said).
func (a *Auditor) finishDelete(ctx context.Context, in SettleInput) (SettleResult, error) {
	claim, err := a.Ledger.GetClaim(ctx, in.Host, in.ClaimID)
	if errors.Is(err, ledger.ErrUnknownClaim) {
		return SettleResult{Settled: true, Reason: "the instance was deleted; its claim is gone"}, nil
	}
	if err != nil {
		return SettleResult{}, err
	}
	if claim.InstanceUUID != in.UUID {
		return SettleResult{}, invalid(fmt.Sprintf("claim %s on %s belongs to instance %s, not %s", in.ClaimID, in.Host, claim.InstanceUUID, in.UUID))
	}
	for _, call := range []func(context.Context, string, string) error{a.Driver.Stop, a.Driver.Undefine} {
		err := a.actFor(ctx, in, in.Host, in.ClaimID, func(ctx context.Context) error { return call(ctx, in.Host, in.UUID) })
		if err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			return SettleResult{}, err
		}
	}
	if err := a.Ledger.Release(ctx, in.Host, in.ClaimID); err != nil {
		return SettleResult{}, err
	}
	return SettleResult{Settled: true, Reason: "the instance was deleted: its guest destroyed and its claim released"}, nil
}

// runsOn looks at the instance's domain on host and says why it is not
// running (or, when stopped, shut off) pinned to exactly claim's pCPUs
// ("" when it is).
func (a *Auditor) runsOn(ctx context.Context, host, uuid string, topo *numa.Host, claim *ledger.Claim, stopped bool) (*hypervisor.Domain, string, error) {
	dom, err := a.Driver.Lookup(ctx, host, uuid)
	if errors.Is(err, hypervisor.ErrNotFound) {
		return nil, fmt.Sprintf("the guest has no domain on %s", host), nil
	}
	if err != nil {
		return nil, "", err
	}
	if dom.State != hypervisor.StateRunning && (!stopped || dom.State != hypervisor.StateShutoff) {
		return nil, fmt.Sprintf("the guest is %s on %s", dom.State, host), nil
	}
	pins, err := xmlpatch.Read(dom.XML)
	if err != nil {
		return nil, fmt.Sprintf("the guest's domain XML on %s cannot be read: %v", host, err), nil
	}
	// A claim's pCPUs are held one to one; a cpuset the guest floats over
	// is no claim's.
	used, want := pins.PinnedCPUs().Intersection(pinnable(topo)), claimCPUs(claim)
	if !used.Equal(want) {
		return nil, fmt.Sprintf("the guest runs on %s pinned to %s, and the claim holds %s", host, orNone(used), orNone(want)), nil
	}
	return dom, "", nil
}

// stagedFits says whether the domain XML staged for the claim pins the
// guest as its running domain is pinned: the XML the interrupted
// operation made for the claim, which the record takes rather than the
// running domain's when they agree.
func (a *Auditor) stagedFits(ctx context.Context, in SettleInput, dom *hypervisor.Domain) bool {
	staged, err := a.Ledger.StagedDomainXML(ctx, in.UUID, in.ClaimID)
	if err != nil {
		return false
	}
	want, err := xmlpatch.Read(staged)
	if err != nil {
		return false
	}
	got, err := xmlpatch.Read(dom.XML)
	return err == nil && want.HostCPUs().Equal(got.HostCPUs())
}

// pinnable is every pCPU of the host a claim can pin.
func pinnable(h *numa.Host) numa.CPUSet {
	var s numa.CPUSet
	for _, c := range h.Cells {
		s = s.Union(c.PCPUs)
	}
	return s
}

// hostDown says whether an operator fenced host: its hypervisor is not
// asked, and its claims of guests that moved become tombstones.
func (a *Auditor) hostDown(ctx context.Context, host string) (bool, error) {
	if host == "" {
		return false, nil
	}
	st, err := a.Ledger.HostStatus(ctx, host)
	if errors.Is(err, ledger.ErrUnknownHost) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return st.State == ledger.HostDown, nil
}
