package ledger

import (
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
type hostCache struct {
	gen    int64
	digest string
	topo   *numa.Host // without usage; never modified

	mu    sync.Mutex
	pins  map[int]seen    // pCPU -> 1 pinned, 0 free
	usage map[string]seen // usage field -> value
	// floor is the revision of the newest whole state seen: a counter
	// missing from usage was zero then, so an older reply must not add it.
	floor int64
	// top is the newest revision seen at all.
	top  int64
	view *numa.Host // topo with pins and usage applied; nil when stale
}

// seen is one value as of one revision.
type seen struct {
	val, rev int64
}

func newHostCache(gen int64, digest string, topo *numa.Host) *hostCache {
	return &hostCache{gen: gen, digest: digest, topo: topo, pins: map[int]seen{}, usage: map[string]seen{}}
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
// every pinned pCPU, usage every usage counter above zero. It reports false,
// recording nothing, when rev is older than the newest one seen: either a
// reply overtaken by newer ones or a host whose keys were made again from
// scratch, so the caller drops the cache rather than trust it.
func (hc *hostCache) observeState(rev int64, pinned []int, usage map[string]int64) bool {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if rev < hc.top {
		return false
	}
	hc.top = rev
	is := make(map[int]bool, len(pinned))
	for _, cpu := range pinned {
		is[cpu] = true
	}
	for _, c := range hc.topo.Cells {
		for _, cpu := range c.PCPUs.List() {
			var v int64
			if is[cpu] {
				v = 1
			}
			note(hc.pins, cpu, v, rev)
		}
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
	hc.view = nil
	return true
}

// observe records what one claim or release changed as of rev: the pCPUs
// it pinned (val 1) or freed (val 0) and the new values of the counters it
// changed.
func (hc *hostCache) observe(rev int64, cpus []int, val int64, usage map[string]int64) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	hc.top = max(hc.top, rev)
	for _, cpu := range cpus {
		note(hc.pins, cpu, val, rev)
	}
	for f, v := range usage {
		if _, ok := hc.usage[f]; ok || rev >= hc.floor {
			note(hc.usage, f, v, rev)
		}
	}
	hc.view = nil
}

// host returns the cached view of the host with its usage. It is shared:
// callers must not modify it.
func (hc *hostCache) host() *numa.Host {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.view == nil {
		pinned := make([]int, 0, len(hc.pins))
		for cpu, s := range hc.pins {
			if s.val != 0 {
				pinned = append(pinned, cpu)
			}
		}
		usage := make(map[string]int64, len(hc.usage))
		for f, s := range hc.usage {
			usage[f] = s.val
		}
		hc.view = compose(hc.topo, pinned, usage)
	}
	return hc.view
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

// parseCPUList parses a script's comma-separated pCPU ids, leaving out
// anything that is not a cpu id.
func parseCPUList(s string) []int {
	if s == "" {
		return nil
	}
	return cpuIDs(strings.Split(s, ","))
}

// parseCounters parses a script's "field,value,field,value" list of usage
// counters, leaving out malformed pairs.
func parseCounters(s string) map[string]int64 {
	out := map[string]int64{}
	if s == "" {
		return out
	}
	parts := strings.Split(s, ",")
	for i := 0; i+1 < len(parts); i += 2 {
		if n, err := strconv.ParseInt(parts[i+1], 10, 64); err == nil {
			out[parts[i]] = n
		}
	}
	return out
}
