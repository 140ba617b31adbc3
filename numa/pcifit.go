package numa

import (
	"fmt"
	"slices"
	"strings"
)

// DeviceTake is devices a placement takes from one of the host's pools for
// one of the guest's PCI requests.
type DeviceTake struct {
	Request int `json:"request"` // index in Request.PCI
	Pool    int `json:"pool"`    // index in Host.Devices
	// HostCell is the pool's NUMA node; nil when its devices have none.
	HostCell  *int   `json:"host_cell"`
	VendorID  string `json:"vendor_id"`
	ProductID string `json:"product_id"`
	Count     int    `json:"count"`
	// Addresses are the devices taken, when the host lists its devices.
	Addresses []string `json:"addresses,omitempty"`
	// Names are their host-side names (PCIDevice.DevName), in the same
	// order, when any has one: what a macvtap, vdpa or virtio-forwarder
	// port's domain XML names the device by.
	Names []string `json:"dev_names,omitempty"`
}

// deviceNeeds is what a guest asks of a host beyond its cells' CPUs and
// memory: PCI devices and network affinity. Both depend on the whole set
// of host cells the guest gets, not on any one cell, so Fit checks them on
// each candidate set.
type deviceNeeds struct {
	host *Host
	reqs []PCIRequest
	net  *NetworkAffinity
	// pools are h.Devices indexes in the order Nova's PCI stats keep
	// them: pools with fewer tags first, the given order otherwise.
	pools []int
	// specOK[r][i] says whether pool pools[i] matches request r's specs.
	specOK [][]bool
	// socketsKnown is false when some host cell's socket is unknown.
	socketsKnown bool
}

func newDeviceNeeds(h *Host, r *Request) *deviceNeeds {
	d := &deviceNeeds{host: h, reqs: r.PCI, net: r.Network, socketsKnown: true}
	if len(r.PCI) == 0 {
		return d
	}
	d.pools = make([]int, len(h.Devices))
	for i := range d.pools {
		d.pools[i] = i
	}
	// Nova sorts its pool dicts by their number of keys, stably.
	tags := func(i int) int { return len(h.Devices[d.pools[i]].Tags) }
	for i := 1; i < len(d.pools); i++ {
		for j := i; j > 0 && tags(j) < tags(j-1); j-- {
			d.pools[j], d.pools[j-1] = d.pools[j-1], d.pools[j]
		}
	}
	d.specOK = make([][]bool, len(r.PCI))
	for ri := range r.PCI {
		d.specOK[ri] = make([]bool, len(d.pools))
		for i, pi := range d.pools {
			d.specOK[ri][i] = h.Devices[pi].Matches(r.PCI[ri].Specs)
		}
	}
	for i := range h.Cells {
		if h.Cells[i].SocketUnknown {
			d.socketsKnown = false
		}
	}
	return d
}

// deviceMiss says which request the devices fall short for.
type deviceMiss struct {
	request int
	found   int // devices left after the step that fell short
}

// take takes each request's devices in turn from what the requests before
// it left, as Nova applies requests to a copy of its PCI stats: the pools
// that match the request, narrowed to the NUMA affinity its policy asks
// for relative to the host cells in cells (nil: a guest without NUMA
// placement, no affinity), then without PFs, vDPA and remote-managed
// devices it did not ask for; devices come from those pools in order.
// Each narrowing must leave the request's count, or the request fails.
func (d *deviceNeeds) take(cells []int) ([]DeviceTake, *deviceMiss) {
	if len(d.reqs) == 0 {
		return nil, nil
	}
	h := d.host
	left := make([]int, len(d.pools))
	for i, pi := range d.pools {
		left[i] = h.Devices[pi].Count
	}
	inCells := func(node *int) bool { return onNode(node, cells) }
	sum := func(list []int) int {
		n := 0
		for _, i := range list {
			n += left[i]
		}
		return n
	}
	filter := func(list []int, keep func(p *DevicePool) bool) []int {
		var out []int
		for _, i := range list {
			if keep(&h.Devices[d.pools[i]]) {
				out = append(out, i)
			}
		}
		return out
	}
	blocked := heldDevices{}
	var takes []DeviceTake
	for ri := range d.reqs {
		r := &d.reqs[ri]
		var cand []int
		for i := range d.pools {
			if left[i] > 0 && d.specOK[ri][i] {
				cand = append(cand, i)
			}
		}
		if n := sum(cand); n < r.Count {
			return nil, &deviceMiss{request: ri, found: n}
		}
		if cells != nil {
			cand = d.narrow(cand, r, cells, inCells, sum, filter)
			if n := sum(cand); n < r.Count {
				return nil, &deviceMiss{request: ri, found: n}
			}
		}
		if !r.wants(DeviceTypePF) {
			cand = filter(cand, func(p *DevicePool) bool { return p.DevType != DeviceTypePF })
			if n := sum(cand); n < r.Count {
				return nil, &deviceMiss{request: ri, found: n}
			}
		}
		if !r.wants(DeviceTypeVDPA) {
			cand = filter(cand, func(p *DevicePool) bool { return p.DevType != DeviceTypeVDPA })
		}
		if !r.wantsRemoteManaged() {
			cand = filter(cand, func(p *DevicePool) bool { return !p.remoteManaged() })
		}
		if n := sum(cand); n < r.Count {
			return nil, &deviceMiss{request: ri, found: n}
		}
		need := r.Count
		for _, i := range cand {
			n := min(need, left[i])
			p := &h.Devices[d.pools[i]]
			var addrs []string
			if n > 0 && len(p.Addresses) == p.Count {
				addrs = blocked.pick(p.Addresses, n)
			}
			left[i] -= n
			need -= n
			if len(addrs) > 0 {
				// A VF taken holds its PF and a PF its VFs, so each pool
				// has as many left as it has devices nothing holds.
				for _, a := range addrs {
					blocked.hold(h, a)
				}
				for j, pj := range d.pools {
					if q := &h.Devices[pj]; len(q.Addresses) == q.Count {
						left[j] = blocked.free(q.Addresses)
					}
				}
			}
			if n > 0 {
				takes = append(takes, DeviceTake{Request: ri, Pool: d.pools[i], HostCell: p.NUMANode,
					VendorID: p.VendorID, ProductID: p.ProductID, Count: n, Addresses: addrs, Names: h.deviceNames(addrs)})
			}
			if need == 0 {
				break
			}
		}
	}
	return takes, nil
}

// heldDevices are the listed devices one placement has taken so far, and
// those they hold: a VF's PF, a PF's VFs.
type heldDevices map[string]bool

func (b heldDevices) hold(h *Host, addr string) {
	for _, a := range h.DeviceHolds(addr) {
		b[a] = true
	}
	if dev := h.PCIDevice(addr); dev != nil && dev.PhysFunction != "" {
		b[dev.PhysFunction] = true
	}
}

// pick returns the first n of addrs nothing holds, in list order.
func (b heldDevices) pick(addrs []string, n int) []string {
	var out []string
	for _, a := range addrs {
		if len(out) == n {
			break
		}
		if !b[a] {
			out = append(out, a)
		}
	}
	return out
}

func (b heldDevices) free(addrs []string) int {
	n := 0
	for _, a := range addrs {
		if !b[a] {
			n++
		}
	}
	return n
}

// narrow keeps the pools with the NUMA affinity r's policy asks for. Each
// policy tries the strictest affinity first and stops there when it has
// enough devices, or when it may go no further.
func (d *deviceNeeds) narrow(cand []int, r *PCIRequest, cells []int, inCells func(*int) bool,
	sum func([]int) int, filter func([]int, func(*DevicePool) bool) []int) []int {
	near := filter(cand, func(p *DevicePool) bool { return inCells(p.NUMANode) })
	policy := r.policy()
	if policy == PCIPolicyRequired || sum(near) >= r.Count {
		return near
	}
	if policy == PCIPolicySocket {
		return filter(cand, func(p *DevicePool) bool { return d.onSocketsOf(p.NUMANode, cells) })
	}
	// Devices with no NUMA node are as good as near ones under legacy.
	nearOrNone := filter(cand, func(p *DevicePool) bool { return p.NUMANode == nil || inCells(p.NUMANode) })
	if policy == PCIPolicyLegacy || sum(nearOrNone) >= r.Count {
		return nearOrNone
	}
	// Preferred: every pool, near ones and those without a node first.
	out := make([]int, 0, len(cand))
	for _, far := range []bool{false, true} {
		for _, i := range cand {
			p := &d.host.Devices[d.pools[i]]
			if (p.NUMANode != nil && !inCells(p.NUMANode)) == far {
				out = append(out, i)
			}
		}
	}
	return out
}

// onSocketsOf reports whether node is a host cell on the socket of one of
// cells. With any socket unknown nothing is, as Nova refuses to guess.
func (d *deviceNeeds) onSocketsOf(node *int, cells []int) bool {
	if node == nil || !d.socketsKnown {
		return false
	}
	c := d.host.Cell(*node)
	if c == nil {
		return false
	}
	for _, id := range cells {
		if hc := d.host.Cell(id); hc != nil && hc.Socket == c.Socket {
			return true
		}
	}
	return false
}

// networksReach reports whether the host cells in cells give the guest's
// networks the NUMA affinity Nova asks: each requested physnet that some
// host cell is affine to must be on one of cells, and so must tunneled
// networks when some host cell is affine to them. Networks no cell is
// affine to constrain nothing.
func (d *deviceNeeds) networksReach(cells []int) bool {
	if d.net == nil {
		return true
	}
	h := d.host
	chosen := func(id int) bool {
		for _, c := range cells {
			if c == id {
				return true
			}
		}
		return false
	}
	for _, p := range d.net.Physnets {
		anywhere, here := false, false
		for i := range h.Cells {
			c := &h.Cells[i]
			if c.Network != nil && c.Network.has(p) {
				anywhere = true
				here = here || chosen(c.ID)
			}
		}
		if anywhere && !here {
			return false
		}
	}
	if d.net.Tunneled {
		anywhere, here := false, false
		for i := range h.Cells {
			c := &h.Cells[i]
			if c.Network != nil && c.Network.Tunneled {
				anywhere = true
				here = here || chosen(c.ID)
			}
		}
		if anywhere && !here {
			return false
		}
	}
	return true
}

// holds reports whether host cells cells supply the guest's devices and
// reach its networks.
func (d *deviceNeeds) holds(cells []int) bool {
	if _, miss := d.take(cells); miss != nil {
		return false
	}
	return d.networksReach(cells)
}

// why explains why cells do not hold.
func (d *deviceNeeds) why(cells []int) string {
	where := "without a NUMA placement"
	if cells != nil {
		where = "on host cells " + joinInts(cells)
	}
	if _, miss := d.take(cells); miss != nil {
		return fmt.Sprintf("%s: PCI request %d wants %s and finds %d", where, miss.request, &d.reqs[miss.request], miss.found)
	}
	return fmt.Sprintf("%s: the guest's networks (%s) are affine to other host cells", where, networkNames(d.net))
}

func networkNames(n *NetworkAffinity) string {
	var parts []string
	parts = append(parts, n.Physnets...)
	if n.Tunneled {
		parts = append(parts, "tunneled")
	}
	return strings.Join(parts, ", ")
}

func joinInts(ids []int) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprint(id)
	}
	return strings.Join(parts, ",")
}

// sortByDevices reorders host cells as Nova does for a host with PCI
// devices: cells with more devices first when the guest asks for devices,
// so it finds them, and last when it does not, so they stay free for
// guests that will. The sort is stable, as Nova's.
func (h *Host) sortByDevices(order []int, wantsDevices bool) {
	if len(h.Devices) == 0 {
		return
	}
	total := make(map[int]int, len(h.Cells))
	for i := range h.Devices {
		if n := h.Devices[i].NUMANode; n != nil {
			total[*n] += h.Devices[i].Count
		}
	}
	key := func(pos int) int {
		k := total[h.Cells[order[pos]].ID]
		if wantsDevices {
			return -k
		}
		return k
	}
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && key(j) < key(j-1); j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
}

// cellOrder returns the indexes of h.Cells in the order Nova tries them
// for r: all of them in their order when the guest needs every cell,
// otherwise sorted by free memory and CPUs, then by PCI devices.
func (h *Host) cellOrder(r *Request) []int {
	n := len(h.Cells)
	if n == len(r.Cells) {
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		return order
	}
	order := h.sortedCellOrder(r.Cells[0].CPUPolicy.Pinned())
	h.sortByDevices(order, len(r.PCI) > 0)
	return order
}

// constrained reports whether the guest's cells must be fitted together
// with its devices or networks.
func (d *deviceNeeds) constrained() bool { return len(d.reqs) > 0 || d.net != nil }

// relevant reports, per host cell index, whether having the cell among the
// guest's can change whether devices and networks hold: it has a device
// some request can take, or a network the guest asks affinity for.
func (d *deviceNeeds) relevant() []bool {
	h := d.host
	out := make([]bool, len(h.Cells))
	byID := make(map[int]int, len(h.Cells))
	for i := range h.Cells {
		byID[h.Cells[i].ID] = i
	}
	for ri := range d.reqs {
		for i, pi := range d.pools {
			p := &h.Devices[pi]
			if d.specOK[ri][i] && p.Count > 0 && p.NUMANode != nil {
				if c, ok := byID[*p.NUMANode]; ok {
					out[c] = true
				}
			}
		}
	}
	if d.net != nil {
		for i := range h.Cells {
			c := h.Cells[i].Network
			if c == nil {
				continue
			}
			if d.net.Tunneled && c.Tunneled {
				out[i] = true
			}
			for _, p := range d.net.Physnets {
				if c.has(p) {
					out[i] = true
				}
			}
		}
	}
	return out
}

// usesSockets reports whether which sockets the guest's cells are on can
// matter: a request under the socket policy, every socket known.
func (d *deviceNeeds) usesSockets() bool {
	if !d.socketsKnown {
		return false
	}
	for i := range d.reqs {
		if d.reqs[i].policy() == PCIPolicySocket {
			return true
		}
	}
	return false
}

// possible reports whether cells drawn from reach could at best supply each
// request on its own and reach every network: a bound that prunes search
// branches which cannot succeed, whatever cells they go on to take.
func (d *deviceNeeds) possible(reach []int) bool {
	h := d.host
	in := func(node *int) bool { return onNode(node, reach) }
	for ri := range d.reqs {
		r := &d.reqs[ri]
		n := 0
		for i, pi := range d.pools {
			p := &h.Devices[pi]
			if !d.specOK[ri][i] || (p.DevType == DeviceTypePF && !r.wants(DeviceTypePF)) ||
				(p.DevType == DeviceTypeVDPA && !r.wants(DeviceTypeVDPA)) || (p.remoteManaged() && !r.wantsRemoteManaged()) {
				continue
			}
			ok := false
			switch r.policy() {
			case PCIPolicyRequired:
				ok = in(p.NUMANode)
			case PCIPolicySocket:
				ok = in(p.NUMANode) || d.onSocketsOf(p.NUMANode, reach)
			case PCIPolicyPreferred:
				ok = true
			default:
				ok = p.NUMANode == nil || in(p.NUMANode)
			}
			if ok {
				n += p.Count
			}
		}
		if n < r.Count {
			return false
		}
	}
	return d.networksReach(reach)
}

// onNode says whether a device's NUMA node is one of cells; a device with
// no node is on none.
func onNode(node *int, cells []int) bool {
	return node != nil && slices.Contains(cells, *node)
}

// deviceNames are the host-side names of the devices at addrs, in order,
// or nil when none has one.
func (h *Host) deviceNames(addrs []string) []string {
	var out []string
	named := false
	for _, a := range addrs {
		name := ""
		if d := h.PCIDevice(a); d != nil {
			name = d.DevName
		}
		named = named || name != ""
		out = append(out, name)
	}
	if !named {
		return nil
	}
	return out
}
