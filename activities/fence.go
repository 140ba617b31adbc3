package activities

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/sdk/activity"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
)

// Every step that changes a domain acts for a claim, through act: it
// fences on the claim right before the call, and the call runs under the
// fence's lease (hypervisor.WithFence; the worker's driver is
// hypervisor.Guarded, which refuses a call without it).
//
// The token a step fences with is its operation's: a claim the operation
// made has its own, which the workflow passes to the steps that start the
// guest on it, and the run takes its guest's resident claim from the
// token it read when it began on to its run token (compare-and-set,
// ledger.Take) with its first step that acts for it. A step past the run's forward
// steps (a compensation that tears one copy of the guest down or keeps
// the other, a step after the commit) takes its claim on to the run's
// final token first, so no forward attempt of its own acts after it.
// Take waits while a step of another token may still act (its lease), so
// a step of an operation that ended, or was overtaken, fences in vain
// once another took the claim, and cannot take it back: it knows the
// claim only by a token the claim no longer has. The audit's Settle takes
// the claims it settles the same way.

// runToken is the token an attempt's operation takes claims with: its
// workflow run's. finalToken is that of its steps past its
// forward ones.
func runToken(ctx context.Context) string   { return "run-" + runID(ctx) }
func finalToken(ctx context.Context) string { return "final-" + runID(ctx) }

func runID(ctx context.Context) string {
	if activity.IsActivity(ctx) {
		return activity.GetInfo(ctx).WorkflowExecution.RunID
	}
	return "direct"
}

// claimFence is how a step's calls on one guest's domain are fenced: for
// the claim with token, or, when no claim on the host is the guest's,
// unclaimed.
type claimFence struct {
	a                    *Activities
	host, claimID, token string
	teardown             bool
	// unclaimed says why the calls act for no claim; "" when they do.
	unclaimed string
}

// do runs call, which changes the domain, under the fence.
func (f *claimFence) do(ctx context.Context, call func(ctx context.Context) error) error {
	if f.unclaimed == "" {
		return f.a.act(ctx, f.host, f.claimID, f.token, f.teardown, call)
	}
	uctx, cancel := context.WithTimeout(hypervisor.Unclaimed(ctx, f.unclaimed), f.a.lease()/2)
	defer cancel()
	return classify(call(uctx))
}

// act runs do, a call that changes a domain on host, for the claim: it
// renews the claim's fence lease with token right before (teardown: a
// host marked down or returning does not refuse it) and runs do with the
// lease's end as its deadline, marked as fenced. A claim gone or taken by
// another operation is api.ErrTypeFenced, and do does not run.
func (a *Activities) act(ctx context.Context, host, claimID, token string, teardown bool, do func(ctx context.Context) error) error {
	lease := a.claimLease(host, claimID, token)
	lease.teardown = teardown
	until, err := lease.renew(ctx)
	if refused(err) {
		return fenced(err)
	}
	if err != nil {
		return classify(err)
	}
	actx, cancel := context.WithDeadline(hypervisor.WithFence(ctx, host+"/"+claimID), until)
	defer cancel()
	err = do(actx)
	if actx.Err() == nil {
		// The call has returned: the step holds nothing back any more.
		// One cut off by its deadline may still act in the hypervisor,
		// and its lease runs out instead.
		lease.end(ctx)
	}
	return classify(err)
}

// fenceClaim takes the claim, which the operation knows by known, for
// this attempt's operation (final: on to its final token) and returns
// its fence. A claim that is gone, or that another operation took, is
// api.ErrTypeFenced.
func (a *Activities) fenceClaim(ctx context.Context, host, claimID, known string, final, teardown bool) (*claimFence, error) {
	to, from := runToken(ctx), []string{known}
	if final {
		to, from = finalToken(ctx), append(from, runToken(ctx))
	}
	err := waitLedger(ctx, func(ctx context.Context) error { return a.Ledger.TakeOver(ctx, host, claimID, from, to) })
	var leased *ledger.LeasedError
	if errors.As(err, &leased) {
		return nil, err // the attempt ended first; the next one waits on
	}
	if refused(err) {
		return nil, fenced(err)
	}
	if err != nil {
		return nil, classify(err)
	}
	return &claimFence{a: a, host: host, claimID: claimID, token: to, teardown: teardown}, nil
}

// fenceDomain is the fence of a step on in's domain (see DomainInput).
// A claim that is gone while the guest's record still names it (the
// operation's own release went first, or drift), and a guest of a run
// that named no claim and has none on the host, hold nothing there that a
// call could take from another guest: a teardown's calls act unclaimed.
// A step that starts or plugs in is refused instead (api.ErrTypeFenced): it
// would use what no claim holds.
func (a *Activities) fenceDomain(ctx context.Context, in DomainInput, teardown bool) (*claimFence, error) {
	var inst *ledger.Instance
	if err := waitLedger(ctx, func(ctx context.Context) (err error) { inst, err = a.Ledger.Instance(ctx, in.UUID); return err }); err != nil && !errors.Is(err, ledger.ErrUnknownInstance) {
		return nil, classify(err)
	}
	names := func(claimID string) bool { return inst != nil && inst.Host == in.Host && inst.ClaimID == claimID }
	if in.ClaimID == "" || in.Token == "" {
		return a.fenceFound(ctx, in, inst, teardown)
	}
	f, err := a.fenceClaim(ctx, in.Host, in.ClaimID, in.Token, in.Final, teardown)
	if errors.Is(err, ledger.ErrUnknownClaim) && names(in.ClaimID) && teardown {
		return &claimFence{a: a, host: in.Host, unclaimed: fmt.Sprintf("its record names claim %s, which is released", in.ClaimID)}, nil
	}
	return f, err
}

// fenceFound is the fence of a step of a run from before steps named
// their claim and its token: the claim named, or the record's when it is
// on in.Host, or the guest's one claim there, with the token it has now.
func (a *Activities) fenceFound(ctx context.Context, in DomainInput, inst *ledger.Instance, teardown bool) (*claimFence, error) {
	id := in.ClaimID
	if id == "" && inst != nil && inst.Host == in.Host {
		id = inst.ClaimID
	}
	var claims []ledger.Claim
	if err := waitLedger(ctx, func(ctx context.Context) (err error) { claims, err = a.Ledger.Claims(ctx, in.Host); return err }); err != nil {
		return nil, classify(err)
	}
	var found *ledger.Claim
	for i, c := range claims {
		if c.ID == id || (id == "" && c.InstanceUUID == in.UUID) {
			found = &claims[i]
			break
		}
	}
	switch {
	case found == nil && !teardown:
		return nil, fenced(fmt.Errorf("%w: host %s has no claim of instance %s", ledger.ErrUnknownClaim, in.Host, in.UUID))
	case found == nil:
		return &claimFence{a: a, host: in.Host, unclaimed: "no claim on the host is the guest's"}, nil
	}
	return &claimFence{a: a, host: in.Host, claimID: found.ID, token: found.Token, teardown: teardown}, nil
}
