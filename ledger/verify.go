package ledger

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/numa"
)

// Verify checks the snapshot's invariants and returns every violation
// found: no pCPU or PCI device in two claims; the pins are exactly the
// claims' pCPUs and devices, each owned by its claim; a claim's devices
// are the host's and what its placement holds on them; every claim's pCPUs are pinnable CPUs of the
// cell it names; the usage counters are the sums of the claims' usage,
// the host-level ones too, and these stay within the host's limits (a
// host whose ratios were lowered below what its claims take is reported
// until enough is released); every claim has an undo entry, and each undo
// entry belongs to a claim and says what the claim took; every claim has
// a known state, and tombstones lie only on a host that is down or
// returning (a host goes up only once it has none); the server group
// counters are what the claims of members make them.
// The scripts keep these true; Verify is how the audit and the tests see
// that they did. A host whose topology is gone has no snapshot at all:
// LostHosts finds those.
func (s *Snapshot) Verify() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("ledger: host %s: "+format, append([]any{s.Host}, args...)...))
	}
	owner := map[int]string{}
	want := map[int]*CellLoad{}
	load := func(cell int) *CellLoad {
		if want[cell] == nil {
			want[cell] = &CellLoad{Cell: cell, Pages: map[int64]int64{}}
		}
		return want[cell]
	}
	devOwner := map[string]string{}
	var host numa.HostUsage
	for _, c := range s.Claims {
		for _, a := range c.Devices {
			if prev, ok := devOwner[a]; ok {
				bad("PCI device %s is in claims %s and %s", a, prev, c.ID)
			}
			devOwner[a] = c.ID
		}
		if c.Placement != nil && (len(c.Placement.Devices) > 0 || len(c.Devices) > 0) {
			if want, err := s.Topology.PlacementDevices(c.Placement); err != nil {
				bad("claim %s: %v", c.ID, err)
			} else if !slices.Equal(want, c.Devices) {
				bad("claim %s holds PCI devices [%s], its placement [%s]", c.ID, strings.Join(c.Devices, " "), strings.Join(want, " "))
			}
		}
		host.MemoryMB += c.HostUsage.MemoryMB
		host.VCPUs += c.HostUsage.VCPUs
		if !slices.Contains(claimStates, c.State) {
			bad("claim %s has state %q, not one of %v", c.ID, c.State, claimStates)
		}
		if c.State == StateTombstone && s.Status.State != HostDown && s.Status.State != HostReturning {
			bad("claim %s is a tombstone on a host that is %q, not down or returning", c.ID, s.Status.State)
		}
		for _, u := range c.Usage {
			cell := s.Topology.Cell(u.Cell)
			switch {
			case cell == nil:
				bad("claim %s uses cell %d, which the host does not have", c.ID, u.Cell)
			case !u.PinnedCPUs.IsSubsetOf(cell.PCPUs):
				bad("claim %s pins %s, outside cell %d's pcpuset %s", c.ID, u.PinnedCPUs.Difference(cell.PCPUs), u.Cell, cell.PCPUs)
			}
			for _, cpu := range u.PinnedCPUs.List() {
				if prev, ok := owner[cpu]; ok {
					bad("pCPU %d is in claims %s and %s", cpu, prev, c.ID)
				}
				owner[cpu] = c.ID
			}
			w := load(u.Cell)
			w.MemoryMB += u.MemoryMB
			w.SharedCPUs += int64(u.SharedCPUs)
			if u.PageSizeKB != 0 && u.Pages != 0 {
				w.Pages[u.PageSizeKB] += u.Pages
			}
		}
	}
	pinned := map[int]bool{}
	for _, p := range s.Pins {
		pinned[p.CPU] = true
		if o, ok := owner[p.CPU]; !ok {
			bad("pCPU %d is pinned to %s, which is not a live claim using it", p.CPU, p.ClaimID)
		} else if o != p.ClaimID {
			bad("pCPU %d is pinned to %s but claim %s uses it", p.CPU, p.ClaimID, o)
		}
	}
	for cpu, id := range owner {
		if !pinned[cpu] {
			bad("claim %s uses pCPU %d, which is not pinned", id, cpu)
		}
	}
	// The promise: no guest's floating threads may run on a pCPU another
	// guest's claim dedicates.
	var all numa.CPUSet
	for _, c := range s.Topology.Cells {
		all = all.Union(c.CPUs).Union(c.PCPUs)
	}
	guestOf := make(map[string]string, len(s.Claims))
	for _, c := range s.Claims {
		guestOf[c.ID] = c.InstanceUUID
	}
	for _, c := range s.Claims {
		if c.Placement == nil {
			continue
		}
		over := map[string]numa.CPUSet{}
		for _, cpu := range c.Placement.Floats(all).List() {
			if o, ok := owner[cpu]; ok && guestOf[o] != c.InstanceUUID {
				over[o] = over[o].Union(numa.NewCPUSet(cpu))
			}
		}
		for _, o := range slices.Sorted(maps.Keys(over)) {
			bad("claim %s of %s floats over pCPUs %s that claim %s dedicates to %s", c.ID, c.InstanceUUID, over[o], o, guestOf[o])
		}
	}
	held := map[string]bool{}
	for _, d := range s.Devices {
		held[d.Address] = true
		if o, ok := devOwner[d.Address]; !ok {
			bad("PCI device %s is held by %s, which is not a live claim holding it", d.Address, d.ClaimID)
		} else if o != d.ClaimID {
			bad("PCI device %s is held by %s but claim %s holds it", d.Address, d.ClaimID, o)
		}
	}
	for a, id := range devOwner {
		if !held[a] {
			bad("claim %s holds PCI device %s, which is not pinned", id, a)
		}
	}
	got := map[int]CellLoad{}
	for _, l := range s.Usage {
		got[l.Cell] = l
	}
	for cell, w := range want {
		g := got[cell]
		if g.MemoryMB != w.MemoryMB || g.SharedCPUs != w.SharedCPUs {
			bad("cell %d usage says %d MiB and %d shared vCPUs, its claims %d MiB and %d", cell, g.MemoryMB, g.SharedCPUs, w.MemoryMB, w.SharedCPUs)
		}
		for size, n := range w.Pages {
			if g.Pages[size] != n {
				bad("cell %d usage says %d pages of %d KiB, its claims %d", cell, g.Pages[size], size, n)
			}
		}
		for size, n := range g.Pages {
			if _, ok := w.Pages[size]; !ok && n != 0 {
				bad("cell %d usage says %d pages of %d KiB, its claims none", cell, n, size)
			}
		}
	}
	for cell, g := range got {
		if _, ok := want[cell]; !ok && (g.MemoryMB != 0 || g.SharedCPUs != 0 || len(g.Pages) != 0) {
			bad("cell %d usage is %+v without any claim", cell, g)
		}
	}
	if s.HostUsage != host {
		bad("host usage says %d MiB and %d shared vCPUs, its claims %d MiB and %d", s.HostUsage.MemoryMB, s.HostUsage.VCPUs, host.MemoryMB, host.VCPUs)
	}
	if mem, vcpus := s.Topology.HostLimits(); s.HostUsage.MemoryMB > mem || int64(s.HostUsage.VCPUs) > vcpus {
		bad("host usage %d MiB and %d shared vCPUs is above the limits %d MiB and %d", s.HostUsage.MemoryMB, s.HostUsage.VCPUs, mem, vcpus)
	}
	if want := groupCounters(s.Claims); !maps.Equal(want, s.Groups) && (len(want) > 0 || len(s.Groups) > 0) {
		bad("server group counters say %v, its claims %v", s.Groups, want)
	}
	byID := make(map[string]*Claim, len(s.Claims))
	for i := range s.Claims {
		byID[s.Claims[i].ID] = &s.Claims[i]
	}
	for _, c := range s.Claims {
		if _, ok := s.Undo[c.ID]; !ok {
			bad("claim %s has no undo entry: its release would not know what it took", c.ID)
		}
	}
	for id, entry := range s.Undo {
		c := byID[id]
		if c == nil {
			bad("undo entry %q of %s has no claim record", entry, id)
			continue
		}
		if err := checkUndo(c, entry); err != nil {
			bad("claim %s: %v", id, err)
		}
	}
	return errors.Join(errs...)
}

// groupCounters are the server group counters claims make: per group,
// the members with a claim; per "group|uuid", that member's claims.
func groupCounters(claims []Claim) map[string]int64 {
	out := map[string]int64{}
	for _, c := range claims {
		if c.Group == "" {
			continue
		}
		member := c.Group + "|" + c.InstanceUUID
		if out[member] == 0 {
			out[c.Group]++
		}
		out[member]++
	}
	return out
}

// checkUndo compares an undo entry (undoEntry) with what its claim says
// it took: a release frees what the entry says.
func checkUndo(c *Claim, entry string) error {
	u, err := parseUndo(entry)
	switch {
	case err != nil:
		return err
	case c.Group == "" && u.group != "":
		return fmt.Errorf("undo entry %q counts a member of group %s, the record names no group", entry, u.group)
	case c.Group != "" && u.group == "":
		return fmt.Errorf("undo entry %q is not token|pins|counters|group|uuid", entry)
	case c.Group != "" && (u.group != c.Group || u.uuid != c.InstanceUUID):
		return fmt.Errorf("undo entry counts member %s of group %s, the record %s of %s", u.uuid, u.group, c.InstanceUUID, c.Group)
	}
	if u.token != c.Token {
		return fmt.Errorf("undo entry has token %q, the record %q", u.token, c.Token)
	}
	var cpus numa.CPUSet
	want := map[string]int64{}
	for _, u := range c.Usage {
		cpus = cpus.Union(u.PinnedCPUs)
		if u.MemoryMB != 0 {
			want[usageField(u.Cell, "mem")] += u.MemoryMB
		}
		if u.SharedCPUs != 0 {
			want[usageField(u.Cell, "shared")] += int64(u.SharedCPUs)
		}
		if u.Pages != 0 && u.PageSizeKB != 0 {
			want[pagesField(u.Cell, u.PageSizeKB)] += u.Pages
		}
	}
	if c.HostUsage.MemoryMB != 0 {
		want[hostMemField] = c.HostUsage.MemoryMB
	}
	if c.HostUsage.VCPUs != 0 {
		want[hostVCPUsField] = int64(c.HostUsage.VCPUs)
	}
	pins := u.pins
	if got := numa.NewCPUSet(pins.cpus...); !got.Equal(cpus) {
		return fmt.Errorf("undo entry frees pCPUs %s, the record pins %s", got, cpus)
	}
	if got := slices.Sorted(slices.Values(pins.devs)); !slices.Equal(got, c.Devices) {
		return fmt.Errorf("undo entry frees PCI devices [%s], the record holds [%s]", strings.Join(got, " "), strings.Join(c.Devices, " "))
	}
	got := map[string]int64{}
	for _, n := range u.counters {
		got[n.field] = n.val
	}
	if !maps.Equal(got, want) {
		return fmt.Errorf("undo entry gives back %v, the record took %v", got, want)
	}
	return nil
}

// LostHost is a host that the ledger names but whose topology key is
// gone: evicted, lost in a failover, or deleted by hand. Snapshot and
// Claim then take it for a host never registered, while its claims,
// pins or guests may still be there.
type LostHost struct {
	Host string `json:"host"`
	// Registered: the registry of host names lists it.
	Registered bool `json:"registered"`
	// Keys are the kinds of the host's own keys left (pins, claims, ...).
	Keys []string `json:"keys,omitempty"`
	// Instances are the instance records that place a guest on it.
	Instances []string `json:"instances,omitempty"`
}

func (h LostHost) String() string {
	var by []string
	if h.Registered {
		by = append(by, "the host registry")
	}
	if len(h.Keys) > 0 {
		by = append(by, "its "+strings.Join(h.Keys, ", ")+" keys")
	}
	if n := len(h.Instances); n > 0 {
		shown := h.Instances[:min(n, 3)]
		more := ""
		if n > len(shown) {
			more = fmt.Sprintf(" and %d more", n-len(shown))
		}
		by = append(by, fmt.Sprintf("the records of instances %s%s", strings.Join(shown, ", "), more))
	}
	return fmt.Sprintf("host %s has no topology key (evicted, lost in a failover or deleted), yet %s name it", h.Host, strings.Join(by, "; "))
}

// LostHosts returns, by name, every host the ledger names (the registry,
// a host key of its own, an instance record's host) that has no topology.
// Snapshot refuses such a host as unknown, so a check of the registered
// hosts' snapshots alone would pass it, and its claims, by. Like
// Instances it walks every key of the database: for an operator's check.
func (l *Ledger) LostHosts(ctx context.Context) ([]LostHost, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: lost hosts: %w", err) }
	named := map[string]*LostHost{}
	host := func(h string) *LostHost {
		if named[h] == nil {
			named[h] = &LostHost{Host: h}
		}
		return named[h]
	}
	registered, err := l.Hosts(ctx)
	if err != nil {
		return nil, wrap(err)
	}
	for _, h := range registered {
		host(h).Registered = true
	}
	start := l.prefix + ":host:{"
	err = l.scanKeys(ctx, start+"*", func(key string) {
		h, kind, ok := strings.Cut(strings.TrimPrefix(key, start), "}:")
		if !ok || !validKeyName(h) {
			return
		}
		if k := l.hostKeys(h); key != k.topo && slices.Contains(k.all(), key) {
			lh := host(h)
			if !slices.Contains(lh.Keys, kind) {
				lh.Keys = append(lh.Keys, kind)
			}
		}
	})
	if err != nil {
		return nil, wrap(err)
	}
	insts, err := l.Instances(ctx)
	if err != nil {
		return nil, wrap(err)
	}
	for _, in := range insts {
		if in.Host != "" && validKeyName(in.Host) {
			lh := host(in.Host)
			lh.Instances = append(lh.Instances, in.UUID)
		}
	}
	names := slices.Sorted(maps.Keys(named))
	var lost []LostHost
	for len(names) > 0 {
		batch := names[:min(len(names), listBatch)]
		names = names[len(batch):]
		has := make([]*redis.BoolCmd, len(batch))
		if _, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, h := range batch {
				has[i] = p.HExists(ctx, l.hostKeys(h).topo, "topology")
			}
			return nil
		}); err != nil {
			return nil, wrap(err)
		}
		for i, h := range batch {
			if !has[i].Val() {
				lh := named[h]
				slices.Sort(lh.Keys)
				lost = append(lost, *lh)
			}
		}
	}
	return lost, nil
}
