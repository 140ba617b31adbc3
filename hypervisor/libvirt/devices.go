package libvirt

import (
	"context"
	"encoding/xml"
	"fmt"
	"maps"
	"slices"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/numa"
)

// nodeDevice is one PCI device as libvirt's node device XML gives it.
func nodeDevice(doc string) (numa.PCIDevice, bool, error) {
	var nd libvirtxml.NodeDevice
	if err := nd.Unmarshal(doc); err != nil {
		return numa.PCIDevice{}, false, fmt.Errorf("node device XML does not parse: %w", err)
	}
	pci := nd.Capability.PCI
	if pci == nil {
		return numa.PCIDevice{}, false, nil
	}
	if pci.Domain == nil || pci.Bus == nil || pci.Slot == nil || pci.Function == nil {
		return numa.PCIDevice{}, false, fmt.Errorf("node device %s has no full PCI address", nd.Name)
	}
	d := numa.PCIDevice{
		Address:   fmt.Sprintf("%04x:%02x:%02x.%x", *pci.Domain, *pci.Bus, *pci.Slot, *pci.Function),
		VendorID:  hexID(pci.Vendor.ID),
		ProductID: hexID(pci.Product.ID),
		DevType:   numa.DeviceTypePCI,
	}
	if pci.NUMA != nil && pci.NUMA.Node >= 0 {
		node := pci.NUMA.Node
		d.NUMANode = &node
	}
	for _, sub := range pci.Capabilities {
		switch {
		case sub.VirtFunctions != nil && (sub.VirtFunctions.MaxCount > 0 || len(sub.VirtFunctions.Address) > 0):
			d.DevType = numa.DeviceTypePF
		case sub.PhysFunction != nil:
			a := sub.PhysFunction.Address
			if a.Domain == nil || a.Bus == nil || a.Slot == nil || a.Function == nil {
				return numa.PCIDevice{}, false, fmt.Errorf("node device %s names its PF without a full address", nd.Name)
			}
			d.DevType = numa.DeviceTypeVF
			d.PhysFunction = fmt.Sprintf("%04x:%02x:%02x.%x", *a.Domain, *a.Bus, *a.Slot, *a.Function)
		}
	}
	return d, true, nil
}

// hexID turns libvirt's "0x8086" into numa's "8086".
func hexID(s string) string {
	s = strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X"))
	if len(s) < 4 {
		s = strings.Repeat("0", 4-len(s)) + s
	}
	return s
}

// OfferedDevices turns the node device XML of a host's PCI devices into
// the devices specs offer, in address order, each with its spec's tags (the
// first matching entry's). A device's NUMA node that is not one of cells
// (a node without memory) is dropped: the device has no affinity then.
func OfferedDevices(docs []string, specs []libvirthost.DeviceSpec, cells []int) ([]numa.PCIDevice, error) {
	var all []numa.PCIDevice
	var pfs []string
	names, vdpa, err := childNames(docs)
	if err != nil {
		return nil, err
	}
	for _, doc := range docs {
		d, ok, err := nodeDevice(doc)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		node := pciNodeName(d.Address)
		switch {
		case vdpa[node] != "":
			// A VF that backs a vDPA device is the vDPA device, as Nova
			// has it, reached by its character device.
			d.DevType, d.DevName = numa.DeviceTypeVDPA, vdpa[node]
		case d.DevType == numa.DeviceTypeVF:
			d.DevName = names[node]
		}
		if d.NUMANode != nil && !slices.Contains(cells, *d.NUMANode) {
			d.NUMANode = nil
		}
		if d.DevType == numa.DeviceTypePF {
			pfs = append(pfs, d.Address)
		}
		all = append(all, d)
	}
	var out []numa.PCIDevice
	for _, d := range all {
		for _, s := range specs {
			if s.Matches(d, pfs) {
				if len(s.Tags) > 0 {
					d.Tags = maps.Clone(s.Tags)
				}
				out = append(out, d)
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b numa.PCIDevice) int { return strings.Compare(a.Address, b.Address) })
	return out, nil
}

// pciNodeName is libvirt's node device name of the PCI device at addr.
func pciNodeName(addr string) string {
	return "pci_" + strings.NewReplacer(":", "_", ".", "_").Replace(addr)
}

// childNames reads, from the node devices of docs, the network interface
// of each PCI device that has one (names) and the character device of
// each PCI device that backs a vDPA device (vdpa), by the PCI device's
// node name: the host-side names macvtap and vdpa ports reach them by.
func childNames(docs []string) (names, vdpa map[string]string, err error) {
	names, vdpa = map[string]string{}, map[string]string{}
	for _, doc := range docs {
		var nd struct {
			Name       string `xml:"name"`
			Parent     string `xml:"parent"`
			Capability struct {
				Type      string `xml:"type,attr"`
				Interface string `xml:"interface"`
				Chardev   string `xml:"chardev"`
			} `xml:"capability"`
		}
		if err := xml.Unmarshal([]byte(doc), &nd); err != nil {
			return nil, nil, fmt.Errorf("node device XML does not parse: %w", err)
		}
		switch nd.Capability.Type {
		case "net":
			if nd.Parent != "" && nd.Capability.Interface != "" {
				names[nd.Parent] = nd.Capability.Interface
			}
		case "vdpa":
			if nd.Parent != "" && nd.Capability.Chardev != "" {
				vdpa[nd.Parent] = nd.Capability.Chardev
			}
		}
	}
	return names, vdpa, nil
}

// pciNodeDevices returns the node device XML of every PCI device of the
// host c reaches, and of every network interface and vDPA device, which
// name some of them.
func (c *conn) pciNodeDevices(ctx context.Context) ([]string, error) {
	devs, err := call(ctx, c, func(l *golibvirt.Libvirt) ([]golibvirt.NodeDevice, error) {
		caps := golibvirt.ConnectListNodeDevicesCapPciDev | golibvirt.ConnectListNodeDevicesCapNet | golibvirt.ConnectListNodeDevicesCapVdpa
		d, _, err := l.ConnectListAllNodeDevices(1, uint32(caps))
		return d, err
	})
	if err != nil {
		return nil, c.errorf(err, "list the PCI node devices")
	}
	docs := make([]string, 0, len(devs))
	for _, nd := range devs {
		doc, err := call(ctx, c, func(l *golibvirt.Libvirt) (string, error) { return l.NodeDeviceGetXMLDesc(nd.Name, 0) })
		if err != nil {
			return nil, c.errorf(err, "read node device %s", nd.Name)
		}
		docs = append(docs, doc)
	}
	return docs, nil
}
