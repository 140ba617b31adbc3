package ledger

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/pinflow/pinflow/numa"
)

// RepinSpec asks to move a guest's resident claim to another placement on
// its host: a live re-pin. The target keeps every guest cell on the host
// cell it is on, with the same memory, pages, shared vCPUs and devices;
// only pinned pCPUs change.
type RepinSpec struct {
	// ID identifies the re-pin claim; retrying with the same ID returns the
	// first result.
	ID, Host, InstanceUUID string
	// Resident is the guest's resident claim, which the commit rewrites.
	Resident        string
	OwnerWorkflowID string
	OwnerRunID      string
	Target          *numa.Placement
}

// ClaimRepin makes a pending re-pin claim (KindRepin) for spec.Target: it
// pins the target's pCPUs the resident claim does not hold, and nothing
// else, so that both the old pins (the guest runs on them until its live
// pins change) and the new ones are the guest's until CommitRepin or a
// release. The claim's usage is those pCPUs only; Target and TargetUsage
// keep the whole placement for the commit. A target that moves memory,
// pages, shared vCPUs or devices, or a resident claim that is not the
// instance's committed claim, is ErrInvalid or ErrConflict; a target pCPU
// another claim holds is ErrConflict; a host that is down or returning,
// ErrHostDown.
func (l *Ledger) ClaimRepin(ctx context.Context, spec RepinSpec) (*Claim, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: re-pin claim %s on %s: %w", spec.ID, spec.Host, err) }
	cs := ClaimSpec{ID: spec.ID, Host: spec.Host, InstanceUUID: spec.InstanceUUID, Kind: KindRepin,
		OwnerWorkflowID: spec.OwnerWorkflowID, OwnerRunID: spec.OwnerRunID, Placement: spec.Target}
	for _, err := range []error{checkClaimID(spec.ID), checkHostName(spec.Host), checkInstanceKeyName(spec.InstanceUUID),
		checkClaimID(spec.Resident), cs.checkOwned()} {
		if err != nil {
			return nil, wrap(err)
		}
	}
	resident, err := l.getClaim(ctx, spec.Host, spec.Resident)
	if err != nil {
		return nil, wrap(err)
	}
	if resident.InstanceUUID != spec.InstanceUUID || resident.State != StateCommitted {
		return nil, wrap(fmt.Errorf("%w: claim %s is the %s claim of instance %s, not instance %s's resident claim",
			ErrConflict, resident.ID, resident.State, resident.InstanceUUID, spec.InstanceUUID))
	}
	k := l.hostKeys(spec.Host)
	for range l.maxAttempts {
		st, err := l.readState(ctx, spec.Host, spec.ID)
		if err != nil {
			return nil, wrap(err)
		}
		if st.existing != "" {
			if err := l.settled(ctx, k); err != nil {
				return nil, wrap(err)
			}
			return sameClaim(cs, st.existing, wrap)
		}
		c, err := repinClaim(st.cache.topo, resident, spec)
		if err != nil {
			return nil, wrap(err)
		}
		c.Namespace, c.CreatedAt, c.Generation = l.namespace, l.now().UTC(), st.gen
		record, err := json.Marshal(c)
		if err != nil {
			return nil, wrap(err)
		}
		cpus := pinnedOf(c.Usage).List()
		entry := undoEntry{token: c.Token, pins: pinSet{cpus: cpus}}.String()
		args := append(make([]any, 0, 9+len(cpus)), c.ID, record, entry, c.Generation, len(cpus))
		for _, cpu := range cpus {
			args = append(args, cpu)
		}
		args = append(args, 0, "", c.InstanceUUID, "")
		raw, err := l.apply.run(ctx, k, claimScript, args...)
		// The cache saw none of it: the next claim on the host reads it.
		l.dropCache(spec.Host, nil)
		if err != nil {
			return nil, wrap(err)
		}
		res, err := decodeClaim(raw)
		if err != nil {
			return nil, wrap(err)
		}
		switch res.status {
		case "ok":
			return c, nil
		case "exists":
			return sameClaim(cs, res.record, wrap)
		case "nohost":
			return nil, wrap(fmt.Errorf("%w: %q is not registered", ErrUnknownHost, spec.Host))
		case "down":
			return nil, wrap(fmt.Errorf("%w: host %s is %s and takes no new claims", ErrHostDown, spec.Host, res.hostState))
		case "taken":
			return nil, wrap(fmt.Errorf("%w: %s", ErrConflict, res.lostRace()))
		}
		// "gen": the topology changed under the target; read it again.
	}
	return nil, wrap(fmt.Errorf("%w: the host's topology kept changing", ErrConflict))
}

// repinClaim is the re-pin claim of spec on topo for the resident claim:
// its usage is the target's pCPUs the resident does not hold.
func repinClaim(topo *numa.Host, resident *Claim, spec RepinSpec) (*Claim, error) {
	target, err := numa.Usage(topo, spec.Target)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := sameButPins(resident, spec.Target, target); err != nil {
		return nil, err
	}
	held := pinnedOf(resident.Usage)
	usage := make([]numa.CellUsage, 0, len(target))
	for _, u := range target {
		usage = append(usage, numa.CellUsage{Cell: u.Cell, PinnedCPUs: u.PinnedCPUs.Difference(held)})
	}
	var tok [16]byte
	if _, err := crand.Read(tok[:]); err != nil {
		return nil, fmt.Errorf("token: %w", err)
	}
	return &Claim{State: StatePending, ID: spec.ID, Host: spec.Host, InstanceUUID: spec.InstanceUUID, Kind: KindRepin,
		OwnerWorkflowID: spec.OwnerWorkflowID, OwnerRunID: spec.OwnerRunID, Token: hex.EncodeToString(tok[:]),
		Usage: usage, Repins: resident.ID, Target: spec.Target, TargetUsage: target}, nil
}

// sameButPins refuses a target that takes anything but other pCPUs than
// the resident claim: a live re-pin moves no memory between cells (huge
// pages are allocated per cell, and a guest's memory is not migrated by
// its pins) and passes the same devices through.
func sameButPins(resident *Claim, target *numa.Placement, usage []numa.CellUsage) error {
	if len(usage) != len(resident.Usage) {
		return fmt.Errorf("%w: the target uses %d host cells, the guest %d: a re-pin keeps each guest cell on its host cell", ErrInvalid, len(usage), len(resident.Usage))
	}
	for i, u := range usage {
		r := resident.Usage[i]
		if u.Cell != r.Cell {
			return fmt.Errorf("%w: the target puts a guest cell on host cell %d, the guest has it on %d: a re-pin keeps each guest cell on its host cell, since its memory cannot follow the pins live",
				ErrInvalid, u.Cell, r.Cell)
		}
		if u.MemoryMB != r.MemoryMB || u.Pages != r.Pages || u.PageSizeKB != r.PageSizeKB || u.SharedCPUs != r.SharedCPUs {
			return fmt.Errorf("%w: the target takes other memory or shared vCPUs of host cell %d than the guest: a re-pin changes pinned pCPUs only", ErrInvalid, u.Cell)
		}
	}
	if resident.Placement == nil || !slices.EqualFunc(target.Devices, resident.Placement.Devices, func(a, b numa.DeviceTake) bool {
		return slices.Equal(a.Addresses, b.Addresses)
	}) {
		return fmt.Errorf("%w: the target passes through other devices than the guest: a re-pin changes pinned pCPUs only", ErrInvalid)
	}
	return nil
}

// pinnedOf is every pCPU usage pins.
func pinnedOf(usage []numa.CellUsage) numa.CPUSet {
	var s numa.CPUSet
	for _, u := range usage {
		s = s.Union(u.PinnedCPUs)
	}
	return s
}

// CommitRepin makes the re-pin claim's target the resident claim's own,
// atomically: the resident keeps its id and token and takes the target's
// placement and pCPUs, frees those it held that the target does not, and
// the re-pin claim is gone. It returns the resident claim as it now is.
// Committing again after a success returns the same. A re-pin claim that
// is gone (released: its operation aborted) is ErrUnknownClaim, one that
// is not pending, or a resident that is not committed, ErrConflict.
func (l *Ledger) CommitRepin(ctx context.Context, host, resident, repin string) (*Claim, error) {
	wrap := func(err error) error {
		return fmt.Errorf("ledger: commit re-pin %s of claim %s on %s: %w", repin, resident, host, err)
	}
	r, err := l.getClaim(ctx, host, resident)
	if err != nil {
		return nil, wrap(err)
	}
	c, err := l.getClaim(ctx, host, repin)
	switch {
	case errors.Is(err, ErrUnknownClaim) && r.Repin == repin:
		// Committed by an earlier try.
		if err := l.settled(ctx, l.hostKeys(host)); err != nil {
			return nil, wrap(err)
		}
		return r, nil
	case err != nil:
		return nil, wrap(err)
	case c.Kind != KindRepin || c.Repins != resident || c.Target == nil:
		return nil, wrap(fmt.Errorf("%w: claim %s is no re-pin of claim %s", ErrConflict, repin, resident))
	}
	before, after := pinnedOf(r.Usage), pinnedOf(c.TargetUsage)
	next := *r
	next.Placement, next.Usage, next.Repin = c.Target, c.TargetUsage, repin
	record, err := json.Marshal(&next)
	if err != nil {
		return nil, wrap(err)
	}
	free, over := before.Difference(after).List(), pinnedOf(c.Usage).List()
	args := append(make([]any, 0, 6+len(free)+len(over)), resident, repin, record, pinSet{cpus: after.List(), devs: r.Devices}.String(), len(free))
	for _, cpu := range free {
		args = append(args, cpu)
	}
	args = append(args, len(over))
	for _, cpu := range over {
		args = append(args, cpu)
	}
	raw, err := l.apply.run(ctx, l.hostKeys(host), repinCommitScript, args...)
	l.dropCache(host, nil)
	if err != nil {
		return nil, wrap(err)
	}
	res, err := decodeRepinCommit(replyStrings(raw))
	if err != nil {
		return nil, wrap(err)
	}
	switch res.status {
	case "unknown":
		return nil, wrap(fmt.Errorf("%w: the %s claim is gone", ErrUnknownClaim, res.which))
	case "state":
		return nil, wrap(fmt.Errorf("%w: the %s claim is %s", ErrConflict, res.which, res.state))
	case "owner":
		return nil, wrap(fmt.Errorf("%w: pCPU %s is held by %q, not by the claim that should give it", ErrConflict, res.pin, res.owner))
	}
	return &next, nil
}
