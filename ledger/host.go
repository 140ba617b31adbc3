package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/numa"
)

// RegisterHost records a host's NUMA topology (its usage fields are
// ignored: the ledger's claims are the usage) with its shared CPUs apart
// from its pinnable ones (numa.Host.SeparatePools: a host given neither
// set keeps every CPU for pinning, and one given overlapping sets is
// ErrInvalid), and returns the host's
// generation, which grows by one each time the topology changes.
// Registering the same topology again changes nothing. A changed topology
// is refused with ErrConflict while a claim uses a cell or pCPU it drops,
// or memory or pages it no longer has. Lower allocation ratios are
// accepted whatever the cells give out, as in Nova: they only refuse new
// claims until enough is released.
func (l *Ledger) RegisterHost(ctx context.Context, name string, topo *numa.Host) (int64, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: register host %s: %w", name, err) }
	if err := checkHostName(name); err != nil {
		return 0, fmt.Errorf("ledger: register: %w", err)
	}
	if topo == nil {
		return 0, wrap(fmt.Errorf("%w: no topology given", ErrInvalid))
	}
	stored := topo.WithoutUsage()
	if err := stored.SeparatePools(); err != nil {
		return 0, wrap(fmt.Errorf("%w: %v", ErrInvalid, err))
	}
	if err := stored.Validate(); err != nil {
		return 0, wrap(fmt.Errorf("%w: %v", ErrInvalid, err))
	}
	if len(stored.Devices) > 0 {
		// A pool says how many devices, not which: nothing could be held.
		return 0, wrap(fmt.Errorf("%w: pci_pools: the ledger takes a host's PCI devices one by one, as pci_devices with their addresses", ErrInvalid))
	}
	data, err := json.Marshal(stored)
	if err != nil {
		return 0, wrap(fmt.Errorf("%w: encode topology: %v", ErrInvalid, err))
	}
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:16])
	k := l.hostKeys(name)

	for range l.maxAttempts {
		var cur *redis.SliceCmd
		var claims *redis.StringSliceCmd
		if _, err := l.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			cur = p.HMGet(ctx, k.topo, "gen", "rev", "digest")
			claims = p.HVals(ctx, k.claims)
			return nil
		}); err != nil {
			return 0, wrap(err)
		}
		vals := cur.Val()
		gen, _ := vals[0].(string)
		rev, _ := vals[1].(string)
		if rev == "" {
			rev = "0"
		}
		if gen == "" {
			gen = "0"
		} else if d, _ := vals[2].(string); d != digest {
			if err := holdsClaims(stored, claims.Val()); err != nil {
				return 0, wrap(err)
			}
		}
		// The same topology goes through the script too, which then only
		// writes the digest again: so that the wait for durability after
		// it covers the registration that wrote the topology.
		res, err := l.change(ctx, registerScript, []string{k.topo}, data, digest, gen, rev).StringSlice()
		if err != nil {
			return 0, wrap(err)
		}
		switch res[0] {
		case "ok":
			// Fit on the new topology from now on; other processes learn of
			// it from their next claim, which the generation check refuses.
			l.dropCache(name, nil)
			return l.listHost(ctx, name, res[1])
		case "same":
			return l.listHost(ctx, name, res[1])
		}
		// "changed": a claim, release or registration landed since the read.
	}
	return 0, wrap(fmt.Errorf("%w: the host's claims kept changing during %d tries", ErrConflict, l.maxAttempts))
}

// listHost adds the host to the host set (its own slot, hence its own
// script; a crash before it is repaired by registering again) and returns
// the generation.
func (l *Ledger) listHost(ctx context.Context, name, gen string) (int64, error) {
	if err := l.change(ctx, listHostScript, []string{l.hostsKey()}, name).Err(); err != nil {
		return 0, fmt.Errorf("ledger: register host %s: add to host list: %w", name, err)
	}
	// Also when nothing changed: a registration that crashed before its
	// hint is finished by registering again.
	l.hints.now(ctx, name)
	return strconv.ParseInt(gen, 10, 64)
}

// holdsClaims checks that a new topology still holds every claim recorded
// on the host, by claiming them all again on it.
func holdsClaims(topo *numa.Host, records []string) error {
	claims, err := decodeClaims(records)
	if err != nil {
		return err
	}
	h := topo.Clone()
	for _, c := range claims {
		// Host-level usage is left out as the ratios are: a topology with
		// less room only refuses new claims until enough is released.
		if err := h.Add(c.Usage); err != nil {
			return fmt.Errorf("%w: claim %s of instance %s would not fit the new topology: %v", ErrConflict, c.ID, c.InstanceUUID, err)
		}
		// Its devices must be there, and hold what they held: a VF added
		// under a PF passed through would be free to take.
		if c.Placement == nil || len(c.Placement.Devices) == 0 {
			continue
		}
		devs, err := topo.PlacementDevices(c.Placement)
		if err != nil {
			return fmt.Errorf("%w: claim %s of instance %s would not fit the new topology: %v", ErrConflict, c.ID, c.InstanceUUID, err)
		}
		if !slices.Equal(devs, c.Devices) {
			return fmt.Errorf("%w: claim %s of instance %s holds PCI devices %s, which the new topology would make %s",
				ErrConflict, c.ID, c.InstanceUUID, strings.Join(c.Devices, " "), strings.Join(devs, " "))
		}
	}
	return nil
}

// hostState is a host as read for fitting.
type hostState struct {
	gen      int64
	host     *numa.Host // the topology with the usage applied; a copy
	existing string     // the asked-for claim's record, if it exists
	cache    *hostCache // the host's cache, brought up to this state
}

// readState reads a host's topology (from the cache when unchanged), pins
// and usage in one atomic script, plus the record of claimID if given, and
// brings the host's cache up to what it read.
func (l *Ledger) readState(ctx context.Context, name, claimID string) (*hostState, error) {
	cached := l.cachedHost(name)
	digest := ""
	if cached != nil {
		digest = cached.digest
	}
	k := l.hostKeys(name)
	raw, err := readScript.Run(ctx, l.rdb, k.all(), digest, claimID).Slice()
	if err != nil {
		return nil, err
	}
	res, known, err := decodeRead(raw)
	if err != nil {
		return nil, err
	}
	if !known {
		l.dropCache(name, cached)
		return nil, fmt.Errorf("%w: %q is not registered", ErrUnknownHost, name)
	}
	st := &hostState{}
	if st.gen, err = strconv.ParseInt(res.gen, 10, 64); err != nil {
		return nil, fmt.Errorf("stored generation %q is not a number", res.gen)
	}
	gotDigest := res.digest
	rev, err := strconv.ParseInt(res.rev, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("stored revision %q is not a number", res.rev)
	}
	hc := cached
	if res.hasTopology {
		topo, err := decodeTopology(res.topology)
		if err != nil {
			return nil, err
		}
		hc = newHostCache(st.gen, gotDigest, topo)
	} else if cached == nil || cached.digest != gotDigest {
		return nil, errors.New("read script sent no topology for a changed digest")
	} else if cached.gen != st.gen {
		// The same topology registered again after another one: the
		// generation moved on, and the cache with it.
		hc = newHostCache(st.gen, gotDigest, cached.topo)
	}
	pinned, usage := parsePins(res.pins), parseCounters(res.usage)
	if !hc.observeState(rev, pinned, usage) {
		// Older than what the cache saw: the host's keys were made anew.
		hc = newHostCache(st.gen, gotDigest, hc.topo)
		hc.observeState(rev, pinned, usage)
	}
	if hc != cached {
		l.hosts.Store(name, hc)
	}
	st.host = compose(hc.topo, pinned, usage)
	st.existing = res.existing
	st.cache = hc
	return st, nil
}

// The host-level usage fields: every claim's numa.HostUsage, summed
// (numa.Host.MemoryUsedMB and VCPUUsage).
const (
	hostMemField   = "host:mem"
	hostVCPUsField = "host:vcpus"
)

// usageField names a usage hash field: "<cell>:mem", "<cell>:shared" or
// "<cell>:pages:<size KiB>". Every claim and release names a few, so the
// names of the usual cells and page sizes are made once.
func usageField(cell int, what string) string {
	if cell >= 0 && cell < len(memFields) {
		switch what {
		case "mem":
			return memFields[cell]
		case "shared":
			return sharedFields[cell]
		}
	}
	return strconv.Itoa(cell) + ":" + what
}

func pagesField(cell int, sizeKB int64) string {
	key := [2]int64{int64(cell), sizeKB}
	pageFieldsMu.RLock()
	f, ok := pageFields[key]
	pageFieldsMu.RUnlock()
	if ok {
		return f
	}
	f = strconv.Itoa(cell) + ":pages:" + strconv.FormatInt(sizeKB, 10)
	pageFieldsMu.Lock()
	if len(pageFields) < 4096 {
		pageFields[key] = f
	}
	pageFieldsMu.Unlock()
	return f
}

var (
	memFields, sharedFields [64]string
	pageFieldsMu            sync.RWMutex
	pageFields              = map[[2]int64]string{}
)

func init() {
	for i := range memFields {
		memFields[i] = strconv.Itoa(i) + ":mem"
		sharedFields[i] = strconv.Itoa(i) + ":shared"
	}
}

// decodeTopology reads a stored topology. A host registered before the
// ledger kept shared CPUs apart from pinnable ones gets them apart here,
// so that no guest is ever placed to float over pinned pCPUs.
func decodeTopology(data string) (*numa.Host, error) {
	topo := &numa.Host{}
	if err := json.Unmarshal([]byte(data), topo); err != nil {
		return nil, fmt.Errorf("stored topology: %w", err)
	}
	_ = topo.SeparatePools() // registered before the rule: keep it apart, refuse nothing
	return topo, nil
}

// compose applies the ledger's pins and usage counters to a topology.
func compose(topo *numa.Host, pins pinSet, usage map[string]int64) *numa.Host {
	h := topo.Clone()
	h.MemoryUsedMB, h.VCPUUsage = usage[hostMemField], int(usage[hostVCPUsField])
	h.Devices = pins.freeDevices(topo)
	pinned := numa.NewCPUSet(pins.cpus...)
	for i := range h.Cells {
		c := &h.Cells[i]
		c.PinnedCPUs = pinned.Intersection(c.PCPUs)
		c.MemoryUsedMB = usage[usageField(c.ID, "mem")]
		c.CPUUsage = int(usage[usageField(c.ID, "shared")])
		for j := range c.Pages {
			c.Pages[j].Used = usage[pagesField(c.ID, c.Pages[j].SizeKB)]
		}
	}
	return h
}

// Host returns a host's topology with its current usage, for fitting
// elsewhere (choosing a destination, say). It is a copy.
func (l *Ledger) Host(ctx context.Context, name string) (*numa.Host, error) {
	if err := checkHostName(name); err != nil {
		return nil, fmt.Errorf("ledger: host: %w", err)
	}
	st, err := l.readState(ctx, name, "")
	if err != nil {
		return nil, fmt.Errorf("ledger: host %s: %w", name, err)
	}
	return st.host, nil
}

// Hosts lists the registered hosts' names in order.
func (l *Ledger) Hosts(ctx context.Context) ([]string, error) {
	names, err := l.rdb.SMembers(ctx, l.hostsKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("ledger: list hosts: %w", err)
	}
	sort.Strings(names)
	return names, nil
}

// Pin is one pinned pCPU and its owner.
type Pin struct {
	CPU int `json:"cpu"`
	// Cell is the host cell whose pcpuset holds the CPU, -1 if none does.
	Cell         int        `json:"cell"`
	ClaimID      string     `json:"claim_id"`
	InstanceUUID string     `json:"instance_uuid,omitempty"`
	State        ClaimState `json:"state,omitempty"`
}

// DevicePin is one held PCI device and its owner.
type DevicePin struct {
	Address      string     `json:"address"`
	ClaimID      string     `json:"claim_id"`
	InstanceUUID string     `json:"instance_uuid,omitempty"`
	State        ClaimState `json:"state,omitempty"`
}

// CellLoad is what the ledger's counters say one host cell has given out.
type CellLoad struct {
	Cell       int   `json:"cell"`
	MemoryMB   int64 `json:"memory_mb"`
	SharedCPUs int64 `json:"shared_cpus"`
	// Pages maps a page size in KiB to the pages of it in use.
	Pages map[int64]int64 `json:"pages,omitempty"`
}

// Snapshot is one host's ledger at one instant.
type Snapshot struct {
	Host       string `json:"host"`
	Generation int64  `json:"generation"`
	// Status is what operators said of the host.
	Status HostStatus `json:"status"`
	// Topology carries the usage: pinned CPUs, memory, shared vCPUs, pages.
	Topology *numa.Host `json:"topology"`
	// Pins are ordered by CPU.
	Pins []Pin `json:"pins"`
	// Devices are the held PCI devices, ordered by address.
	Devices []DevicePin `json:"devices,omitempty"`
	// Usage holds the cells with any counter above zero, by cell.
	Usage []CellLoad `json:"usage"`
	// HostUsage is what the host-level counters say all claims took.
	HostUsage numa.HostUsage `json:"host_usage"`
	// Claims are ordered by id.
	Claims []Claim `json:"claims"`
	// Undo holds each claim's undo entry, what its release gives back,
	// for Verify.
	Undo map[string]string `json:"-"`
	// Groups are the host's server group counters: per group, the
	// members with a claim here, and per "group|uuid" that member's
	// claims here.
	Groups map[string]int64 `json:"groups,omitempty"`
}

// Snapshot reads a host's topology, status, pins, usage and claims in one
// atomic step.
func (l *Ledger) Snapshot(ctx context.Context, name string) (*Snapshot, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: snapshot %s: %w", name, err) }
	if err := checkHostName(name); err != nil {
		return nil, fmt.Errorf("ledger: snapshot: %w", err)
	}
	k := l.hostKeys(name)
	var topo, pins, usage, claims, undo, groups *redis.MapStringStringCmd
	var status *redis.SliceCmd
	if _, err := l.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		topo = p.HGetAll(ctx, k.topo)
		status = p.HMGet(ctx, k.state, statusFields...)
		pins = p.HGetAll(ctx, k.pins)
		usage = p.HGetAll(ctx, k.usage)
		claims = p.HGetAll(ctx, k.claims)
		undo = p.HGetAll(ctx, k.undo)
		groups = p.HGetAll(ctx, k.groups)
		return nil
	}); err != nil {
		return nil, wrap(err)
	}
	t := topo.Val()
	if t["topology"] == "" {
		return nil, wrap(fmt.Errorf("%w: %q is not registered", ErrUnknownHost, name))
	}
	s := &Snapshot{Host: name, Undo: undo.Val()}
	for f, v := range groups.Val() {
		if s.Groups == nil {
			s.Groups = map[string]int64{}
		}
		s.Groups[f], _ = strconv.ParseInt(v, 10, 64)
	}
	var err error
	if s.Generation, err = strconv.ParseInt(t["gen"], 10, 64); err != nil {
		return nil, wrap(fmt.Errorf("stored generation %q is not a number", t["gen"]))
	}
	if s.Status, err = parseStatus(name, status.Val()); err != nil {
		return nil, wrap(err)
	}
	stored, err := decodeTopology(t["topology"])
	if err != nil {
		return nil, wrap(err)
	}
	recs := make([]string, 0, len(claims.Val()))
	for _, r := range claims.Val() {
		recs = append(recs, r)
	}
	if s.Claims, err = decodeClaims(recs); err != nil {
		return nil, wrap(err)
	}
	byID := make(map[string]*Claim, len(s.Claims))
	for i := range s.Claims {
		byID[s.Claims[i].ID] = &s.Claims[i]
	}
	pinKeys := make([]string, 0, len(pins.Val()))
	for cpu := range pins.Val() {
		pinKeys = append(pinKeys, cpu)
	}
	counters := map[string]int64{}
	for f, v := range usage.Val() {
		counters[f], _ = strconv.ParseInt(v, 10, 64)
	}
	s.Topology = compose(stored, pinsOf(pinKeys), counters)
	s.HostUsage = numa.HostUsage{MemoryMB: s.Topology.MemoryUsedMB, VCPUs: s.Topology.VCPUUsage}
	for key, owner := range pins.Val() {
		if isDevicePin(key) {
			d := DevicePin{Address: key, ClaimID: owner}
			if c := byID[owner]; c != nil {
				d.InstanceUUID, d.State = c.InstanceUUID, c.State
			}
			s.Devices = append(s.Devices, d)
			continue
		}
		id, err := strconv.Atoi(key)
		if err != nil {
			return nil, wrap(fmt.Errorf("pin key %q is neither a cpu id nor a PCI address", key))
		}
		p := Pin{CPU: id, Cell: -1, ClaimID: owner}
		for _, c := range stored.Cells {
			if c.PCPUs.Contains(id) {
				p.Cell = c.ID
			}
		}
		if c := byID[owner]; c != nil {
			p.InstanceUUID, p.State = c.InstanceUUID, c.State
		}
		s.Pins = append(s.Pins, p)
	}
	sort.Slice(s.Pins, func(i, j int) bool { return s.Pins[i].CPU < s.Pins[j].CPU })
	sort.Slice(s.Devices, func(i, j int) bool { return s.Devices[i].Address < s.Devices[j].Address })
	if s.Usage, err = parseUsage(usage.Val()); err != nil {
		return nil, wrap(err)
	}
	return s, nil
}

// parseUsage reads the usage hash into per-cell loads; the host-level
// fields are compose's.
func parseUsage(fields map[string]string) ([]CellLoad, error) {
	byCell := map[int]*CellLoad{}
	for f, v := range fields {
		n, err := strconv.ParseInt(v, 10, 64)
		if (f == hostMemField || f == hostVCPUsField) && err == nil {
			continue
		}
		parts := strings.Split(f, ":")
		cell, cerr := strconv.Atoi(parts[0])
		if err != nil || cerr != nil || len(parts) < 2 {
			return nil, fmt.Errorf("usage field %q = %q is malformed", f, v)
		}
		l := byCell[cell]
		if l == nil {
			l = &CellLoad{Cell: cell}
			byCell[cell] = l
		}
		switch {
		case len(parts) == 2 && parts[1] == "mem":
			l.MemoryMB = n
		case len(parts) == 2 && parts[1] == "shared":
			l.SharedCPUs = n
		case len(parts) == 3 && parts[1] == "pages":
			size, err := strconv.ParseInt(parts[2], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("usage field %q has a malformed page size", f)
			}
			if l.Pages == nil {
				l.Pages = map[int64]int64{}
			}
			l.Pages[size] = n
		default:
			return nil, fmt.Errorf("usage field %q is not <cell>:mem, <cell>:shared or <cell>:pages:<KiB>", f)
		}
	}
	out := make([]CellLoad, 0, len(byCell))
	for _, l := range byCell {
		out = append(out, *l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Cell < out[j].Cell })
	return out, nil
}
