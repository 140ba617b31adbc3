package ledger

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/pinflow/pinflow/numa"
)

// hostCache is this process's view of one host's ledger, so that Claim
// fits without reading the host first. The view may be stale: the claim
// script checks everything it relies on, so a stale view only costs a lost
// race, whose reply carries the host's current state.
//
// Every observation comes from one atomic script and carries the host's
// revision (rev) it saw, and each pCPU and usage counter keeps the value of
// the newest observation of it. Replies arrive in any order from many
// goroutines, so applying them in arrival order could let an old reply undo
// a newer one; keeping the newest per value cannot.
//
// The cache also holds this process's claims between fitting and their
// reply (pending), so concurrent claims here choose around each other
// instead of racing for the same pCPUs: fitted on the same state read
// afresh, they choose the same pCPUs, and of 16 and 64 claims of one host
// made at once 4% and 22% lose every attempt. Fits run on busy: the observed
// state plus the pending claims, kept up to date value by value, so a
// claim costs a fit, not a rebuild of the host.
type hostCache struct {
	gen    int64
	digest string
	topo   *numa.Host // without usage; never modified
	// cellOf and fieldOf say where a pCPU and a usage counter live in busy.
	cellOf  map[int]int
	fieldOf map[string]fieldRef

	mu    sync.Mutex
	pins  map[int]seen    // pCPU -> 1 pinned, 0 free
	devs  map[string]seen // PCI device address -> 1 held, 0 free
	usage map[string]seen // usage field -> value
	// floor is the revision of the newest whole state seen: a counter
	// missing from usage was zero then, so an older reply must not add it.
	floor int64
	// top is the newest revision seen at all.
	top int64

	pending     map[string]claimUse // claim id -> its usage
	pendingPins map[int]int         // pCPU -> pending claims pinning it
	pendingDevs map[string]int      // device -> pending claims holding it
	pendingUse  map[string]int64    // usage field -> pending claims' sum
	busy        *numa.Host          // topo + observed + pending
}

// seen is one value as of one revision.
type seen struct {
	val, rev int64
}

// fieldRef is where a usage counter lives in a host: cell index, what, and
// for pages the pool index.
type fieldRef struct {
	cell, pool int
	what       byte // 'm' memory, 's' shared vCPUs, 'p' pages; 'M', 'V' the host's
}

// claimUse is what one claim takes: of its cells and of the host.
type claimUse struct {
	cells []numa.CellUsage
	host  numa.HostUsage
	devs  []string
}

func newHostCache(gen int64, digest string, topo *numa.Host) *hostCache {
	hc := &hostCache{gen: gen, digest: digest, topo: topo,
		cellOf: map[int]int{}, fieldOf: map[string]fieldRef{},
		pins: map[int]seen{}, devs: map[string]seen{}, usage: map[string]seen{},
		pending: map[string]claimUse{}, pendingPins: map[int]int{}, pendingDevs: map[string]int{}, pendingUse: map[string]int64{},
		busy: topo.Clone()}
	hc.fieldOf[hostMemField] = fieldRef{what: 'M'}
	hc.fieldOf[hostVCPUsField] = fieldRef{what: 'V'}
	for i, c := range topo.Cells {
		for _, cpu := range c.PCPUs.List() {
			hc.cellOf[cpu] = i
		}
		hc.fieldOf[usageField(c.ID, "mem")] = fieldRef{cell: i, what: 'm'}
		hc.fieldOf[usageField(c.ID, "shared")] = fieldRef{cell: i, what: 's'}
		for j, p := range c.Pages {
			hc.fieldOf[pagesField(c.ID, p.SizeKB)] = fieldRef{cell: i, pool: j, what: 'p'}
		}
	}
	return hc
}

// note records val for one value as of rev unless a newer observation is
// already there.
func note[K comparable](m map[K]seen, k K, val, rev int64) bool {
	if cur, ok := m[k]; ok && cur.rev > rev {
		return false
	}
	m[k] = seen{val: val, rev: rev}
	return true
}

// observeState records the host's whole state as of rev: pinned lists
// every pinned pCPU and held device, usage every usage counter above zero.
// It reports false,
// recording nothing, when rev is older than the newest one seen: either a
// reply overtaken by newer ones or a host whose keys were made again from
// scratch, so the caller drops the cache rather than trust it.
func (hc *hostCache) observeState(rev int64, pinned pinSet, usage map[string]int64) bool {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if rev < hc.top {
		return false
	}
	hc.top = rev
	is := make(map[int]bool, len(pinned.cpus))
	for _, cpu := range pinned.cpus {
		is[cpu] = true
	}
	for cpu := range hc.cellOf {
		var v int64
		if is[cpu] {
			v = 1
		}
		note(hc.pins, cpu, v, rev)
	}
	held := make(map[string]bool, len(pinned.devs))
	for _, a := range pinned.devs {
		held[a] = true
	}
	for _, d := range hc.topo.PCIDevices {
		var v int64
		if held[d.Address] {
			v = 1
		}
		note(hc.devs, d.Address, v, rev)
	}
	// A counter the state leaves out is zero: the scripts delete counters
	// that drop to zero.
	for f := range hc.usage {
		if _, ok := usage[f]; !ok {
			note(hc.usage, f, 0, rev)
		}
	}
	for f, v := range usage {
		note(hc.usage, f, v, rev)
	}
	hc.floor = rev
	hc.rebuild()
	return true
}

// observe records what one release changed as of rev: the pCPUs and
// devices it freed and the new values of the counters it changed.
func (hc *hostCache) observe(rev int64, freed pinSet, usage []counter) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	hc.noteChange(rev, freed, 0, usage)
	hc.refreshPins(freed)
	for _, c := range usage {
		hc.refreshField(c.field)
	}
}

// counter is one usage counter's value as a script replied it.
type counter struct {
	field string
	val   int64
}

// noteChange records the pins one script took (val 1) or freed (val 0)
// and the counters it changed, as of rev.
func (hc *hostCache) noteChange(rev int64, pins pinSet, val int64, usage []counter) {
	hc.top = max(hc.top, rev)
	for _, cpu := range pins.cpus {
		note(hc.pins, cpu, val, rev)
	}
	for _, a := range pins.devs {
		note(hc.devs, a, val, rev)
	}
	for _, c := range usage {
		if _, ok := hc.usage[c.field]; ok || rev >= hc.floor {
			note(hc.usage, c.field, c.val, rev)
		}
	}
}

// place chooses c's placement and usage: spec's explicit placement, or a
// fit of spec's request on busy. It records the usage as pending until
// settle(c.ID).
func (hc *hostCache) place(spec *ClaimSpec, c *Claim) error {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	c.Generation = hc.gen
	if spec.Placement != nil {
		// Checked against the ledger's state alone: a pending claim here
		// may yet fail, and the script is the judge.
		us, err := numa.Usage(hc.topo, spec.Placement)
		if err != nil {
			return fmt.Errorf("%w: placement %s: %v", ErrInvalid, spec.Placement, err)
		}
		devs, err := hc.topo.PlacementDevices(spec.Placement)
		if err != nil {
			return fmt.Errorf("%w: placement %s: %v", ErrInvalid, spec.Placement, err)
		}
		state := hc.observed()
		if err := withinCaps(state, us, spec.Placement); err != nil {
			return fmt.Errorf("%w: placement %s: %v", ErrConflict, spec.Placement, err)
		}
		if err := state.Add(us); err != nil {
			return fmt.Errorf("%w: placement %s: %v", ErrConflict, spec.Placement, err)
		}
		for _, a := range devs {
			if hc.devs[a].val != 0 {
				return fmt.Errorf("%w: placement %s: PCI device %s is held", ErrConflict, spec.Placement, a)
			}
		}
		c.Placement, c.Usage, c.Devices = spec.Placement, us, devs
	} else {
		p, err := numa.Fit(hc.busy, spec.Request)
		var nofit *numa.NoFitError
		if errors.As(err, &nofit) && len(hc.pending) > 0 {
			// A pending claim may yet fail; only the ledger itself can say
			// the request does not fit.
			p, err = numa.Fit(hc.observed(), spec.Request)
		}
		if err != nil {
			return err
		}
		us, err := numa.Usage(hc.topo, p)
		if err != nil {
			return fmt.Errorf("usage of the fitted placement: %w", err)
		}
		devs, err := hc.topo.PlacementDevices(p)
		if err != nil {
			return fmt.Errorf("devices of the fitted placement: %w", err)
		}
		c.Placement, c.Usage, c.Devices = p, us, devs
	}
	if c.Usage == nil {
		c.Usage = []numa.CellUsage{}
	}
	c.HostUsage = c.Placement.HostUsage()
	use := claimUse{cells: c.Usage, host: c.HostUsage, devs: c.Devices}
	hc.pending[c.ID] = use
	hc.addPending(use, 1)
	return nil
}

// settle ends claim id's pending state when its script replied: with the
// claim recorded (landed, taking pins and setting usage as of rev) or not.
func (hc *hostCache) settle(id string, landed bool, rev int64, pins pinSet, usage []counter) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	us, ok := hc.pending[id]
	if !ok {
		return
	}
	delete(hc.pending, id)
	if landed {
		// Observed before the pending usage goes, so busy never shows the
		// claim's pCPUs free in between.
		hc.noteChange(rev, pins, 1, usage)
		hc.refreshPins(pins)
		for _, c := range usage {
			hc.refreshField(c.field)
		}
	}
	hc.addPending(us, -1)
}

// addPending adds (sign 1) or takes away (-1) one claim's usage to the
// pending sums, and brings busy up to date.
func (hc *hostCache) addPending(use claimUse, sign int) {
	hc.addPendingField(hostMemField, int64(sign)*use.host.MemoryMB)
	hc.addPendingField(hostVCPUsField, int64(sign*use.host.VCPUs))
	for _, a := range use.devs {
		hc.pendingDevs[a] += sign
		if hc.pendingDevs[a] <= 0 {
			delete(hc.pendingDevs, a)
		}
	}
	hc.refreshPins(pinSet{devs: use.devs})
	for _, u := range use.cells {
		cpus := u.PinnedCPUs.List()
		for _, cpu := range cpus {
			hc.pendingPins[cpu] += sign
			if hc.pendingPins[cpu] <= 0 {
				delete(hc.pendingPins, cpu)
			}
		}
		hc.refreshPins(pinSet{cpus: cpus})
		c := hc.topo.Cell(u.Cell)
		if c == nil {
			continue
		}
		hc.addPendingField(usageField(c.ID, "mem"), int64(sign)*u.MemoryMB)
		hc.addPendingField(usageField(c.ID, "shared"), int64(sign*u.SharedCPUs))
		if u.PageSizeKB != 0 {
			hc.addPendingField(pagesField(c.ID, u.PageSizeKB), int64(sign)*u.Pages)
		}
	}
}

func (hc *hostCache) addPendingField(f string, n int64) {
	if n == 0 {
		return
	}
	hc.pendingUse[f] += n
	if hc.pendingUse[f] == 0 {
		delete(hc.pendingUse, f)
	}
	hc.refreshField(f)
}

// refreshPins brings busy's pins up to the observed state plus the
// pending claims: the given pCPUs, and the free device pools when devices
// are given.
func (hc *hostCache) refreshPins(pins pinSet) {
	if len(pins.devs) > 0 {
		hc.busy.Devices = hc.topo.FreeDevicePools(func(a string) bool { return hc.devs[a].val != 0 || hc.pendingDevs[a] > 0 })
	}
	for _, cpu := range pins.cpus {
		i, ok := hc.cellOf[cpu]
		if !ok {
			continue
		}
		want := hc.pins[cpu].val != 0 || hc.pendingPins[cpu] > 0
		c := &hc.busy.Cells[i]
		switch has := c.PinnedCPUs.Contains(cpu); {
		case want && !has:
			c.PinnedCPUs = c.PinnedCPUs.With(cpu)
		case !want && has:
			c.PinnedCPUs = c.PinnedCPUs.Without(cpu)
		}
	}
}

// refreshField brings busy's counter f up to the observed value plus the
// pending claims'.
func (hc *hostCache) refreshField(f string) {
	ref, ok := hc.fieldOf[f]
	if !ok {
		return
	}
	n := max(0, hc.usage[f].val+hc.pendingUse[f])
	switch ref.what {
	case 'M':
		hc.busy.MemoryUsedMB = n
		return
	case 'V':
		hc.busy.VCPUUsage = int(n)
		return
	}
	c := &hc.busy.Cells[ref.cell]
	switch ref.what {
	case 'm':
		c.MemoryUsedMB = n
	case 's':
		c.CPUUsage = int(n)
	case 'p':
		c.Pages[ref.pool].Used = n
	}
}

// rebuild makes busy anew from the observed state and the pending claims.
func (hc *hostCache) rebuild() { hc.busy = hc.compose(true) }

// observed returns a new host with the observed state alone.
func (hc *hostCache) observed() *numa.Host { return hc.compose(false) }

// compose makes a host of the topology and the observed state, plus the
// pending claims if withPending.
func (hc *hostCache) compose(withPending bool) *numa.Host {
	var pinned pinSet
	for cpu, s := range hc.pins {
		if s.val != 0 {
			pinned.cpus = append(pinned.cpus, cpu)
		}
	}
	for a, s := range hc.devs {
		if s.val != 0 {
			pinned.devs = append(pinned.devs, a)
		}
	}
	usage := make(map[string]int64, len(hc.usage))
	for f, s := range hc.usage {
		usage[f] = s.val
	}
	if withPending {
		for cpu := range hc.pendingPins {
			pinned.cpus = append(pinned.cpus, cpu)
		}
		for a := range hc.pendingDevs {
			pinned.devs = append(pinned.devs, a)
		}
		for f, n := range hc.pendingUse {
			usage[f] = max(0, usage[f]+n)
		}
	}
	return compose(hc.topo, pinned, usage)
}

// cachedHost returns the cache of a host, or nil if there is none.
func (l *Ledger) cachedHost(name string) *hostCache {
	if v, ok := l.hosts.Load(name); ok {
		return v.(*hostCache)
	}
	return nil
}

// dropCache forgets a host's cache if it is still hc (any if hc is nil), so
// the next claim reads the host again.
func (l *Ledger) dropCache(name string, hc *hostCache) {
	if hc == nil {
		l.hosts.Delete(name)
		return
	}
	l.hosts.CompareAndDelete(name, hc)
}

// parseCounterList parses a script's "field,value,field,value" list of
// usage counters, leaving out malformed pairs.
func parseCounterList(s string) []counter {
	var out []counter
	for s != "" {
		var f, v string
		f, s, _ = strings.Cut(s, ",")
		v, s, _ = strings.Cut(s, ",")
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out = append(out, counter{f, n})
		}
	}
	return out
}

// parseCounters parses a script's "field,value,field,value" list of usage
// counters into a map, leaving out malformed pairs.
func parseCounters(s string) map[string]int64 {
	out := map[string]int64{}
	for s != "" {
		var f, v string
		f, s, _ = strings.Cut(s, ",")
		v, s, _ = strings.Cut(s, ",")
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[f] = n
		}
	}
	return out
}
