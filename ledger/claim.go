package ledger

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pinflow/pinflow/numa"
)

// ClaimKind says why a claim was made.
type ClaimKind string

// Claim kinds.
const (
	KindInstance      ClaimKind = "instance"       // an instance's resident claim
	KindMigrationDest ClaimKind = "migration-dest" // a live migration's destination
	KindUnshelve      ClaimKind = "unshelve"       // an unshelve's new host
	KindBoot          ClaimKind = "boot"           // a boot's host
	// KindResizeDest is a resize's or cold migration's destination.
	KindResizeDest ClaimKind = "resize-dest"
	// KindEvacuationDest is an evacuation's (rebuild's) new host.
	KindEvacuationDest ClaimKind = "evacuation-dest"
	// KindQuarantine holds pCPUs a running domain uses that no record
	// explains (after Redis lost data, say): no claim can take them, and
	// only an operator frees them.
	KindQuarantine ClaimKind = "quarantine"
	// KindReservation is capacity a drain holds for a guest it will move
	// there; the guest's migration adopts it (Adopt).
	KindReservation ClaimKind = "reservation"
	// KindRepin holds the pCPUs a live re-pin moves its guest to, beside
	// the guest's resident claim, until CommitRepin hands them over.
	KindRepin ClaimKind = "repin"
)

func (k ClaimKind) valid() bool {
	switch k {
	case KindInstance, KindMigrationDest, KindUnshelve, KindBoot, KindQuarantine, KindResizeDest, KindEvacuationDest, KindReservation:
		return true
	}
	return false
}

// ClaimState is a claim's life stage.
type ClaimState string

// Claim states.
const (
	// StatePending: the owning workflow holds the resources but the
	// instance does not run on them yet.
	StatePending ClaimState = "pending"
	// StateCommitted: the claim is the instance's resident claim.
	StateCommitted ClaimState = "committed"
	// StateHeld: a source hold, the former resident claim that an open resize or
	// cold migration keeps so that a revert gets the very same pCPUs back.
	StateHeld ClaimState = "held"
	// StateTombstone: an evacuated guest's claim on its dead (fenced) host, kept so
	// nothing lands on those pCPUs until the leftover guest there is destroyed.
	StateTombstone ClaimState = "tombstone"
)

// claimStates are the states a stored claim may have.
var claimStates = []ClaimState{StatePending, StateCommitted, StateHeld, StateTombstone}

// Claim is the record of one claim: who holds which of a host's resources.
// It carries the placement and its usage, so releasing never derives
// anything again.
type Claim struct {
	// State comes first in the stored JSON: Commit rewrites it in place.
	State       ClaimState `json:"state"`
	CommittedAt *time.Time `json:"committed_at,omitempty"`

	ID           string    `json:"id"`
	Host         string    `json:"host"`
	InstanceUUID string    `json:"instance_uuid"`
	Kind         ClaimKind `json:"kind"`
	// OwnerWorkflowID and OwnerRunID (the first run's id) name the Temporal
	// workflow that made the claim; reconciliation frees the claim only
	// when that workflow is no longer running.
	OwnerWorkflowID string `json:"owner_workflow_id"`
	OwnerRunID      string `json:"owner_run_id"`
	// Namespace is the Temporal namespace the owner runs in, the one
	// the claiming process served (Options.Namespace); a record without
	// it belongs to the namespace the ledger is bound to (Bind).
	Namespace string `json:"namespace,omitempty"`
	// Token is random; ReleaseIfUnchanged and Fence accept the claim only
	// with it, so a decision on a claim, or a step acting for one, cannot
	// reach a claim made again meanwhile.
	Token     string    `json:"token"`
	CreatedAt time.Time `json:"created_at"`
	// Generation is the host topology generation the claim was made on.
	Generation int64            `json:"generation"`
	Placement  *numa.Placement  `json:"placement"`
	Usage      []numa.CellUsage `json:"usage"`
	// HostUsage is what the claim takes of the host's host-level counters
	// (Placement.HostUsage); a record without it took none.
	HostUsage numa.HostUsage `json:"host_usage"`
	// Devices are the PCI devices the claim holds, by address, sorted:
	// those its placement takes, and the VFs of a PF it takes
	// (numa.Host.PlacementDevices).
	Devices []string `json:"devices,omitempty"`
	// Group is the server group of the claim's instance, which the claim
	// counts a member of on its host; "" for none.
	Group string `json:"group,omitempty"`

	// Repins, Target and TargetUsage are a re-pin claim's (KindRepin): the
	// resident claim it re-pins, and the placement and usage that claim
	// takes at the commit. The re-pin claim itself has no placement and
	// uses only the target's pCPUs the resident does not hold.
	Repins      string           `json:"repins,omitempty"`
	Target      *numa.Placement  `json:"target,omitempty"`
	TargetUsage []numa.CellUsage `json:"target_usage,omitempty"`
	// Repin is the last re-pin a resident claim took (CommitRepin).
	Repin string `json:"repin,omitempty"`
}

// ClaimSpec asks for a claim. Give exactly one of Request (fit it on the
// host) and Placement (claim exactly this, e.g. to restore a known
// placement).
type ClaimSpec struct {
	// ID identifies the claim; retrying with the same ID returns the first
	// result.
	ID              string
	Host            string
	InstanceUUID    string
	Kind            ClaimKind
	OwnerWorkflowID string
	OwnerRunID      string
	Request         *numa.Request
	Placement       *numa.Placement
	// Token, when set, is the claim's token instead of a new random one:
	// recovery makes a lost claim again for the open workflow that holds
	// it, whose fenced steps prove themselves with the token it was given.
	Token string
}

func (s *ClaimSpec) check() error {
	if err := checkClaimID(s.ID); err != nil {
		return err
	}
	if err := checkHostName(s.Host); err != nil {
		return err
	}
	if err := checkInstanceKeyName(s.InstanceUUID); err != nil {
		return err
	}
	if !s.Kind.valid() {
		return fmt.Errorf("claim kind %q: %w: kinds are %s, %s, %s, %s, %s, %s, %s or %s", s.Kind, ErrInvalid,
			KindInstance, KindMigrationDest, KindUnshelve, KindBoot, KindQuarantine, KindResizeDest, KindEvacuationDest, KindReservation)
	}
	return s.checkOwned()
}

// checkOwned checks what every claim spec names but its kind: the
// token, the owner and the placement or request.
func (s *ClaimSpec) checkOwned() error {
	if strings.Contains(s.Token, "|") {
		return fmt.Errorf("%w: token %q: a token has no '|'", ErrInvalid, s.Token)
	}
	if s.OwnerWorkflowID == "" || s.OwnerRunID == "" {
		return fmt.Errorf("%w: owner workflow id %q and run id %q must both be set", ErrInvalid, s.OwnerWorkflowID, s.OwnerRunID)
	}
	if (s.Request == nil) == (s.Placement == nil) {
		return fmt.Errorf("%w: give exactly one of a request and a placement", ErrInvalid)
	}
	if s.Placement != nil {
		if err := s.Placement.Check(); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	return nil
}

// Claim fits the spec on the host's current state and records the claim,
// pending, in one atomic script that checks every chosen pCPU is unowned,
// every usage counter stays within the limits numa.Fit applies (memory,
// shared vCPUs, strict pages, allocation ratios, the host's totals) and
// the topology has not changed. On a lost race it re-reads, re-fits and
// tries again, at most MaxAttempts times, then fails with ErrConflict.
//
// Claiming an existing claim id returns the recorded claim unchanged, so a
// retried activity gets its first result; an id already used for another
// instance is ErrConflict. A request that fits nowhere is a
// *numa.NoFitError; an explicit placement that does not belong on the host
// is ErrInvalid, one on pCPUs owned by others ErrConflict. A host an
// operator marked down or returning takes no new claims: ErrHostDown; a
// disabled one takes them (the caller named it).
//
// A claim for a member of a server group counts it on the host. One that
// would break the group's hard rule is a *GroupRuleError: for
// anti-affinity, the host holds as many other members as the group allows
// (checked in the claim's own script, so racing claims cannot both pass);
// for affinity, the group's members are on another host (the group's
// host is fixed by a compare-and-set in the group's record before the
// claim, given back if the claim fails).
func (l *Ledger) Claim(ctx context.Context, spec ClaimSpec) (_ *Claim, err error) {
	defer func(start time.Time) { observeClaim(ctx, start, err) }(time.Now())
	wrap := func(err error) error { return fmt.Errorf("ledger: claim %s on %s: %w", spec.ID, spec.Host, err) }
	if err := spec.check(); err != nil {
		return nil, wrap(err)
	}
	rule, limit, err := l.claimRule(ctx, &spec)
	if err != nil {
		return nil, wrap(err)
	}
	if rule != nil && limit == "" && rule.Policy == PolicyAffinity && enforced(spec.Kind) {
		made, rerr := l.rdb.HExists(ctx, l.hostKeys(spec.Host).claims, spec.ID).Result()
		if rerr != nil {
			return nil, wrap(rerr)
		}
		// A retried claim that exists was let through already.
		if !made {
			if berr := l.bindAffinity(ctx, rule, spec.Host, spec.Kind); berr != nil {
				return nil, wrap(berr)
			}
			defer func() {
				if err != nil && !Unavailable(err) && ctx.Err() == nil {
					l.unbindAffinity(context.WithoutCancel(ctx), rule, spec.Host)
				}
			}()
		}
	}
	token := spec.Token
	if token == "" {
		var tok [16]byte
		if _, err := crand.Read(tok[:]); err != nil {
			return nil, wrap(fmt.Errorf("token: %w", err))
		}
		token = hex.EncodeToString(tok[:])
	}
	c := &Claim{
		State: StatePending, ID: spec.ID, Host: spec.Host, InstanceUUID: spec.InstanceUUID, Kind: spec.Kind,
		OwnerWorkflowID: spec.OwnerWorkflowID, OwnerRunID: spec.OwnerRunID, Namespace: l.namespace,
		Token: token, CreatedAt: l.now().UTC(),
	}
	if rule != nil {
		c.Group = rule.Name
	}
	k := l.hostKeys(spec.Host)
	lost := ""
	for attempt := range l.maxAttempts {
		if attempt > 0 {
			if err := backoff(ctx, attempt); err != nil {
				return nil, wrap(fmt.Errorf("%w (last lost race: %s)", err, lost))
			}
		}
		// Fit on the cached view; read the host only when there is none,
		// or when the view says no: a stale view may only cost a retry,
		// never a refusal the ledger itself would not give.
		hc := l.cachedHost(spec.Host)
		if hc != nil && hc.place(&spec, c) != nil {
			hc = nil
		}
		if hc == nil {
			st, err := l.readState(ctx, spec.Host, spec.ID)
			if err != nil {
				return nil, wrap(err)
			}
			if st.existing != "" {
				// Made by an earlier try, perhaps on another connection:
				// wait until the host's slot is durable up to now.
				if err := l.settled(ctx, k); err != nil {
					return nil, wrap(err)
				}
				if rule != nil {
					l.noteGroupHost(ctx, rule.Name, spec.Host)
				}
				return sameClaim(spec, st.existing, wrap)
			}
			hc = st.cache
			if err := hc.place(&spec, c); err != nil {
				return nil, wrap(err)
			}
		}
		res, err := l.applyClaim(ctx, k, hc, c, limit)
		if err != nil {
			return nil, wrap(err)
		}
		switch res.status {
		case "ok":
			if c.Group != "" {
				l.noteGroupHost(ctx, c.Group, spec.Host)
			}
			return c, nil
		case "exists":
			if rule != nil {
				l.noteGroupHost(ctx, rule.Name, spec.Host)
			}
			return sameClaim(spec, res.record, wrap)
		case "nohost":
			l.dropCache(spec.Host, hc)
			return nil, wrap(fmt.Errorf("%w: %q is not registered", ErrUnknownHost, spec.Host))
		case "group":
			// Counted in the script: final, whatever another try would see.
			l.dropCache(spec.Host, hc)
			return nil, wrap(&GroupRuleError{Group: rule.Name, Policy: rule.Policy, Host: spec.Host, Max: rule.MaxPerHost,
				Members: l.groupMembersOn(ctx, spec.Host, rule.Name)})
		case "down":
			// An operator's statement, not a race: retrying cannot help.
			return nil, wrap(fmt.Errorf("%w: host %s is %s and takes no new claims", ErrHostDown, spec.Host, res.hostState))
		case "gen":
			// The topology changed: the next attempt reads it.
			l.dropCache(spec.Host, hc)
		case "taken", "full":
			// The reply carries the host's state: the retry fits on it. A
			// state older than the cache's newest, which the cache refuses,
			// comes from a reply overtaken by newer ones or from a host
			// whose revision went backwards (its keys restored or made
			// anew, writes lost in a failover): either way the view the
			// claim lost on cannot be trusted, and fitting on it again
			// would lose the same race again. The retry reads the host.
			if !hc.observeState(res.rev, parsePins(res.pins), parseCounters(res.usage)) {
				l.dropCache(spec.Host, hc)
			}
		}
		observeLostRace(ctx, res.status)
		lost = res.lostRace()
	}
	return nil, wrap(fmt.Errorf("%w: lost the race for the host's resources %d times (last: %s)", ErrConflict, l.maxAttempts, lost))
}

// applyClaim sends c, placed on hc, to the claim script and settles its
// pending state in hc with the reply.
func (l *Ledger) applyClaim(ctx context.Context, k *hostKeys, hc *hostCache, c *Claim, limit string) (claimReply, error) {
	call, err := newClaimCall(hc.topo, c, limit)
	if err != nil {
		hc.settle(c.ID, false, 0, pinSet{}, nil)
		return claimReply{}, err
	}
	// A reply is never empty (the applier makes that an error).
	raw, err := l.apply.run(ctx, k, claimScript, call.args...)
	var res claimReply
	if err == nil {
		res, err = decodeClaim(raw)
	}
	if err == nil && res.status == "ok" && len(res.values) != len(call.fields) {
		err = fmt.Errorf("claim script replied %d counters for %d fields", len(res.values), len(call.fields))
	}
	if err != nil || res.status != "ok" {
		hc.settle(c.ID, false, 0, pinSet{}, nil)
		return res, err
	}
	counters := make([]counter, len(call.fields))
	for i, f := range call.fields {
		counters[i] = counter{f, res.values[i]}
	}
	hc.settle(c.ID, true, res.rev, pinSet{cpus: call.cpus, devs: c.Devices}, counters)
	return res, nil
}

// claimCall is the claim script's arguments for one claim, and what the
// claim pins and adds to, to update the cache with from the reply.
type claimCall struct {
	args   []any
	cpus   []int    // the pCPUs the claim pins; its devices are c.Devices
	fields []string // the usage fields the claim adds to, in argument order
}

// newClaimCall lays out a claim's script arguments from c's usage on h:
// the record and its undo entry, the pCPUs, then each usage field with the
// amount to add and the cap the field may reach: every limit numa.Fit
// holds the counter to on h (see capsOf), so that the script, which alone
// sees the real counters, holds every claim to them whatever the view it
// was fitted on. All of it is computed here so the script decodes no
// JSON; the script checks that h is the host's current generation, for
// which these caps, and the per-guest bounds checked here, hold.
func newClaimCall(h *numa.Host, c *Claim, limit string) (*claimCall, error) {
	type delta struct {
		n, cap int64
	}
	call := &claimCall{}
	deltas := map[string]*delta{}
	add := func(field string, n, limit int64) {
		d := deltas[field]
		if d == nil {
			d = &delta{cap: noCap}
			deltas[field] = d
			call.fields = append(call.fields, field)
		}
		d.n += n
		if n > 0 && limit != noCap && (d.cap == noCap || limit < d.cap) {
			d.cap = limit
		}
	}
	var pinned numa.CPUSet
	for _, u := range c.Usage {
		cell := h.Cell(u.Cell)
		if cell == nil {
			return nil, fmt.Errorf("%w: usage of cell %d, which the host does not have", ErrInvalid, u.Cell)
		}
		if pinned.Intersects(u.PinnedCPUs) {
			return nil, fmt.Errorf("%w: pCPUs %s are in two cells' usage", ErrInvalid, pinned.Intersection(u.PinnedCPUs))
		}
		pinned = pinned.Union(u.PinnedCPUs)
		ratios := ratioHeld(c.Placement, u.Cell)
		if err := checkBounds(cell, u, ratios); err != nil {
			return nil, err
		}
		caps := capsOf(h, cell, u, ratios)
		if u.MemoryMB != 0 {
			add(usageField(u.Cell, "mem"), u.MemoryMB, caps.mem)
		}
		if u.SharedCPUs != 0 {
			add(usageField(u.Cell, "shared"), int64(u.SharedCPUs), caps.shared)
		}
		if u.Pages != 0 && u.PageSizeKB != 0 {
			add(pagesField(u.Cell, u.PageSizeKB), u.Pages, caps.pages)
		}
	}
	// Every claim takes its memory and shared vCPUs of the host as a
	// whole too, to the host's limits: a guest without a NUMA topology
	// takes nothing else.
	memCap, vcpuCap := h.HostLimits()
	if c.HostUsage.MemoryMB != 0 {
		add(hostMemField, c.HostUsage.MemoryMB, memCap)
	}
	if c.HostUsage.VCPUs != 0 {
		add(hostVCPUsField, int64(c.HostUsage.VCPUs), vcpuCap)
	}
	call.cpus = pinned.List()

	undo := undoEntry{token: c.Token, pins: pinSet{cpus: call.cpus, devs: c.Devices}}
	for _, f := range call.fields {
		undo.counters = append(undo.counters, counter{f, deltas[f].n})
	}
	if c.Group != "" {
		undo.group, undo.uuid = c.Group, c.InstanceUUID
	}
	entry := undo.String()
	record, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode claim record: %w", err)
	}
	args := append(make([]any, 0, 6+len(call.cpus)+len(c.Devices)+3*len(call.fields)), c.ID, record, entry, c.Generation, len(call.cpus)+len(c.Devices))
	for _, cpu := range call.cpus {
		args = append(args, cpu)
	}
	for _, a := range c.Devices {
		args = append(args, a)
	}
	args = append(args, len(call.fields))
	for _, f := range call.fields {
		d := deltas[f]
		if d.cap == noCap {
			args = append(args, f, d.n, "")
		} else {
			args = append(args, f, d.n, d.cap)
		}
	}
	args = append(args, c.Group, c.InstanceUUID, limit)
	call.args = args
	return call, nil
}

// toInt reads an integer from a script reply, given as an integer or as a
// string.
func toInt(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case string:
		i, _ := strconv.ParseInt(n, 10, 64)
		return i
	}
	return 0
}

// describeField names a usage field for people: "cell 0 MiB" or "cell 0
// 2048 KiB pages".
func describeField(f string) string {
	parts := strings.Split(f, ":")
	switch {
	case f == hostMemField:
		return "host MiB"
	case f == hostVCPUsField:
		return "host shared vCPUs"
	case len(parts) == 2 && parts[1] == "mem":
		return "cell " + parts[0] + " MiB"
	case len(parts) == 2 && parts[1] == "shared":
		return "cell " + parts[0] + " shared vCPUs"
	case len(parts) == 3 && parts[1] == "pages":
		return "cell " + parts[0] + " " + parts[2] + " KiB pages"
	}
	return "usage field " + f
}

// sameClaim returns the recorded claim for a retried claim id, refusing an
// id reused for another instance.
func sameClaim(spec ClaimSpec, record string, wrap func(error) error) (*Claim, error) {
	c := &Claim{}
	if err := json.Unmarshal([]byte(record), c); err != nil {
		return nil, wrap(fmt.Errorf("stored claim record: %w", err))
	}
	if c.InstanceUUID != spec.InstanceUUID || c.Kind != spec.Kind {
		return nil, wrap(fmt.Errorf("%w: the id is already claimed for %s of instance %s", ErrConflict, c.Kind, c.InstanceUUID))
	}
	return c, nil
}

// backoff sleeps a little more with each attempt, jittered so that losers
// of one race do not collide again in lockstep.
func backoff(ctx context.Context, attempt int) error {
	base := time.Duration(1<<min(attempt-1, 5)) * 200 * time.Microsecond
	d := base/2 + rand.N(base)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Commit marks a pending claim committed: the instance's resident claim.
// Committing a committed claim changes nothing; a held or tombstone claim
// is ErrConflict (it was resident once, and a commit would pass off a
// hold or a dead host's claim as a new resident); an unknown claim is
// ErrUnknownClaim.
func (l *Ledger) Commit(ctx context.Context, host, claimID string) (*Claim, error) {
	return l.setClaimState(ctx, "commit", host, claimID, StateCommitted, anyHost, StatePending)
}

// Hold turns a committed claim into a source hold (held); holding a held claim
// changes nothing. Pending or tombstone: ErrConflict; unknown: ErrUnknownClaim.
//
// The claim keeps its pins and usage, so no other claim can take its pCPUs
// while a resize or cold migration is open, and a revert gets them back.
func (l *Ledger) Hold(ctx context.Context, host, claimID string) (*Claim, error) {
	return l.setClaimState(ctx, "hold", host, claimID, StateHeld, anyHost, StateCommitted)
}

// Unhold turns a source hold back into a committed claim, without any release
// or re-fit in between; unholding a committed claim changes nothing. Pending or
// tombstone: ErrConflict; unknown: ErrUnknownClaim.
//
// It is for a guest that never left the claim's host (a resize undone
// before its guest moved), whatever the host's state: a claim of a guest
// on a fenced host stays resident until an evacuation tombstones it.
// A guest that comes back to its hold comes with Reinstate.
func (l *Ledger) Unhold(ctx context.Context, host, claimID string) (*Claim, error) {
	return l.setClaimState(ctx, "unhold", host, claimID, StateCommitted, anyHost, StateHeld)
}

// Reinstate turns a source hold back into a committed claim for a guest
// that is to run on it again (a resize's revert), in one script with the
// check that the host is neither down nor returning: ErrHostDown there,
// since the guest must not start on a fenced host. Reinstating a committed
// claim changes nothing; pending or tombstone: ErrConflict; unknown:
// ErrUnknownClaim.
func (l *Ledger) Reinstate(ctx context.Context, host, claimID string) (*Claim, error) {
	return l.setClaimState(ctx, "reinstate", host, claimID, StateCommitted, liveHost, StateHeld)
}

// Tombstone turns a committed or held claim on a host that is down into a
// tombstone; a tombstone stays one. Host up: ErrConflict (a host that came back
// may run the guest again); pending: ErrConflict; unknown: ErrUnknownClaim.
//
// A host that is returning is not down either: its tombstones are being
// cleared, and no evacuation starts from it.
func (l *Ledger) Tombstone(ctx context.Context, host, claimID string) (*Claim, error) {
	return l.setClaimState(ctx, "tombstone", host, claimID, StateTombstone, downHost, StateCommitted, StateHeld)
}

// hostRule is what the claim state script asks of the host's state.
type hostRule string

const (
	anyHost  hostRule = ""
	downHost hostRule = "down" // fenced
	liveHost hostRule = "live" // neither down nor returning
)

// setClaimState moves a claim of host to state to, from one of the states
// from, in one script that also checks the host's state by rule. A claim
// in state to already is a retry's success.
func (l *Ledger) setClaimState(ctx context.Context, op, host, claimID string, to ClaimState, rule hostRule, from ...ClaimState) (*Claim, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: %s %s on %s: %w", op, claimID, host, err) }
	if err := checkHostName(host); err != nil {
		return nil, wrap(err)
	}
	if err := checkClaimID(claimID); err != nil {
		return nil, wrap(err)
	}
	at, _ := json.Marshal(l.now().UTC())
	names := make([]string, len(from))
	for i, s := range from {
		names[i] = string(s)
	}
	k := l.hostKeys(host)
	raw, err := l.change(ctx, claimStateScript, []string{k.claims, k.state},
		claimID, string(to), strings.Join(names, ","), at, string(rule)).Slice()
	if err != nil {
		return nil, wrap(err)
	}
	res, err := decodeClaimState(replyStrings(raw))
	if err != nil {
		return nil, wrap(err)
	}
	switch res.status {
	case "unknown":
		return nil, wrap(fmt.Errorf("%w: host %s has no claim %q", ErrUnknownClaim, host, claimID))
	case "state":
		return nil, wrap(fmt.Errorf("%w: the claim is %s; only a claim that is %s can become %s", ErrConflict, res.current, strings.Join(names, " or "), to))
	case "host":
		if rule == liveHost {
			return nil, wrap(fmt.Errorf("%w: host %s is %s; no guest runs again on a host that is down or returning", ErrHostDown, host, res.hostState))
		}
		return nil, wrap(fmt.Errorf("%w: host %s is %s; only a claim on a host that is down becomes a tombstone", ErrConflict, host, res.hostState))
	}
	c := &Claim{}
	if err := json.Unmarshal([]byte(res.record), c); err != nil {
		return nil, wrap(fmt.Errorf("stored claim record: %w", err))
	}
	return c, nil
}

// Release frees a claim's pins and usage and deletes it, in one step,
// whatever its state (a tombstone once the guest left on its fenced host
// is destroyed, a hold once its resize is confirmed). Releasing an
// unknown or already released claim succeeds and changes nothing: a
// delete after an aborted claim must not fail. A claim whose record has
// no undo entry (a damaged ledger) is ErrConflict and stays.
func (l *Ledger) Release(ctx context.Context, host, claimID string) error {
	_, err := l.release(ctx, "release", host, claimID, "", "")
	return err
}

// ReleasePending releases the claim only while it is pending, and says
// whether it did: a compensation undoes a claim its operation made, and
// must not free one that became an instance's resident claim (a Temporal
// Reset replays a run with the same claim ids). An unknown claim is no
// error and nothing to release.
func (l *Ledger) ReleasePending(ctx context.Context, host, claimID string) (bool, error) {
	return l.release(ctx, "release-pending", host, claimID, "", "pending")
}

// ReleaseIfUnchanged releases the claim only if it still has token and
// state and no fence lease runs on it, and says whether it did: the
// audit's compare-and-delete. The audit decided on the claim as it read
// it; a claim made again, committed or held meanwhile, or guarded by a
// hypervisor step that passed its fence (Fence) is kept. state is
// pending, committed or held (a hold no operation keeps any more); a
// tombstone is never the audit's to free, since only the destruction of
// the guest left on its host makes its pCPUs free: ErrInvalid.
func (l *Ledger) ReleaseIfUnchanged(ctx context.Context, host, claimID, token string, state ClaimState) (bool, error) {
	if token == "" || (state != StatePending && state != StateCommitted && state != StateHeld) {
		return false, fmt.Errorf("ledger: release-if-unchanged %s on %s: %w: token %q and state %q: a token and the state pending, committed or held are needed",
			claimID, host, ErrInvalid, token, state)
	}
	return l.release(ctx, "release-if-unchanged", host, claimID, token, "unchanged:"+string(state))
}

func (l *Ledger) release(ctx context.Context, op, host, claimID, token, cond string) (bool, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: %s %s on %s: %w", op, claimID, host, err) }
	if err := checkHostName(host); err != nil {
		return false, wrap(err)
	}
	if err := checkClaimID(claimID); err != nil {
		return false, wrap(err)
	}
	raw, err := l.apply.run(ctx, l.hostKeys(host), releaseScript, claimID, token, cond)
	if err != nil {
		return false, wrap(err)
	}
	res, err := decodeRelease(raw)
	if err != nil {
		return false, wrap(err)
	}
	freed := res.status == "released"
	observeRelease(ctx, op, freed)
	if res.status == "no-undo" {
		return false, wrap(fmt.Errorf("%w: the claim's record has no undo entry, so what it took is unknown (a damaged ledger, which Verify reports); nothing was released", ErrConflict))
	}
	if !freed {
		return false, nil
	}
	if hc := l.cachedHost(host); hc != nil {
		hc.observe(res.rev, parsePins(res.freed), parseCounterList(res.counters))
	}
	return true, nil
}

// Fence renews the fence lease of a claim for length, if the claim still
// exists with token, and returns when the lease ends by the server's
// clock. A hypervisor step that acts for a claim (starting a guest on its
// pCPUs, switching a migration over to them) calls Fence right before it
// and must finish within length: while the lease runs, ReleaseIfUnchanged
// refuses the claim, so the audit cannot free pCPUs that a step which
// passed its fence is about to use, and a step whose claim was freed
// (its workflow ended long ago) is refused here instead of taking
// effect. A gone claim is ErrUnknownClaim, one made again with another
// token ErrConflict, and a host marked down or returning ErrHostDown: no
// step starts a guest on a fenced host. The end returned is by Redis'
// clock: a caller measures the lease on its own clock from before the
// call (see Fences in the package doc), never by comparing that end with
// its own time.
func (l *Ledger) Fence(ctx context.Context, host, claimID, token string, length time.Duration) (time.Time, error) {
	return l.fence(ctx, host, claimID, token, length, "")
}

// FenceTeardown is Fence for a step that only stops, undefines or unplugs
// the guest: it may act on a host that is down or returning too (the
// leftovers of an evacuation are cleared there).
func (l *Ledger) FenceTeardown(ctx context.Context, host, claimID, token string, length time.Duration) (time.Time, error) {
	return l.fence(ctx, host, claimID, token, length, "teardown")
}

func (l *Ledger) fence(ctx context.Context, host, claimID, token string, length time.Duration, mode string) (time.Time, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: fence %s on %s: %w", claimID, host, err) }
	if err := checkHostName(host); err != nil {
		return time.Time{}, wrap(err)
	}
	if err := checkClaimID(claimID); err != nil {
		return time.Time{}, wrap(err)
	}
	if token == "" || length <= 0 {
		return time.Time{}, wrap(fmt.Errorf("%w: token %q and lease %s: a token and a positive lease are needed", ErrInvalid, token, length))
	}
	k := l.hostKeys(host)
	raw, err := l.change(ctx, fenceScript, []string{k.undo, k.lease, k.state}, claimID, token, length.Milliseconds(), mode).Slice()
	if err != nil {
		return time.Time{}, wrap(err)
	}
	res, err := decodeLease("fence", replyStrings(raw))
	if err != nil {
		return time.Time{}, wrap(err)
	}
	switch res.status {
	case "ok":
		return time.UnixMilli(res.until), nil
	case "gone":
		return time.Time{}, wrap(fmt.Errorf("%w: host %s has no claim %q", ErrUnknownClaim, host, claimID))
	case "down":
		return time.Time{}, wrap(fmt.Errorf("%w: host %s is %s; no guest starts there", ErrHostDown, host, res.hostState))
	}
	return time.Time{}, wrap(fmt.Errorf("%w: claim %q was made again with another token", ErrConflict, claimID))
}

// Unfence ends the fence lease of token on the claim: the step that
// renewed it has acted, or will not act. A lease of another token, or
// none, is left as it is.
func (l *Ledger) Unfence(ctx context.Context, host, claimID, token string) error {
	if err := checkHostName(host); err != nil {
		return fmt.Errorf("ledger: unfence %s: %w", claimID, err)
	}
	if err := checkClaimID(claimID); err != nil {
		return fmt.Errorf("ledger: unfence %s on %s: %w", claimID, host, err)
	}
	if err := l.change(ctx, unfenceScript, []string{l.hostKeys(host).lease}, claimID, token).Err(); err != nil {
		return fmt.Errorf("ledger: unfence %s on %s: %w", claimID, host, err)
	}
	return nil
}

// LeasedError is Take's answer while a step of another token may still
// act for the claim: Until is when its fence lease ends, by the Redis
// server's clock. It matches ErrConflict.
type LeasedError struct {
	Host, ClaimID string
	Until         time.Time
}

func (e *LeasedError) Error() string {
	return fmt.Sprintf("ledger: take %s on %s: a step of another operation may act for the claim until its fence lease ends at %s",
		e.ClaimID, e.Host, e.Until.UTC().Format(time.RFC3339Nano))
}

func (e *LeasedError) Unwrap() error { return ErrConflict }

// Take gives the claim the token to if its token now is one of from (any
// when from is empty) or to already: an operation takes over its guest's
// claim from the token it read when it began, so that every step that
// fences with another token is refused from then on (see the package
// doc, Fences). A claim whose token is none of them is ErrConflict: an
// operation that began later took it. While a fence lease of a token
// other than to runs it changes nothing and returns a *LeasedError.
func (l *Ledger) Take(ctx context.Context, host, claimID string, from []string, to string) error {
	wrap := func(err error) error { return fmt.Errorf("ledger: take %s on %s: %w", claimID, host, err) }
	if err := checkHostName(host); err != nil {
		return wrap(err)
	}
	if err := checkClaimID(claimID); err != nil {
		return wrap(err)
	}
	for _, t := range append([]string{to}, from...) {
		if t == "" || strings.ContainsAny(t, "|\"\\") {
			return wrap(fmt.Errorf("%w: token %q: a token is not empty and has no '|', '\"' or '\\'", ErrInvalid, t))
		}
	}
	k := l.hostKeys(host)
	raw, err := l.change(ctx, takeScript, []string{k.claims, k.undo, k.lease}, claimID, to, strings.Join(from, "|")).Slice()
	if err != nil {
		return wrap(err)
	}
	res, err := decodeLease("take", replyStrings(raw))
	if err != nil {
		return wrap(err)
	}
	switch res.status {
	case "ok":
		return nil
	case "gone":
		return wrap(fmt.Errorf("%w: host %s has no claim %q", ErrUnknownClaim, host, claimID))
	case "token":
		return wrap(fmt.Errorf("%w: claim %q was taken by another operation", ErrConflict, claimID))
	}
	return &LeasedError{Host: host, ClaimID: claimID, Until: time.UnixMilli(res.until)}
}

// Claims lists a host's claims by id. A host never registered, or with no
// claims, has none.
func (l *Ledger) Claims(ctx context.Context, host string) ([]Claim, error) {
	if err := checkHostName(host); err != nil {
		return nil, fmt.Errorf("ledger: claims: %w", err)
	}
	recs, err := l.rdb.HVals(ctx, l.hostKeys(host).claims).Result()
	if err != nil {
		return nil, fmt.Errorf("ledger: claims of %s: %w", host, err)
	}
	out, err := decodeClaims(recs)
	if err != nil {
		return nil, fmt.Errorf("ledger: claims of %s: %w", host, err)
	}
	return out, nil
}

// GetClaim returns one claim of a host, or ErrUnknownClaim.
func (l *Ledger) GetClaim(ctx context.Context, host, claimID string) (*Claim, error) {
	c, err := l.getClaim(ctx, host, claimID)
	if err != nil {
		return nil, fmt.Errorf("ledger: claim %s on %s: %w", claimID, host, err)
	}
	return c, nil
}

// getClaim is GetClaim with errors that do not say where they come from,
// for callers that say it themselves.
func (l *Ledger) getClaim(ctx context.Context, host, claimID string) (*Claim, error) {
	if err := checkHostName(host); err != nil {
		return nil, err
	}
	if err := checkClaimID(claimID); err != nil {
		return nil, err
	}
	rec, err := l.rdb.HGet(ctx, l.hostKeys(host).claims, claimID).Result()
	if err != nil {
		if isNil(err) {
			return nil, fmt.Errorf("%w: host %s has no claim %q", ErrUnknownClaim, host, claimID)
		}
		return nil, err
	}
	c := &Claim{}
	if err := json.Unmarshal([]byte(rec), c); err != nil {
		return nil, fmt.Errorf("stored claim record: %w", err)
	}
	return c, nil
}

func decodeClaims(records []string) ([]Claim, error) {
	out := make([]Claim, 0, len(records))
	for _, r := range records {
		var c Claim
		if err := json.Unmarshal([]byte(r), &c); err != nil {
			return nil, fmt.Errorf("stored claim record: %w", err)
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// TakeOver is Take, waiting while a fence lease of another token runs
// (asking again every second, by the caller's clock: no time of Redis'
// is compared with it) until ctx ends.
func (l *Ledger) TakeOver(ctx context.Context, host, claimID string, from []string, to string) error {
	for {
		err := l.Take(ctx, host, claimID, from, to)
		var leased *LeasedError
		if !errors.As(err, &leased) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}
