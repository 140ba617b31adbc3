package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// AuditHost audits one host's claims and compares them with its domains.
//
// It walks the ledger's claims, never a list of workflows (visibility is
// eventually consistent), and asks the OwnerChecker about each claim
// older than the grace period. It keeps every claim whose owner runs with
// the claim's first run id, every claim whose owner runs in another
// namespace, every claim younger than the namespace's retention whose
// owner Temporal does not know (it runs where this worker cannot see),
// and every claim it cannot decide on. A candidate is a pending claim
// whose owner is closed (for at least the grace period, and never less
// than MinGrace), replaced or unknown, or a
// committed claim that its instance record does not name while no
// workflow of the instance is open. Before freeing a candidate it reads
// the claim and the record again (Temporal's answer is newer than the
// snapshot), looks at the instance's domain on the host and keeps the
// claim if that domain uses any of its pCPUs or devices, or runs there
// on a claim without pCPUs (a floating guest), starting Settle when the
// guest runs on exactly the claim, and frees with a
// compare-and-delete on the token and state it judged, which a running
// fence lease also refuses. Other drift against the hypervisor is only
// reported (see the workflows package documentation for why), except a
// shut-off domain left by an operation that is over, which it cleans
// (pass.leftover).
//
// Only the host being unknown fails the audit; every other error is
// reported in the result and keeps what it touches.
func (a *Auditor) AuditHost(ctx context.Context, in AuditHostInput) (HostAudit, error) {
	start := time.Now()
	au := &pass{a: a, res: HostAudit{Host: in.Host, DryRun: in.DryRun}, grace: a.Grace, minGrace: a.MinGrace, namespace: a.Ledger.Namespace()}
	if in.Grace != nil {
		au.grace = *in.Grace
	}
	if au.grace < 0 {
		return HostAudit{}, invalid(fmt.Sprintf("grace %s: must be 0 or more", au.grace))
	}
	if a.Owners == nil {
		return HostAudit{}, errors.New("audit: no owner checker configured")
	}
	snap, err := a.Ledger.Snapshot(ctx, in.Host)
	if err != nil {
		return HostAudit{}, err
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
	au.pinnable, au.topology = pinnable(snap.Topology), snap.Topology
	now := time.Now()
	j := judged{freed: map[string]bool{}, resident: map[string]string{}, residentClaim: map[string]string{}, states: map[string]recordStates{}}
	for i := range snap.Claims {
		j.add(&snap.Claims[i], au.judge(ctx, &snap.Claims[i], now))
	}
	if snap.Status.State == ledger.HostDown && snap.Status.AutoEvacuate && !in.DryRun {
		au.evacuate(ctx, snap.Claims)
	}
	if domErr == nil {
		au.drift(ctx, snap, doms, j)
	} else {
		for _, d := range j.inUse {
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

// Evacuator starts an evacuation of a guest of a fenced host under the
// instance's own workflow id. Started is false, with no error, when
// another workflow of the instance is open: that one holds the guest.
type Evacuator interface {
	StartEvacuate(ctx context.Context, uuid, host string) (started bool, err error)
}

// evacuate starts an evacuation of every guest that still lives on this
// down host, so that one no host could take before (a full cloud, a
// server group's rule) is rebuilt once a host can. The evacuation decides
// everything itself; a guest in VERIFY_RESIZE waits for its operator.
// Claims of any age count: a guest fenced with its host moments after it
// booted is evacuated too.
func (au *pass) evacuate(ctx context.Context, claims []ledger.Claim) {
	if au.a.Evacuator == nil {
		return
	}
	claims = slices.Clone(claims)
	slices.SortFunc(claims, func(x, y ledger.Claim) int { return strings.Compare(x.InstanceUUID, y.InstanceUUID) })
	for _, c := range claims {
		uuid := c.InstanceUUID
		inst, err := au.a.Ledger.Instance(ctx, uuid)
		if errors.Is(err, ledger.ErrUnknownInstance) {
			continue
		}
		if err != nil {
			au.fail("evacuate %s: %v", uuid, err)
			continue
		}
		if inst.Host != au.res.Host || inst.ClaimID != c.ID || inst.VMState == guest.VMResized {
			continue
		}
		started, err := au.a.Evacuator.StartEvacuate(ctx, uuid, au.res.Host)
		if err != nil {
			au.fail("evacuate %s: %v", uuid, err)
			continue
		}
		if started {
			au.res.Evacuated = append(au.res.Evacuated, uuid)
			au.res.Tally.Evacuations++
		}
	}
}

// pass is one host's audit in progress.
type pass struct {
	a     *Auditor
	res   HostAudit
	grace time.Duration
	// minGrace is the least time a closed owner must have been closed.
	minGrace time.Duration
	// namespace is the Temporal namespace the audit sees and settles in.
	namespace string
	// retention is the namespace's, read when first needed.
	retention *time.Duration
	pinnable  numa.CPUSet
	topology  *numa.Host
}

func (au *pass) fail(format string, args ...any) {
	au.res.Errors = append(au.res.Errors, fmt.Sprintf(format, args...))
}

func (au *pass) keep(reason string) { au.res.Tally.Kept.Add(reason, 1) }

// judged is what judging a host's claims tells the drift check.
type judged struct {
	// freed are the claims freed (or, in a dry run, that would be).
	freed map[string]bool
	// resident holds, per instance whose claim on this host its record
	// names, the digest of the domain XML pinflow defined for it.
	resident map[string]string
	// residentClaim is, per such instance, the id of that claim.
	residentClaim map[string]string
	// states are, per such instance, its record's vm and task states.
	states map[string]recordStates
	// inUse are the claims kept because their instance's domain uses
	// them, reported as drift.
	inUse []Drift
}

func (j *judged) add(c *ledger.Claim, o claimOutcome) {
	if o.freed != "" {
		j.freed[c.ID] = true
	}
	if o.resident {
		j.resident[c.InstanceUUID] = o.digest
		j.residentClaim[c.InstanceUUID] = c.ID
		j.states[c.InstanceUUID] = o.states
	}
	if o.inUse != nil {
		j.inUse = append(j.inUse, *o.inUse)
	}
}

// claimOutcome is what became of one claim: kept or freed, and why.
type claimOutcome struct {
	kept, freed string
	// resident is set for a claim its instance record names, with the
	// digest of the domain XML the record says pinflow defined and the
	// record's states.
	resident bool
	digest   string
	states   recordStates
	inUse    *Drift
}

// judge decides on one claim, reading only the facts the decision asks
// for, and acts on the decision.
func (au *pass) judge(ctx context.Context, c *ledger.Claim, now time.Time) claimOutcome {
	au.res.Tally.Claims++
	r := auditRules{grace: au.grace, minGrace: au.minGrace, namespace: au.namespace, now: now}
	var f claimFacts
	v := decide(c, f, r)
	for v.need != needNothing {
		if !au.learn(ctx, c, &f, v.need) {
			v = verdict{kept: KeptDoubt}
			break
		}
		v = decide(c, f, r)
	}
	o := claimOutcome{kept: v.kept}
	if f.record.Names(c) {
		o.resident, o.digest = true, f.record.DomainDigest
		o.states = recordStates{vm: f.record.VMState, task: f.record.TaskState}
	}
	if v.settle {
		o.kept = KeptResident
		if au.maySettle(c) && au.a.Settler.StartSettle(ctx, SettleInput{UUID: c.InstanceUUID, Host: c.Host, ClaimID: c.ID}) == nil {
			o.kept = KeptSettling
		}
	}
	if v.freed != "" {
		o = au.free(ctx, c, v.freed)
	}
	if o.kept != "" {
		au.keep(o.kept)
	}
	return o
}

// auditRules are the audit's settings a decision depends on.
type auditRules struct {
	grace time.Duration
	// minGrace is the least time a closed owner must have been closed.
	minGrace time.Duration
	// namespace is the Temporal namespace the audit's answers come from.
	namespace string
	// now is when the audit began judging; younger claims are not judged.
	now time.Time
}

// claimFacts are what the audit has read about one claim, each only when
// a decision asked for it.
type claimFacts struct {
	record    *ledger.Home   // the instance record
	noRecord  bool           // the instance has no record
	owner     *OwnerStatus   // the status of the claim's owning workflow
	ownerAt   time.Time      // when the owner's status was read
	instance  *OwnerStatus   // the status of the instance's workflow
	retention *time.Duration // the namespace's retention of closed runs
}

// need is a fact a decision cannot be made without.
type need int

const (
	needNothing need = iota
	needRecord
	needOwner
	needInstance
	needRetention
)

// verdict is a decision on a claim: kept or to be freed and why, or the
// fact to read before it can be made.
type verdict struct {
	need        need
	kept, freed string
	// settle: the claim is its guest's, which Settle is to make resident.
	settle bool
}

// decide judges claim c on the facts read so far. It asks for the
// instance record before Temporal, and for Temporal only about claims the
// record does not settle: that is almost every claim, and it keeps the
// audit's cost near the reads'.
func decide(c *ledger.Claim, f claimFacts, r auditRules) verdict {
	if c.Kind == ledger.KindQuarantine {
		// An operator's to release, never the audit's.
		return verdict{kept: KeptQuarantined}
	}
	if c.State == ledger.StateTombstone {
		return verdict{kept: KeptTombstone}
	}
	// With no grace at all every claim is judged, whatever the clocks say.
	if r.grace > 0 && r.now.Sub(c.CreatedAt) < r.grace {
		return verdict{kept: KeptYoung}
	}
	resident := false
	if c.State == ledger.StateCommitted || c.State == ledger.StateHeld {
		if f.record == nil && !f.noRecord {
			return verdict{need: needRecord}
		}
		resident = f.record.Names(c)
		if resident && c.State == ledger.StateCommitted {
			return verdict{kept: KeptResident}
		}
		// A hold its record still names: its resize held the claim and
		// had not moved the guest yet.
	}
	if !ownNamespace(c, r.namespace) {
		// Temporal answers for the audit's namespace only.
		return verdict{kept: KeptOtherNamespace}
	}
	if f.owner == nil {
		return verdict{need: needOwner}
	}
	owner := *f.owner
	if owner.State == OwnerRunning && owner.FirstRunID == c.OwnerRunID {
		return verdict{kept: KeptOwnerRunning}
	}
	if v := unseen(c, owner, f, r); v != (verdict{}) {
		return v
	}
	// The claim's own chain is closed. Its last activity attempts may
	// still be in flight (termination does not stop them), so it must
	// have been closed for the grace period too, and never less than the
	// minimum grace.
	if wait := max(r.grace, r.minGrace); wait > 0 && owner.State != OwnerNotFound && f.ownerAt.Sub(owner.Since) < wait {
		return verdict{kept: KeptRecentlyClosed}
	}
	switch {
	case c.State == ledger.StatePending && owner.State == OwnerRunning:
		return verdict{freed: FreedOwnerReplaced}
	case c.State == ledger.StatePending && owner.State == OwnerClosed:
		return verdict{freed: FreedOwnerClosed}
	case c.State == ledger.StatePending:
		return verdict{freed: FreedOwnerNotFound}
	}
	// Committed or a source hold, not resident: free only while no
	// workflow of the instance is open, since an open one may still name
	// or release it (a resize's revert makes its hold resident).
	inst := owner
	if guest.InstanceWorkflowID(c.InstanceUUID) != c.OwnerWorkflowID {
		if f.instance == nil {
			return verdict{need: needInstance}
		}
		inst = *f.instance
		if v := unseen(c, inst, f, r); v != (verdict{}) {
			return v
		}
	}
	switch {
	case inst.State == OwnerRunning && c.State == ledger.StateHeld:
		return verdict{kept: KeptSourceHold}
	case inst.State == OwnerRunning:
		return verdict{kept: KeptInstanceBusy}
	case resident:
		// Its resize was stopped before the guest moved, and nothing will
		// make the claim resident again but Settle.
		return verdict{settle: true}
	case f.noRecord:
		return verdict{freed: FreedInstanceGone}
	case c.Kind == ledger.KindResizeDest && c.State == ledger.StateCommitted && f.record.TaskState != guest.TaskNone:
		// A revert stopped midway: Settle takes the guest forwards
		// onto this claim, or forgets the resize the record still keeps.
		return verdict{settle: true}
	}
	return verdict{freed: FreedNotResident}
}

// unseen judges a claim of whose workflow st Temporal knows no run. That
// proves the workflow gone only for a claim older than the namespace's
// retention: a younger claim's workflow would still be known had it run
// here, so it runs where the audit cannot see (another namespace or
// server), and the claim is kept. It returns the zero verdict when the
// decision goes on.
func unseen(c *ledger.Claim, st OwnerStatus, f claimFacts, r auditRules) verdict {
	switch {
	case st.State != OwnerNotFound:
		return verdict{}
	case f.retention == nil:
		return verdict{need: needRetention}
	case r.now.Sub(c.CreatedAt) <= *f.retention:
		return verdict{kept: KeptOwnerUnseen}
	}
	return verdict{}
}

// ownNamespace says whether c's owner runs in namespace; a claim recorded
// before claims named their namespace belongs to the ledger's, which is
// the namespace of every process the ledger lets act (ledger.Bind).
func ownNamespace(c *ledger.Claim, namespace string) bool {
	return c.Namespace == "" || c.Namespace == namespace
}

// learn reads into f the fact a decision on c needs. It reports an error
// and returns false when it cannot: the claim is then kept, in doubt.
func (au *pass) learn(ctx context.Context, c *ledger.Claim, f *claimFacts, n need) bool {
	switch n {
	case needRecord:
		home, err := au.a.Ledger.Home(ctx, c.InstanceUUID)
		switch {
		case errors.Is(err, ledger.ErrUnknownInstance):
			f.noRecord = true
		case err != nil:
			au.fail("claim %s: instance record: %v", c.ID, err)
			return false
		default:
			f.record = &home
		}
	case needOwner:
		st, err := au.a.Owners.OwnerStatus(ctx, c.OwnerWorkflowID)
		if err != nil {
			au.fail("claim %s: owner %s: %v", c.ID, c.OwnerWorkflowID, err)
			return false
		}
		f.owner, f.ownerAt = &st, time.Now()
	case needInstance:
		instWF := guest.InstanceWorkflowID(c.InstanceUUID)
		st, err := au.a.Owners.OwnerStatus(ctx, instWF)
		if err != nil {
			au.fail("claim %s: instance workflow %s: %v", c.ID, instWF, err)
			return false
		}
		f.instance = &st
	case needRetention:
		if au.retention == nil {
			d, err := au.a.Owners.Retention(ctx)
			if err != nil {
				au.fail("claim %s: retention of namespace %q: %v", c.ID, au.namespace, err)
				return false
			}
			au.retention = &d
		}
		f.retention = au.retention
	}
	return true
}

// free acts on a decision to free c for reason. Temporal's answers are
// newer than the snapshot, so it reads the claim, its record and its
// domain again first, and releases only what is unchanged.
func (au *pass) free(ctx context.Context, c *ledger.Claim, reason string) claimOutcome {
	// The owner may have committed and attached the claim, and closed,
	// since the snapshot.
	if kept := au.recheck(ctx, c); kept != "" {
		return claimOutcome{kept: kept}
	}
	// Defence in depth: whatever the workflows say, pCPUs a domain of the
	// claim's own instance uses on this host are not freed.
	if kept, inUse := au.guarded(ctx, c); kept != "" {
		return claimOutcome{kept: kept, inUse: inUse}
	}
	if au.settleHold(ctx, c) {
		return claimOutcome{kept: KeptSettling}
	}
	if !au.res.DryRun {
		ok, err := au.a.Ledger.ReleaseIfUnchanged(ctx, c.Host, c.ID, c.Token, c.State)
		if err != nil {
			au.fail("claim %s: release: %v", c.ID, err)
			return claimOutcome{kept: KeptDoubt}
		}
		if !ok {
			// Made again, committed, or under a fence lease meanwhile.
			return claimOutcome{kept: KeptChanged}
		}
	}
	au.res.Tally.Freed.Add(reason, 1)
	au.res.Freed = append(au.res.Freed, FreedClaim{ClaimID: c.ID, Instance: c.InstanceUUID, Kind: c.Kind, State: c.State,
		Owner: c.OwnerWorkflowID, CPUs: claimCPUs(c).String(), Reason: reason})
	return claimOutcome{freed: reason}
}

// settleHold starts Settle for a source hold whose resize was left
// without its workflow, and reports whether it did: the guest lives where
// its record says, so Settle confirms it, which frees this hold and
// clears the record's resize too.
func (au *pass) settleHold(ctx context.Context, c *ledger.Claim) bool {
	if c.State != ledger.StateHeld || !au.maySettle(c) {
		return false
	}
	home, err := au.a.Ledger.Home(ctx, c.InstanceUUID)
	if err != nil || home.ClaimID == "" {
		return false
	}
	return au.a.Settler.StartSettle(ctx, SettleInput{UUID: c.InstanceUUID, Host: home.Host, ClaimID: home.ClaimID}) == nil
}

// maySettle says whether the audit may start Settle for c's instance. The
// Settler starts it in the audit's namespace, so only for a claim whose
// owner runs there: in another, Settle would run beside the instance's
// open operation instead of being refused by its workflow id.
func (au *pass) maySettle(c *ledger.Claim) bool {
	return au.a.Settler != nil && !au.res.DryRun && ownNamespace(c, au.namespace)
}

// recheck reads the claim and, for a committed one, its instance record
// again, and returns why the claim is kept ("" when it may go).
func (au *pass) recheck(ctx context.Context, c *ledger.Claim) string {
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
// claim is kept ("" when no domain of the instance uses its pCPUs), with
// the drift to report when a domain uses them. A guest that runs pinned
// to exactly the claim, and nowhere else, had its operation interrupted
// after it started there: the audit starts Settle to finish that
// operation forwards.
func (au *pass) guarded(ctx context.Context, c *ledger.Claim) (string, *Drift) {
	dom, err := au.a.Driver.Lookup(ctx, c.Host, c.InstanceUUID)
	switch {
	case errors.Is(err, hypervisor.ErrNotFound):
		return "", nil
	case err != nil:
		au.fail("claim %s: domain of %s: %v", c.ID, c.InstanceUUID, err)
		return KeptDoubt, nil
	}
	want := claimCPUs(c)
	used, err := hypervisor.UsedCPUs(*dom)
	if err != nil {
		au.fail("claim %s: domain of %s: %v", c.ID, c.InstanceUUID, err)
		return KeptDoubt, nil
	}
	used = used.Intersection(au.pinnable)
	devs, err := hypervisor.UsedDevices(*dom, au.topology)
	if err != nil {
		au.fail("claim %s: domain of %s: %v", c.ID, c.InstanceUUID, err)
		return KeptDoubt, nil
	}
	sharedDevs := commonDevices(devs, c.Devices)
	floats, err := au.floatsOn(ctx, c, *dom)
	if err != nil {
		au.fail("claim %s: instance record: %v", c.ID, err)
		return KeptDoubt, nil
	}
	if !used.Intersects(want) && len(sharedDevs) == 0 && !floats {
		return "", nil
	}
	what := holdings(used.Intersection(want), sharedDevs)
	if floats && len(sharedDevs) == 0 {
		what = "memory"
	}
	d := Drift{Kind: DriftClaimInUse, Instance: c.InstanceUUID, ClaimID: c.ID, CPUs: used.Intersection(want).String(), Devices: sharedDevs,
		Detail: fmt.Sprintf("%s claim %s has no operation to finish it, but domain %s (%s) uses its %s", c.State, c.ID, dom.Name, dom.State, what)}
	kept := KeptInUse
	// A guest that passes through fewer of the claim's devices than it
	// holds had them unplugged for a live migration: it runs on the claim
	// all the same, and once settled the audit plugs them in again.
	runsOn := want
	if c.Kind == ledger.KindRepin {
		// A re-pin's guest runs on the whole target, part of which its
		// resident claim holds.
		runsOn = usageCPUs(c.TargetUsage)
	}
	if dom.State == hypervisor.StateRunning && used.Equal(runsOn) && len(sharedDevs) == len(devs) && au.maySettle(c) {
		err := au.a.Settler.StartSettle(ctx, SettleInput{UUID: c.InstanceUUID, Host: c.Host, ClaimID: c.ID})
		if err != nil {
			d.Detail += fmt.Sprintf("; settling it failed to start: %v", err)
		} else {
			d.Detail += "; settling it as the instance's resident claim"
			kept = KeptSettling
		}
	}
	return kept, &d
}

// floatsOn says whether c is the claim of a floating guest that is up on
// c's host. Such a guest has no dedicated pCPUs, so its XML names nothing
// of its claim but devices, yet it uses the claim's memory: a claim
// without pCPUs is in use while its instance's domain runs or is paused
// there, unless the instance's record names another claim of it on that
// host (the leftover of a same-host resize).
func (au *pass) floatsOn(ctx context.Context, c *ledger.Claim, dom hypervisor.Domain) (bool, error) {
	if !claimCPUs(c).IsEmpty() || dom.State == hypervisor.StateShutoff {
		return false, nil
	}
	home, err := au.a.Ledger.Home(ctx, c.InstanceUUID)
	switch {
	case errors.Is(err, ledger.ErrUnknownInstance):
		return true, nil
	case err != nil:
		return false, err
	}
	return home.Host != c.Host || home.ClaimID == "" || home.ClaimID == c.ID, nil
}
