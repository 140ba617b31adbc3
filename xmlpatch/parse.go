package xmlpatch

import (
	"sort"
	"strconv"
	"strings"

	"github.com/pinflow/pinflow/numa"
)

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
	// devices are the host PCI devices passed through, in document order.
	devices []hostDevice
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
	if err := d.readDevices(one); err != nil {
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
