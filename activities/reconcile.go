package activities

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// Why the audit freed a claim.
const (
	// FreedOwnerClosed: a pending claim whose owning workflow closed
	// (completed, failed, cancelled, terminated, timed out) without
	// releasing it.
	FreedOwnerClosed = "owner-closed"
	// FreedOwnerReplaced: a pending claim whose owning workflow id now runs
	// another chain (another first run id); the claim's chain is closed.
	FreedOwnerReplaced = "owner-replaced"
	// FreedOwnerNotFound: a pending claim whose owning workflow the server
	// no longer knows (closed beyond retention).
	FreedOwnerNotFound = "owner-not-found"
	// FreedNotResident: a committed claim the instance record does not
	// name (another host, another claim, or no host), with no workflow of
	// the instance open to finish the move.
	FreedNotResident = "not-resident"
	// FreedInstanceGone: a committed claim of an instance that has no
	// record any more, with no workflow of the instance open.
	FreedInstanceGone = "instance-gone"
)

// Why the audit kept a claim.
const (
	// KeptYoung: younger than the grace period; not judged.
	KeptYoung = "young"
	// KeptResident: committed and named by its instance record.
	KeptResident = "resident"
	// KeptOwnerRunning: the owning workflow runs with the claim's first
	// run id. Such a claim is kept whatever else holds.
	KeptOwnerRunning = "owner-running"
	// KeptInstanceBusy: a committed claim not named by its instance, while
	// a workflow of the instance is open and may still name or release it.
	KeptInstanceBusy = "instance-busy"
	// KeptRecentlyClosed: the owner closed less than the grace period ago;
	// an activity attempt it started may still be writing.
	KeptRecentlyClosed = "recently-closed"
	// KeptChanged: the claim was released or made again between the read
	// and the compare-and-delete; nothing was freed.
	KeptChanged = "changed"
	// KeptDoubt: an error kept the audit from deciding; see Errors.
	KeptDoubt = "doubt"
	// KeptInUse: no operation will finish the claim, but a domain of its
	// own instance on the host uses its pCPUs; freeing them would hand
	// them to a second guest. Reported as DriftClaimInUse.
	KeptInUse = "in-use"
	// KeptSettling: as KeptInUse, where the guest runs pinned to exactly
	// the claim and nowhere else: the audit started Settle, which makes
	// the claim the instance's resident claim.
	KeptSettling = "settling"
)

// Kinds of drift between the ledger and a hypervisor.
const (
	// DriftPinnedToOther: a domain is pinned to pCPUs the ledger gives to
	// another instance's claim.
	DriftPinnedToOther = "pinned-to-other"
	// DriftPinsOutsideClaim: a domain with a claim on the host is pinned to
	// pinnable pCPUs no claim owns.
	DriftPinsOutsideClaim = "pins-outside-claim"
	// DriftDomainWithoutClaim: a running domain has no claim on its host.
	DriftDomainWithoutClaim = "domain-without-claim"
	// DriftClaimWithoutDomain: a committed claim has no domain on its host.
	DriftClaimWithoutDomain = "claim-without-domain"
	// DriftUnreadableDomain: a domain's XML could not be read for its pins.
	DriftUnreadableDomain = "unreadable-domain"
	// DriftClaimInUse: a claim no operation will finish is used by a
	// domain of its instance; the audit keeps it (KeptInUse, KeptSettling).
	DriftClaimInUse = "claim-in-use"
)

// AuditHostInput asks for an audit of one host.
type AuditHostInput struct {
	Host string `json:"host"`
	// Grace is how old a claim must be to be judged; nil takes the
	// worker's configured grace (Activities.Grace). Zero judges all.
	Grace *time.Duration `json:"grace,omitempty"`
	// DryRun decides and reports but frees nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// ReasonCount is how many claims one reason applied to.
type ReasonCount struct {
	Reason string `json:"reason"`
	Count  int    `json:"count"`
}

// ReasonCounts are counts by reason, ordered by reason. A slice rather
// than a map, so workflow code can sum it deterministically.
type ReasonCounts []ReasonCount

// Add adds n to reason's count.
func (rc *ReasonCounts) Add(reason string, n int) {
	i := sort.Search(len(*rc), func(i int) bool { return (*rc)[i].Reason >= reason })
	if i < len(*rc) && (*rc)[i].Reason == reason {
		(*rc)[i].Count += n
		return
	}
	*rc = append(*rc, ReasonCount{})
	copy((*rc)[i+1:], (*rc)[i:])
	(*rc)[i] = ReasonCount{Reason: reason, Count: n}
}

// Total sums every reason's count.
func (rc ReasonCounts) Total() int {
	n := 0
	for _, c := range rc {
		n += c.Count
	}
	return n
}

// Of returns reason's count.
func (rc ReasonCounts) Of(reason string) int {
	for _, c := range rc {
		if c.Reason == reason {
			return c.Count
		}
	}
	return 0
}

// Tally counts what audits kept, freed and found.
type Tally struct {
	Claims int          `json:"claims"`
	Kept   ReasonCounts `json:"kept"`
	Freed  ReasonCounts `json:"freed"`
	Drift  ReasonCounts `json:"drift"`
	Errors int          `json:"errors"`
}

// Add adds o's counts to t.
func (t *Tally) Add(o Tally) {
	t.Claims += o.Claims
	t.Errors += o.Errors
	for _, c := range o.Kept {
		t.Kept.Add(c.Reason, c.Count)
	}
	for _, c := range o.Freed {
		t.Freed.Add(c.Reason, c.Count)
	}
	for _, c := range o.Drift {
		t.Drift.Add(c.Reason, c.Count)
	}
}

// FreedClaim is a claim the audit freed (or, in a dry run, would free).
type FreedClaim struct {
	ClaimID  string            `json:"claim_id"`
	Instance string            `json:"instance"`
	Kind     ledger.ClaimKind  `json:"kind"`
	State    ledger.ClaimState `json:"state"`
	Owner    string            `json:"owner"`
	CPUs     string            `json:"cpus"`
	Reason   string            `json:"reason"`
}

// Drift is one difference between the ledger and the hypervisor.
type Drift struct {
	Kind     string `json:"kind"`
	Instance string `json:"instance,omitempty"`
	ClaimID  string `json:"claim_id,omitempty"`
	CPUs     string `json:"cpus,omitempty"`
	Detail   string `json:"detail"`
	// InFlight says a workflow of the instance is open, so the difference
	// may be a step in progress rather than a fault.
	InFlight bool `json:"in_flight,omitempty"`
}

// HostAudit is the outcome of one host's audit.
type HostAudit struct {
	Host   string       `json:"host"`
	DryRun bool         `json:"dry_run,omitempty"`
	Tally  Tally        `json:"tally"`
	Freed  []FreedClaim `json:"freed,omitempty"`
	Drift  []Drift      `json:"drift,omitempty"`
	Errors []string     `json:"errors,omitempty"`
	// Duration is how long the audit of the host took.
	Duration time.Duration `json:"duration"`
}

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
	doms, domErr := a.Driver.Domains(ctx, in.Host)
	if domErr != nil {
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
	// With no grace at all every claim is judged, whatever the clocks say.
	if au.grace > 0 && now.Sub(c.CreatedAt) < au.grace {
		au.keep(KeptYoung)
		return ""
	}
	instGone := false
	if c.State == ledger.StateCommitted {
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
		// Committed, not resident: free only while no workflow of the
		// instance is open, since an open one may still name or release it.
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
			au.keep(KeptInstanceBusy)
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

// InstanceWorkflowPrefix starts the workflow id every operation on one
// guest runs under (workflows.InstanceWorkflowID); the audit needs it to
// ask whether a guest has an open workflow.
const InstanceWorkflowPrefix = "instance-"

// InstanceWorkflowID is the workflow id of the guest uuid's operations.
func InstanceWorkflowID(uuid string) string { return InstanceWorkflowPrefix + uuid }

func claimCPUs(c *ledger.Claim) numa.CPUSet {
	var s numa.CPUSet
	for _, u := range c.Usage {
		s = s.Union(u.PinnedCPUs)
	}
	return s
}

// drift compares the host's domains and their pins with the snapshot's
// claims (less those just freed).
func (au *audit) drift(ctx context.Context, snap *ledger.Snapshot, doms []hypervisor.Domain, freed map[string]bool) {
	var pinnable numa.CPUSet
	for _, c := range snap.Topology.Cells {
		pinnable = pinnable.Union(c.PCPUs)
	}
	claims := map[string]*ledger.Claim{}
	byInstance := map[string][]*ledger.Claim{}
	for i := range snap.Claims {
		c := &snap.Claims[i]
		if freed[c.ID] {
			continue
		}
		claims[c.ID] = c
		byInstance[c.InstanceUUID] = append(byInstance[c.InstanceUUID], c)
	}
	owners := map[int]*ledger.Claim{}
	for _, p := range snap.Pins {
		if c := claims[p.ClaimID]; c != nil {
			owners[p.CPU] = c
		}
	}
	var found []Drift
	hasDomain := map[string]bool{}
	for _, d := range doms {
		hasDomain[d.UUID] = true
		// A resident guest whose hypervisor returns the very document
		// pinflow defined carries its claim's pins and nothing else: no
		// drift is possible, so its XML need not be parsed again.
		if digest, ok := au.resident[d.UUID]; ok && digest != "" && digest == ledger.DomainDigest(d.XML) {
			continue
		}
		pins, err := xmlpatch.Read(d.XML)
		if err != nil {
			found = append(found, Drift{Kind: DriftUnreadableDomain, Instance: d.UUID, Detail: err.Error()})
			continue
		}
		cpus := pins.HostCPUs().Intersection(pinnable)
		var other, own numa.CPUSet
		otherClaims := map[string]bool{}
		for _, cpu := range cpus.List() {
			if c := owners[cpu]; c != nil && c.InstanceUUID != d.UUID {
				other = other.Union(numa.NewCPUSet(cpu))
				otherClaims[c.ID] = true
			}
		}
		for _, c := range byInstance[d.UUID] {
			own = own.Union(claimCPUs(c))
		}
		if !other.IsEmpty() {
			ids := make([]string, 0, len(otherClaims))
			for id := range otherClaims {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			found = append(found, Drift{Kind: DriftPinnedToOther, Instance: d.UUID, CPUs: other.String(),
				Detail: fmt.Sprintf("domain %s (%s) is pinned to pCPUs %s of claim %v", d.Name, d.State, other, ids)})
		}
		switch {
		case len(byInstance[d.UUID]) == 0 && d.State == hypervisor.StateRunning:
			found = append(found, Drift{Kind: DriftDomainWithoutClaim, Instance: d.UUID, CPUs: cpus.String(),
				Detail: fmt.Sprintf("domain %s runs pinned to %s with no claim on %s", d.Name, orNone(cpus), snap.Host)})
		case len(byInstance[d.UUID]) > 0:
			if out := cpus.Difference(own).Difference(other); !out.IsEmpty() {
				found = append(found, Drift{Kind: DriftPinsOutsideClaim, Instance: d.UUID, CPUs: out.String(),
					Detail: fmt.Sprintf("domain %s is pinned to pCPUs %s that no claim owns", d.Name, out)})
			}
		}
	}
	for i := range snap.Claims {
		c := &snap.Claims[i]
		if freed[c.ID] || c.State != ledger.StateCommitted || hasDomain[c.InstanceUUID] {
			continue
		}
		found = append(found, Drift{Kind: DriftClaimWithoutDomain, Instance: c.InstanceUUID, ClaimID: c.ID,
			CPUs: claimCPUs(c).String(), Detail: fmt.Sprintf("committed claim %s has no domain on %s", c.ID, snap.Host)})
	}
	found = append(found, au.inUse...)
	for i := range found {
		f := &found[i]
		au.res.Tally.Drift.Add(f.Kind, 1)
		if f.Instance == "" {
			continue
		}
		// A step in progress explains most drift; say so, from the same
		// strongly consistent source the decisions use.
		st, err := au.a.Owners.OwnerStatus(ctx, InstanceWorkflowID(f.Instance))
		if err != nil {
			au.fail("drift of %s: instance workflow: %v", f.Instance, err)
			continue
		}
		f.InFlight = st.State == OwnerRunning
	}
	au.res.Drift = found
}

func orNone(s numa.CPUSet) string {
	if s.IsEmpty() {
		return "no pinnable pCPU"
	}
	return "pCPUs " + s.String()
}

// Metric instruments on the global meter provider: a no-op until the
// process installs one, and bound to it when it does.
var (
	metricsOnce sync.Once
	metKept     metric.Int64Counter
	metFreed    metric.Int64Counter
	metDrift    metric.Int64Counter
	metDuration metric.Float64Histogram
)

func instruments() {
	m := otel.Meter("github.com/pinflow/pinflow/activities")
	// Instrument creation fails only on invalid names, which these are not;
	// the returned instruments are then no-ops, never nil.
	metKept, _ = m.Int64Counter("pinflow.reconcile.claims.kept", metric.WithDescription("Claims the audit kept, by reason."))
	metFreed, _ = m.Int64Counter("pinflow.reconcile.claims.freed", metric.WithDescription("Claims the audit freed, by reason."))
	metDrift, _ = m.Int64Counter("pinflow.reconcile.drift", metric.WithDescription("Differences found between the ledger and the hypervisor, by kind."))
	metDuration, _ = m.Float64Histogram("pinflow.reconcile.host.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of one host's audit."))
}

// record adds a host audit's counts to the metrics.
func record(ctx context.Context, h *HostAudit) {
	metricsOnce.Do(instruments)
	// No host attribute: a cloud's hosts would multiply every series.
	dry := attribute.Bool("dry_run", h.DryRun)
	for _, c := range h.Tally.Kept {
		metKept.Add(ctx, int64(c.Count), metric.WithAttributes(attribute.String("reason", c.Reason)))
	}
	for _, c := range h.Tally.Freed {
		metFreed.Add(ctx, int64(c.Count), metric.WithAttributes(dry, attribute.String("reason", c.Reason)))
	}
	for _, c := range h.Tally.Drift {
		metDrift.Add(ctx, int64(c.Count), metric.WithAttributes(attribute.String("kind", c.Reason)))
	}
	metDuration.Record(ctx, h.Duration.Seconds())
}
