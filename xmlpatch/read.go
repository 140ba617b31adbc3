package xmlpatch

import (
	"strconv"
	"strings"

	"github.com/pinflow/pinflow/numa"
)

// Read returns the pinning domainXML carries: its <cputune> pins and
// scheduler policies, its <numatune>, its vCPU count and guest NUMA cells,
// and the host PCI devices it passes through.
func Read(domainXML string) (*Pins, error) {
	d, err := parseDomain(domainXML)
	if err != nil {
		return nil, err
	}
	p := &Pins{VCPUs: d.vcpus, IOThreads: d.iothreadIDs}
	if v, ok := d.vcpu.attr("cpuset"); ok {
		if p.DefaultCPUs, err = numa.Parse(v); err != nil {
			return nil, malformed("<vcpu cpuset='%.40s'>: %v", v, err)
		}
	}
	for _, c := range d.cells {
		p.GuestCells = append(p.GuestCells, GuestCell{ID: c.id, VCPUs: c.vcpus, MemoryKiB: c.bytes / 1024})
	}
	for _, dev := range d.devices {
		if dev.source != nil {
			p.DeviceNames = append(p.DeviceNames, dev.name)
			continue
		}
		p.Devices = append(p.Devices, dev.addr)
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
