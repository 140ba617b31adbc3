package audit

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.temporal.io/api/serviceerror"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// QuarantineOwner is the owner of quarantine claims: no workflow, an
// operator's decision.
const QuarantineOwner = "operator"

// RecoverHostInput asks to rebuild one host's ledger from its hypervisor.
type RecoverHostInput struct {
	Host   string `json:"host"`
	DryRun bool   `json:"dry_run,omitempty"`
}

// RecoveredClaim is a claim RecoverHost made (or, in a dry run, would make).
type RecoveredClaim struct {
	ClaimID  string `json:"claim_id"`
	Instance string `json:"instance"`
	CPUs     string `json:"cpus"`
	// Devices are the PCI devices the claim holds, by address.
	Devices []string `json:"devices,omitempty"`
	Why     string   `json:"why"`
	// Pending: the claim was made again pending, for the open operation
	// that made it, rather than committed as a resident claim.
	Pending bool `json:"pending,omitempty"`
}

// RecoverHostResult says what RecoverHost found and did.
type RecoverHostResult struct {
	Host   string `json:"host"`
	DryRun bool   `json:"dry_run,omitempty"`
	// Registered: the host's topology was gone and was registered again
	// from the hypervisor's capabilities.
	Registered bool `json:"registered,omitempty"`
	// Agreeing counts the running domains whose pCPUs a claim of their own
	// instance already holds.
	Agreeing int `json:"agreeing"`
	// Restored are committed claims made again for records that name the
	// host and agree with the running domain.
	Restored []RecoveredClaim `json:"restored,omitempty"`
	// Quarantined are pCPUs running domains use that no record explains.
	Quarantined []RecoveredClaim `json:"quarantined,omitempty"`
	// Unresolved is what needs an operator: pCPUs a domain uses that
	// another claim holds, records naming claims that are gone.
	Unresolved []string `json:"unresolved,omitempty"`
}

// Changed says whether the recovery changed (or would change) anything.
func (r RecoverHostResult) Changed() bool {
	return r.Registered || len(r.Restored) > 0 || len(r.Quarantined) > 0
}

// RecoverHost rebuilds a host's ledger after Redis lost data, from what
// is true: the domains running (or paused mid-migration) on the
// hypervisor with their pins, and the instance records. It only adds:
//
//   - a topology that is gone is registered again from the hypervisor;
//   - a domain whose pCPUs no claim of its instance holds, and whose record
//     names this host with the same pins, gets its resident claim back
//     (the record's claim id and placement), committed;
//   - a domain pinned exactly to a claim its instance's open operation
//     made on this host gets that claim back as the operation knows it:
//     pending, with its id, owner, placement and token, so the operation's
//     fenced steps go on;
//   - the pCPUs of any other such domain are quarantined: a claim of kind
//     quarantine, owned by no workflow, that the audit never frees and
//     that only an operator releases.
//
// It never frees a claim, so it cannot take anything from an open
// workflow, and every claim it makes is an exact compare-and-set on free
// pCPUs, so it never gives one pCPU to two claims: pCPUs a domain uses
// that another claim holds already are reported, not taken.
func (a *Auditor) RecoverHost(ctx context.Context, in RecoverHostInput) (RecoverHostResult, error) {
	res := RecoverHostResult{Host: in.Host, DryRun: in.DryRun}
	topo, err := a.Ledger.Host(ctx, in.Host)
	if errors.Is(err, ledger.ErrUnknownHost) {
		caps, cerr := a.Driver.Capabilities(ctx, in.Host)
		if cerr != nil {
			return res, cerr
		}
		res.Registered, topo = true, caps
		if !in.DryRun {
			if _, err := a.Ledger.RegisterHost(ctx, in.Host, caps); err != nil {
				return res, err
			}
		}
	} else if err != nil {
		return res, err
	}
	snap, err := a.Ledger.Snapshot(ctx, in.Host)
	if err != nil && !(res.Registered && in.DryRun) {
		return res, err
	}
	held := map[string]holding{} // instance -> what its claims hold
	owner := map[int]string{}    // pCPU -> claim id
	devOwner := map[string]string{}
	if snap != nil {
		for i := range snap.Claims {
			c := &snap.Claims[i]
			held[c.InstanceUUID] = held[c.InstanceUUID].union(claimHolding(c))
		}
		for _, p := range snap.Pins {
			owner[p.CPU] = p.ClaimID
		}
		for _, p := range snap.Devices {
			devOwner[p.Address] = p.ClaimID
		}
	}
	doms, err := a.Driver.Domains(ctx, in.Host)
	if err != nil {
		return res, err
	}
	sort.Slice(doms, func(i, j int) bool { return doms[i].UUID < doms[j].UUID })
	for _, d := range doms {
		if d.State == hypervisor.StateShutoff {
			continue
		}
		used, err := domainHolding(d, topo)
		if err != nil {
			res.Unresolved = append(res.Unresolved, err.Error())
			continue
		}
		if used.isEmpty() || used.subsetOf(held[d.UUID]) {
			res.Agreeing++
			continue
		}
		missing := used.minus(held[d.UUID])
		var taken []string
		for _, cpu := range missing.cpus.List() {
			if id, ok := owner[cpu]; ok {
				taken = append(taken, fmt.Sprintf("%d (claim %s)", cpu, id))
			}
		}
		if len(taken) > 0 {
			res.Unresolved = append(res.Unresolved, fmt.Sprintf("domain %s uses pCPUs another claim holds: %v", d.UUID, taken))
			continue
		}
		if taken := deviceOwners(missing, devOwner); len(taken) > 0 {
			res.Unresolved = append(res.Unresolved, fmt.Sprintf("domain %s uses PCI devices another claim holds: %v", d.UUID, taken))
			continue
		}
		rc, restore, err := a.recoverDomain(ctx, in, topo, d, used, missing)
		if err != nil {
			res.Unresolved = append(res.Unresolved, fmt.Sprintf("domain %s: %v", d.UUID, err))
			continue
		}
		if restore {
			res.Restored = append(res.Restored, rc)
		} else {
			res.Quarantined = append(res.Quarantined, rc)
		}
	}
	return res, nil
}

// recoverDomain gives a running domain's missing pCPUs a claim: the
// resident claim its record names, when the record agrees, or else a
// quarantine. It says which.
func (a *Auditor) recoverDomain(ctx context.Context, in RecoverHostInput, topo *numa.Host, d hypervisor.Domain, used, missing holding) (RecoveredClaim, bool, error) {
	inst, err := a.Ledger.Instance(ctx, d.UUID)
	if err != nil && !errors.Is(err, ledger.ErrUnknownInstance) {
		return RecoveredClaim{}, false, err
	}
	if err == nil && inst.Host == in.Host && inst.ClaimID != "" && inst.Placement != nil && missing.equal(used) {
		if placed, perr := placementHolding(topo, inst.Placement); perr == nil && placed.equal(used) {
			rc := RecoveredClaim{ClaimID: inst.ClaimID, Instance: d.UUID, CPUs: used.cpus.String(), Devices: used.devs,
				Why: "its record names this host and claim with the same pins"}
			if in.DryRun {
				return rc, true, nil
			}
			_, err := a.Ledger.Claim(ctx, ledger.ClaimSpec{ID: inst.ClaimID, Host: in.Host, InstanceUUID: d.UUID,
				Kind: ledger.KindInstance, OwnerWorkflowID: guest.InstanceWorkflowID(d.UUID), OwnerRunID: "recovered",
				Placement: inst.Placement})
			if err != nil {
				return RecoveredClaim{}, false, err
			}
			if _, err := a.Ledger.Commit(ctx, in.Host, inst.ClaimID); err != nil {
				return RecoveredClaim{}, false, err
			}
			return rc, true, nil
		}
	}
	if missing.equal(used) {
		rc, ok, err := a.restoreHeld(ctx, in.Host, in.DryRun, topo, d.UUID, used)
		if err != nil || ok {
			return rc, ok, err
		}
	}
	why := "no record of the instance"
	if inst != nil {
		why = fmt.Sprintf("its record says host %q, claim %q", inst.Host, inst.ClaimID)
	}
	rc, err := a.quarantine(ctx, in.Host, topo, d.UUID, missing, why, in.DryRun)
	return rc, false, err
}

// restoreHeld makes again, pending and with its own token, the lost claim
// of the instance's open operation that the running domain is pinned to
// exactly (the incoming side of a migration, a guest an unshelve or a
// resize has started), so that the operation goes on as if nothing had
// been lost. It says whether there was such a claim; when the operation
// does not answer (askHeld), there is none, and the pCPUs are quarantined
// instead.
func (a *Auditor) restoreHeld(ctx context.Context, host string, dryRun bool, topo *numa.Host, uuid string, used holding) (RecoveredClaim, bool, error) {
	if a.Holders == nil || a.Owners == nil {
		return RecoveredClaim{}, false, nil
	}
	wid := guest.InstanceWorkflowID(uuid)
	held, ok := a.askHeld(ctx, wid)
	if !ok {
		return RecoveredClaim{}, false, nil
	}
	for _, h := range held {
		if h.Host != host || h.Token == "" {
			continue
		}
		placed, err := placementHolding(topo, &h.Placement)
		if err != nil || !placed.equal(used) {
			continue
		}
		rc := RecoveredClaim{ClaimID: h.ClaimID, Instance: uuid, CPUs: used.cpus.String(), Devices: used.devs, Pending: true,
			Why: fmt.Sprintf("the open operation %s made it (%s) and its guest runs pinned to it", wid, h.Kind)}
		if dryRun {
			return rc, true, nil
		}
		p := h.Placement
		if _, err := a.Ledger.Claim(ctx, ledger.ClaimSpec{ID: h.ClaimID, Host: host, InstanceUUID: uuid, Kind: h.Kind,
			OwnerWorkflowID: wid, OwnerRunID: h.OwnerRunID, Placement: &p, Token: h.Token}); err != nil {
			return RecoveredClaim{}, false, err
		}
		return rc, true, nil
	}
	return RecoveredClaim{}, false, nil
}

// heldPatience bounds how long a recovery asks an open operation for its
// claims. A worker busy on a loaded machine answers late; an operation
// that never answers has its guest's pCPUs quarantined, which keeps them
// safe but fails the operation at its next fence.
const heldPatience = 2 * time.Minute

// askHeld asks the open operation wid which claims it made, again and
// again while it stays open and its answer is late, for up to
// heldPatience, and stops with a quarter of ctx's time left so that the
// quarantine that follows an unanswered question still has time to be
// made. It says whether the operation answered.
func (a *Auditor) askHeld(ctx context.Context, wid string) ([]HeldClaim, bool) {
	deadline := time.Now().Add(heldPatience)
	if d, ok := ctx.Deadline(); ok {
		if stop := d.Add(-time.Until(d) / 4); stop.Before(deadline) {
			deadline = stop
		}
	}
	pause := 250 * time.Millisecond
	for {
		st, err := a.Owners.OwnerStatus(ctx, wid)
		if err == nil && st.State != OwnerRunning {
			return nil, false
		}
		if err == nil {
			held, qerr := a.Holders.HeldClaims(ctx, wid)
			if qerr == nil {
				return held, true
			}
			var failed *serviceerror.QueryFailed
			if errors.As(qerr, &failed) {
				return nil, false
			}
		}
		if ctx.Err() != nil || time.Now().Add(pause).After(deadline) {
			return nil, false
		}
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
}

// quarantine claims what h holds of host for the instance's domain, as
// kind quarantine owned by no workflow.
func (a *Auditor) quarantine(ctx context.Context, host string, topo *numa.Host, uuid string, h holding, why string, dryRun bool) (RecoveredClaim, error) {
	id := "quarantine-" + uuid
	rc := RecoveredClaim{ClaimID: id, Instance: uuid, CPUs: h.cpus.String(), Devices: h.devs, Why: why}
	if dryRun {
		return rc, nil
	}
	p := &numa.Placement{}
	for _, c := range topo.Cells {
		if in := h.cpus.Intersection(c.PCPUs); !in.IsEmpty() {
			p.Cells = append(p.Cells, numa.PlacedCell{GuestCell: len(p.Cells), HostCell: c.ID, Reserved: in})
		}
	}
	devicePlacement(topo, p, h.devs)
	c, err := a.Ledger.Claim(ctx, ledger.ClaimSpec{ID: id, Host: host, InstanceUUID: uuid, Kind: ledger.KindQuarantine,
		OwnerWorkflowID: QuarantineOwner, OwnerRunID: QuarantineOwner, Placement: p})
	if err != nil {
		return rc, err
	}
	// The domain was seen before the quarantine was made: if it is gone
	// now (a guest destroyed, then its claim released, in between), the
	// pCPUs were free for good and the quarantine goes again. A domain
	// still running on them ran there without a claim when the quarantine
	// took them, so it stays.
	if used, err := a.domainUses(ctx, host, topo, uuid, h); err != nil || !used {
		if _, rerr := a.Ledger.ReleaseIfUnchanged(ctx, host, c.ID, c.Token, c.State); rerr != nil {
			return rc, rerr
		}
		if err != nil {
			return rc, err
		}
		return rc, errNoLongerUsed
	}
	return rc, nil
}

// errNoLongerUsed: the domain a quarantine was for no longer uses what it
// held, and the quarantine was released again.
var errNoLongerUsed = errors.New("the domain no longer uses those pCPUs or devices; nothing quarantined")

// domainUses says whether the instance's domain on host runs (or is
// paused) on any of h.
func (a *Auditor) domainUses(ctx context.Context, host string, topo *numa.Host, uuid string, h holding) (bool, error) {
	dom, err := a.Driver.Lookup(ctx, host, uuid)
	if errors.Is(err, hypervisor.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	used, err := domainHolding(*dom, topo)
	if err != nil {
		return true, nil // unreadable: keep it, as the audit keeps in doubt
	}
	return used.intersects(h), nil
}

// placementCPUs is every pCPU a placement pins on the host.
func placementCPUs(topo *numa.Host, p *numa.Placement) (numa.CPUSet, error) {
	us, err := numa.Usage(topo, p)
	if err != nil {
		return numa.CPUSet{}, err
	}
	var s numa.CPUSet
	for _, u := range us {
		s = s.Union(u.PinnedCPUs)
	}
	return s, nil
}
