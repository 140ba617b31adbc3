package audit

import (
	"slices"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// holding is what the ledger gives out on a host, as a domain uses it or a
// claim holds it: pinnable pCPUs and listed PCI devices (a PF with its VFs,
// as numa.Host.DeviceHolds counts it). Recovery and quarantine compare
// and take the two together, so that a device is guarded as a pCPU is.
type holding struct {
	cpus numa.CPUSet
	devs []string // sorted, unique
}

// domainHolding is what a running or paused domain uses on the host of
// topo; a shut-off one uses nothing. Devices the host does not list are
// not pinflow's to give out, as pCPUs outside the pinnable set are not.
func domainHolding(d hypervisor.Domain, topo *numa.Host) (holding, error) {
	cpus, err := hypervisor.UsedCPUs(d)
	if err != nil {
		return holding{}, err
	}
	devs, err := hypervisor.UsedDevices(d, topo)
	if err != nil {
		return holding{}, err
	}
	return holding{cpus: cpus.Intersection(pinnable(topo)), devs: listedDevices(topo, devs)}, nil
}

// listedDevices are the devices of addrs the host of topo lists, with
// what each holds (a PF its VFs), sorted.
func listedDevices(topo *numa.Host, addrs []string) []string {
	var out []string
	for _, a := range addrs {
		if topo.PCIDevice(a) != nil {
			out = append(out, topo.DeviceHolds(a)...)
		}
	}
	return sortedUnique(out)
}

// claimHolding is what a claim holds.
func claimHolding(c *ledger.Claim) holding {
	return holding{cpus: claimCPUs(c), devs: sortedUnique(slices.Clone(c.Devices))}
}

// placementHolding is what a placement would hold on the host of topo.
func placementHolding(topo *numa.Host, p *numa.Placement) (holding, error) {
	cpus, err := placementCPUs(topo, p)
	if err != nil {
		return holding{}, err
	}
	devs, err := topo.PlacementDevices(p)
	if err != nil {
		return holding{}, err
	}
	return holding{cpus: cpus, devs: devs}, nil
}

func sortedUnique(a []string) []string {
	slices.Sort(a)
	return slices.Compact(a)
}

func (h holding) isEmpty() bool { return h.cpus.IsEmpty() && len(h.devs) == 0 }

func (h holding) union(o holding) holding {
	return holding{cpus: h.cpus.Union(o.cpus), devs: sortedUnique(append(slices.Clone(h.devs), o.devs...))}
}

func (h holding) minus(o holding) holding {
	out := holding{cpus: h.cpus.Difference(o.cpus)}
	for _, a := range h.devs {
		if !slices.Contains(o.devs, a) {
			out.devs = append(out.devs, a)
		}
	}
	return out
}

func (h holding) intersects(o holding) bool {
	return !h.minus(h.minus(o)).isEmpty()
}

func (h holding) equal(o holding) bool {
	return h.cpus.Equal(o.cpus) && slices.Equal(h.devs, o.devs)
}

func (h holding) subsetOf(o holding) bool { return h.minus(o).isEmpty() }

// String names the holding for a report: "pCPUs 4-5 and PCI devices
// 0000:81:10.1".
func (h holding) String() string { return holdings(h.cpus, h.devs) }

// devicePlacement is a placement taking exactly devs (addresses topo
// lists), for a quarantine: each as its own take, a PF's VFs left to the
// PF that holds them.
func devicePlacement(topo *numa.Host, p *numa.Placement, devs []string) {
	for _, a := range devs {
		d := topo.PCIDevice(a)
		if d == nil || (d.PhysFunction != "" && slices.Contains(devs, d.PhysFunction)) {
			continue
		}
		p.Devices = append(p.Devices, numa.DeviceTake{Request: len(p.Devices), VendorID: d.VendorID, ProductID: d.ProductID,
			HostCell: d.NUMANode, Count: 1, Addresses: []string{a}})
	}
}

// deviceOwners describes the devices of h that claims in owner hold:
// "0000:81:10.1 (claim c)".
func deviceOwners(h holding, owner map[string]string) []string {
	var out []string
	for _, a := range h.devs {
		if id, ok := owner[a]; ok {
			out = append(out, a+" (claim "+id+")")
		}
	}
	return out
}
