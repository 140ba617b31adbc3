package placement

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// maxReasons bounds the hosts a no-fit error names; the rest are counted.
const maxReasons = 5

// Request asks for a host for a guest.
type Request struct {
	// UUID names the guest in errors.
	UUID string
	// Request is what the guest asks of a host's NUMA cells.
	Request *numa.Request
	// Exclude lists hosts never to choose (a migration's source).
	Exclude []string
	// Only, when not nil, lists the only hosts that may be chosen (where
	// an affinity group's members are).
	Only []string
}

// Usable says whether a host in this state may be chosen: only one that
// is up. Down and returning hosts take no claims; a disabled one takes
// them only when an operation names it.
func Usable(st ledger.HostStatus) bool { return st.State == ledger.HostUp || st.State == "" }

// FreeAfter counts the pinnable CPUs h would have left after placing p:
// the packing every choice of pinflow's minimises (a drain's plan too),
// which keeps whole hosts free for large guests.
func FreeAfter(h *numa.Host, p *numa.Placement) int {
	free := 0
	for _, c := range h.Cells {
		free += c.FreePCPUs().Len()
	}
	if us, err := numa.Usage(h, p); err == nil {
		for _, u := range us {
			free -= u.PinnedCPUs.Len()
		}
	}
	return free
}

// choice is a host and the pinnable CPUs it keeps free after the guest;
// the zero value is no host.
type choice struct {
	name string
	free int
}

// beats says whether a host keeping free pCPUs after the guest is a better
// choice than c: fewer free (packing keeps whole hosts free for large
// guests), ties broken by name.
func (c choice) beats(name string, free int) bool {
	return c.name == "" || free < c.free || (free == c.free && name < c.name)
}

// misses gathers why hosts cannot take the guest, for its error: the
// first maxReasons by name, and how many more.
type misses struct {
	first []miss // by name
	more  int
}

// miss is why one host cannot take the guest: its group (Group) and the
// particulars.
type miss struct {
	host, group, why string
}

func (m *misses) add(host, group, why string) {
	i := len(m.first)
	for i > 0 && m.first[i-1].host > host {
		i--
	}
	if i == maxReasons {
		m.more++
		return
	}
	m.first = append(m.first, miss{})
	copy(m.first[i+1:], m.first[i:])
	m.first[i] = miss{host, group, why}
	if len(m.first) > maxReasons {
		m.first = m.first[:maxReasons]
		m.more++
	}
}

// addFit records why Fit refused a host.
func (m *misses) addFit(host string, err error) { m.add(host, FitGroup(err), fitMiss(err)) }

// addState records a host whose state takes no claims.
func (m *misses) addState(host string, st ledger.HostStatus) {
	m.add(host, StateGroup(st), downMiss(st))
}

// fitMiss is why Fit refused a host, without the package prefix.
func fitMiss(err error) string { return strings.TrimPrefix(err.Error(), "numa: ") }

// downMiss is the particulars of a host whose state takes no claims: why
// an operator put it there.
func downMiss(st ledger.HostStatus) string {
	if st.Reason == "" {
		return "no reason recorded"
	}
	return st.Reason
}

// err is the no-fit error of a guest no host can take: the hosts grouped
// by why, with the particulars of the first of each group.
func (m *misses) err(uuid string) error {
	msg := fmt.Sprintf("no host can take instance %s", uuid)
	if len(m.first) == 0 {
		return &numa.NoFitError{Reason: msg + ": there are no other hosts"}
	}
	var order []string
	byGroup := map[string][]miss{}
	for _, x := range m.first {
		if byGroup[x.group] == nil {
			order = append(order, x.group)
		}
		byGroup[x.group] = append(byGroup[x.group], x)
	}
	parts := make([]string, len(order))
	for i, g := range order {
		xs := byGroup[g]
		hosts := xs[0].host + " (" + xs[0].why + ")"
		for _, x := range xs[1:] {
			hosts += ", " + x.host
		}
		parts[i] = g + ": " + hosts
	}
	msg += ": " + strings.Join(parts, "; ")
	if m.more > 0 {
		msg += fmt.Sprintf("; %d more hosts cannot take it either ('pinflow explain' lists every host)", m.more)
	}
	hosts := make([]numa.HostMiss, len(m.first))
	for i, x := range m.first {
		hosts[i] = numa.HostMiss{Host: x.host, Reason: x.group + ": " + x.why}
	}
	return &numa.NoFitError{Reason: msg, Hosts: hosts, More: m.more}
}

// query is a request with what the index filters and orders by, worked
// out once per choice.
type query struct {
	Request
	exclude map[string]bool
	// only is Request.Only as a set; nil when any host may be chosen.
	only map[string]bool
	// cells is the guest's NUMA cells; 0 fits any host.
	cells int
	// need is the fewest pCPUs the guest pins: its dedicated vCPUs and
	// its emulator pCPU. isolated is the part of it in cells of thread
	// policy isolate, which take the whole core of each.
	need, isolated int
	// rooms are what each guest cell with pinned vCPUs needs free in its
	// host cell, each a cell of its own.
	rooms []room
}

func newQuery(r Request) (*query, error) {
	if r.Request == nil {
		return nil, errors.New("placement: no request to place")
	}
	q := &query{Request: r, exclude: make(map[string]bool, len(r.Exclude)), cells: len(r.Request.Cells)}
	for _, h := range r.Exclude {
		q.exclude[h] = true
	}
	if r.Only != nil {
		q.only = make(map[string]bool, len(r.Only))
		for _, h := range r.Only {
			q.only[h] = true
		}
	}
	for i, g := range r.Request.Cells {
		if !g.CPUPolicy.Pinned() {
			continue
		}
		n := g.DedicatedVCPUs.Len()
		if i == 0 && r.Request.EmulatorPolicy == numa.EmulatorPolicyIsolate {
			n++ // the emulator pCPU, placed with guest cell 0
		}
		q.need += n
		r := room{pcpus: n, memMB: g.MemoryMB}
		if g.ThreadPolicy == numa.ThreadPolicyIsolate {
			q.isolated += n
			// A whole free core per vCPU; the emulator pCPU may take a
			// smaller one.
			r.cores = g.DedicatedVCPUs.Len()
		}
		q.rooms = append(q.rooms, r)
	}
	return q, nil
}

// roomFor says whether the pinned guest cells can each have a host cell
// of their own with room for them: if not, numa.Fit refuses the host.
func (q *query) roomFor(cells []room) bool {
	if len(q.rooms) == 1 {
		for _, c := range cells {
			if c.holds(q.rooms[0]) {
				return true
			}
		}
		return false
	}
	// Kuhn's augmenting paths, on the stack: a search checks many hosts.
	var ownerOf [16]int
	var seenBuf [16]bool
	owner, seen := ownerOf[:], seenBuf[:]
	if len(cells) > len(ownerOf) {
		owner, seen = make([]int, len(cells)), make([]bool, len(cells))
	}
	owner, seen = owner[:len(cells)], seen[:len(cells)]
	for i := range owner {
		owner[i] = -1
	}
	for g := range q.rooms {
		clear(seen)
		if !q.augment(cells, g, owner, seen) {
			return false
		}
	}
	return true
}

// augment finds guest cell g a host cell, moving others along.
func (q *query) augment(cells []room, g int, owner []int, seen []bool) bool {
	for c := range cells {
		if seen[c] || !cells[c].holds(q.rooms[g]) {
			continue
		}
		seen[c] = true
		if owner[c] < 0 || q.augment(cells, owner[c], owner, seen) {
			owner[c] = g
			return true
		}
	}
	return false
}

// holds says whether a host cell with room r has room for need.
func (r room) holds(need room) bool {
	return r.pcpus >= need.pcpus && r.cores >= need.cores && r.memMB >= need.memMB
}

// most is the most pCPUs the guest pins on a host of threads threads per
// core: a host keeping free pCPUs before keeps at least free-most after.
func (q *query) most(threads int) int { return q.need + q.isolated*(max(threads, 1)-1) }

// passes says whether host may be chosen at all: not excluded, and among
// the only hosts when the request names them.
func (q *query) passes(host string) bool {
	return !q.exclude[host] && (q.only == nil || q.only[host])
}
