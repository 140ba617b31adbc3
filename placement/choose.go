package placement

import (
	"context"
	"sort"
	"sync"

	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// maxBatch bounds the hosts a choice reads in one round trip.
const maxBatch = 32

// Choose returns the host Exhaustive would choose, trying only the hosts
// that take the guest as the index saw them and could still beat the best
// found, each fitted on a fresh read of it and its status before it is
// chosen. On the state Exhaustive would read the choice is the same; a
// stale index may cost the best choice, never a host that cannot take the
// guest or is not up (and the claim that follows is the ledger's to
// judge). When no host takes the guest, the error is Exhaustive's, from
// fresh reads of the hosts it names. A call before the first sweep makes
// it.
func (ix *Index) Choose(ctx context.Context, r Request) (string, error) {
	q, err := newQuery(r)
	if err != nil {
		return "", err
	}
	if err := ix.ensureSynced(ctx); err != nil {
		return "", err
	}
	var found choice
	for range 2 {
		best, err := ix.search(ctx, q)
		if err != nil || best.name != "" {
			return best.name, err
		}
		var m *misses
		if found, m, err = ix.explain(ctx, q); err != nil {
			return "", err
		}
		if found.name == "" {
			return "", m.err(r.UUID)
		}
		// A host the index ruled out takes the guest after all: its view
		// was stale, and the read for the explanation mended it. Search
		// again, for the best of the hosts now seen to take it.
	}
	return found.name, nil
}

// position is where a search goes on: at the hosts with free pinnable
// CPUs free, named after after.
type position struct {
	free  int
	after string
}

// search tries the hosts in the index's order, fewest free pCPUs first,
// batch by batch, until no host left could beat the best found.
func (ix *Index) search(ctx context.Context, q *query) (choice, error) {
	var best choice
	seen := map[string]bool{}
	pos := position{free: q.need}
	for {
		batch, next := ix.nextBatch(q, pos, best, seen)
		if len(batch) == 0 {
			return best, nil
		}
		pos = next
		fits, err := ix.verify(ctx, q, batch)
		if err != nil {
			return choice{}, err
		}
		for _, c := range fits {
			if best.beats(c.name, c.free) {
				best = c
			}
		}
	}
}

// candidate is a host a search reads, and whether the index believes it
// is up.
type candidate struct {
	name string
	up   bool
}

// nextBatch returns the next hosts to read, from pos on, and where to go
// on after them: hosts that take the guest as the index saw them and could
// beat best. A host keeping free pCPUs keeps at least free-most after the
// guest (query.most), so the search ends where that bound passes the best
// found. While the batch fills, its hosts count as fitting as the index
// says: a host that could beat none of them waits for the batch's reads,
// so a fresh index reads one host per choice.
func (ix *Index) nextBatch(q *query, pos position, best choice, seen map[string]bool) ([]candidate, position) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var batch []candidate
	prov := best
	most := q.most(ix.threads)
	for free := pos.free; free < len(ix.byFree); free++ {
		if prov.name != "" && free-most > prov.free {
			if len(batch) == 0 {
				break
			}
			return batch, position{free: free}
		}
		l := ix.byFree[free]
		i := 0
		if free == pos.free && pos.after != "" {
			i = sort.Search(len(l), func(i int) bool { return l[i].name > pos.after })
		}
		for ; i < len(l); i++ {
			e := l[i]
			// Cheapest first: most hosts a search passes over fail the
			// bounds, and a large search passes over many.
			if q.cells > 0 && (len(e.cells) < q.cells || !q.roomFor(e.cells)) {
				continue
			}
			if seen[e.name] || !q.passes(e.name) {
				continue
			}
			least := free - q.most(e.threads)
			if !best.beats(e.name, least) {
				if q.isolated == 0 {
					break // the rest of the list: the same bound, later names
				}
				continue
			}
			if !prov.beats(e.name, least) {
				after := ""
				if i > 0 {
					after = l[i-1].name
				}
				return batch, position{free: free, after: after}
			}
			p, err := numa.Fit(e.host, q.Request.Request)
			if err != nil {
				continue
			}
			seen[e.name] = true
			batch = append(batch, candidate{e.name, e.up})
			if f := FreeAfter(e.host, p); e.up && prov.beats(e.name, f) {
				prov = choice{e.name, f}
			}
			if len(batch) == maxBatch {
				return batch, position{free: free, after: e.name}
			}
		}
	}
	return batch, position{free: len(ix.byFree)}
}

// verify reads the batch's hosts and statuses afresh, brings the index up
// to what it read, and returns the hosts that are up and take the guest.
func (ix *Index) verify(ctx context.Context, q *query, batch []candidate) ([]choice, error) {
	names := make([]string, len(batch))
	var guess []string
	for i, c := range batch {
		names[i] = c.name
		if c.up {
			guess = append(guess, c.name)
		}
	}
	// The hosts believed up are read along with the statuses of all.
	var states map[string]ledger.HostStatus
	var statesErr error
	var wg sync.WaitGroup
	wg.Go(func() { states, statesErr = ix.led.HostStatuses(ctx, names) })
	views, err := ix.led.ReadHosts(ctx, guess, ix.known)
	wg.Wait()
	if statesErr != nil {
		return nil, statesErr
	}
	if err != nil {
		return nil, err
	}
	read := make(map[string]bool, len(guess))
	for _, n := range guess {
		read[n] = true
	}
	var late []string
	for _, n := range names {
		if st, ok := states[n]; ok && Usable(st) && !read[n] {
			late = append(late, n)
		}
	}
	if len(late) > 0 {
		more, err := ix.led.ReadHosts(ctx, late, ix.known)
		if err != nil {
			return nil, err
		}
		views = append(views, more...)
	}
	ix.learn(names, states, views)
	var out []choice
	for _, v := range views {
		if st, ok := states[v.Name]; !ok || !Usable(st) || v.Host == nil {
			continue
		}
		if p, err := numa.Fit(v.Host, q.Request.Request); err == nil {
			out = append(out, choice{v.Name, FreeAfter(v.Host, p)})
		}
	}
	return out, nil
}

// learn brings the index up to fresh reads of statuses and hosts.
func (ix *Index) learn(names []string, states map[string]ledger.HostStatus, views []ledger.HostView) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, n := range names {
		st, ok := states[n]
		if !ok {
			if e := ix.entries[n]; e != nil {
				ix.remove(e) // not registered any more
			}
			continue
		}
		ix.setUp(n, Usable(st))
	}
	for _, v := range views {
		ix.put(v, false)
	}
}

// explain reads the first hosts by name afresh, for the error of a guest
// no host takes, and returns the best of them that takes it after all (the
// index was stale), if any.
func (ix *Index) explain(ctx context.Context, q *query) (choice, *misses, error) {
	m := &misses{}
	var first []string
	ix.mu.RLock()
	total := 0
	for _, n := range ix.names {
		if !q.passes(n) {
			continue
		}
		total++
		if len(first) < maxReasons {
			first = append(first, n)
		}
	}
	ix.mu.RUnlock()
	if total == 0 {
		return choice{}, m, nil
	}
	states, err := ix.led.HostStatuses(ctx, first)
	if err != nil {
		return choice{}, nil, err
	}
	views, err := ix.led.ReadHosts(ctx, first, ix.known)
	if err != nil {
		return choice{}, nil, err
	}
	ix.learn(first, states, views)
	var found choice
	for i, n := range first {
		st, ok := states[n]
		switch {
		case !ok || views[i].Host == nil:
		case !Usable(st):
			m.addState(n, st)
		default:
			p, err := numa.Fit(views[i].Host, q.Request.Request)
			if err != nil {
				m.addFit(n, err)
			} else if free := FreeAfter(views[i].Host, p); found.beats(n, free) {
				found = choice{n, free}
			}
		}
	}
	m.more += total - len(first)
	return found, m, nil
}
