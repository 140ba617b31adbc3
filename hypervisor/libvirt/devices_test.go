package libvirt

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/numa"
)

// nodeDeviceXML is a PCI node device as libvirt describes it; sub is its
// SR-IOV sub-capability, if any.
func nodeDeviceXML(addr, vendor, product string, node int, sub string) string {
	var d, b, s, f int
	fmt.Sscanf(addr, "%x:%x:%x.%x", &d, &b, &s, &f)
	return fmt.Sprintf(`<device>
  <name>pci_%04x_%02x_%02x_%x</name>
  <parent>computer</parent>
  <capability type='pci'>
    <class>0x020000</class>
    <domain>%d</domain>
    <bus>%d</bus>
    <slot>%d</slot>
    <function>%d</function>
    <product id='0x%s'>Ethernet Controller</product>
    <vendor id='0x%s'>Intel Corporation</vendor>
    %s
    <numa node='%d'/>
  </capability>
</device>`, d, b, s, f, d, b, s, f, product, vendor, sub, node)
}

func sriovHostDevices() []string {
	pf := func(addr string, node int) string {
		return nodeDeviceXML(addr, "8086", "1572", node, `<capability type='virt_functions' maxCount='64'>
      <address domain='0x0000' bus='0x81' slot='0x10' function='0x0'/>
    </capability>`)
	}
	vf := func(addr, parent string, node int) string {
		var d, b, s, f int
		fmt.Sscanf(parent, "%x:%x:%x.%x", &d, &b, &s, &f)
		return nodeDeviceXML(addr, "8086", "154c", node, fmt.Sprintf(`<capability type='phys_function'>
      <address domain='0x%04x' bus='0x%02x' slot='0x%02x' function='0x%x'/>
    </capability>`, d, b, s, f))
	}
	return []string{
		pf("0000:81:00.0", 1), vf("0000:81:10.0", "0000:81:00.0", 1), vf("0000:81:10.2", "0000:81:00.0", 1),
		pf("0000:82:00.0", 1), vf("0000:82:10.0", "0000:82:00.0", 1),
		nodeDeviceXML("0000:3b:00.0", "10de", "1db4", 0, ""),
		nodeDeviceXML("0000:00:1f.2", "8086", "a102", -1, ""),
		`<device><name>net_eth0</name><capability type='net'><interface>eth0</interface></capability></device>`,
	}
}

func TestOfferedDevices(t *testing.T) {
	one, zero := 1, 0
	vf := func(addr, parent string, tags map[string]string) numa.PCIDevice {
		return numa.PCIDevice{Address: addr, VendorID: "8086", ProductID: "154c", DevType: numa.DeviceTypeVF, PhysFunction: parent, NUMANode: &one, Tags: tags}
	}
	physnet := func(n string) map[string]string { return map[string]string{"physical_network": n} }
	tests := []struct {
		name  string
		spec  string
		cells []int
		want  []numa.PCIDevice
	}{
		{"a PF's address offers its VFs", `[{"address": "0000:81:00.0", "physical_network": "physnet1"}]`, []int{0, 1},
			[]numa.PCIDevice{vf("0000:81:10.0", "0000:81:00.0", physnet("physnet1")), vf("0000:81:10.2", "0000:81:00.0", physnet("physnet1"))}},
		{"by ids and by a wildcard address (PF included), each with its first entry's tags", `[{"address": "0000:82:*.*", "physical_network": "physnet2"}, {"vendor_id": "8086", "product_id": "154c", "physical_network": "physnet1"}]`, []int{0, 1},
			[]numa.PCIDevice{vf("0000:81:10.0", "0000:81:00.0", physnet("physnet1")), vf("0000:81:10.2", "0000:81:00.0", physnet("physnet1")),
				{Address: "0000:82:00.0", VendorID: "8086", ProductID: "1572", DevType: numa.DeviceTypePF, NUMANode: &one, Tags: physnet("physnet2")},
				vf("0000:82:10.0", "0000:82:00.0", physnet("physnet2"))}},
		{"a PF by its ids, and a GPU", `[{"vendor_id": "8086", "product_id": "1572", "physical_network": "physnet1"}, {"vendor_id": "10de"}]`, []int{0, 1},
			[]numa.PCIDevice{
				{Address: "0000:3b:00.0", VendorID: "10de", ProductID: "1db4", DevType: numa.DeviceTypePCI, NUMANode: &zero},
				{Address: "0000:81:00.0", VendorID: "8086", ProductID: "1572", DevType: numa.DeviceTypePF, NUMANode: &one, Tags: physnet("physnet1")},
				{Address: "0000:82:00.0", VendorID: "8086", ProductID: "1572", DevType: numa.DeviceTypePF, NUMANode: &one, Tags: physnet("physnet1")},
			}},
		{"a node without memory, or none, gives no affinity", `[{"vendor_id": "10de"}, {"address": "0000:00:1f.2"}]`, []int{1},
			[]numa.PCIDevice{
				{Address: "0000:00:1f.2", VendorID: "8086", ProductID: "a102", DevType: numa.DeviceTypePCI},
				{Address: "0000:3b:00.0", VendorID: "10de", ProductID: "1db4", DevType: numa.DeviceTypePCI},
			}},
		{"nothing matches", `[{"vendor_id": "15b3"}]`, []int{0, 1}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			specs, err := libvirthost.ParseDeviceSpecs(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := OfferedDevices(sriovHostDevices(), specs, tt.cells)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("OfferedDevices(%s) (-want +got):\n%s", tt.spec, diff)
			}
		})
	}
}

// TestOfferedDevicesNames: a VF's network interface becomes its dev_name
// (a macvtap port's), and a VF that backs a vDPA device becomes that vdpa
// device, named by its character device; a PF's interface names nothing.
func TestOfferedDevicesNames(t *testing.T) {
	docs := append(sriovHostDevices(),
		`<device><name>net_enp129s16f0_52_54_00_00_00_01</name><parent>pci_0000_81_10_0</parent><capability type='net'><interface>enp129s16f0</interface></capability></device>`,
		`<device><name>net_enp129s0f0_52_54_00_00_00_02</name><parent>pci_0000_81_00_0</parent><capability type='net'><interface>enp129s0f0</interface></capability></device>`,
		`<device><name>vdpa_vdpa0</name><parent>pci_0000_81_10_2</parent><capability type='vdpa'><chardev>/dev/vhost-vdpa-0</chardev></capability></device>`)
	specs, err := libvirthost.ParseDeviceSpecs(`[{"vendor_id": "8086", "physical_network": "physnet1"}]`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := OfferedDevices(docs, specs, []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	types := map[string]numa.DeviceType{}
	for _, d := range got {
		names[d.Address], types[d.Address] = d.DevName, d.DevType
	}
	want := map[string]string{"0000:81:00.0": "", "0000:81:10.0": "enp129s16f0", "0000:81:10.2": "/dev/vhost-vdpa-0", "0000:82:00.0": "", "0000:82:10.0": ""}
	for a, n := range want {
		if names[a] != n {
			t.Errorf("device %s has dev_name %q, want %q", a, names[a], n)
		}
	}
	if types["0000:81:10.2"] != numa.DeviceTypeVDPA || types["0000:81:10.0"] != numa.DeviceTypeVF {
		t.Errorf("device types = %v; want 0000:81:10.2 vdpa and 0000:81:10.0 a VF", types)
	}
}
