package audit

import (
	"sort"
	"time"

	"github.com/pinflow/pinflow/ledger"
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
	// FreedOwnerNotFound: a pending claim, older than the namespace's
	// retention, whose owning workflow the server no longer knows (closed
	// beyond retention).
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
	// KeptQuarantined: a quarantine (pCPUs a running domain used that no
	// record explained); only an operator releases it.
	KeptQuarantined = "quarantined"
	// KeptTombstone: an evacuated guest's claim on its fenced host; it
	// goes when the host comes back and the leftover there is destroyed
	// (host up), never before.
	KeptTombstone = "tombstone"
	// KeptSourceHold: a resize's source hold, while the resize is open.
	KeptSourceHold = "source-hold"
	// KeptOwnerUnseen: Temporal knows no run of the claim's owner (or of
	// its instance's workflow), but the claim is younger than the
	// namespace's retention, so the workflow cannot have been forgotten:
	// it runs where this worker cannot see it.
	KeptOwnerUnseen = "owner-unseen"
	// KeptOtherNamespace: the claim's owner runs in another Temporal
	// namespace, whose workflows this worker cannot see or start.
	KeptOtherNamespace = "other-namespace"
)

// Kinds of drift between the ledger and a hypervisor.
const (
	// DriftPinnedToOther: a domain is pinned, one to one, to pCPUs the
	// ledger gives to another instance's claim.
	DriftPinnedToOther = "pinned-to-other"
	// DriftPinsOutsideClaim: a domain with a claim on the host is pinned,
	// one to one, to pinnable pCPUs no claim owns. A cpuset a guest floats
	// over is not such a pin (see DriftFloatsOnPinned).
	DriftPinsOutsideClaim = "pins-outside-claim"
	// DriftFloatsOnPinned: a running or paused domain may run (it has no
	// cpuset, or one over pinnable pCPUs) on pCPUs another guest's claim
	// dedicates, breaking pinflow's promise to that guest. Only reported:
	// the pCPUs are rightly owned, so nothing is freed or quarantined; the
	// floating guest is to be moved or resized.
	DriftFloatsOnPinned = "floats-on-pinned"
	// DriftDomainWithoutClaim: a running domain has no claim on its host.
	DriftDomainWithoutClaim = "domain-without-claim"
	// DriftClaimWithoutDomain: a committed claim has no domain on its host.
	DriftClaimWithoutDomain = "claim-without-domain"
	// DriftUnreadableDomain: a domain's XML could not be read for its pins.
	DriftUnreadableDomain = "unreadable-domain"
	// DriftClaimInUse: a claim no operation will finish is used by a
	// domain of its instance; the audit keeps it (KeptInUse, KeptSettling).
	DriftClaimInUse = "claim-in-use"
	// DriftLeftoverDomain: a shut-off domain has no claim on its host; the
	// audit cleans one no operation of its instance will (pass.leftover).
	DriftLeftoverDomain = "leftover-domain"
	// DriftGroupRule: the domains up on a host break the hard rule of
	// their server group (an operator started or moved one through the
	// hypervisor, say). Only reported: the audit frees nothing for a
	// group.
	DriftGroupRule = "group-rule"
	// DriftDevicesUnplugged: a running domain passes through fewer PCI
	// devices than its committed claim on the host holds: a live
	// migration unplugged them and has not plugged them in yet, or one
	// that was terminated left them out. Only reported: the claim keeps
	// the devices, so no other guest takes them.
	DriftDevicesUnplugged = "devices-unplugged"
	// DriftPowerState: a guest's domain on its host is shut off while its
	// record says active, or runs while it says stopped, with no
	// operation of the guest open (a crashed host came back, an operator
	// used the hypervisor). As Nova's power-state sync does, the audit
	// records the state it sees; it never starts or stops a guest.
	DriftPowerState = "power-state"
)

// AuditHostInput asks for an audit of one host.
type AuditHostInput struct {
	Host string `json:"host"`
	// Grace is how old a claim must be to be judged; nil takes the
	// worker's configured grace (Auditor.Grace). Zero judges all.
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
	// Evacuations counts the evacuations started from hosts fenced down
	// with automatic evacuation on.
	Evacuations int `json:"evacuations,omitempty"`
}

// Add adds o's counts to t.
func (t *Tally) Add(o Tally) {
	t.Claims += o.Claims
	t.Errors += o.Errors
	t.Evacuations += o.Evacuations
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
	// Devices are the PCI devices concerned, by address.
	Devices []string `json:"devices,omitempty"`
	Detail  string   `json:"detail"`
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
	// Evacuated are the guests whose evacuation the audit started, from a
	// host fenced down with automatic evacuation on.
	Evacuated []string `json:"evacuated,omitempty"`
	// Duration is how long the audit of the host took.
	Duration time.Duration `json:"duration"`
}
