package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// ListHosts returns the ledger's registered hosts, for an audit of all.
func (a *Activities) ListHosts(ctx context.Context) ([]string, error) {
	return a.Ledger.Hosts(ctx)
}

// AuditHost audits one host's claims and compares them with its domains.
//
// It walks the ledger's claims, never a list of workflows (visibility is
// eventually consistent), and asks the OwnerChecker about each claim
// older than the grace period. It keeps every claim whose owner runs with
// the claim's first run id, and every claim it cannot decide on. A
// candidate is a pending claim whose owner is closed (for at least the
// grace period, and never less than MinGrace), replaced or unknown, or a
// committed claim that its instance record does not name while no
// workflow of the instance is open. Before freeing a candidate it reads
// the claim and the record again (Temporal's answer is newer than the
// snapshot), looks at the instance's domain on the host and keeps the
// claim if that domain uses any of its pCPUs (starting Settle when the
// guest runs pinned to exactly the claim), and frees with a
// compare-and-delete on the token and state it judged, which a running
// fence lease also refuses. Other drift against the hypervisor is only
// reported (see the workflows package documentation for why).
//
// Only the host being unknown fails the activity; every other error is
// reported in the result and keeps what it touches.
func (a *Activities) AuditHost(ctx context.Context, in AuditHostInput) (HostAudit, error) {
	var res HostAudit
	// Heartbeating, so that an audit whose worker died is retried at once
	// rather than after its timeout.
	err := a.heartbeating(ctx, func(ctx context.Context) error {
		var err error
		res, err = a.auditHost(ctx, in)
		return err
	})
	return res, err
}

func (a *Activities) auditHost(ctx context.Context, in AuditHostInput) (HostAudit, error) {
	start := time.Now()
	au := &audit{a: a, res: HostAudit{Host: in.Host, DryRun: in.DryRun}, grace: a.Grace, minGrace: a.MinGrace}
	if in.Grace != nil {
		au.grace = *in.Grace
	}
	if au.grace < 0 {
		return HostAudit{}, BadRequest(fmt.Sprintf("grace %s: must be 0 or more", au.grace))
	}
	if a.Owners == nil {
		return HostAudit{}, errors.New("activities: audit: no owner checker configured")
	}
	snap, err := a.Ledger.Snapshot(ctx, in.Host)
	if err != nil {
		return HostAudit{}, classify(err)
	}
	var doms []hypervisor.Domain
	var domErr error
	if snap.Status.State == ledger.HostDown {
		// Fenced by an operator: its hypervisor does not answer, and no
		// drift is reported until it comes back.
		domErr = errHostDown
	} else if doms, domErr = a.Driver.Domains(ctx, in.Host); domErr != nil {
		au.fail("domains of %s: %v", in.Host, domErr)
	}
	au.pinnable = pinnable(snap.Topology)
	now := time.Now()
	freed := map[string]bool{}
	for i := range snap.Claims {
		c := &snap.Claims[i]
		if id := au.judge(ctx, c, now); id != "" {
			freed[id] = true
		}
	}
	if domErr == nil {
		au.drift(ctx, snap, doms, freed)
	} else {
		for _, d := range au.inUse {
			au.res.Tally.Drift.Add(d.Kind, 1)
			au.res.Drift = append(au.res.Drift, d)
		}
	}
	au.res.Duration = time.Since(start)
	au.res.Tally.Errors = len(au.res.Errors)
	record(ctx, &au.res)
	return au.res, nil
}

var errHostDown = errors.New("the host is down")

// audit is one host's audit in progress.
type audit struct {
	a     *Activities
	res   HostAudit
	grace time.Duration
	// minGrace is the least time a closed owner must have been closed.
	minGrace time.Duration
	pinnable numa.CPUSet
	// inUse are the claims kept because their instance's domain uses
	// them, reported as drift.
	inUse []Drift
	// resident holds, per instance whose claim on this host its record
	// names, the digest of the domain XML pinflow defined for it.
	resident map[string]string
}

func (au *audit) fail(format string, args ...any) {
	au.res.Errors = append(au.res.Errors, fmt.Sprintf(format, args...))
}

func (au *audit) keep(reason string) { au.res.Tally.Kept.Add(reason, 1) }

// judge decides on one claim, frees it when it must go, and returns its id
// when it was freed (or, in a dry run, would be).
func (au *audit) judge(ctx context.Context, c *ledger.Claim, now time.Time) string {
	au.res.Tally.Claims++
	if c.Kind == ledger.KindQuarantine {
		// An operator's to release, never the audit's.
		au.keep(KeptQuarantined)
		return ""
	}
	if c.State == ledger.StateTombstone {
		au.keep(KeptTombstone)
		return ""
	}
	// With no grace at all every claim is judged, whatever the clocks say.
	if au.grace > 0 && now.Sub(c.CreatedAt) < au.grace {
		au.keep(KeptYoung)
		return ""
	}
	instGone := false
	if c.State == ledger.StateCommitted || c.State == ledger.StateHeld {
		// A resident claim is kept without asking Temporal: that is almost
		// every claim, and it keeps the audit's cost near the reads'.
		home, err := au.a.Ledger.Home(ctx, c.InstanceUUID)
		switch {
		case errors.Is(err, ledger.ErrUnknownInstance):
			instGone = true
		case err != nil:
			au.fail("claim %s: instance record: %v", c.ID, err)
			au.keep(KeptDoubt)
			return ""
		case home.Host == c.Host && home.ClaimID == c.ID:
			if au.resident == nil {
				au.resident = map[string]string{}
			}
			au.resident[c.InstanceUUID] = home.DomainDigest
			au.keep(KeptResident)
			return ""
		}
	}
	owner, err := au.a.Owners.OwnerStatus(ctx, c.OwnerWorkflowID)
	if err != nil {
		au.fail("claim %s: owner %s: %v", c.ID, c.OwnerWorkflowID, err)
		au.keep(KeptDoubt)
		return ""
	}
	if owner.State == OwnerRunning && owner.FirstRunID == c.OwnerRunID {
		au.keep(KeptOwnerRunning)
		return ""
	}
	// The claim's own chain is closed. Its last activity attempts may
	// still be in flight (termination does not stop them), so it must
	// have been closed for the grace period too, and never less than the
	// minimum grace.
	if wait := max(au.grace, au.minGrace); wait > 0 && owner.State != OwnerNotFound && time.Since(owner.Since) < wait {
		au.keep(KeptRecentlyClosed)
		return ""
	}
	var reason string
	switch {
	case c.State == ledger.StatePending && owner.State == OwnerRunning:
		reason = FreedOwnerReplaced
	case c.State == ledger.StatePending && owner.State == OwnerClosed:
		reason = FreedOwnerClosed
	case c.State == ledger.StatePending:
		reason = FreedOwnerNotFound
	default:
		// Committed or a source hold, not resident: free only while no
		// workflow of the instance is open, since an open one may still
		// name or release it (a resize's revert makes its hold resident).
		instWF := InstanceWorkflowID(c.InstanceUUID)
		st := owner
		if instWF != c.OwnerWorkflowID {
			if st, err = au.a.Owners.OwnerStatus(ctx, instWF); err != nil {
				au.fail("claim %s: instance workflow %s: %v", c.ID, instWF, err)
				au.keep(KeptDoubt)
				return ""
			}
		}
		if st.State == OwnerRunning {
			if c.State == ledger.StateHeld {
				au.keep(KeptSourceHold)
			} else {
				au.keep(KeptInstanceBusy)
			}
			return ""
		}
		reason = FreedNotResident
		if instGone {
			reason = FreedInstanceGone
		}
	}
	// Temporal's answer is newer than the snapshot: the owner may have
	// committed and attached the claim, and closed, since. Decide on the
	// claim and record as they are now.
	if kept := au.recheck(ctx, c); kept != "" {
		au.keep(kept)
		return ""
	}
	// Defence in depth: whatever the workflows say, pCPUs a domain of the
	// claim's own instance uses on this host are not freed.
	if kept := au.guarded(ctx, c); kept != "" {
		au.keep(kept)
		return ""
	}
	if c.State == ledger.StateHeld && au.a.Settler != nil && !au.res.DryRun {
		// A resize left without its workflow: the guest lives where its
		// record says, so Settle confirms it, which frees this hold and
		// clears the record's resize too.
		if home, err := au.a.Ledger.Home(ctx, c.InstanceUUID); err == nil && home.ClaimID != "" {
			if err := au.a.Settler.StartSettle(ctx, SettleInput{UUID: c.InstanceUUID, Host: home.Host, ClaimID: home.ClaimID}); err == nil {
				au.keep(KeptSettling)
				return ""
			}
		}
	}
	if !au.res.DryRun {
		ok, err := au.a.Ledger.ReleaseIfUnchanged(ctx, c.Host, c.ID, c.Token, c.State)
		if err != nil {
			au.fail("claim %s: release: %v", c.ID, err)
			au.keep(KeptDoubt)
			return ""
		}
		if !ok {
			// Made again, committed, or under a fence lease meanwhile.
			au.keep(KeptChanged)
			return ""
		}
	}
	au.res.Tally.Freed.Add(reason, 1)
	au.res.Freed = append(au.res.Freed, FreedClaim{ClaimID: c.ID, Instance: c.InstanceUUID, Kind: c.Kind, State: c.State,
		Owner: c.OwnerWorkflowID, CPUs: claimCPUs(c).String(), Reason: reason})
	return c.ID
}

// recheck reads the claim and, for a committed one, its instance record
// again, and returns why the claim is kept ("" when it may go).
func (au *audit) recheck(ctx context.Context, c *ledger.Claim) string {
	now, err := au.a.Ledger.GetClaim(ctx, c.Host, c.ID)
	switch {
	case errors.Is(err, ledger.ErrUnknownClaim):
		return KeptChanged
	case err != nil:
		au.fail("claim %s: read again: %v", c.ID, err)
		return KeptDoubt
	case now.Token != c.Token || now.State != c.State:
		return KeptChanged
	}
	home, err := au.a.Ledger.Home(ctx, c.InstanceUUID)
	switch {
	case errors.Is(err, ledger.ErrUnknownInstance):
		return ""
	case err != nil:
		au.fail("claim %s: instance record: %v", c.ID, err)
		return KeptDoubt
	case home.Host == c.Host && home.ClaimID == c.ID:
		return KeptResident
	}
	return ""
}

// guarded looks at the claim's instance on the host and returns why the
// claim is kept ("" when no domain of the instance uses its pCPUs). A
// guest that runs pinned to exactly the claim, and nowhere else, had its
// operation interrupted after it started there: the audit starts Settle
// to finish that operation forwards.
func (au *audit) guarded(ctx context.Context, c *ledger.Claim) string {
	dom, err := au.a.Driver.Lookup(ctx, c.Host, c.InstanceUUID)
	switch {
	case errors.Is(err, hypervisor.ErrNotFound):
		return ""
	case err != nil:
		au.fail("claim %s: domain of %s: %v", c.ID, c.InstanceUUID, err)
		return KeptDoubt
	case dom.State == hypervisor.StateShutoff:
		// A shut-off domain uses no pCPU; only an operation, which
		// claims first, starts it again.
		return ""
	}
	want := claimCPUs(c)
	pins, err := xmlpatch.Read(dom.XML)
	if err != nil {
		au.fail("claim %s: domain of %s: %v", c.ID, c.InstanceUUID, err)
		return KeptDoubt
	}
	used := pins.HostCPUs().Intersection(au.pinnable)
	if !used.Intersects(want) {
		return ""
	}
	d := Drift{Kind: DriftClaimInUse, Instance: c.InstanceUUID, ClaimID: c.ID, CPUs: used.Intersection(want).String(),
		Detail: fmt.Sprintf("%s claim %s has no operation to finish it, but domain %s (%s) uses its pCPUs %s", c.State, c.ID, dom.Name, dom.State, used.Intersection(want))}
	kept := KeptInUse
	if dom.State == hypervisor.StateRunning && used.Equal(want) && au.a.Settler != nil && !au.res.DryRun {
		err := au.a.Settler.StartSettle(ctx, SettleInput{UUID: c.InstanceUUID, Host: c.Host, ClaimID: c.ID})
		if err != nil {
			d.Detail += fmt.Sprintf("; settling it failed to start: %v", err)
		} else {
			d.Detail += "; settling it as the instance's resident claim"
			kept = KeptSettling
		}
	}
	au.inUse = append(au.inUse, d)
	return kept
}
