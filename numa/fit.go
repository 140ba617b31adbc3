package numa

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"
)

// Resource names what a guest cell lacked on a host cell.
type Resource string

// Resources a NoFitError can name.
const (
	ResourcePCPUs   Resource = "pcpus"   // pinnable CPUs
	ResourceCPUs    Resource = "cpus"    // shared CPUs
	ResourceMemory  Resource = "memory"  // MiB
	ResourcePages   Resource = "pages"   // pages of the requested size
	ResourceThreads Resource = "threads" // SMT layout for the thread policy
	// The host as a whole: memory and shared vCPUs under its allocation
	// ratios (FitsHost).
	ResourceHostMemory Resource = "host-memory"
	ResourceHostVCPUs  Resource = "host-vcpus"
	// ResourceCells is a guest of more NUMA cells than the host has, or
	// whose cells each fit but not on distinct host cells.
	ResourceCells Resource = "cells"
	// ResourceDevices is PCI devices: too few that match, or none with
	// the NUMA affinity the policy asks on host cells the guest fits.
	ResourceDevices Resource = "devices"
	// ResourceNetworks is network NUMA affinity: no host cells the guest
	// fits reach the physnets or tunneled networks its ports are on.
	ResourceNetworks Resource = "networks"
)

// CellMiss says why one guest cell does not fit one host cell.
type CellMiss struct {
	GuestCell int
	HostCell  int
	Resource  Resource
	Detail    string
}

// NoFitError says why a valid request does not fit a host.
type NoFitError struct {
	// Misses holds, for each guest cell that fits no host cell, why it
	// misses each of them. When every guest cell fits somewhere but no two
	// can share a host cell, Misses is empty and Reason says so.
	Misses []CellMiss
	Reason string
	// Resource is what the host as a whole lacks, when Misses is empty.
	Resource Resource
	// Hosts, from a choice among hosts, are the first few that refused
	// and why; More counts the others. Reason says them all already.
	Hosts []HostMiss `json:",omitempty"`
	More  int        `json:",omitempty"`
}

// HostMiss is why one host refused a guest.
type HostMiss struct {
	Host   string
	Reason string
}

// Lacks is what the host lacks for the guest: each resource that some
// host cell lacked for a guest cell fitting none, or the host's own.
func (e *NoFitError) Lacks() []Resource {
	if len(e.Misses) == 0 {
		return []Resource{e.Resource}
	}
	var out []Resource
	for _, m := range e.Misses {
		if !slices.Contains(out, m.Resource) {
			out = append(out, m.Resource)
		}
	}
	slices.Sort(out)
	return out
}

func (e *NoFitError) Error() string {
	var sb strings.Builder
	sb.WriteString("numa: no fit: ")
	sb.WriteString(e.Reason)
	for i, m := range e.Misses {
		if i == 0 {
			sb.WriteString(": ")
		} else {
			sb.WriteString("; ")
		}
		fmt.Fprintf(&sb, "guest cell %d on host cell %d: %s", m.GuestCell, m.HostCell, m.Detail)
	}
	return sb.String()
}

// Fit places r on h. Guest cell i goes to a distinct host cell; among all
// valid assignments it returns the one Nova's permutation walk would reach
// first (lexicographically first over Nova's ordering of host cells), found
// with a bipartite matching in polynomial time. A guest with PCI devices
// or network affinity also needs host cells that together supply its
// devices (Placement.Devices says which) and reach its networks, as Nova
// checks each assignment; then the search is exponential only in the
// number of host cells that carry its devices or networks (and, under the
// socket policy, in the number of sockets). A request
// without a NUMA topology fits with a placement without cells, carrying its
// memory, vCPUs and devices, taken with no NUMA affinity. Either way the
// guest must fit the host's host-level limits (FitsHost). No fit is a
// *NoFitError.
func Fit(h *Host, r *Request) (*Placement, error) {
	p := &Placement{EmulatorPolicy: r.EmulatorPolicy, RealtimeVCPUs: r.RealtimeVCPUs,
		RealtimePriority: r.RealtimePriority, HostSharedSet: h.SharedSet}
	d := newDeviceNeeds(h, r)
	if !r.HasNUMA() {
		p.MemoryMB, p.VCPUs, p.FloatCPUs = r.MemoryMB, r.VCPUs, h.SharedCPUs()
		if err := h.FitsHost(p.HostUsage()); err != nil {
			return nil, err
		}
		takes, miss := d.take(nil)
		if miss != nil {
			return nil, &NoFitError{Resource: ResourceDevices, Reason: d.why(nil)}
		}
		p.Devices = takes
		return p, nil
	}
	k, n := len(r.Cells), len(h.Cells)
	if n < k {
		return nil, &NoFitError{Reason: fmt.Sprintf("the guest has %d NUMA cells but the host only %d", k, n), Resource: ResourceCells}
	}
	m := newMatcher(h, r, h.cellOrder(r))
	var assign []int
	var err error
	if d.constrained() {
		assign, err = m.solveWith(d)
	} else {
		assign, err = m.solve()
	}
	if err != nil {
		return nil, err
	}
	p.Cells = make([]PlacedCell, k)
	for i, pos := range assign {
		p.Cells[i] = m.place(i, pos)
	}
	if err := h.FitsHost(p.HostUsage()); err != nil {
		return nil, err
	}
	p.Devices, _ = d.take(m.hostIDs(assign))
	return p, nil
}

// cellView is what pinning needs to know about a host cell, computed once
// per Fit: free pCPUs and, per sibling group, how many of its threads are
// free.
type cellView struct {
	cell        *Cell
	free        CPUSet
	freeInGroup []int32 // free threads per sibling group, in sibling order
	groupSize   []int32
	perCore     int // threads per core
	totalFree   int // free threads over all sibling groups
	fullyFree   int // groups with every thread free
	maxFree     int // the most free threads in one group
}

func newCellView(c *Cell) *cellView {
	n := len(c.Siblings)
	counts := make([]int32, 2*n) // one allocation for both
	v := &cellView{cell: c, free: c.FreePCPUs(), perCore: c.ThreadsPerCore(),
		freeInGroup: counts[:n:n], groupSize: counts[n:]}
	for i, s := range c.Siblings {
		nf := countIntersection(s, v.free)
		v.freeInGroup[i], v.groupSize[i] = int32(nf), int32(s.Len())
		v.totalFree += nf
		v.maxFree = max(v.maxFree, nf)
		if nf > 0 && int32(nf) == v.groupSize[i] {
			v.fullyFree++
		}
	}
	return v
}

func countIntersection(a, b CPUSet) int {
	n := 0
	for i := 0; i < len(a.words) && i < len(b.words); i++ {
		n += bits.OnesCount64(a.words[i] & b.words[i])
	}
	return n
}

// groupsWithFree counts the sibling groups with at least t free threads.
func (v *cellView) groupsWithFree(t int) int {
	n := 0
	for _, nf := range v.freeInGroup {
		if int(nf) >= t {
			n++
		}
	}
	return n
}

// fit decides whether guest cell g fits this host cell with `reserved`
// extra pCPUs for emulator threads. It returns the page size chosen (0 when
// none was requested) or why it does not fit. The checks and their order
// are Nova's _numa_fit_instance_cell.
func (v *cellView) fit(g *GuestCell, reserved int, limits *Limits) (int64, *CellMiss) {
	c := v.cell
	miss := func(res Resource, format string, args ...any) (int64, *CellMiss) {
		return 0, &CellMiss{GuestCell: g.ID, HostCell: c.ID, Resource: res, Detail: fmt.Sprintf(format, args...)}
	}
	memKB := g.MemoryMB * 1024
	var pageSize int64
	if g.PageSize != 0 {
		pageSize = v.choosePageSize(g.PageSize, memKB)
		if pageSize == 0 {
			return miss(ResourcePages, "no %s page pool holds %d MiB free (pools: %s)", pageRequestName(g.PageSize), g.MemoryMB, poolSummary(c.Pages))
		}
	} else if small := c.smallestPage(); small != 0 {
		pool := c.pagePool(small)
		if memKB > pool.Total*small || memKB%small != 0 {
			return miss(ResourceMemory, "needs %d MiB, the cell has %d MiB of %d KiB pages", g.MemoryMB, pool.Total*small/1024, small)
		}
	} else if g.MemoryMB > c.MemoryMB {
		return miss(ResourceMemory, "needs %d MiB, the cell has %d MiB", g.MemoryMB, c.MemoryMB)
	}

	pinned := g.CPUPolicy.Pinned()
	dedicated := g.DedicatedVCPUs.Len()
	shared := g.SharedVCPUs.Len()
	if pinned && dedicated+reserved > c.PCPUs.Len() {
		return miss(ResourcePCPUs, "needs %d pCPUs, the cell has %d", dedicated+reserved, c.PCPUs.Len())
	}
	if !pinned || g.CPUPolicy == CPUPolicyMixed {
		if shared > c.CPUs.Len() {
			return miss(ResourceCPUs, "needs %d shared CPUs, the cell has %d", shared, c.CPUs.Len())
		}
	}
	if pinned {
		if free := v.free.Len(); dedicated+reserved > free {
			return miss(ResourcePCPUs, "needs %d free pCPUs, %d are free", dedicated+reserved, free)
		}
		if g.MemoryMB > c.AvailMemoryMB() {
			return miss(ResourceMemory, "needs %d MiB, %d MiB are free", g.MemoryMB, c.AvailMemoryMB())
		}
		if why := v.packable(g.ThreadPolicy, dedicated, reserved); why != "" {
			return miss(ResourceThreads, "%s", why)
		}
	}
	if (!pinned || g.CPUPolicy == CPUPolicyMixed) && limits != nil {
		if usage, limit := float64(c.CPUUsage+shared), float64(c.CPUs.Len())*limits.CPUAllocationRatio; usage > limit {
			return miss(ResourceCPUs, "shared CPU usage would be %.0f, above the limit %.1f", usage, limit)
		}
		if usage, limit := float64(c.MemoryUsedMB+g.MemoryMB), float64(c.MemoryMB)*limits.RAMAllocationRatio; usage > limit {
			return miss(ResourceMemory, "memory usage would be %.0f MiB, above the limit %.1f MiB", usage, limit)
		}
	}
	return pageSize, nil
}

// choosePageSize returns the largest allowed page size whose free pages
// hold memKB exactly, or 0. Each host cell resolves the request on its own
// (Nova resolves large/any once, on the first cell it tries).
func (v *cellView) choosePageSize(req PageSize, memKB int64) int64 {
	c := v.cell
	sizes := make([]int64, 0, 4)
	for _, p := range c.Pages {
		sizes = append(sizes, p.SizeKB)
	}
	sortDesc(sizes)
	switch req {
	case PageSizeSmall:
		if len(sizes) > 0 {
			sizes = sizes[len(sizes)-1:]
		}
	case PageSizeLarge:
		if len(sizes) > 0 {
			sizes = sizes[:len(sizes)-1]
		}
	case PageSizeAny:
	default:
		sizes = []int64{int64(req)}
	}
	for _, size := range sizes {
		pool := c.pagePool(size)
		if pool != nil && memKB <= pool.Free()*size && memKB%size == 0 {
			return size
		}
	}
	return 0
}

func sortDesc(s []int64) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] > s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func pageRequestName(p PageSize) string {
	if p > 0 {
		return fmt.Sprintf("%d KiB", int64(p))
	}
	return p.String()
}

func poolSummary(pools []PagePool) string {
	if len(pools) == 0 {
		return "none"
	}
	parts := make([]string, len(pools))
	for i, p := range pools {
		parts[i] = fmt.Sprintf("%d KiB: %d free", p.SizeKB, p.Free())
	}
	return strings.Join(parts, ", ")
}

// packable says why `vcpus` pinned vCPUs plus `reserved` emulator pCPUs
// cannot be packed onto the cell's free threads under the thread policy, or
// "" when they can.
func (v *cellView) packable(policy ThreadPolicy, vcpus, reserved int) string {
	if vcpus == 0 {
		// Nova never fits a pinned guest cell without dedicated vCPUs
		// (an all-shared cell of a mixed guest); neither do we.
		return "a cell of a dedicated or mixed guest needs at least one dedicated vCPU"
	}
	switch policy {
	case ThreadPolicyIsolate:
		if v.groupsWithFree(v.perCore) == 0 {
			return "isolate needs a core with every thread free; there is none"
		}
		// Nova refuses isolate on SMT cells configured with
		// cpu_dedicated_set (bug 1889633); placement filters such hosts
		// out through the HW_CPU_HYPERTHREADING trait.
		if v.perCore != 1 && !v.cell.PCPUs.Equal(v.cell.CPUs) {
			return "isolate cannot use an SMT cell whose pcpuset differs from its cpuset"
		}
		cores := v.groupsWithFree(v.perCore)
		if cores < vcpus {
			return fmt.Sprintf("isolate needs %d free cores, %d are free", vcpus, cores)
		}
		// The emulator pCPU takes a whole free core too: the claim
		// consumes the sibling sets of everything an isolated guest holds.
		if reserved > 0 && v.fullyFree-vcpus < reserved {
			return fmt.Sprintf("isolate with emulator isolate needs %d free cores, %d are free", vcpus+reserved, v.fullyFree)
		}
		return ""
	case ThreadPolicyRequire:
		if v.perCore <= 1 {
			return "require needs SMT siblings; the cell has one thread per core"
		}
		if v.requireThreads(vcpus) == 0 {
			return fmt.Sprintf("require needs %d vCPUs on cores with 2 or more free threads; there are not enough", vcpus)
		}
	default:
		if v.preferThreads(vcpus) < 0 && v.totalFree < vcpus {
			return fmt.Sprintf("needs %d free threads, %d are free", vcpus, v.totalFree)
		}
	}
	if v.totalFree-vcpus < reserved {
		return fmt.Sprintf("needs %d more free threads for emulator threads, none is left", reserved)
	}
	return ""
}

// preferThreads returns how many threads per core pinning takes: the
// largest t such that cores with t free threads hold every vCPU, or -1 when
// no t works (then pinning spreads over any free threads).
func (v *cellView) preferThreads(vcpus int) int {
	for t := v.maxFree; t >= 1; t-- {
		if t*v.groupsWithFree(t) >= vcpus {
			return t
		}
	}
	return -1
}

// requireThreads is preferThreads limited to t >= 2; 0 when none works.
func (v *cellView) requireThreads(vcpus int) int {
	for t := v.maxFree; t >= 2; t-- {
		if t*v.groupsWithFree(t) >= vcpus {
			return t
		}
	}
	return 0
}

// pin chooses the pCPUs of a guest cell known to fit: vCPUs in ascending
// order onto the first t free threads of each core with at least t free,
// in sibling order (Nova's packing), then the emulator pCPU.
func (v *cellView) pin(g *GuestCell, reserved int) (map[int]int, CPUSet) {
	vcpus := g.DedicatedVCPUs.List()
	pins := make(map[int]int, len(vcpus))
	var used cpuSetBuilder
	take := func(pcpu int) {
		pins[vcpus[len(pins)]] = pcpu
		used.add(pcpu)
	}
	c := v.cell
	switch g.ThreadPolicy {
	case ThreadPolicyIsolate:
		for i, s := range c.Siblings {
			if len(pins) == len(vcpus) {
				break
			}
			if int(v.freeInGroup[i]) >= v.perCore {
				take(s.Min())
			}
		}
	default:
		t := v.preferThreads(len(vcpus))
		if g.ThreadPolicy == ThreadPolicyRequire {
			t = v.requireThreads(len(vcpus))
		}
		for i, s := range c.Siblings {
			if len(pins) == len(vcpus) {
				break
			}
			if t > 0 && int(v.freeInGroup[i]) < t {
				continue
			}
			taken := 0
			for _, id := range s.Intersection(v.free).List() {
				if len(pins) == len(vcpus) || (t > 0 && taken == t) {
					break
				}
				take(id)
				taken++
			}
		}
	}
	usedSet := used.set()
	if reserved == 0 {
		return pins, CPUSet{}
	}
	var res cpuSetBuilder
	got := 0
	for i, s := range c.Siblings {
		if got == reserved {
			break
		}
		if g.ThreadPolicy == ThreadPolicyIsolate {
			if v.freeInGroup[i] == v.groupSize[i] && !s.Intersects(usedSet) {
				res.add(s.Min())
				got++
			}
			continue
		}
		for _, id := range s.Intersection(v.free).Difference(usedSet).List() {
			if got == reserved {
				break
			}
			res.add(id)
			got++
		}
	}
	return pins, res.set()
}

// matcher assigns guest cells to host cells. fits is filled lazily: most
// fits are decided after looking at a few pairs.
type matcher struct {
	host  *Host
	req   *Request
	order []int // host cell indexes in the order Nova tries them
	views []*cellView
	state [][]fitState
	// shape maps each guest cell to the first guest cell with identical
	// requirements, so identical cells share one fit decision per host cell.
	shape []int
}

type fitState struct {
	known    bool
	pageSize int64
	miss     *CellMiss
}

func newMatcher(h *Host, r *Request, order []int) *matcher {
	k := len(r.Cells)
	m := &matcher{host: h, req: r, order: order, views: make([]*cellView, len(order)),
		state: make([][]fitState, k), shape: make([]int, k)}
	for i := range r.Cells {
		m.state[i] = make([]fitState, len(order))
		m.shape[i] = i
		for j := 1; j < i; j++ { // guest cell 0 may carry the emulator pCPU
			if sameShape(&r.Cells[i], &r.Cells[j]) {
				m.shape[i] = j
				break
			}
		}
	}
	return m
}

func sameShape(a, b *GuestCell) bool {
	return a.SharedVCPUs.Len() == b.SharedVCPUs.Len() && a.DedicatedVCPUs.Len() == b.DedicatedVCPUs.Len() &&
		a.MemoryMB == b.MemoryMB && a.PageSize == b.PageSize && a.CPUPolicy == b.CPUPolicy && a.ThreadPolicy == b.ThreadPolicy
}

func (m *matcher) view(pos int) *cellView {
	if m.views[pos] == nil {
		m.views[pos] = newCellView(&m.host.Cells[m.order[pos]])
	}
	return m.views[pos]
}

func (m *matcher) reserved(guest int) int {
	if guest == 0 && m.req.EmulatorPolicy == EmulatorPolicyIsolate {
		return 1
	}
	return 0
}

// fits reports whether guest cell i fits the host cell at position pos.
func (m *matcher) fits(i, pos int) bool {
	s := &m.state[m.shape[i]][pos]
	if !s.known {
		shape := m.shape[i]
		s.pageSize, s.miss = m.view(pos).fit(&m.req.Cells[shape], m.reserved(shape), m.host.Limits)
		s.known = true
	}
	return s.miss == nil
}

// solve returns, per guest cell, the position of its host cell: the
// lexicographically first complete assignment.
func (m *matcher) solve() ([]int, error) {
	assign := make([]int, len(m.req.Cells))
	if !m.extend(0, make([]bool, len(m.order)), assign) {
		return nil, m.noFit()
	}
	return assign, nil
}

// completable reports whether guest cells from..k-1 can each get a
// distinct unused host cell (Kuhn's augmenting paths).
func (m *matcher) completable(from int, used []bool) bool {
	k, n := len(m.req.Cells), len(m.order)
	if from == k {
		return true
	}
	owner := make([]int, n)
	for i := range owner {
		owner[i] = -1
	}
	var augment func(g int, seen []bool) bool
	augment = func(g int, seen []bool) bool {
		for pos := 0; pos < n; pos++ {
			if used[pos] || seen[pos] || !m.fits(g, pos) {
				continue
			}
			seen[pos] = true
			if owner[pos] < 0 || augment(owner[pos], seen) {
				owner[pos] = g
				return true
			}
		}
		return false
	}
	seen := make([]bool, n)
	for g := from; g < k; g++ {
		clear(seen)
		if !augment(g, seen) {
			return false
		}
	}
	return true
}

// noFit explains a failed solve.
func (m *matcher) noFit() error {
	k, n := len(m.req.Cells), len(m.order)
	var misses []CellMiss
	for i := 0; i < k; i++ {
		any := false
		for pos := 0; pos < n; pos++ {
			if m.fits(i, pos) {
				any = true
			}
		}
		if any {
			continue
		}
		for pos := 0; pos < n; pos++ {
			miss := *m.state[m.shape[i]][pos].miss
			miss.GuestCell = i
			misses = append(misses, miss)
		}
	}
	if len(misses) > 0 {
		return &NoFitError{Reason: "a guest cell fits no host cell", Misses: misses}
	}
	return &NoFitError{Reason: fmt.Sprintf("each of the %d guest cells fits some host cell, but no %d distinct host cells take them all", k, k), Resource: ResourceCells}
}

// place builds guest cell i's placement on the host cell at position pos.
func (m *matcher) place(i, pos int) PlacedCell {
	g := &m.req.Cells[i]
	v := m.view(pos)
	pc := PlacedCell{GuestCell: i, HostCell: v.cell.ID, SharedVCPUs: g.SharedVCPUs, DedicatedVCPUs: g.DedicatedVCPUs,
		MemoryMB: g.MemoryMB, PageSizeKB: m.state[m.shape[i]][pos].pageSize, CPUPolicy: g.CPUPolicy, ThreadPolicy: g.ThreadPolicy}
	if !g.SharedVCPUs.IsEmpty() {
		pc.HostCPUs = v.cell.CPUs
	}
	if g.CPUPolicy.Pinned() {
		pc.Pins, pc.Reserved = v.pin(g, m.reserved(i))
	}
	return pc
}
