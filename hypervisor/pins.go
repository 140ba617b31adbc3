package hypervisor

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// PinsFit checks that every host CPU and NUMA node a domain's pins name is
// one the host has: the CPUs of <vcpu cpuset>, <vcpupin>, <emulatorpin>
// and <iothreadpin> must be among cpus, the host's online CPUs, and the
// node sets of <numatune> among nodes, its NUMA node ids. A real host
// finds these out only when QEMU starts on it, so drivers check them
// before a start or a migration. The error wraps ErrRejected and names the
// first element that does not fit (in the order above; vCPUs, threads and
// guest cells in ascending order), what it names that the host lacks, and
// what the host has.
func PinsFit(p *xmlpatch.Pins, cpus, nodes numa.CPUSet) error {
	within := func(have numa.CPUSet, kind, items, list string) func(what string, set numa.CPUSet) error {
		return func(what string, set numa.CPUSet) error {
			if set.IsSubsetOf(have) {
				return nil
			}
			return fmt.Errorf("%s %s %q names %s %s the host does not have; its %s %s: %w",
				what, kind, set, items, set.Difference(have), list, have, ErrRejected)
		}
	}
	checkCPUs := within(cpus, "cpuset", "cpus", "online cpus are")
	checkNodes := within(nodes, "nodeset", "NUMA nodes", "nodes are")
	if err := checkCPUs("<vcpu>", p.DefaultCPUs); err != nil {
		return err
	}
	for _, v := range slices.Sorted(maps.Keys(p.VCPUPins)) {
		if err := checkCPUs(fmt.Sprintf("<vcpupin vcpu='%d'>", v), p.VCPUPins[v]); err != nil {
			return err
		}
	}
	if err := checkCPUs("<emulatorpin>", p.EmulatorPins); err != nil {
		return err
	}
	for _, id := range slices.Sorted(maps.Keys(p.IOThreadPins)) {
		if err := checkCPUs(fmt.Sprintf("<iothreadpin iothread='%d'>", id), p.IOThreadPins[id]); err != nil {
			return err
		}
	}
	if p.Memory != nil {
		if err := checkNodes("<numatune><memory>", p.Memory.Nodeset); err != nil {
			return err
		}
	}
	for _, cell := range slices.Sorted(maps.Keys(p.MemNodes)) {
		if err := checkNodes(fmt.Sprintf("<memnode cellid='%d'>", cell), p.MemNodes[cell].Nodeset); err != nil {
			return err
		}
	}
	return nil
}

// DevicesFit checks that every host PCI device a domain uses, passed
// through or reached by name, is one of host h's: a real host fails to
// start a guest whose device it lacks. The error wraps ErrRejected and
// names the first missing device in document order.
func DevicesFit(p *xmlpatch.Pins, h *numa.Host) error {
	for _, a := range p.DeviceAddresses(h) {
		if h.PCIDevice(a) == nil {
			return fmt.Errorf("PCI device %s the domain uses is not one of the host's %d devices: %w", a, len(h.PCIDevices), ErrRejected)
		}
	}
	return nil
}

// UsedDevices are the PCI devices of host h a domain uses while it runs
// or is paused, passed through or reached by name (Pins.DeviceAddresses);
// a shut-off domain holds none, as with UsedCPUs.
func UsedDevices(d Domain, h *numa.Host) ([]string, error) {
	if d.State == StateShutoff {
		return nil, nil
	}
	pins, err := xmlpatch.Read(d.XML)
	if err != nil {
		return nil, fmt.Errorf("domain %s: its devices cannot be read: %w", d.UUID, err)
	}
	return pins.DeviceAddresses(h), nil
}

// UsedCPUs is every pCPU a domain holds one to one while it runs or is
// paused (xmlpatch.Pins.PinnedCPUs): the pCPUs nothing else may be given.
// A pin to several CPUs, or none, floats: Reach says where. A shut-off
// domain uses none, since only an operation, which claims first, starts it
// again. The error of pins that cannot be read wraps xmlpatch's; callers
// keep what such a domain may use.
func UsedCPUs(d Domain) (numa.CPUSet, error) {
	if d.State == StateShutoff {
		return numa.CPUSet{}, nil
	}
	pins, err := xmlpatch.Read(d.XML)
	if err != nil {
		return numa.CPUSet{}, fmt.Errorf("domain %s: its pins cannot be read: %w", d.UUID, err)
	}
	return pins.PinnedCPUs(), nil
}

// Reach is every CPU of a host (all) that some thread of a running or
// paused domain may run on (xmlpatch.Pins.Reach): a guest without a
// cpuset reaches the whole host. A shut-off domain reaches none; one
// whose XML cannot be read reaches all, with the error.
func Reach(d Domain, all numa.CPUSet) (numa.CPUSet, error) {
	if d.State == StateShutoff {
		return numa.CPUSet{}, nil
	}
	pins, err := xmlpatch.Read(d.XML)
	if err != nil {
		return all, fmt.Errorf("domain %s: its pins cannot be read: %w", d.UUID, err)
	}
	return pins.Reach(all), nil
}

// Owner is the claim that dedicates a pCPU, and the guest it is for.
type Owner struct {
	Claim, Guest string
}

// Breach is a break of pinflow's promise found at the hypervisor: a
// running or paused domain that may run on pCPUs a claim dedicates to
// another guest.
type Breach struct {
	Domain Domain
	// CPUs are the pCPUs it reaches that other guests' claims dedicate.
	CPUs numa.CPUSet
	// Owners are those claims, sorted by claim id.
	Owners []Owner
}

func (b Breach) String() string {
	owners := make([]string, len(b.Owners))
	for i, o := range b.Owners {
		owners[i] = fmt.Sprintf("claim %s of guest %s", o.Claim, o.Guest)
	}
	verb := "dedicates"
	if len(owners) > 1 {
		verb = "dedicate"
	}
	return fmt.Sprintf("domain %s (%s, %s) may run on pCPUs %s that %s %s",
		b.Domain.Name, b.Domain.UUID, b.Domain.State, b.CPUs, strings.Join(owners, " and "), verb)
}

// Breaches checks the promise on one host whose CPUs are all: no pCPU a
// claim dedicates (owners maps each such pCPU to its claim) is within
// Reach of any other guest's running or paused domain. A domain whose XML
// cannot be read is taken to reach the whole host.
func Breaches(doms []Domain, all numa.CPUSet, owners map[int]Owner) []Breach {
	var out []Breach
	for _, d := range doms {
		reach, _ := Reach(d, all)
		b := Breach{Domain: d}
		seen := map[Owner]bool{}
		for _, cpu := range reach.List() {
			o, ok := owners[cpu]
			if !ok || o.Guest == d.UUID {
				continue
			}
			b.CPUs = b.CPUs.Union(numa.NewCPUSet(cpu))
			if !seen[o] {
				seen[o] = true
				b.Owners = append(b.Owners, o)
			}
		}
		if !b.CPUs.IsEmpty() {
			slices.SortFunc(b.Owners, func(x, y Owner) int { return strings.Compare(x.Claim, y.Claim) })
			out = append(out, b)
		}
	}
	return out
}
