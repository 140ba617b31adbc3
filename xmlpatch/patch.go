package xmlpatch

import (
	"encoding/xml"
	"sort"
	"strconv"
	"strings"

	"github.com/pinflow/pinflow/numa"
)

// plan is what Patch writes for one placement on one domain.
type plan struct {
	vcpuPins     []numa.CPUSet // by vCPU
	emulator     numa.CPUSet
	iothreadIDs  []int
	realtime     bool        // rewrite <vcpusched>
	sched        map[int]int // realtime vCPU -> priority, when realtime
	memory       numa.CPUSet // union of the host cells
	memnodes     map[int]int // guest cell -> host cell; empty for an implicit cell
	memnodeOrder []int
}

// Patch returns domainXML with its <cputune> pins and <numatune> rewritten
// for placement p; every other byte of the document is kept as it was.
//
// Each vCPU gets a <vcpupin>: a dedicated vCPU its pCPU, a shared vCPU of
// a mixed guest its host cell's shared CPUs. <emulatorpin> and every I/O
// thread's <iothreadpin> get p.EmulatorPCPUs(). When p names realtime
// vCPUs, every <vcpusched> is replaced by fifo elements at
// p.RealtimePriority (when 0: the domain's priority for that vCPU, else
// numa.DefaultRealtimePriority); otherwise the source's are kept, and the
// emulator avoids the pCPUs of the source's realtime vCPUs. <numatune> gets the union of the host
// cells as <memory> nodeset and each guest cell's host cell as its
// <memnode> nodeset, keeping their modes (strict where new). Other children
// of <cputune> and <numatune> (shares, quota, cachetune, ...) are kept.
//
// Guest NUMA cells never change: a placement whose guest cells or vCPU
// count differ from the domain's is an ErrMismatch, not a rewrite.
//
// The source address of each device element pinflow wrote (user alias
// DeviceAlias(r, i)) becomes the i-th device p takes for PCI request r;
// every device p takes must have its element. A placement without NUMA
// cells decides no pins: its FloatCPUs become <vcpu cpuset> (kept as they
// are when it has none) and its devices are rewritten.
func Patch(domainXML string, p *numa.Placement) (string, error) {
	if p == nil {
		return "", badPlacement("no placement given")
	}
	d, err := parseDomain(domainXML)
	if err != nil {
		return "", err
	}
	var pl *plan
	if p.HasNUMA() {
		if pl, err = d.plan(p); err != nil {
			return "", err
		}
	} else if err := p.Check(); err != nil {
		return "", badPlacement("%v", err)
	}
	devices, err := d.planDevices(p)
	if err != nil {
		return "", err
	}
	edits, err := d.deviceEdits(devices)
	if err != nil {
		return "", err
	}
	if !p.HasNUMA() && !p.FloatCPUs.IsEmpty() {
		// Nova's <vcpu cpuset>: the vCPUs and the emulator of a guest
		// without pins run on its host's shared CPUs alone.
		edits = append(edits, rewriteAttr(d.vcpu, "cpuset", p.FloatCPUs.String()))
	}
	out := d.apply(pl, edits)
	// The splice keeps bytes it did not write, so a document that parsed
	// before parses after; check anyway rather than hand on broken XML.
	if _, err := parseTree(out); err != nil {
		return "", malformed("patched document does not parse: %v", err)
	}
	return out, nil
}

// checkPlacement rejects ids that numa.CPUSet cannot hold before any set
// is built from them, then checks the placement's own consistency.
func checkPlacement(p *numa.Placement) error {
	for _, c := range p.Cells {
		if c.GuestCell < 0 || c.GuestCell > numa.MaxCPU {
			return badPlacement("guest cell %d: allowed ids are 0-%d", c.GuestCell, numa.MaxCPU)
		}
		if c.HostCell < 0 || c.HostCell > numa.MaxCPU {
			return badPlacement("guest cell %d has no host cell (host_cell %d); allowed host cells are 0-%d", c.GuestCell, c.HostCell, numa.MaxCPU)
		}
		for v, pc := range c.Pins {
			if v < 0 || v > numa.MaxCPU || pc < 0 || pc > numa.MaxCPU {
				return badPlacement("guest cell %d: pin vCPU %d -> pCPU %d: allowed ids are 0-%d", c.GuestCell, v, pc, numa.MaxCPU)
			}
		}
	}
	if err := p.Check(); err != nil {
		return badPlacement("%v", err)
	}
	if p.RealtimePriority < 0 || p.RealtimePriority > 99 {
		return badPlacement("realtime priority %d: allowed priorities are 1-99 (0 keeps the domain's)", p.RealtimePriority)
	}
	return nil
}

func (d *domain) plan(p *numa.Placement) (*plan, error) {
	if err := checkPlacement(p); err != nil {
		return nil, err
	}
	all := numa.Range(0, d.vcpus-1)
	var placed numa.CPUSet
	for _, c := range p.Cells {
		placed = placed.Union(c.SharedVCPUs).Union(c.DedicatedVCPUs)
	}
	if !placed.Equal(all) {
		return nil, mismatch("the domain's <vcpu> is %d (vCPUs %s) but the placement places vCPUs %q; they must be the same", d.vcpus, all, placed)
	}
	pl := &plan{vcpuPins: make([]numa.CPUSet, d.vcpus), iothreadIDs: d.iothreadIDs, memnodes: map[int]int{}}
	if err := d.matchCells(p, pl); err != nil {
		return nil, err
	}
	for _, c := range p.Cells {
		for v, pc := range c.Pins {
			pl.vcpuPins[v] = numa.NewCPUSet(pc)
		}
		if !c.SharedVCPUs.IsEmpty() {
			if c.HostCPUs.IsEmpty() {
				return nil, badPlacement("guest cell %d: shared vCPUs %s need the host cell's shared CPUs (host_cpuset), which the placement lacks", c.GuestCell, c.SharedVCPUs)
			}
			for _, v := range c.SharedVCPUs.List() {
				pl.vcpuPins[v] = c.HostCPUs
			}
		}
		pl.memory = pl.memory.Union(numa.NewCPUSet(c.HostCell))
	}
	if d.numatune != nil {
		for _, el := range d.numatune.children {
			if el.kind == elementNode && (el.name == "memory" || el.name == "memnode") {
				if err := checkMode(el); err != nil {
					return nil, err
				}
			}
		}
	}
	src, err := d.sched()
	if err != nil {
		return nil, err
	}
	// Emulator threads avoid realtime vCPUs' pCPUs; without realtime in
	// the placement, the guest's realtime vCPUs are the domain's.
	emu := *p
	if p.RealtimeVCPUs.IsEmpty() {
		emu.RealtimeVCPUs, _ = realtimeOf(src)
	} else {
		if !p.RealtimeVCPUs.IsSubsetOf(all) {
			return nil, mismatch("realtime vCPUs %q are not all vCPUs of the domain (%s)", p.RealtimeVCPUs, all)
		}
		pl.realtime = true
		pl.sched = map[int]int{}
		for _, v := range p.RealtimeVCPUs.List() {
			prio := p.RealtimePriority
			if prio == 0 {
				prio = numa.DefaultRealtimePriority
				if s, ok := src[v]; ok && (s.Scheduler == "fifo" || s.Scheduler == "rr") && s.Priority > 0 {
					prio = s.Priority
				}
			}
			pl.sched[v] = prio
		}
	}
	pl.emulator = emu.EmulatorPCPUs()
	if pl.emulator.IsEmpty() {
		return nil, badPlacement("the placement leaves no pCPU for the emulator threads")
	}
	return pl, nil
}

// matchCells checks that the placement's guest cells are the domain's and
// records each one's host cell.
func (d *domain) matchCells(p *numa.Placement, pl *plan) error {
	if d.cells == nil {
		// Without <cpu><numa> the guest is one implicit cell: libvirt has no
		// memnode for it, so only <memory> is written.
		c := p.Cells[0]
		if len(p.Cells) != 1 || c.GuestCell != 0 {
			return mismatch("the domain has no guest NUMA cells (<cpu><numa>) but the placement has %d, the first with id %d; allowed is one cell 0", len(p.Cells), c.GuestCell)
		}
		if d.hasMemory && (c.MemoryMB > 1<<40 || uint64(c.MemoryMB)*1024 != d.memoryKiB) {
			return mismatch("guest cell 0: the placement has %d MiB but the domain's <memory> is %d KiB; they must be equal", c.MemoryMB, d.memoryKiB)
		}
		return nil
	}
	if len(p.Cells) != len(d.cells) {
		return mismatch("the placement has %d guest cells (%s) but the domain %d; guest cells must not change", len(p.Cells), placedIDs(p), len(d.cells))
	}
	byID := map[int]*numa.PlacedCell{}
	for i := range p.Cells {
		byID[p.Cells[i].GuestCell] = &p.Cells[i]
	}
	for _, gc := range d.cells {
		c, ok := byID[gc.id]
		if !ok {
			return mismatch("guest cell %d of the domain has no host cell in the placement (it places guest cells %s)", gc.id, placedIDs(p))
		}
		vcpus := c.SharedVCPUs.Union(c.DedicatedVCPUs)
		if !vcpus.Equal(gc.vcpus) {
			return mismatch("guest cell %d: the placement gives it vCPUs %q but the domain's <cell cpus='%s'>; guest cells must not change", gc.id, vcpus, gc.rawCPUs)
		}
		if c.MemoryMB > 1<<40 || uint64(c.MemoryMB)<<20 != gc.bytes {
			return mismatch("guest cell %d: the placement gives it %d MiB but the domain's cell has %d KiB; guest cells must not change", gc.id, c.MemoryMB, gc.bytes/1024)
		}
		pl.memnodes[gc.id] = c.HostCell
		pl.memnodeOrder = append(pl.memnodeOrder, gc.id)
	}
	sort.Ints(pl.memnodeOrder)
	return nil
}

func placedIDs(p *numa.Placement) string {
	ids := make([]string, len(p.Cells))
	for i, c := range p.Cells {
		ids[i] = strconv.Itoa(c.GuestCell)
	}
	return strings.Join(ids, ",")
}

// edit replaces doc[from:to] with text.
type edit struct {
	from, to int
	text     string
}

// apply splices the planned <cputune> and <numatune> (none when pl is
// nil) and the device edits into the document.
func (d *domain) apply(pl *plan, edits []edit) string {
	if pl != nil {
		edits = append(edits, d.pinEdits(pl)...)
	}
	// An insertion (to == from) goes before a replacement starting there.
	sort.Slice(edits, func(i, j int) bool {
		if edits[i].from != edits[j].from {
			return edits[i].from < edits[j].from
		}
		return edits[i].to < edits[j].to
	})
	var sb strings.Builder
	at := 0
	for _, e := range edits {
		sb.WriteString(d.doc[at:e.from])
		sb.WriteString(e.text)
		at = e.to
	}
	sb.WriteString(d.doc[at:])
	return sb.String()
}

// pinEdits write the planned <cputune> and <numatune>.
func (d *domain) pinEdits(pl *plan) []edit {
	var edits []edit
	cputune := d.cputuneText(pl)
	numatune := d.numatuneText(pl)
	switch {
	case d.cputune != nil && d.numatune != nil:
		edits = append(edits, edit{d.cputune.start, d.cputune.end, cputune}, edit{d.numatune.start, d.numatune.end, numatune})
	case d.cputune != nil:
		ws := lineBreak(d.doc, d.cputune.start)
		edits = append(edits, edit{d.cputune.start, d.cputune.end, cputune + ws + numatune})
	default:
		anchor := d.cputuneAnchor()
		ws := lineBreak(d.doc, anchor.start)
		text := ws + cputune
		if d.numatune == nil {
			text += ws + numatune
		} else {
			edits = append(edits, edit{d.numatune.start, d.numatune.end, numatune})
		}
		edits = append(edits, edit{anchor.end, anchor.end, text})
	}
	return edits
}

// cputuneAnchor returns the element a new <cputune> follows: the last of
// those libvirt writes just before it.
func (d *domain) cputuneAnchor() *node {
	anchor := d.vcpu
	for _, c := range d.root.children {
		switch c.name {
		case "vcpu", "vcpus", "iothreads", "iothreadids", "defaultiothread":
			if c.kind == elementNode && c.end > anchor.end {
				anchor = c
			}
		}
	}
	return anchor
}

// lineBreak returns what separates the element at offset from its previous
// sibling: a newline and its indentation, or nothing in a compact document.
func lineBreak(doc string, offset int) string {
	if indent, ok := indentOf(doc, offset); ok && offset > 0 {
		return "\n" + indent
	}
	return ""
}

func (d *domain) cputuneText(pl *plan) string {
	var kids []string
	for v, set := range pl.vcpuPins {
		kids = append(kids, element("vcpupin", "vcpu", strconv.Itoa(v), "cpuset", set.String()))
	}
	kids = append(kids, element("emulatorpin", "cpuset", pl.emulator.String()))
	for _, id := range pl.iothreadIDs {
		kids = append(kids, element("iothreadpin", "iothread", strconv.Itoa(id), "cpuset", pl.emulator.String()))
	}
	if pl.realtime {
		kids = append(kids, schedElements(pl.sched)...)
	}
	owned := func(n *node) bool {
		switch n.name {
		case "vcpupin", "emulatorpin", "iothreadpin":
			return true
		case "vcpusched":
			return pl.realtime
		}
		return false
	}
	return d.rewrite(d.cputune, "cputune", owned, kids)
}

// schedElements writes one fifo <vcpusched> per priority, its vCPUs as a
// range list, as Nova does.
func schedElements(sched map[int]int) []string {
	byPrio := map[int][]int{}
	var prios []int
	for v, pr := range sched {
		if byPrio[pr] == nil {
			prios = append(prios, pr)
		}
		byPrio[pr] = append(byPrio[pr], v)
	}
	sort.Ints(prios)
	var out []string
	for _, pr := range prios {
		out = append(out, element("vcpusched", "vcpus", numa.NewCPUSet(byPrio[pr]...).String(),
			"scheduler", "fifo", "priority", strconv.Itoa(pr)))
	}
	return out
}

func (d *domain) numatuneText(pl *plan) string {
	var kids []string
	var oldMemory *node
	oldNodes := map[int]*node{}
	if d.numatune != nil {
		if m := d.numatune.elements("memory"); len(m) > 0 {
			oldMemory = m[0]
		}
		for _, el := range d.numatune.elements("memnode") {
			v, _ := el.attr("cellid")
			if id, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && oldNodes[id] == nil {
				oldNodes[id] = el
			}
		}
	}
	kids = append(kids, policyElement("memory", oldMemory, []string{"mode", "strict"}, pl.memory.String()))
	for _, id := range pl.memnodeOrder {
		kids = append(kids, policyElement("memnode", oldNodes[id], []string{"cellid", strconv.Itoa(id), "mode", "strict"},
			strconv.Itoa(pl.memnodes[id])))
	}
	owned := func(n *node) bool { return n.name == "memory" || n.name == "memnode" }
	return d.rewrite(d.numatune, "numatune", owned, kids)
}

// policyElement writes a <memory> or <memnode> with the given nodeset.
// An existing element keeps its attributes and their order, nodeset
// replaced in place; placement='auto' goes, as it excludes a nodeset. A new
// one gets fresh and then the nodeset. A memnode must have a mode: strict
// when it had none.
func policyElement(name string, old *node, fresh []string, nodeset string) string {
	if old == nil {
		return element(name, append(fresh, "nodeset", nodeset)...)
	}
	var kv []string
	hasMode, hasNodeset := false, false
	for _, a := range old.attrs {
		n := qname(a.Name)
		switch {
		case n == "nodeset":
			kv, hasNodeset = append(kv, n, nodeset), true
		case n == "placement" && strings.TrimSpace(a.Value) == "auto":
		default:
			hasMode = hasMode || n == "mode"
			kv = append(kv, n, a.Value)
		}
	}
	if name == "memnode" && !hasMode {
		kv = append(kv, "mode", "strict")
	}
	if !hasNodeset {
		kv = append(kv, "nodeset", nodeset)
	}
	return element(name, kv...)
}

// element writes an empty element with attributes in libvirt's style
// (single quotes), escaping every value.
func element(name string, kv ...string) string {
	var sb strings.Builder
	sb.WriteString("<" + name)
	for i := 0; i+1 < len(kv); i += 2 {
		sb.WriteString(" " + kv[i] + "='")
		// EscapeText escapes quotes, <, >, &, and line breaks.
		_ = xml.EscapeText(&sb, []byte(kv[i+1]))
		sb.WriteString("'")
	}
	sb.WriteString("/>")
	return sb.String()
}

// rewrite returns element el with its owned children replaced by kids,
// placed where the first owned child was (at the end when none was), and
// every other child and its preceding whitespace kept. A nil el yields a
// new element indented like its would-be position.
func (d *domain) rewrite(el *node, name string, owned func(*node) bool, kids []string) string {
	var sb strings.Builder
	if el == nil {
		// A new element is a sibling of the anchor and indented like it.
		br := lineBreak(d.doc, d.cputuneAnchor().start)
		sb.WriteString("<" + name + ">")
		for _, k := range kids {
			if br != "" {
				sb.WriteString(br + "  ")
			}
			sb.WriteString(k)
		}
		sb.WriteString(br)
		sb.WriteString("</" + name + ">")
		return sb.String()
	}
	start := d.doc[el.start:el.inner]
	selfClosing := el.inner == el.end
	if selfClosing {
		start = strings.TrimSuffix(start, "/>") + ">"
	}
	sb.WriteString(start)
	// kidWS is the whitespace before each new child: what stood before the
	// first owned child, else before the last element child, else a fresh
	// indentation one level deeper than el.
	kidWS := ""
	if br := lineBreak(d.doc, el.start); br != "" {
		kidWS = br + "  "
	}
	for _, c := range el.children {
		if c.kind == elementNode {
			kidWS = precedingBlank(d.doc, el, c)
		}
	}
	inserted := false
	pending := ""
	insert := func(ws string) {
		for _, k := range kids {
			sb.WriteString(ws + k)
		}
		inserted = true
	}
	for _, c := range el.children {
		switch {
		case c.isBlank(d.doc):
			pending += d.doc[c.start:c.end]
		case c.kind == elementNode && owned(c):
			if !inserted {
				insert(pending)
			}
			pending = ""
		default:
			// Text keeps its trailing whitespace apart, as the indentation
			// of whatever follows.
			raw := d.doc[c.start:c.end]
			body := raw
			if c.kind == textNode {
				body = strings.TrimRight(raw, " \t\r\n")
			}
			sb.WriteString(pending + body)
			pending = raw[len(body):]
		}
	}
	closeBR := ""
	if !inserted {
		insert(kidWS)
		// New last children on their own lines put the end tag on its own.
		if br := lineBreak(d.doc, el.start); pending == "" && br != "" && strings.Contains(kidWS, "\n") {
			closeBR = br
		}
	}
	sb.WriteString(pending + closeBR)
	if selfClosing {
		sb.WriteString("</" + el.name + ">")
	} else {
		sb.WriteString(d.doc[el.innerEnd:el.end])
	}
	return sb.String()
}

// precedingBlank returns the whitespace directly before child c of el.
func precedingBlank(doc string, el, c *node) string {
	ws := ""
	for _, k := range el.children {
		if k == c {
			return ws
		}
		raw := doc[k.start:k.end]
		switch {
		case k.isBlank(doc):
			ws += raw
		case k.kind == textNode:
			ws = raw[len(strings.TrimRight(raw, " \t\r\n")):]
		default:
			ws = ""
		}
	}
	return ws
}
