package xmlpatch

import (
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"strconv"
	"strings"

	"github.com/pinflow/pinflow/numa"
)

// Sentinel errors; every error of this package wraps one of them.
var (
	// ErrMalformed marks a document that is not well-formed XML, not a
	// libvirt domain, or carries a value that cannot be read.
	ErrMalformed = errors.New("malformed domain XML")
	// ErrMismatch marks a placement that does not fit the domain: another
	// vCPU count or other guest NUMA cells.
	ErrMismatch = errors.New("placement does not match the domain")
	// ErrPlacement marks a placement that is unusable on its own.
	ErrPlacement = errors.New("unusable placement")
)

func malformed(format string, args ...any) error {
	return fmt.Errorf("xmlpatch: %w: %s", ErrMalformed, oneLine(fmt.Sprintf(format, args...)))
}

func mismatch(format string, args ...any) error {
	return fmt.Errorf("xmlpatch: %w: %s", ErrMismatch, oneLine(fmt.Sprintf(format, args...)))
}

func badPlacement(format string, args ...any) error {
	return fmt.Errorf("xmlpatch: %w: %s", ErrPlacement, oneLine(fmt.Sprintf(format, args...)))
}

// oneLine escapes control characters, so that values quoted from the
// document keep an error message on one line.
func oneLine(s string) string {
	var sb strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&sb, `\x%02x`, r)
		default:
			sb.WriteRune(r)
		}
	}
	return sb.String()
}

// maxIOThreads bounds <iothreads>N</iothreads> so a hostile count cannot
// make Patch write millions of pins; libvirt's own limits are far lower.
const maxIOThreads = 4096

// domain is a parsed domain document and the elements pinning concerns.
type domain struct {
	doc      string
	root     *node
	vcpu     *node // never nil after parseDomain
	vcpus    int
	cputune  *node
	numatune *node
	// cells are the guest NUMA cells of <cpu><numa>; nil without them.
	cells []guestCell
	// iothreadIDs are the domain's I/O thread ids, ascending.
	iothreadIDs []int
	memoryKiB   uint64
	hasMemory   bool
}

// guestCell is one <cpu><numa><cell>.
type guestCell struct {
	id      int
	vcpus   numa.CPUSet
	bytes   uint64
	rawCPUs string
}

// parseDomain reads what Patch and Read need and rejects what they cannot
// work with.
func parseDomain(doc string) (*domain, error) {
	root, err := parseTree(doc)
	if err != nil {
		return nil, malformed("%v", err)
	}
	if root.name != "domain" {
		return nil, malformed("root element is <%s>; a libvirt domain's root is <domain>", root.name)
	}
	d := &domain{doc: doc, root: root}
	one := func(parent *node, name string) (*node, error) {
		els := parent.elements(name)
		if len(els) > 1 {
			return nil, malformed("<%s> has %d <%s> elements; at most one is allowed", parent.name, len(els), name)
		}
		if len(els) == 0 {
			return nil, nil
		}
		return els[0], nil
	}
	if d.vcpu, err = one(root, "vcpu"); err != nil {
		return nil, err
	}
	if d.vcpu == nil {
		return nil, malformed("the domain has no <vcpu> element; it must declare its vCPU count")
	}
	text := strings.TrimSpace(d.vcpu.textContent())
	n, err := strconv.Atoi(text)
	if err != nil || n < 1 || n > numa.MaxCPU+1 {
		return nil, malformed("<vcpu>%.20s</vcpu>: the vCPU count must be a whole number 1-%d", text, numa.MaxCPU+1)
	}
	d.vcpus = n
	if d.cputune, err = one(root, "cputune"); err != nil {
		return nil, err
	}
	if d.numatune, err = one(root, "numatune"); err != nil {
		return nil, err
	}
	if err := d.readCells(one); err != nil {
		return nil, err
	}
	if err := d.readIOThreads(one); err != nil {
		return nil, err
	}
	mem, err := one(root, "memory")
	if err != nil {
		return nil, err
	}
	if mem != nil {
		unit, _ := mem.attr("unit")
		b, err := ScaledBytes(strings.TrimSpace(mem.textContent()), unit)
		if err != nil {
			return nil, malformed("<memory>: %v", err)
		}
		d.memoryKiB, d.hasMemory = b/1024, true
	}
	return d, nil
}

func (d *domain) readCells(one func(*node, string) (*node, error)) error {
	cpu, err := one(d.root, "cpu")
	if err != nil || cpu == nil {
		return err
	}
	nm, err := one(cpu, "numa")
	if err != nil || nm == nil {
		return err
	}
	seen := map[int]bool{}
	for i, c := range nm.elements("cell") {
		gc := guestCell{id: i}
		if v, ok := c.attr("id"); ok {
			id, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || id < 0 || id > numa.MaxCPU {
				return malformed("<cell id='%.20s'>: the id must be a whole number 0-%d", v, numa.MaxCPU)
			}
			gc.id = id
		}
		if seen[gc.id] {
			return malformed("guest NUMA cell id %d appears twice in <cpu><numa>", gc.id)
		}
		seen[gc.id] = true
		gc.rawCPUs, _ = c.attr("cpus")
		if gc.vcpus, err = numa.Parse(gc.rawCPUs); err != nil {
			return malformed("<cell id='%d' cpus='%.40s'>: %v", gc.id, gc.rawCPUs, err)
		}
		mem, _ := c.attr("memory")
		unit, _ := c.attr("unit")
		if gc.bytes, err = ScaledBytes(mem, unit); err != nil {
			return malformed("<cell id='%d'> memory: %v", gc.id, err)
		}
		d.cells = append(d.cells, gc)
	}
	return nil
}

func (d *domain) readIOThreads(one func(*node, string) (*node, error)) error {
	ids, err := one(d.root, "iothreadids")
	if err != nil {
		return err
	}
	if ids != nil {
		seen := map[int]bool{}
		for _, t := range ids.elements("iothread") {
			v, _ := t.attr("id")
			id, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || id < 1 || id > maxIOThreads {
				return malformed("<iothread id='%.20s'>: the id must be a whole number 1-%d", v, maxIOThreads)
			}
			if !seen[id] {
				seen[id] = true
				d.iothreadIDs = append(d.iothreadIDs, id)
			}
		}
		sort.Ints(d.iothreadIDs)
	}
	count, err := one(d.root, "iothreads")
	if err != nil || count == nil {
		return err
	}
	text := strings.TrimSpace(count.textContent())
	n, err := strconv.Atoi(text)
	if err != nil || n < 0 || n > maxIOThreads {
		return malformed("<iothreads>%.20s</iothreads>: the count must be a whole number 0-%d", text, maxIOThreads)
	}
	// Without <iothreadids>, libvirt numbers the threads 1..N; with fewer
	// ids than N it adds the lowest unused ids.
	have := map[int]bool{}
	for _, id := range d.iothreadIDs {
		have[id] = true
	}
	for id := 1; len(d.iothreadIDs) < n; id++ {
		if !have[id] {
			d.iothreadIDs = append(d.iothreadIDs, id)
		}
	}
	sort.Ints(d.iothreadIDs)
	return nil
}

// units are libvirt's scaled-integer units, in lower case.
var units = map[string]uint64{
	"b": 1, "bytes": 1,
	"kb": 1000, "k": 1 << 10, "kib": 1 << 10,
	"mb": 1000 * 1000, "m": 1 << 20, "mib": 1 << 20,
	"gb": 1000 * 1000 * 1000, "g": 1 << 30, "gib": 1 << 30,
	"tb": 1000 * 1000 * 1000 * 1000, "t": 1 << 40, "tib": 1 << 40,
	"pb": 1000 * 1000 * 1000 * 1000 * 1000, "p": 1 << 50, "pib": 1 << 50,
	"eb": 1000 * 1000 * 1000 * 1000 * 1000 * 1000, "e": 1 << 60, "eib": 1 << 60,
}

// ScaledBytes converts a libvirt scaled integer, a memory amount and its
// unit attribute as in <memory unit='MiB'>512</memory>, to bytes. An empty
// unit is KiB, libvirt's default; units are case-insensitive. Its error
// names the bad value or unit and what is allowed.
func ScaledBytes(value, unit string) (uint64, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a whole number of %s", value, unitName(unit))
	}
	unit = strings.TrimSpace(unit)
	mult, ok := units[strings.ToLower(unit)]
	if unit == "" {
		mult, ok = 1024, true
	}
	if !ok {
		return 0, fmt.Errorf("unit %q: allowed units are b, bytes, KB, k, KiB, MB, M, MiB, GB, G, GiB, TB, T, TiB, PB, P, PiB, EB, E, EiB", unit)
	}
	hi, lo := bits.Mul64(n, mult)
	if hi != 0 {
		return 0, fmt.Errorf("%s %s overflows 64 bits of bytes", value, unit)
	}
	return lo, nil
}

func unitName(unit string) string {
	if unit == "" {
		return "KiB"
	}
	return unit
}

// Pins is the pinning a domain carries, as libvirt would apply it.
type Pins struct {
	// VCPUs is the vCPU count of <vcpu>.
	VCPUs int `json:"vcpus"`
	// DefaultCPUs is <vcpu cpuset>: where vCPUs without a vcpupin run.
	DefaultCPUs numa.CPUSet `json:"vcpu_cpuset,omitzero"`
	// VCPUPins maps a vCPU to the host CPUs of its <vcpupin>.
	VCPUPins map[int]numa.CPUSet `json:"vcpu_pins,omitempty"`
	// EmulatorPins is <emulatorpin cpuset>.
	EmulatorPins numa.CPUSet `json:"emulator_pins,omitzero"`
	// IOThreadPins maps an I/O thread id to the host CPUs of its <iothreadpin>.
	IOThreadPins map[int]numa.CPUSet `json:"iothread_pins,omitempty"`
	// Memory is <numatune><memory>; nil without one.
	Memory *MemoryPolicy `json:"memory,omitempty"`
	// MemNodes maps a guest cell id to its <numatune><memnode>.
	MemNodes map[int]MemoryPolicy `json:"memnodes,omitempty"`
	// Sched maps each vCPU named by a <vcpusched> to its scheduler; libvirt
	// writes one element per vCPU or one per range, so ranges are expanded.
	Sched map[int]Sched `json:"vcpu_sched,omitempty"`
	// RealtimeVCPUs are the vCPUs scheduled fifo or rr.
	RealtimeVCPUs numa.CPUSet `json:"realtime_vcpus,omitzero"`
	// RealtimePriority is the priority of every realtime vCPU when they
	// share one, otherwise 0 (Sched has each vCPU's).
	RealtimePriority int `json:"realtime_priority,omitempty"`
	// GuestCells are the guest NUMA cells of <cpu><numa>, in document order.
	GuestCells []GuestCell `json:"guest_cells,omitempty"`
}

// MemoryPolicy is a NUMA memory policy: a mode and host nodes.
type MemoryPolicy struct {
	// Mode is strict, preferred, interleave or restrictive; "" when the
	// element leaves it to libvirt's default (strict).
	Mode    string      `json:"mode,omitempty"`
	Nodeset numa.CPUSet `json:"nodeset"`
	// Placement is "auto" when numad chooses the nodes.
	Placement string `json:"placement,omitempty"`
}

// Sched is one vCPU's scheduler policy.
type Sched struct {
	Scheduler string `json:"scheduler"`
	Priority  int    `json:"priority,omitempty"`
}

// GuestCell is one guest NUMA cell.
type GuestCell struct {
	ID        int         `json:"id"`
	VCPUs     numa.CPUSet `json:"vcpus"`
	MemoryKiB uint64      `json:"memory_kib"`
}

// HostCPUs returns every host CPU the domain's pins name: vCPU, emulator
// and I/O thread pins. Reconciliation compares it with the ledger's owners.
func (p *Pins) HostCPUs() numa.CPUSet {
	out := p.EmulatorPins
	for _, s := range p.VCPUPins {
		out = out.Union(s)
	}
	for _, s := range p.IOThreadPins {
		out = out.Union(s)
	}
	return out
}

// Read returns the pinning domainXML carries: its <cputune> pins and
// scheduler policies, its <numatune>, its vCPU count and guest NUMA cells.
func Read(domainXML string) (*Pins, error) {
	d, err := parseDomain(domainXML)
	if err != nil {
		return nil, err
	}
	p := &Pins{VCPUs: d.vcpus}
	if v, ok := d.vcpu.attr("cpuset"); ok {
		if p.DefaultCPUs, err = numa.Parse(v); err != nil {
			return nil, malformed("<vcpu cpuset='%.40s'>: %v", v, err)
		}
	}
	for _, c := range d.cells {
		p.GuestCells = append(p.GuestCells, GuestCell{ID: c.id, VCPUs: c.vcpus, MemoryKiB: c.bytes / 1024})
	}
	if err := d.readCPUTune(p); err != nil {
		return nil, err
	}
	if err := d.readNUMATune(p); err != nil {
		return nil, err
	}
	return p, nil
}

func (d *domain) readCPUTune(p *Pins) error {
	if d.cputune == nil {
		return nil
	}
	for _, el := range d.cputune.elements("vcpupin") {
		v, err := d.index(el, "vcpu", d.vcpus-1)
		if err != nil {
			return err
		}
		set, err := cpusetAttr(el, "cpuset")
		if err != nil {
			return err
		}
		if _, dup := p.VCPUPins[v]; dup {
			return malformed("two <vcpupin> for vCPU %d; libvirt allows one per vCPU", v)
		}
		if p.VCPUPins == nil {
			p.VCPUPins = map[int]numa.CPUSet{}
		}
		p.VCPUPins[v] = set
	}
	emu := d.cputune.elements("emulatorpin")
	if len(emu) > 1 {
		return malformed("<cputune> has %d <emulatorpin> elements; at most one is allowed", len(emu))
	}
	if len(emu) == 1 {
		set, err := cpusetAttr(emu[0], "cpuset")
		if err != nil {
			return err
		}
		p.EmulatorPins = set
	}
	for _, el := range d.cputune.elements("iothreadpin") {
		id, err := d.index(el, "iothread", maxIOThreads)
		if err != nil {
			return err
		}
		set, err := cpusetAttr(el, "cpuset")
		if err != nil {
			return err
		}
		if _, dup := p.IOThreadPins[id]; dup {
			return malformed("two <iothreadpin> for I/O thread %d; libvirt allows one per thread", id)
		}
		if p.IOThreadPins == nil {
			p.IOThreadPins = map[int]numa.CPUSet{}
		}
		p.IOThreadPins[id] = set
	}
	sched, err := d.sched()
	if err != nil {
		return err
	}
	if len(sched) > 0 {
		p.Sched = sched
	}
	p.RealtimeVCPUs, p.RealtimePriority = realtimeOf(sched)
	return nil
}

// sched expands the <vcpusched> elements of <cputune> to one entry per vCPU.
func (d *domain) sched() (map[int]Sched, error) {
	out := map[int]Sched{}
	if d.cputune == nil {
		return out, nil
	}
	for _, el := range d.cputune.elements("vcpusched") {
		set, err := cpusetAttr(el, "vcpus")
		if err != nil {
			return nil, err
		}
		if set.Max() >= d.vcpus {
			return nil, malformed("<vcpusched vcpus='%s'>: the domain has vCPUs 0-%d", set, d.vcpus-1)
		}
		s := Sched{}
		s.Scheduler, _ = el.attr("scheduler")
		switch s.Scheduler {
		case "batch", "idle", "fifo", "rr":
		default:
			return nil, malformed("<vcpusched scheduler='%.20s'>: allowed schedulers are batch, idle, fifo, rr", s.Scheduler)
		}
		if v, ok := el.attr("priority"); ok {
			pr, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || pr < 0 || pr > 99 {
				return nil, malformed("<vcpusched priority='%.20s'>: the priority must be a whole number 0-99", v)
			}
			s.Priority = pr
		}
		for _, v := range set.List() {
			if _, dup := out[v]; dup {
				return nil, malformed("vCPU %d is in two <vcpusched> elements; libvirt requires them not to overlap", v)
			}
			out[v] = s
		}
	}
	return out, nil
}

// realtimeOf returns the fifo and rr vCPUs and their priority when they
// share one.
func realtimeOf(sched map[int]Sched) (numa.CPUSet, int) {
	var rt []int
	prio := -1
	for v, s := range sched {
		if s.Scheduler != "fifo" && s.Scheduler != "rr" {
			continue
		}
		rt = append(rt, v)
		switch {
		case prio == -1:
			prio = s.Priority
		case prio != s.Priority:
			prio = 0
		}
	}
	return numa.NewCPUSet(rt...), max(prio, 0)
}

func (d *domain) readNUMATune(p *Pins) error {
	if d.numatune == nil {
		return nil
	}
	mem := d.numatune.elements("memory")
	if len(mem) > 1 {
		return malformed("<numatune> has %d <memory> elements; at most one is allowed", len(mem))
	}
	if len(mem) == 1 {
		mp, err := memoryPolicy(mem[0])
		if err != nil {
			return err
		}
		mp.Placement, _ = mem[0].attr("placement")
		p.Memory = &mp
	}
	for _, el := range d.numatune.elements("memnode") {
		id, err := d.index(el, "cellid", numa.MaxCPU)
		if err != nil {
			return err
		}
		mp, err := memoryPolicy(el)
		if err != nil {
			return err
		}
		if _, dup := p.MemNodes[id]; dup {
			return malformed("two <memnode> for guest cell %d; libvirt allows one per cell", id)
		}
		if p.MemNodes == nil {
			p.MemNodes = map[int]MemoryPolicy{}
		}
		p.MemNodes[id] = mp
	}
	return nil
}

func memoryPolicy(el *node) (MemoryPolicy, error) {
	var mp MemoryPolicy
	mp.Mode, _ = el.attr("mode")
	if err := checkMode(el); err != nil {
		return mp, err
	}
	if _, ok := el.attr("nodeset"); ok {
		set, err := cpusetAttr(el, "nodeset")
		if err != nil {
			return mp, err
		}
		mp.Nodeset = set
	}
	return mp, nil
}

// checkMode rejects a memory mode libvirt does not know; Patch keeps modes,
// so it must not carry a bad one to the destination.
func checkMode(el *node) error {
	mode, ok := el.attr("mode")
	if !ok {
		return nil
	}
	switch mode {
	case "strict", "preferred", "interleave", "restrictive":
		return nil
	}
	return malformed("<%s mode='%.20s'>: allowed modes are strict, preferred, interleave, restrictive", el.name, mode)
}

// index reads a required whole-number attribute in 0..limit.
func (d *domain) index(el *node, name string, limit int) (int, error) {
	v, ok := el.attr(name)
	if !ok {
		return 0, malformed("<%s> has no %s attribute", el.name, name)
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 || n > limit {
		return 0, malformed("<%s %s='%.20s'>: must be a whole number 0-%d", el.name, name, v, limit)
	}
	return n, nil
}

func cpusetAttr(el *node, name string) (numa.CPUSet, error) {
	v, ok := el.attr(name)
	if !ok {
		return numa.CPUSet{}, malformed("<%s> has no %s attribute", el.name, name)
	}
	set, err := numa.Parse(v)
	if err != nil {
		return numa.CPUSet{}, malformed("<%s %s='%.40s'>: %v", el.name, name, v, err)
	}
	return set, nil
}

// PinsFor returns the pins Patch writes for placement p: vCPU and
// emulator pins, the <memory> and per-cell <memnode> nodesets, the guest
// cells and, when p names realtime vCPUs, their fifo scheduling (at
// numa.DefaultRealtimePriority when p.RealtimePriority is 0). What comes
// from the domain instead (memory modes, I/O thread pins, the realtime
// vCPUs of a placement without any, <vcpu cpuset>) is left empty.
func PinsFor(p *numa.Placement) (*Pins, error) {
	if p == nil {
		return nil, badPlacement("no placement given")
	}
	if err := checkPlacement(p); err != nil {
		return nil, err
	}
	out := &Pins{VCPUPins: map[int]numa.CPUSet{}, Memory: &MemoryPolicy{}, MemNodes: map[int]MemoryPolicy{}}
	for _, c := range p.Cells {
		if !c.SharedVCPUs.IsEmpty() && c.HostCPUs.IsEmpty() {
			return nil, badPlacement("guest cell %d: shared vCPUs %s need the host cell's shared CPUs (host_cpuset), which the placement lacks", c.GuestCell, c.SharedVCPUs)
		}
		for v, pc := range c.Pins {
			out.VCPUPins[v] = numa.NewCPUSet(pc)
		}
		for _, v := range c.SharedVCPUs.List() {
			out.VCPUPins[v] = c.HostCPUs
		}
		vcpus := c.SharedVCPUs.Union(c.DedicatedVCPUs)
		out.VCPUs += vcpus.Len()
		host := numa.NewCPUSet(c.HostCell)
		out.Memory.Nodeset = out.Memory.Nodeset.Union(host)
		out.MemNodes[c.GuestCell] = MemoryPolicy{Nodeset: host}
		out.GuestCells = append(out.GuestCells, GuestCell{ID: c.GuestCell, VCPUs: vcpus, MemoryKiB: uint64(c.MemoryMB) * 1024})
	}
	sort.Slice(out.GuestCells, func(i, j int) bool { return out.GuestCells[i].ID < out.GuestCells[j].ID })
	out.EmulatorPins = p.EmulatorPCPUs()
	if !p.RealtimeVCPUs.IsEmpty() {
		prio := p.RealtimePriority
		if prio == 0 {
			prio = numa.DefaultRealtimePriority
		}
		out.Sched = map[int]Sched{}
		for _, v := range p.RealtimeVCPUs.List() {
			out.Sched[v] = Sched{Scheduler: "fifo", Priority: prio}
		}
		out.RealtimeVCPUs, out.RealtimePriority = p.RealtimeVCPUs, prio
	}
	return out, nil
}
