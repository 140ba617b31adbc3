package guestxml

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// deviceHost is testHost with, on cell 1, a NIC PF with two VFs on
// physnet1 and a second PF without VFs, and a GPU on cell 0.
func deviceHost() *numa.Host {
	h := testHost()
	one, zero := 1, 0
	nic := func(addr string, t numa.DeviceType, parent string) numa.PCIDevice {
		return numa.PCIDevice{Address: addr, VendorID: "8086", ProductID: map[numa.DeviceType]string{numa.DeviceTypePF: "1572", numa.DeviceTypeVF: "154c"}[t],
			DevType: t, PhysFunction: parent, NUMANode: &one, Tags: map[string]string{"physical_network": "physnet1"}}
	}
	h.PCIDevices = []numa.PCIDevice{
		nic("0000:81:00.0", numa.DeviceTypePF, ""),
		nic("0000:81:10.0", numa.DeviceTypeVF, "0000:81:00.0"),
		nic("0000:81:10.1", numa.DeviceTypeVF, "0000:81:00.0"),
		nic("0000:82:00.0", numa.DeviceTypePF, ""),
		{Address: "0000:05:00.0", VendorID: "10de", ProductID: "1db4", DevType: numa.DeviceTypePCI, NUMANode: &zero},
	}
	h.Devices = h.FreeDevicePools(func(string) bool { return false })
	return h
}

// deviceRequest asks for the GPU by alias, a direct port and a
// direct-physical port on physnet1.
func deviceRequest(t *testing.T) *numa.Request {
	t.Helper()
	req, err := numa.NewRequest(2, 1024, map[string]string{"hw:cpu_policy": "dedicated"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ports, net, err := numa.PortRequests([]numa.Port{
		{Name: "data", Physnet: "physnet1", VNICType: numa.VNICDirect},
		{Name: "uplink", Physnet: "physnet1", VNICType: numa.VNICDirectPhysical},
	})
	if err != nil {
		t.Fatal(err)
	}
	gpu := numa.PCIRequest{Count: 1, Specs: []numa.DeviceSpec{{"vendor_id": "10de", "product_id": "1db4"}}, Alias: "gpu", Policy: numa.PCIPolicy("preferred")}
	if err := req.AddDevices(append([]numa.PCIRequest{gpu}, ports...), net, nil, nil); err != nil {
		t.Fatal(err)
	}
	return req
}

// newWithDevices fits deviceRequest on deviceHost and writes its domain.
func newWithDevices(t *testing.T) (*numa.Host, *numa.Request, *numa.Placement, string) {
	t.Helper()
	h, req := deviceHost(), deviceRequest(t)
	p, err := numa.Fit(h, req)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := New(testName, testUUID, req, p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return h, req, p, doc
}

func TestNewWithDevices(t *testing.T) {
	h, _, p, doc := newWithDevices(t)
	testenv.ValidateDomainXML(t, "guest with devices", doc)
	d := parse(t, "new", doc)
	got := map[string]string{}
	for _, hd := range d.Devices.Hostdevs {
		got[hd.Alias.Name] = "hostdev " + address(hd.SubsysPCI.Source.Address)
	}
	for _, i := range d.Devices.Interfaces {
		got[i.Alias.Name] = "interface " + address(i.Source.Hostdev.PCI.Address)
	}
	want := map[string]string{
		xmlpatch.DeviceAlias(0, 0): "hostdev 0000:05:00.0",
		xmlpatch.DeviceAlias(1, 0): "interface " + p.Devices[1].Addresses[0],
		xmlpatch.DeviceAlias(2, 0): "hostdev 0000:82:00.0",
	}
	if len(got) != len(want) {
		t.Fatalf("device elements = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("element %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if a := p.Devices[1].Addresses[0]; !strings.HasPrefix(a, "0000:81:10.") {
		t.Errorf("the direct port took %s, want a VF of 0000:81:00.0", a)
	}
	pins, err := xmlpatch.Read(doc)
	if err != nil {
		t.Fatal(err)
	}
	held, err := h.PlacementDevices(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(slices.Values(pins.Devices)); !slices.Equal(got, held) {
		t.Errorf("the domain passes through %v, the placement holds %v", got, held)
	}
}

// TestResizeReplacesDevices drops the devices written for the old flavor,
// writes the new one's, and keeps a device the operator added.
func TestResizeReplacesDevices(t *testing.T) {
	_, req, p, doc := newWithDevices(t)
	own := "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' bus='0x03' slot='0x00' function='0x0'/></source></hostdev>"
	doc = strings.Replace(doc, "</devices>", own+"</devices>", 1)
	smaller, pSmall := fit(t, flavorSpec{vcpus: 2, memoryMB: 1024, specs: map[string]string{"hw:cpu_policy": "dedicated"}})
	out, err := Resize(doc, smaller, pSmall, Options{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.ValidateDomainXML(t, "resized guest", out)
	pins, err := xmlpatch.Read(out)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pins.Devices, []string{"0000:03:00.0"}) {
		t.Errorf("resized to a flavor without devices, the domain passes through %v; want only the operator's 0000:03:00.0", pins.Devices)
	}
	back, err := Resize(out, req, p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if pins, err = xmlpatch.Read(back); err != nil {
		t.Fatal(err)
	}
	if len(pins.Devices) != 4 {
		t.Errorf("resized back, the domain passes through %v; want the three placed devices and the operator's", pins.Devices)
	}
}

func TestNewDeviceErrors(t *testing.T) {
	req := deviceRequest(t)
	p, err := numa.Fit(deviceHost(), req)
	if err != nil {
		t.Fatal(err)
	}
	short := *p
	short.Devices = p.Devices[:2]
	if _, err := New(testName, testUUID, req, &short, Options{}); err == nil || !strings.Contains(err.Error(), "PCI request 2 asks for 1 devices but the placement takes 0") {
		t.Errorf("New with a placement missing a device = %v", err)
	}
	macvtap := *req
	macvtap.PCI = slices.Clone(req.PCI)
	macvtap.PCI[1].VNICType = numa.VNICMacvtap
	if _, err := New(testName, testUUID, &macvtap, p, Options{}); err == nil || !strings.Contains(err.Error(), "port data: vnic_type macvtap") {
		t.Errorf("New with a macvtap port = %v", err)
	}
}

func address(a *libvirtxml.DomainAddressPCI) string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", *a.Domain, *a.Bus, *a.Slot, *a.Function)
}

// TestNamedPorts writes the interfaces of the ports that reach their
// device by its host-side name: a macvtap on a VF's netdev, a vDPA
// device, and a VF's relay socket for virtio-forwarder. The documents are
// schema-valid, Read names the devices, and Patch moves each to the
// device another placement takes, by its name there.
func TestNamedPorts(t *testing.T) {
	h := testHost()
	one := 1
	dev := func(addr string, typ numa.DeviceType, physnet, name string) numa.PCIDevice {
		return numa.PCIDevice{Address: addr, VendorID: "15b3", ProductID: "101e", DevType: typ, PhysFunction: "0000:81:00.0",
			NUMANode: &one, Tags: map[string]string{"physical_network": physnet}, DevName: name}
	}
	h.PCIDevices = []numa.PCIDevice{
		{Address: "0000:81:00.0", VendorID: "15b3", ProductID: "101d", DevType: numa.DeviceTypePF, NUMANode: &one},
		dev("0000:81:00.2", numa.DeviceTypeVF, "physnet1", "enp129s0f0v0"),
		dev("0000:81:00.3", numa.DeviceTypeVF, "physnet1", "enp129s0f0v1"),
		dev("0000:81:00.4", numa.DeviceTypeVDPA, "physnet1", "/dev/vhost-vdpa-0"),
		dev("0000:81:00.5", numa.DeviceTypeVDPA, "physnet1", "/dev/vhost-vdpa-1"),
		dev("0000:81:00.6", numa.DeviceTypeVF, "physnet2", "/run/virtio-forwarder/vf6.sock"),
		dev("0000:81:00.7", numa.DeviceTypeVF, "physnet2", "/run/virtio-forwarder/vf7.sock"),
	}
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	h.Devices = h.FreeDevicePools(func(string) bool { return false })
	req, err := numa.NewRequest(2, 1024, map[string]string{"hw:cpu_policy": "dedicated"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ports, net, err := numa.PortRequests([]numa.Port{
		{Name: "tap", Physnet: "physnet1", VNICType: numa.VNICMacvtap},
		{Name: "accel", Physnet: "physnet1", VNICType: numa.VNICVDPA},
		{Name: "relay", Physnet: "physnet2", VNICType: numa.VNICVirtioForwarder},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := req.AddDevices(ports, net, nil, nil); err != nil {
		t.Fatal(err)
	}
	p, err := numa.Fit(h, req)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := New(testName, testUUID, req, p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.ValidateDomainXML(t, "guest with named ports", doc)
	for _, want := range []string{
		"<interface type=\"direct\">", "<source dev=\"enp129s0f0v0\" mode=\"passthrough\"></source>",
		"<interface type=\"vdpa\">", "<source dev=\"/dev/vhost-vdpa-0\"></source>",
		"<interface type=\"vhostuser\">", "<source type=\"unix\" mode=\"client\" path=\"/run/virtio-forwarder/vf6.sock\"></source>",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the domain has no %s:\n%s", want, doc)
		}
	}
	pins, err := xmlpatch.Read(doc)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"enp129s0f0v0", "/dev/vhost-vdpa-0", "/run/virtio-forwarder/vf6.sock"}; !slices.Equal(pins.DeviceNames, want) {
		t.Errorf("Read names %v, want %v", pins.DeviceNames, want)
	}
	held, err := h.PlacementDevices(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(slices.Values(pins.DeviceAddresses(h))); !slices.Equal(got, held) {
		t.Errorf("the domain uses %v, the placement holds %v", got, held)
	}

	// Another placement takes the other device of each pool.
	moved := *p
	moved.Devices = slices.Clone(p.Devices)
	for i := range moved.Devices {
		d := &moved.Devices[i]
		a := d.Addresses[0]
		next := a[:len(a)-1] + string(a[len(a)-1]+1)
		d.Addresses, d.Names = []string{next}, []string{h.PCIDevice(next).DevName}
	}
	patched, err := xmlpatch.Patch(doc, &moved)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ValidateDomainXML(t, "guest with named ports, moved", patched)
	pins, err = xmlpatch.Read(patched)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"enp129s0f0v1", "/dev/vhost-vdpa-1", "/run/virtio-forwarder/vf7.sock"}; !slices.Equal(pins.DeviceNames, want) {
		t.Errorf("after Patch the domain names %v, want %v", pins.DeviceNames, want)
	}
	noNames := moved
	noNames.Devices = slices.Clone(moved.Devices)
	noNames.Devices[0].Names = nil
	if _, err := xmlpatch.Patch(doc, &noNames); !errors.Is(err, xmlpatch.ErrPlacement) {
		t.Errorf("Patch to a device without a name = %v, want ErrPlacement", err)
	}
}
