package numa

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// MaxHostDevices bounds a host's PCI device list.
const MaxHostDevices = 4096

// PCIDevice is one PCI device a host offers guests, as Nova's PCI tracker
// records a device its [pci] device_spec lists: a whole device, an SR-IOV
// physical or virtual function, or a vDPA device.
type PCIDevice struct {
	// Address is the device's PCI address, DDDD:BB:SS.F.
	Address   string     `json:"address"`
	VendorID  string     `json:"vendor_id"`
	ProductID string     `json:"product_id"`
	DevType   DeviceType `json:"dev_type"`
	// PhysFunction is a VF's (or vDPA device's) parent PF address.
	PhysFunction string `json:"parent_addr,omitempty"`
	// NUMANode is the host cell the device is attached to; nil when the
	// host reports none.
	NUMANode *int `json:"numa_node"`
	// Tags are the operator's properties of the device (physical_network,
	// remote_managed, ...), which requests match by name.
	Tags map[string]string `json:"tags,omitempty"`
	// DevName is the host-side name a port reaches the device by when it
	// does not pass it through: a VF's network interface for a macvtap
	// port, a vDPA device's /dev/vhost-vdpa-N for a vdpa port, the
	// vhost-user socket of the relay that forwards a VF for a
	// virtio-forwarder port. Empty: such ports cannot take the device.
	DevName string `json:"dev_name,omitempty"`
}

// devNameRE is what a device's host-side name may look like: an
// interface name or an absolute path, nothing a domain XML attribute or
// a shell would read differently.
var devNameRE = regexp.MustCompile(`^[A-Za-z0-9_./:@+-]{1,255}$`)

// deviceFields are the names a tag may not take: a request's spec names
// them for the device's own properties.
var deviceFields = map[string]bool{"vendor_id": true, "product_id": true, "dev_type": true,
	"numa_node": true, "count": true, "address": true, "parent_addr": true, "dev_name": true, TagDevNamed: true}

// validateDevices checks the host's device list: well-formed, unique
// addresses, known types, NUMA nodes among the host's cells, and a VF's
// parent, when the list has it, a PF.
func (h *Host) validateDevices() error {
	if len(h.PCIDevices) == 0 {
		return nil
	}
	if len(h.PCIDevices) > MaxHostDevices {
		return fmt.Errorf("numa: host: %d PCI devices; allowed are at most %d", len(h.PCIDevices), MaxHostDevices)
	}
	byAddr := make(map[string]*PCIDevice, len(h.PCIDevices))
	for i := range h.PCIDevices {
		d := &h.PCIDevices[i]
		where := fmt.Sprintf("numa: host: pci_devices[%d]", i)
		if !pciAddress.MatchString(d.Address) {
			return fmt.Errorf("%s: address %q: allowed is a PCI address DDDD:BB:SS.F such as 0000:81:00.1", where, d.Address)
		}
		if d.Address != strings.ToLower(d.Address) {
			return fmt.Errorf("%s: address %q: write its hex digits in lower case (%s)", where, d.Address, strings.ToLower(d.Address))
		}
		if byAddr[d.Address] != nil {
			return fmt.Errorf("%s: address %s is listed twice", where, d.Address)
		}
		byAddr[d.Address] = d
		if !pciHexID.MatchString(d.VendorID) {
			return fmt.Errorf("%s (%s): vendor_id %q: allowed are four hex digits such as 8086", where, d.Address, d.VendorID)
		}
		if !pciHexID.MatchString(d.ProductID) {
			return fmt.Errorf("%s (%s): product_id %q: allowed are four hex digits such as 154d", where, d.Address, d.ProductID)
		}
		switch d.DevType {
		case DeviceTypePCI, DeviceTypePF:
			if d.PhysFunction != "" {
				return fmt.Errorf("%s (%s): parent_addr %q: only a type-VF or vdpa device has a parent", where, d.Address, d.PhysFunction)
			}
		case DeviceTypeVF, DeviceTypeVDPA:
			if d.PhysFunction != "" && !pciAddress.MatchString(d.PhysFunction) {
				return fmt.Errorf("%s (%s): parent_addr %q: allowed is a PCI address DDDD:BB:SS.F", where, d.Address, d.PhysFunction)
			}
		default:
			return fmt.Errorf("%s (%s): dev_type %q: allowed are type-PCI, type-PF, type-VF or vdpa", where, d.Address, d.DevType)
		}
		if d.DevName != "" && !devNameRE.MatchString(d.DevName) {
			return fmt.Errorf("%s (%s): dev_name %q: allowed is an interface name or an absolute path of letters, digits and _./:@+-", where, d.Address, d.DevName)
		}
		if d.NUMANode != nil && h.Cell(*d.NUMANode) == nil {
			return fmt.Errorf("%s (%s): numa_node %d: allowed are the host's cell ids (%s) or null", where, d.Address, *d.NUMANode, cellIDList(h))
		}
		for k := range d.Tags {
			if strings.TrimSpace(k) == "" || deviceFields[k] {
				return fmt.Errorf("%s (%s): tag %q: tags are named properties such as physical_network, other than the device's own fields", where, d.Address, k)
			}
		}
	}
	byName := map[string]string{}
	for i := range h.PCIDevices {
		d := &h.PCIDevices[i]
		if other, ok := byName[d.DevName]; ok && d.DevName != "" {
			return fmt.Errorf("numa: host: pci_devices[%d] (%s): dev_name %s is %s's already; each device has its own", i, d.Address, d.DevName, other)
		}
		byName[d.DevName] = d.Address
		if p := byAddr[d.PhysFunction]; p != nil && p.DevType != DeviceTypePF {
			return fmt.Errorf("numa: host: pci_devices[%d] (%s): parent_addr %s is a %s, not a type-PF", i, d.Address, p.Address, p.DevType)
		}
	}
	return nil
}

// DeviceNamed returns the host's device whose host-side name is name,
// or nil.
func (h *Host) DeviceNamed(name string) *PCIDevice {
	for i := range h.PCIDevices {
		if name != "" && h.PCIDevices[i].DevName == name {
			return &h.PCIDevices[i]
		}
	}
	return nil
}

// PCIDevice returns the host's device at address, or nil.
func (h *Host) PCIDevice(address string) *PCIDevice {
	for i := range h.PCIDevices {
		if h.PCIDevices[i].Address == address {
			return &h.PCIDevices[i]
		}
	}
	return nil
}

// DeviceHolds returns what taking the device at address holds: the device,
// and for a PF every listed VF of it as well, since a PF passed through
// takes its VFs with it. A VF in use holds its PF only indirectly: the PF
// cannot be taken while any of its VFs is (FreeDevicePools).
func (h *Host) DeviceHolds(address string) []string {
	out := []string{address}
	if d := h.PCIDevice(address); d != nil && d.DevType == DeviceTypePF {
		for i := range h.PCIDevices {
			if h.PCIDevices[i].PhysFunction == address {
				out = append(out, h.PCIDevices[i].Address)
			}
		}
	}
	return out
}

// PlacementDevices returns every device address p holds on h, sorted: the
// devices its takes name, with each PF's VFs (DeviceHolds). It refuses a
// placement whose takes name no addresses, or devices h does not list, or
// one device twice.
func (h *Host) PlacementDevices(p *Placement) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, t := range p.Devices {
		if len(t.Addresses) != t.Count {
			return nil, fmt.Errorf("numa: placement takes %d devices of pool %d but names %d addresses; a claimed placement names each device", t.Count, t.Pool, len(t.Addresses))
		}
		for _, a := range t.Addresses {
			d := h.PCIDevice(a)
			if d == nil {
				return nil, fmt.Errorf("numa: placement takes PCI device %s, which the host does not list", a)
			}
			if d.VendorID != t.VendorID || d.ProductID != t.ProductID {
				return nil, fmt.Errorf("numa: placement takes PCI device %s as %s:%s, but it is %s:%s", a, t.VendorID, t.ProductID, d.VendorID, d.ProductID)
			}
			for _, held := range h.DeviceHolds(a) {
				if seen[held] {
					return nil, fmt.Errorf("numa: placement takes PCI device %s twice", held)
				}
				seen[held] = true
				out = append(out, held)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// FreeDevicePools pools the host's devices that are free, as Nova's PCI
// stats pool them: one pool per vendor, product, type, NUMA node and tags,
// in the order of each pool's first device, and each pool's devices in
// list order (Addresses). A device is free unless taken says it is held;
// a PF is free only when none of its VFs is held either, as a VF in use
// keeps its PF from being passed through whole.
func (h *Host) FreeDevicePools(taken func(address string) bool) []DevicePool {
	if len(h.PCIDevices) == 0 {
		return nil
	}
	busyPF := map[string]bool{}
	for i := range h.PCIDevices {
		d := &h.PCIDevices[i]
		if d.PhysFunction != "" && taken(d.Address) {
			busyPF[d.PhysFunction] = true
		}
	}
	var pools []DevicePool
	index := map[string]int{}
	for i := range h.PCIDevices {
		d := &h.PCIDevices[i]
		if taken(d.Address) || busyPF[d.Address] {
			continue
		}
		key := d.poolKey()
		j, ok := index[key]
		if !ok {
			j = len(pools)
			index[key] = j
			pools = append(pools, DevicePool{VendorID: d.VendorID, ProductID: d.ProductID, DevType: d.DevType,
				NUMANode: d.NUMANode, Tags: d.poolTags()})
		}
		pools[j].Count++
		pools[j].Addresses = append(pools[j].Addresses, d.Address)
	}
	return pools
}

// poolTags are the device's tags as its pool offers them: a device the
// operator did not mark remote_managed is not, as Nova's [pci]
// device_spec reads a spec without the tag, so that a port's request
// (which always names remote_managed) finds it.
func (d *PCIDevice) poolTags() map[string]string {
	_, marked := d.Tags["remote_managed"]
	if marked && d.DevName == "" {
		return d.Tags
	}
	tags := maps.Clone(d.Tags)
	if tags == nil {
		tags = map[string]string{}
	}
	if !marked {
		tags["remote_managed"] = "false"
	}
	if d.DevName != "" {
		// What a port that reaches its device by name asks for.
		tags[TagDevNamed] = "true"
	}
	return tags
}

// TagDevNamed is the tag of the pools of devices with a host-side name
// (PCIDevice.DevName), which the ports that reach their device by name
// (macvtap, vdpa, virtio-forwarder) ask for.
const TagDevNamed = "dev_named"

// poolKey is what puts two devices in one pool: everything but the
// address and parent.
func (d *PCIDevice) poolKey() string {
	var b strings.Builder
	node := "none"
	if d.NUMANode != nil {
		node = fmt.Sprint(*d.NUMANode)
	}
	fmt.Fprintf(&b, "%s|%s|%s|%s", d.VendorID, d.ProductID, d.DevType, node)
	tags := d.poolTags()
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		fmt.Fprintf(&b, "|%q=%q", k, tags[k])
	}
	return b.String()
}
