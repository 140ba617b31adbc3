package audit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

func claimCPUs(c *ledger.Claim) numa.CPUSet { return usageCPUs(c.Usage) }

// usageCPUs is every pCPU usage pins.
func usageCPUs(usage []numa.CellUsage) numa.CPUSet {
	var s numa.CPUSet
	for _, u := range usage {
		s = s.Union(u.PinnedCPUs)
	}
	return s
}

// commonDevices are the addresses of used that held also names, sorted.
func commonDevices(used, held []string) []string {
	var out []string
	for _, a := range used {
		if slices.Contains(held, a) {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

// holdings names pCPUs and devices for a drift's detail: "pCPUs 4-5 and
// PCI devices 0000:81:10.1".
func holdings(cpus numa.CPUSet, devs []string) string {
	var parts []string
	if !cpus.IsEmpty() {
		parts = append(parts, "pCPUs "+cpus.String())
	}
	if len(devs) > 0 {
		parts = append(parts, "PCI devices "+strings.Join(devs, ","))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, " and ")
}

// drift compares the host's domains and their pins with the snapshot's
// claims (less those just freed).
func (au *pass) drift(ctx context.Context, snap *ledger.Snapshot, doms []hypervisor.Domain, j judged) {
	freed := j.freed
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
	devOwners := map[string]*ledger.Claim{}
	for _, p := range snap.Devices {
		if c := claims[p.ClaimID]; c != nil {
			devOwners[p.Address] = c
		}
	}
	var found []Drift
	hasDomain := map[string]bool{}
	all := hostCPUs(snap.Topology)
	// reach is where each readable domain's threads may run;
	// pinnedToOther, the pCPUs of other claims it is reported pinned to.
	reach, pinnedToOther := map[string]numa.CPUSet{}, map[string]numa.CPUSet{}
	for _, d := range doms {
		hasDomain[d.UUID] = true
		// A resident guest whose hypervisor returns the very document
		// pinflow defined carries its claim's pins and nothing else: no
		// drift of its pins or devices is possible, so its XML need not
		// be parsed again. Where its threads may run is still checked,
		// from the memo of such documents.
		if digest, ok := j.resident[d.UUID]; ok && digest != "" && digest == ledger.DomainDigest(d.XML) {
			if r, err := residentReach.of(digest, d.XML, all); err == nil {
				reach[d.UUID] = r
				continue
			}
		}
		pins, err := xmlpatch.Read(d.XML)
		if err != nil {
			found = append(found, Drift{Kind: DriftUnreadableDomain, Instance: d.UUID, Detail: err.Error()})
			continue
		}
		reach[d.UUID] = pins.Reach(all)
		// What it holds one to one: a pin to several CPUs, or <vcpu
		// cpuset>, is where a floating guest may run, never pCPUs it
		// holds, and floatsOnPinned judges it.
		cpus := pins.PinnedCPUs().Intersection(pinnable)
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
		// The devices it passes through: another instance's, or no one's.
		devs := listedDevices(snap.Topology, pins.DeviceAddresses(snap.Topology))
		var otherDevs, strayDevs []string
		for _, a := range devs {
			switch c := devOwners[a]; {
			case c == nil:
				strayDevs = append(strayDevs, a)
			case c.InstanceUUID != d.UUID:
				otherDevs = append(otherDevs, a)
				otherClaims[c.ID] = true
			}
		}
		if !other.IsEmpty() || len(otherDevs) > 0 {
			ids := make([]string, 0, len(otherClaims))
			for id := range otherClaims {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			found = append(found, Drift{Kind: DriftPinnedToOther, Instance: d.UUID, CPUs: other.String(), Devices: otherDevs,
				Detail: fmt.Sprintf("domain %s (%s) uses %s of claim %v", d.Name, d.State, holdings(other, otherDevs), ids)})
			pinnedToOther[d.UUID] = other
		}
		switch {
		case len(byInstance[d.UUID]) == 0 && d.State == hypervisor.StateRunning:
			f := Drift{Kind: DriftDomainWithoutClaim, Instance: d.UUID, CPUs: cpus.String(), Devices: devs,
				Detail: fmt.Sprintf("domain %s runs pinned to %s with no claim on %s", d.Name, orNone(cpus), snap.Host)}
			if len(devs) > 0 {
				f.Detail += fmt.Sprintf(", passing through PCI devices %s", strings.Join(devs, ","))
			}
			au.quarantineVanished(ctx, snap, d, holding{cpus: cpus.Difference(other), devs: strayDevs}, &f)
			found = append(found, f)
		case len(byInstance[d.UUID]) == 0 && d.State == hypervisor.StatePaused && !au.res.DryRun:
			// The incoming side of a migration whose claim vanished: its
			// open operation gets the claim back, and goes on.
			if rc, ok, err := au.a.restoreHeld(ctx, snap.Host, false, snap.Topology, d.UUID, holding{cpus: cpus.Difference(other), devs: strayDevs}); err == nil && ok {
				found = append(found, Drift{Kind: DriftDomainWithoutClaim, Instance: d.UUID, CPUs: cpus.String(),
					Detail: fmt.Sprintf("domain %s is paused pinned to %s with no claim on %s; made again as claim %s of its open operation, pending",
						d.Name, orNone(cpus), snap.Host, rc.ClaimID)})
			}
		case len(byInstance[d.UUID]) == 0 && d.State == hypervisor.StateShutoff:
			found = append(found, au.leftover(ctx, snap.Host, d))
		case len(byInstance[d.UUID]) > 0:
			if out := cpus.Difference(own).Difference(other); !out.IsEmpty() || len(strayDevs) > 0 {
				f := Drift{Kind: DriftPinsOutsideClaim, Instance: d.UUID, CPUs: out.String(), Devices: strayDevs,
					Detail: fmt.Sprintf("domain %s uses %s that no claim owns", d.Name, holdings(out, strayDevs))}
				au.quarantineVanished(ctx, snap, d, holding{cpus: out, devs: strayDevs}, &f)
				found = append(found, f)
			}
			if d.State == hypervisor.StateRunning {
				for _, f := range unplugged(d, byInstance[d.UUID], devs) {
					if j.residentClaim[d.UUID] == f.ClaimID {
						au.replug(ctx, snap.Host, claims[f.ClaimID], &f)
					}
					found = append(found, f)
				}
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
	found = append(found, floatsOnPinned(doms, all, owners, reach, pinnedToOther)...)
	found = append(found, j.inUse...)
	found = append(found, au.groupDrift(ctx, snap.Host, doms)...)
	found = append(found, au.powerDrift(ctx, snap.Host, doms, j)...)
	for i := range found {
		f := &found[i]
		au.res.Tally.Drift.Add(f.Kind, 1)
		if f.Instance == "" {
			continue
		}
		// A step in progress explains most drift; say so, from the same
		// strongly consistent source the decisions use.
		st, err := au.a.Owners.OwnerStatus(ctx, guest.InstanceWorkflowID(f.Instance))
		if err != nil {
			au.fail("drift of %s: instance workflow: %v", f.Instance, err)
			continue
		}
		f.InFlight = st.State == OwnerRunning
	}
	au.res.Drift = found
}

// floatsOnPinned reports each running or paused domain that may run on
// pCPUs another guest's claim dedicates (owners, by pCPU), as
// hypervisor.Breaches finds it: a guest with no cpuset, which runs
// anywhere on the host (all), or whose cpuset was written before its host
// kept its shared CPUs apart from its pinnable ones. Nothing is freed or
// quarantined: the pCPUs are rightly owned, and the fix is to move or
// resize the floating guest. pCPUs a domain holds one to one are
// pinned-to-other (pinnedToOther), not reported again. reach, where each
// readable domain may run, picks the few domains Breaches reads again; an
// unreadable one is reported as such, not here.
func floatsOnPinned(doms []hypervisor.Domain, all numa.CPUSet, owners map[int]*ledger.Claim, reach, pinnedToOther map[string]numa.CPUSet) []Drift {
	var suspects []hypervisor.Domain
	for _, d := range doms {
		r, ok := reach[d.UUID]
		if !ok || d.State == hypervisor.StateShutoff {
			continue
		}
		for _, cpu := range r.Difference(pinnedToOther[d.UUID]).List() {
			if c := owners[cpu]; c != nil && c.InstanceUUID != d.UUID {
				suspects = append(suspects, d)
				break
			}
		}
	}
	if len(suspects) == 0 {
		return nil
	}
	dedicated := make(map[int]hypervisor.Owner, len(owners))
	for cpu, c := range owners {
		dedicated[cpu] = hypervisor.Owner{Claim: c.ID, Guest: c.InstanceUUID}
	}
	var out []Drift
	for _, b := range hypervisor.Breaches(suspects, all, dedicated) {
		if held := pinnedToOther[b.Domain.UUID]; !held.IsEmpty() {
			b.CPUs = b.CPUs.Difference(held)
			b.Owners = slices.DeleteFunc(b.Owners, func(o hypervisor.Owner) bool {
				for _, cpu := range b.CPUs.List() {
					if dedicated[cpu] == o {
						return false
					}
				}
				return true
			})
		}
		if !b.CPUs.IsEmpty() {
			out = append(out, Drift{Kind: DriftFloatsOnPinned, Instance: b.Domain.UUID, CPUs: b.CPUs.String(), Detail: b.String()})
		}
	}
	return out
}

// hostCPUs is every CPU of the host of topo, shared or pinnable: where a
// domain without a cpuset runs.
func hostCPUs(topo *numa.Host) numa.CPUSet {
	var s numa.CPUSet
	for _, c := range topo.Cells {
		s = s.Union(c.CPUs).Union(c.PCPUs)
	}
	return s
}

// reachMemo remembers where the threads of a domain document may run on a
// host, by the document's ledger.DomainDigest and the host's CPUs: a
// resident guest's document is the same audit after audit, and reading
// each one every minute would cost the audit more than its reads from
// Redis do. Two generations of at most reachMemoSize entries each bound
// its memory; an entry used in either generation stays.
type reachMemo struct {
	mu        sync.Mutex
	cur, prev map[reachKey]numa.CPUSet
}

type reachKey struct{ digest, all string }

// reachMemoSize is the entries of one generation of the memo: some tens
// of bytes each.
const reachMemoSize = 1 << 16

// residentReach is shared by every audit: an entry is a function of its
// key alone.
var residentReach reachMemo

// of returns xmlpatch.Pins.Reach(all) of domainXML, whose digest is
// digest, reading the document only when the memo lacks it.
func (m *reachMemo) of(digest, domainXML string, all numa.CPUSet) (numa.CPUSet, error) {
	k := reachKey{digest: digest, all: all.String()}
	m.mu.Lock()
	r, ok := m.cur[k]
	if !ok {
		if r, ok = m.prev[k]; ok {
			m.put(k, r)
		}
	}
	m.mu.Unlock()
	if ok {
		return r, nil
	}
	pins, err := xmlpatch.Read(domainXML)
	if err != nil {
		return numa.CPUSet{}, err
	}
	r = pins.Reach(all)
	m.mu.Lock()
	m.put(k, r)
	m.mu.Unlock()
	return r, nil
}

// put adds an entry; the caller holds mu.
func (m *reachMemo) put(k reachKey, r numa.CPUSet) {
	if m.cur == nil || len(m.cur) >= reachMemoSize {
		m.prev, m.cur = m.cur, make(map[reachKey]numa.CPUSet)
	}
	m.cur[k] = r
}

// quarantineVanished claims, as a quarantine, the pCPUs a running domain
// uses that the ledger calls free: its claim vanished (Redis lost it) or
// it was started outside pinflow, and either way the next claim must not
// take them. A domain pinned exactly to a claim its open operation made
// gets that claim back instead (restoreHeld), so the operation goes on.
// The claim is a compare-and-set on free pCPUs, so a claim made since the
// snapshot wins and nothing is quarantined.
func (au *pass) quarantineVanished(ctx context.Context, snap *ledger.Snapshot, d hypervisor.Domain, h holding, f *Drift) {
	if h.isEmpty() || d.State != hypervisor.StateRunning || au.res.DryRun {
		return
	}
	if rc, ok, err := au.a.restoreHeld(ctx, snap.Host, false, snap.Topology, d.UUID, h); err == nil && ok {
		f.Detail += "; made again as claim " + rc.ClaimID + " of its open operation, pending"
		return
	}
	rc, err := au.a.quarantine(ctx, snap.Host, snap.Topology, d.UUID, h, "a running domain uses "+h.String()+" the ledger called free", false)
	if errors.Is(err, errNoLongerUsed) {
		f.Detail += "; gone since, so nothing quarantined"
		return
	}
	if err != nil {
		f.Detail += fmt.Sprintf("; not quarantined: %v", err)
		return
	}
	f.Detail += "; quarantined as claim " + rc.ClaimID
}

func orNone(s numa.CPUSet) string {
	if s.IsEmpty() {
		return "no pinnable pCPU"
	}
	return "pCPUs " + s.String()
}

// groupDrift reports the hard server group rules that the domains up on
// host break: more members of an anti-affinity group than it allows, or
// a member of an affinity group away from the group's host.
func (au *pass) groupDrift(ctx context.Context, host string, doms []hypervisor.Domain) []Drift {
	members := map[string][]string{}
	rules := map[string]*ledger.GroupRule{}
	for _, d := range doms {
		if d.State == hypervisor.StateShutoff {
			continue
		}
		r, err := au.a.Ledger.MemberRule(ctx, d.UUID)
		if err != nil {
			au.fail("group of %s: %v", d.UUID, err)
			continue
		}
		if r == nil || !r.Policy.Hard() {
			continue
		}
		rules[r.Name] = r
		members[r.Name] = append(members[r.Name], d.UUID)
	}
	var found []Drift
	for _, name := range slices.Sorted(maps.Keys(members)) {
		r, ms := rules[name], members[name]
		slices.Sort(ms)
		switch r.Policy {
		case ledger.PolicyAntiAffinity:
			if len(ms) > r.MaxPerHost {
				found = append(found, Drift{Kind: DriftGroupRule, Detail: fmt.Sprintf("host %s runs %d members of anti-affinity group %s (%s); the group allows %d",
					host, len(ms), name, strings.Join(ms, ", "), r.MaxPerHost)})
			}
		case ledger.PolicyAffinity:
			g, err := au.a.Ledger.Group(ctx, name)
			if err != nil {
				au.fail("group %s: %v", name, err)
				continue
			}
			if g.Host != "" && g.Host != host {
				found = append(found, Drift{Kind: DriftGroupRule, Detail: fmt.Sprintf("host %s runs members %s of affinity group %s, whose members are on host %s",
					host, strings.Join(ms, ", "), name, g.Host)})
			}
		}
	}
	return found
}

// unplugged reports the devices each committed claim of a running domain
// holds that the domain does not pass through (used).
func unplugged(d hypervisor.Domain, claims []*ledger.Claim, used []string) []Drift {
	var out []Drift
	for _, c := range claims {
		if c.State != ledger.StateCommitted {
			continue
		}
		var missing []string
		for _, a := range c.Devices {
			if !slices.Contains(used, a) {
				missing = append(missing, a)
			}
		}
		if len(missing) > 0 {
			out = append(out, Drift{Kind: DriftDevicesUnplugged, Instance: d.UUID, ClaimID: c.ID, Devices: missing,
				Detail: fmt.Sprintf("domain %s runs without PCI devices %s that its claim %s holds", d.Name, strings.Join(missing, ","), c.ID)})
		}
	}
	return out
}

// replug starts Replug for a guest whose resident claim c holds devices
// its running domain does not pass through. It runs under the instance's
// workflow id, so it does not start while an operation of the guest is
// open: a live migration between its unplug and its plug.
func (au *pass) replug(ctx context.Context, host string, c *ledger.Claim, f *Drift) {
	if c == nil || !au.maySettle(c) {
		return
	}
	if err := au.a.Settler.StartReplug(ctx, SettleInput{UUID: c.InstanceUUID, Host: host, ClaimID: c.ID}); err == nil {
		f.Detail += "; plugging them in again"
	}
}
