package numa

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Placement is where Fit put a guest: what a ledger claims and what a
// domain XML is patched to.
type Placement struct {
	// Cells is empty when the request has no NUMA topology.
	Cells          []PlacedCell
	EmulatorPolicy EmulatorPolicy
	// RealtimeVCPUs run SCHED_FIFO at RealtimePriority.
	RealtimeVCPUs    CPUSet
	RealtimePriority int
	// HostSharedSet is the host's cpu_shared_set, where emulator threads run
	// under hw:emulator_threads_policy=share.
	HostSharedSet CPUSet
	// MemoryMB and VCPUs are the guest's when it has no NUMA topology (no
	// Cells): it floats over the whole host, which it takes them of.
	MemoryMB int64
	VCPUs    int
	// FloatCPUs are the host CPUs such a guest's vCPUs and emulator float
	// over: its host's shared CPUs, which the domain gets as <vcpu cpuset>.
	// Empty in a placement recorded before pinflow wrote them.
	FloatCPUs CPUSet
	// Devices are the PCI devices the guest takes, per request and pool;
	// empty when it asks for none.
	Devices []DeviceTake
}

// PlacedCell is one guest cell on its host cell.
type PlacedCell struct {
	GuestCell int
	HostCell  int
	// SharedVCPUs float over HostCPUs, the host cell's shared CPUs.
	SharedVCPUs CPUSet
	HostCPUs    CPUSet
	// DedicatedVCPUs are pinned one to one by Pins (vCPU -> pCPU).
	DedicatedVCPUs CPUSet
	Pins           map[int]int
	// Reserved holds the emulator threads' pCPU (emulator policy isolate).
	Reserved     CPUSet
	MemoryMB     int64
	PageSizeKB   int64 // the page size chosen; 0 when none was requested
	CPUPolicy    CPUPolicy
	ThreadPolicy ThreadPolicy
}

// HasNUMA reports whether the placement pins the guest to host cells.
func (p *Placement) HasNUMA() bool { return len(p.Cells) > 0 }

// PinnedPCPUs returns the pCPUs the cell's vCPUs are pinned to.
func (c *PlacedCell) PinnedPCPUs() CPUSet {
	var b cpuSetBuilder
	for _, p := range c.Pins {
		b.add(p)
	}
	return b.set()
}

// Floats returns the host CPUs the placed guest's threads may float over,
// beside the pCPUs it is pinned to or reserves: without NUMA cells, its
// FloatCPUs (all, the host's every CPU, when it predates them); with
// cells, the shared CPUs of cells with shared vCPUs and an emulator that
// runs on the host's shared set.
func (p *Placement) Floats(all CPUSet) CPUSet {
	if !p.HasNUMA() {
		if p.VCPUs > 0 && p.FloatCPUs.IsEmpty() {
			return all
		}
		return p.FloatCPUs
	}
	var out, own CPUSet
	for i := range p.Cells {
		c := &p.Cells[i]
		if !c.SharedVCPUs.IsEmpty() {
			out = out.Union(c.HostCPUs)
		}
		own = own.Union(c.PinnedPCPUs()).Union(c.Reserved)
	}
	return out.Union(p.EmulatorPCPUs().Difference(own))
}

// EmulatorPCPUs returns where the guest's emulator threads run: the
// reserved pCPUs under isolate, the host's cpu_shared_set under share when
// it has one, otherwise every pCPU of non-realtime vCPUs (or of all vCPUs
// when every vCPU is realtime), as Nova's libvirt driver does.
func (p *Placement) EmulatorPCPUs() CPUSet {
	var reserved, pinned, nonRT CPUSet
	for i := range p.Cells {
		c := &p.Cells[i]
		reserved = reserved.Union(c.Reserved)
		for v, pc := range c.Pins {
			one := NewCPUSet(pc)
			pinned = pinned.Union(one)
			if !p.RealtimeVCPUs.Contains(v) {
				nonRT = nonRT.Union(one)
			}
		}
		if !c.SharedVCPUs.IsEmpty() {
			pinned = pinned.Union(c.HostCPUs)
			nonRT = nonRT.Union(c.HostCPUs)
		}
	}
	switch {
	case p.EmulatorPolicy == EmulatorPolicyIsolate && !reserved.IsEmpty():
		return reserved
	case p.EmulatorPolicy == EmulatorPolicyShare && !p.HostSharedSet.IsEmpty():
		return p.HostSharedSet
	case !nonRT.IsEmpty():
		return nonRT
	}
	return pinned
}

// placementJSON is the wire form of a Placement: the answer format of the
// Nova reference cases (cells with guest_cell, host_cell, cpu_pinning, ...)
// plus what a domain XML needs beyond it.
type placementJSON struct {
	EmulatorPolicy   *string      `json:"emulator_threads_policy"`
	Cells            []cellJSON   `json:"cells"`
	RealtimeVCPUs    []int        `json:"realtime_vcpus,omitempty"`
	RealtimePriority int          `json:"realtime_priority,omitempty"`
	HostSharedSet    []int        `json:"host_shared_set,omitempty"`
	MemoryMB         int64        `json:"memory_mb,omitempty"`
	VCPUs            int          `json:"vcpus,omitempty"`
	FloatCPUs        []int        `json:"float_cpuset,omitempty"`
	Devices          []DeviceTake `json:"pci_devices,omitempty"`
}

type cellJSON struct {
	GuestCell    int            `json:"guest_cell"`
	HostCell     int            `json:"host_cell"`
	CPUSet       []int          `json:"cpuset"`
	PCPUSet      []int          `json:"pcpuset"`
	MemoryMB     int64          `json:"memory_mb"`
	CPUPinning   map[string]int `json:"cpu_pinning"`
	PinnedPCPUs  []int          `json:"pinned_pcpus"`
	Reserved     []int          `json:"cpuset_reserved"`
	PageSize     *int64         `json:"pagesize"`
	CPUPolicy    *string        `json:"cpu_policy"`
	ThreadPolicy *string        `json:"cpu_thread_policy"`
	HostCPUs     []int          `json:"host_cpuset,omitempty"`
}

func strOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func listOrNil(c CPUSet) []int {
	if c.IsEmpty() {
		return nil
	}
	return c.List()
}

// MarshalJSON writes the placement in the reference answer format.
func (p Placement) MarshalJSON() ([]byte, error) {
	out := placementJSON{
		EmulatorPolicy:   strOrNil(string(p.EmulatorPolicy)),
		Cells:            make([]cellJSON, len(p.Cells)),
		RealtimeVCPUs:    listOrNil(p.RealtimeVCPUs),
		RealtimePriority: p.RealtimePriority,
		HostSharedSet:    listOrNil(p.HostSharedSet),
		MemoryMB:         p.MemoryMB,
		VCPUs:            p.VCPUs,
		FloatCPUs:        listOrNil(p.FloatCPUs),
		Devices:          p.Devices,
	}
	for i, c := range p.Cells {
		var pins map[string]int
		if c.Pins != nil {
			pins = make(map[string]int, len(c.Pins))
			for v, pc := range c.Pins {
				pins[strconv.Itoa(v)] = pc
			}
		}
		cj := cellJSON{
			GuestCell: c.GuestCell, HostCell: c.HostCell,
			CPUSet: c.SharedVCPUs.List(), PCPUSet: c.DedicatedVCPUs.List(),
			MemoryMB: c.MemoryMB, CPUPinning: pins, PinnedPCPUs: c.PinnedPCPUs().List(),
			Reserved:  listOrNil(c.Reserved),
			CPUPolicy: strOrNil(string(c.CPUPolicy)), ThreadPolicy: strOrNil(string(c.ThreadPolicy)),
			HostCPUs: listOrNil(c.HostCPUs),
		}
		if c.PageSizeKB != 0 {
			ps := c.PageSizeKB
			cj.PageSize = &ps
		}
		out.Cells[i] = cj
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads the reference answer format. It checks the form, not
// whether the placement fits any host; Usage does that against a host.
func (p *Placement) UnmarshalJSON(data []byte) error {
	var in placementJSON
	if err := json.Unmarshal(data, &in); err != nil {
		return fmt.Errorf("numa: placement: %w", err)
	}
	set := func(field string, ids []int) (CPUSet, error) {
		var b cpuSetBuilder
		for _, id := range ids {
			if id < 0 || id > MaxCPU {
				return CPUSet{}, fmt.Errorf("numa: placement: %s: cpu id %d out of range 0-%d", field, id, MaxCPU)
			}
			b.add(id)
		}
		return b.set(), nil
	}
	var out Placement
	var err error
	if in.EmulatorPolicy != nil {
		out.EmulatorPolicy = EmulatorPolicy(*in.EmulatorPolicy)
		if _, err := emulatorPolicy(specs{flavor: map[string]string{"hw:emulator_threads_policy": *in.EmulatorPolicy}}); err != nil {
			return fmt.Errorf("numa: placement: emulator_threads_policy %q: allowed values are share, isolate or null", *in.EmulatorPolicy)
		}
	}
	if out.RealtimeVCPUs, err = set("realtime_vcpus", in.RealtimeVCPUs); err != nil {
		return err
	}
	out.RealtimePriority = in.RealtimePriority
	out.MemoryMB, out.VCPUs = in.MemoryMB, in.VCPUs
	out.Devices = in.Devices
	if out.HostSharedSet, err = set("host_shared_set", in.HostSharedSet); err != nil {
		return err
	}
	if out.FloatCPUs, err = set("float_cpuset", in.FloatCPUs); err != nil {
		return err
	}
	for i, cj := range in.Cells {
		c := PlacedCell{GuestCell: cj.GuestCell, HostCell: cj.HostCell, MemoryMB: cj.MemoryMB}
		where := fmt.Sprintf("cells[%d]", i)
		if c.SharedVCPUs, err = set(where+".cpuset", cj.CPUSet); err != nil {
			return err
		}
		if c.DedicatedVCPUs, err = set(where+".pcpuset", cj.PCPUSet); err != nil {
			return err
		}
		if c.Reserved, err = set(where+".cpuset_reserved", cj.Reserved); err != nil {
			return err
		}
		if c.HostCPUs, err = set(where+".host_cpuset", cj.HostCPUs); err != nil {
			return err
		}
		if cj.PageSize != nil {
			c.PageSizeKB = *cj.PageSize
		}
		if cj.CPUPolicy != nil {
			c.CPUPolicy = CPUPolicy(*cj.CPUPolicy)
		}
		if cj.ThreadPolicy != nil {
			c.ThreadPolicy = ThreadPolicy(*cj.ThreadPolicy)
		}
		c.Pins = make(map[int]int, len(cj.CPUPinning))
		for k, pc := range cj.CPUPinning {
			v, err := strconv.Atoi(k)
			if err != nil || v < 0 || v > MaxCPU {
				return fmt.Errorf("numa: placement: %s.cpu_pinning: vCPU %q is not a number 0-%d", where, k, MaxCPU)
			}
			if pc < 0 || pc > MaxCPU {
				return fmt.Errorf("numa: placement: %s.cpu_pinning: pCPU %d out of range 0-%d", where, pc, MaxCPU)
			}
			c.Pins[v] = pc
		}
		out.Cells = append(out.Cells, c)
	}
	if err := out.Check(); err != nil {
		return err
	}
	*p = out
	return nil
}

// Check verifies that the placement is well formed on its own: distinct
// guest and host cells, each dedicated vCPU pinned once, no pCPU used twice.
func (p *Placement) Check() error {
	if p.MemoryMB < 0 || p.VCPUs < 0 {
		return fmt.Errorf("numa: placement: memory_mb %d and vcpus %d must not be negative", p.MemoryMB, p.VCPUs)
	}
	for _, d := range p.Devices {
		if d.Request < 0 || d.Pool < 0 || d.Count < 1 {
			return fmt.Errorf("numa: placement: pci_devices: request %d, pool %d, count %d: request and pool are indexes of 0 or more, count at least 1",
				d.Request, d.Pool, d.Count)
		}
		if d.Addresses != nil && len(d.Addresses) != d.Count {
			return fmt.Errorf("numa: placement: pci_devices: pool %d: count %d but %d addresses", d.Pool, d.Count, len(d.Addresses))
		}
		if d.Names != nil && len(d.Names) != len(d.Addresses) {
			return fmt.Errorf("numa: placement: pci_devices: pool %d: %d addresses but %d dev_names", d.Pool, len(d.Addresses), len(d.Names))
		}
		for _, a := range d.Addresses {
			if !pciAddress.MatchString(a) {
				return fmt.Errorf("numa: placement: pci_devices: address %q: allowed is a PCI address DDDD:BB:SS.F such as 0000:81:00.1", a)
			}
		}
	}
	guests, hosts := map[int]bool{}, map[int]bool{}
	var used, vcpus CPUSet
	for _, c := range p.Cells {
		if guests[c.GuestCell] || hosts[c.HostCell] {
			return fmt.Errorf("numa: placement: guest cell %d on host cell %d: each guest cell and each host cell may appear once", c.GuestCell, c.HostCell)
		}
		guests[c.GuestCell], hosts[c.HostCell] = true, true
		for v, pc := range c.Pins {
			if v < 0 || v > MaxCPU || pc < 0 || pc > MaxCPU {
				return fmt.Errorf("numa: placement: guest cell %d: pin %d -> %d: cpu ids are 0-%d", c.GuestCell, v, pc, MaxCPU)
			}
		}
		if c.MemoryMB < 0 {
			return fmt.Errorf("numa: placement: guest cell %d: memory_mb %d must not be negative", c.GuestCell, c.MemoryMB)
		}
		cellVCPUs := c.SharedVCPUs.Union(c.DedicatedVCPUs)
		if cellVCPUs.Intersects(vcpus) || c.SharedVCPUs.Intersects(c.DedicatedVCPUs) {
			return fmt.Errorf("numa: placement: guest cell %d: vCPUs %s are placed twice", c.GuestCell, cellVCPUs.Intersection(vcpus.Union(c.SharedVCPUs)))
		}
		vcpus = vcpus.Union(cellVCPUs)
		if len(c.Pins) > 0 || !c.DedicatedVCPUs.IsEmpty() {
			var pinnedV CPUSet
			for v := range c.Pins {
				pinnedV = pinnedV.Union(NewCPUSet(v))
			}
			if !pinnedV.Equal(c.DedicatedVCPUs) {
				return fmt.Errorf("numa: placement: guest cell %d: pins cover vCPUs %q but its dedicated vCPUs are %q", c.GuestCell, pinnedV, c.DedicatedVCPUs)
			}
		}
		pcpus := c.PinnedPCPUs()
		if pcpus.Len() != len(c.Pins) {
			return fmt.Errorf("numa: placement: guest cell %d: two vCPUs share a pCPU", c.GuestCell)
		}
		cell := pcpus.Union(c.Reserved)
		if cell.Len() != pcpus.Len()+c.Reserved.Len() || cell.Intersects(used) {
			return fmt.Errorf("numa: placement: guest cell %d: pCPUs %s are used twice", c.GuestCell, cell.Intersection(used.Union(pcpus)))
		}
		used = used.Union(cell)
	}
	return nil
}

// String summarises the placement in one line, e.g.
// "g0->h1 pins 0:4,1:5 reserved 6 pages 2048K", and the PCI devices it
// takes, e.g. "; pci 8086:154d x2 from pool 0 (h1)".
func (p *Placement) String() string {
	if !p.HasNUMA() {
		s := "no NUMA placement"
		if !p.FloatCPUs.IsEmpty() {
			s += ", floating on " + p.FloatCPUs.String()
		}
		return s + p.devicesString()
	}
	var parts []string
	for _, c := range p.Cells {
		// Walk the vCPUs, not the map: the same placement always prints
		// the same, which workflows rely on when they show it.
		var pins []string
		for _, v := range c.DedicatedVCPUs.List() {
			if pc, ok := c.Pins[v]; ok {
				pins = append(pins, fmt.Sprintf("%d:%d", v, pc))
			}
		}
		s := fmt.Sprintf("g%d->h%d", c.GuestCell, c.HostCell)
		if len(pins) > 0 {
			s += " pins " + strings.Join(pins, ",")
		}
		if !c.SharedVCPUs.IsEmpty() {
			s += fmt.Sprintf(" shared %s on %s", c.SharedVCPUs, c.HostCPUs)
		}
		if !c.Reserved.IsEmpty() {
			s += " reserved " + c.Reserved.String()
		}
		if c.PageSizeKB != 0 {
			s += fmt.Sprintf(" pages %dK", c.PageSizeKB)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ") + p.devicesString()
}

// devicesString is the placement's PCI devices, "" when it takes none.
func (p *Placement) devicesString() string {
	if len(p.Devices) == 0 {
		return ""
	}
	parts := make([]string, len(p.Devices))
	for i, d := range p.Devices {
		where := "no NUMA node"
		if d.HostCell != nil {
			where = fmt.Sprintf("h%d", *d.HostCell)
		}
		parts[i] = fmt.Sprintf("%s:%s x%d from pool %d (%s)", d.VendorID, d.ProductID, d.Count, d.Pool, where)
		if len(d.Addresses) > 0 {
			parts[i] += " " + strings.Join(d.Addresses, " ")
		}
	}
	return "; pci " + strings.Join(parts, ", ")
}
