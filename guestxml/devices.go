package guestxml

import (
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// WritableVNICTypes are the port types whose device New can write into a
// domain: a VF as a network interface (direct, remote-managed), a whole
// PF as a host device (direct-physical), and, by the device's host-side
// name (numa.PCIDevice.DevName), a VF's netdev as a macvtap interface in
// passthrough mode (macvtap), a vDPA device (vdpa) and the vhost-user
// socket of the relay that forwards a VF (virtio-forwarder).
var WritableVNICTypes = []string{numa.VNICDirect, numa.VNICDirectPhysical, numa.VNICRemoteManaged,
	numa.VNICMacvtap, numa.VNICVDPA, numa.VNICVirtioForwarder}

// addDevices writes one element per PCI device p takes, in the order of
// the requests: a port's VF as <interface type='hostdev'>, a PF of a
// direct-physical port and an alias's device as <hostdev>. Each carries
// the user alias xmlpatch.DeviceAlias(request, i), by which xmlpatch moves
// it to another host's devices.
func addDevices(list *libvirtxml.DomainDeviceList, req *numa.Request, p *numa.Placement) error {
	if p == nil {
		if len(req.PCI) > 0 {
			return fmt.Errorf("the guest asks for %d PCI requests but has no placement to take devices from", len(req.PCI))
		}
		return nil
	}
	taken, names := map[int][]string{}, map[int][]string{}
	for _, t := range p.Devices {
		if len(t.Addresses) != t.Count {
			return fmt.Errorf("request %d takes %d devices but the placement names %d addresses", t.Request, t.Count, len(t.Addresses))
		}
		taken[t.Request] = append(taken[t.Request], t.Addresses...)
		n := t.Names
		if n == nil {
			n = make([]string, len(t.Addresses))
		}
		names[t.Request] = append(names[t.Request], n...)
	}
	for r, pr := range req.PCI {
		if len(taken[r]) != pr.Count {
			return fmt.Errorf("PCI request %d asks for %d devices but the placement takes %d", r, pr.Count, len(taken[r]))
		}
		for i, a := range taken[r] {
			src, err := pciSource(a)
			if err != nil {
				return err
			}
			alias := &libvirtxml.DomainAlias{Name: xmlpatch.DeviceAlias(r, i)}
			switch pr.VNICType {
			case "", numa.VNICDirectPhysical:
				list.Hostdevs = append(list.Hostdevs, libvirtxml.DomainHostdev{
					Managed: "yes", SubsysPCI: &libvirtxml.DomainHostdevSubsysPCI{Source: src}, Alias: alias,
				})
			case numa.VNICDirect, numa.VNICRemoteManaged:
				list.Interfaces = append(list.Interfaces, libvirtxml.DomainInterface{
					Managed: "yes", Source: &libvirtxml.DomainInterfaceSource{Hostdev: &libvirtxml.DomainInterfaceSourceHostdev{PCI: src}}, Alias: alias,
				})
			case numa.VNICMacvtap, numa.VNICVDPA, numa.VNICVirtioForwarder:
				name := names[r][i]
				if name == "" {
					return fmt.Errorf("port %s: vnic_type %s reaches device %s by its host-side name, and the host's device list gives it none (dev_name)", pr.Port, pr.VNICType, a)
				}
				list.Interfaces = append(list.Interfaces, namedInterface(pr.VNICType, name, alias))
			default:
				return fmt.Errorf("port %s: vnic_type %s: the domain XML can be written for %s ports", pr.Port, pr.VNICType, strings.Join(WritableVNICTypes, ", "))
			}
		}
	}
	return nil
}

// namedInterface is the interface of a port that reaches its device by
// the device's host-side name rather than passing it through: a macvtap
// on the VF's netdev in passthrough mode, a vDPA device, or the
// vhost-user socket of the relay that forwards the VF.
func namedInterface(vnic, name string, alias *libvirtxml.DomainAlias) libvirtxml.DomainInterface {
	virtio := &libvirtxml.DomainInterfaceModel{Type: "virtio"}
	switch vnic {
	case numa.VNICMacvtap:
		return libvirtxml.DomainInterface{Source: &libvirtxml.DomainInterfaceSource{
			Direct: &libvirtxml.DomainInterfaceSourceDirect{Dev: name, Mode: "passthrough"}}, Model: virtio, Alias: alias}
	case numa.VNICVDPA:
		return libvirtxml.DomainInterface{Source: &libvirtxml.DomainInterfaceSource{
			VDPA: &libvirtxml.DomainInterfaceSourceVDPA{Device: name}}, Alias: alias}
	}
	return libvirtxml.DomainInterface{Source: &libvirtxml.DomainInterfaceSource{VHostUser: &libvirtxml.DomainInterfaceSourceVHostUser{
		Chardev: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Path: name, Mode: "client"}}}}, Model: virtio, Alias: alias}
}

// dropDevices removes the device elements pinflow wrote for an earlier
// placement; the operator's own are kept.
func dropDevices(list *libvirtxml.DomainDeviceList) {
	if list == nil {
		return
	}
	mine := func(a *libvirtxml.DomainAlias) bool {
		return a != nil && xmlpatch.IsDeviceAlias(a.Name)
	}
	hostdevs := list.Hostdevs[:0]
	for _, h := range list.Hostdevs {
		if !mine(h.Alias) {
			hostdevs = append(hostdevs, h)
		}
	}
	list.Hostdevs = hostdevs
	ifaces := list.Interfaces[:0]
	for _, i := range list.Interfaces {
		if !mine(i.Alias) {
			ifaces = append(ifaces, i)
		}
	}
	list.Interfaces = ifaces
}

// pciSource is the <source> of host PCI device a ("0000:81:00.1").
func pciSource(a string) (*libvirtxml.DomainHostdevSubsysPCISource, error) {
	var d, b, s, f uint
	if _, err := fmt.Sscanf(a, "%4x:%2x:%2x.%1x", &d, &b, &s, &f); err != nil || fmt.Sprintf("%04x:%02x:%02x.%x", d, b, s, f) != a {
		return nil, fmt.Errorf("device address %q: allowed is dddd:bb:ss.f in lower-case hex", a)
	}
	return &libvirtxml.DomainHostdevSubsysPCISource{Address: &libvirtxml.DomainAddressPCI{Domain: &d, Bus: &b, Slot: &s, Function: &f}}, nil
}
