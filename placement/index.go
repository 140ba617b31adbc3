package placement

import (
	"context"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// Defaults of Options.
const (
	DefaultPollInterval  = 500 * time.Millisecond
	DefaultSweepInterval = time.Minute
)

// hintOverlap is how far before its last look a poll asks for hints
// again. Hint stamps only grow on one server, but a failover can promote
// a replica that missed the newest ones; a host's own stamp keeps the
// overlap from reading it twice.
const hintOverlap = 2 * time.Second

// putSlice is how many hosts a sweep puts in the index per hold of its
// lock.
const putSlice = 1000

// Options configure an Index.
type Options struct {
	// PollInterval is how often Run reads the hosts changed since its last
	// look; DefaultPollInterval when zero.
	PollInterval time.Duration
	// SweepInterval is how often Run reads every host's version, and then
	// every host that changed, to repair what a lost hint left stale;
	// DefaultSweepInterval when zero.
	SweepInterval time.Duration
	// Logger gets Run's failed refreshes; nil discards them.
	Logger *slog.Logger
}

// Index is an in-process view of every host's free capacity, kept for
// choosing hosts (Choose). It is safe for concurrent use.
type Index struct {
	led  *ledger.Ledger
	opts Options

	// refresh makes polls and sweeps one at a time; it guards cursor and
	// lastLook.
	refresh sync.Mutex
	// cursor is the stamp of the newest change hint read.
	cursor int64
	// lastLook is when the hints were last read (or a sweep began).
	lastLook time.Time
	// synced is set once the first sweep is done.
	synced atomic.Bool

	mu      sync.RWMutex
	entries map[string]*entry
	// byFree holds the entries by their free pCPUs, each list by name:
	// the order choices try hosts in.
	byFree [][]*entry
	// names are the entries' names in order, for errors.
	names []string
	// topos are the topologies the entries have, by digest, shared.
	topos map[string]*numa.Host
	// threads is the most threads per core of any host seen.
	threads int
}

// entry is one host as the index last read it.
type entry struct {
	name string
	ver  ledger.HostVersion
	host *numa.Host // topology and usage; shared with the topology, read only
	// free is the pinnable CPUs not pinned, over all cells.
	free  int
	cells []room
	// threads is the threads per core, the most of any cell.
	threads int
	// up is the host's status as last read: it only decides how many
	// hosts a choice reads at once, never whether one is chosen.
	up bool
	// hinted is the stamp of the newest change hint the entry's read
	// covers.
	hinted int64
}

// room is what one host cell has free for a guest cell with pinned
// vCPUs, as numa.Fit counts it.
type room struct {
	pcpus int // pinnable CPUs not pinned
	// cores are the cores with every thread free, of the cell's most
	// threads per core: what thread policy isolate pins one vCPU to.
	cores int
	memMB int64
}

func roomOf(c *numa.Cell) room {
	free := c.FreePCPUs()
	r := room{pcpus: free.Len(), memMB: c.AvailMemoryMB()}
	perCore := c.ThreadsPerCore()
	for _, s := range c.Siblings {
		if s.Intersection(free).Len() == perCore {
			r.cores++
		}
	}
	return r
}

// NewIndex returns an empty index of the ledger's hosts. Run keeps it
// current; a choice before the first sweep makes it.
func NewIndex(led *ledger.Ledger, opts Options) *Index {
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = DefaultSweepInterval
	}
	return &Index{led: led, opts: opts, entries: map[string]*entry{}, topos: map[string]*numa.Host{}, threads: 1}
}

// Run keeps the index current until ctx ends: a sweep first, then a poll
// every PollInterval and a sweep every SweepInterval. Failures are logged
// and retried at the next tick. It returns ctx's error.
func (ix *Index) Run(ctx context.Context) error {
	if err := ix.ensureSynced(ctx); err != nil {
		ix.logFailure(ctx, "sweep", err)
	}
	poll := time.NewTicker(ix.opts.PollInterval)
	defer poll.Stop()
	sweep := time.NewTicker(ix.opts.SweepInterval)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-poll.C:
			if err := ix.Poll(ctx); err != nil {
				ix.logFailure(ctx, "poll", err)
			}
		case <-sweep.C:
			if err := ix.Sweep(ctx); err != nil {
				ix.logFailure(ctx, "sweep", err)
			}
		}
	}
}

func (ix *Index) logFailure(ctx context.Context, what string, err error) {
	if ix.opts.Logger != nil && ctx.Err() == nil {
		ix.opts.Logger.WarnContext(ctx, "placement index: "+what+" failed; choices fit on what it saw before", "error", err)
	}
}

// ensureSynced makes the first sweep unless one is done.
func (ix *Index) ensureSynced(ctx context.Context) error {
	if ix.synced.Load() {
		return nil
	}
	ix.refresh.Lock()
	defer ix.refresh.Unlock()
	if ix.synced.Load() {
		return nil
	}
	return ix.sweep(ctx)
}

// Poll reads the hosts whose change hints came since the last look. The
// first call, and one after a gap longer than the hints are kept, sweeps
// instead.
func (ix *Index) Poll(ctx context.Context) error {
	ix.refresh.Lock()
	defer ix.refresh.Unlock()
	if !ix.synced.Load() || time.Since(ix.lastLook) > ledger.ChangeRetention/2 {
		return ix.sweep(ctx)
	}
	started := time.Now()
	changes, err := ix.led.ChangedSince(ctx, ix.cursor-hintOverlap.Microseconds())
	if err != nil {
		return err
	}
	cursor := ix.cursor
	at := map[string]int64{}
	var names []string
	ix.mu.RLock()
	for _, c := range changes {
		cursor = max(cursor, c.At)
		if e := ix.entries[c.Host]; e == nil || c.At > e.hinted {
			at[c.Host] = c.At
			names = append(names, c.Host)
		}
	}
	ix.mu.RUnlock()
	if len(names) > 0 {
		views, err := ix.led.ReadHosts(ctx, names, ix.known)
		if err != nil {
			return err
		}
		ix.mu.Lock()
		for _, v := range views {
			ix.put(v, false)
			if e := ix.entries[v.Name]; e != nil {
				e.hinted = max(e.hinted, at[v.Name])
			}
		}
		ix.mu.Unlock()
	}
	ix.cursor, ix.lastLook = cursor, started
	return nil
}

// Sweep reads every host's version, then every host whose version
// differs from the index's, and drops the hosts that are gone: it repairs
// whatever a lost hint left stale.
func (ix *Index) Sweep(ctx context.Context) error {
	ix.refresh.Lock()
	defer ix.refresh.Unlock()
	return ix.sweep(ctx)
}

func (ix *Index) sweep(ctx context.Context) error {
	started := time.Now()
	// Read first: hints written from now on are later than cursor, and
	// the next poll reads them.
	cursor, err := ix.led.LastChange(ctx)
	if err != nil {
		return err
	}
	names, err := ix.led.Hosts(ctx)
	if err != nil {
		return err
	}
	vers, err := ix.led.HostVersions(ctx, names)
	if err != nil {
		return err
	}
	// The statuses only say how many hosts a choice reads at once, and
	// every choice reads its candidates' afresh: the first sweep reads
	// them, choices keep them.
	var states map[string]ledger.HostStatus
	if !ix.synced.Load() {
		if states, err = ix.led.HostStatuses(ctx, names); err != nil {
			return err
		}
	}
	listed := make(map[string]bool, len(names))
	var stale []string
	var staleVers []ledger.HostVersion
	topos := map[string]*numa.Host{}
	ix.mu.RLock()
	for i, n := range names {
		if vers[i].Gen == 0 {
			continue
		}
		listed[n] = true
		if e := ix.entries[n]; e == nil || e.ver != vers[i] {
			stale = append(stale, n)
			staleVers = append(staleVers, vers[i])
		}
	}
	for d, t := range ix.topos {
		topos[d] = t
	}
	ix.mu.RUnlock()
	views, err := readAll(ctx, ix.led, stale, staleVers, topos)
	if err != nil {
		return err
	}
	// In slices: choices wait for the lock, and a first sweep puts every
	// host.
	for lo := 0; lo < len(views); lo += putSlice {
		ix.mu.Lock()
		for _, v := range views[lo:min(lo+putSlice, len(views))] {
			ix.put(v, true)
		}
		ix.mu.Unlock()
	}
	ix.mu.Lock()
	for n, e := range ix.entries {
		if !listed[n] {
			ix.remove(e)
		}
	}
	inUse := map[string]*numa.Host{}
	for n, e := range ix.entries {
		if st, ok := states[n]; ok {
			e.up = Usable(st)
		}
		inUse[e.ver.Digest] = ix.topos[e.ver.Digest]
	}
	ix.topos = inUse
	ix.mu.Unlock()
	ix.cursor, ix.lastLook = max(ix.cursor, cursor), started
	ix.synced.Store(true)
	return nil
}

// known is what ReadHosts needs of the index: the topology it holds for
// a host.
func (ix *Index) known(host string) (string, *numa.Host) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if e := ix.entries[host]; e != nil {
		return e.ver.Digest, ix.topos[e.ver.Digest]
	}
	return "", nil
}

// put brings the entry of v's host up to v, or drops it when the host is
// not registered. Unless force, a view older than the entry (the same
// topology, a lower revision: a read overtaken by a newer one) is left
// out; a sweep forces, so a host whose revision went back (its keys
// restored) is read as it is. The caller holds mu.
func (ix *Index) put(v ledger.HostView, force bool) {
	e := ix.entries[v.Name]
	if v.Host == nil {
		if e != nil {
			ix.remove(e)
		}
		return
	}
	if e != nil && !force && v.Version.Gen == e.ver.Gen && v.Version.Digest == e.ver.Digest && v.Version.Rev < e.ver.Rev {
		return
	}
	if ix.topos[v.Version.Digest] == nil {
		ix.topos[v.Version.Digest] = v.Topology
	}
	if e == nil {
		e = &entry{name: v.Name, up: true}
		ix.entries[v.Name] = e
		i, _ := slices.BinarySearch(ix.names, v.Name)
		ix.names = slices.Insert(ix.names, i, v.Name)
	} else {
		ix.unlist(e)
	}
	e.ver, e.host = v.Version, v.Host
	e.free, e.threads = 0, 1
	e.cells = e.cells[:0]
	for i := range v.Host.Cells {
		r := roomOf(&v.Host.Cells[i])
		e.free += r.pcpus
		e.cells = append(e.cells, r)
		e.threads = max(e.threads, v.Host.Cells[i].ThreadsPerCore())
	}
	ix.threads = max(ix.threads, e.threads)
	ix.list(e)
}

// setUp records a host's status as a choice read it.
func (ix *Index) setUp(name string, up bool) {
	if e := ix.entries[name]; e != nil {
		e.up = up
	}
}

func (ix *Index) remove(e *entry) {
	ix.unlist(e)
	delete(ix.entries, e.name)
	if i, ok := slices.BinarySearch(ix.names, e.name); ok {
		ix.names = slices.Delete(ix.names, i, i+1)
	}
}

// list puts e in its place in byFree.
func (ix *Index) list(e *entry) {
	for len(ix.byFree) <= e.free {
		ix.byFree = append(ix.byFree, nil)
	}
	l := ix.byFree[e.free]
	i := sort.Search(len(l), func(i int) bool { return l[i].name >= e.name })
	l = append(l, nil)
	copy(l[i+1:], l[i:])
	l[i] = e
	ix.byFree[e.free] = l
}

// unlist takes e out of byFree.
func (ix *Index) unlist(e *entry) {
	if e.free >= len(ix.byFree) {
		return
	}
	l := ix.byFree[e.free]
	i := sort.Search(len(l), func(i int) bool { return l[i].name >= e.name })
	if i < len(l) && l[i] == e {
		ix.byFree[e.free] = append(l[:i], l[i+1:]...)
	}
}

// Len returns how many hosts the index holds.
func (ix *Index) Len() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return len(ix.entries)
}
