package numa

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// sriovHost is deviceHost with listed devices: on cell 0 a PF with three
// VFs, on cell 1 a PF with one VF, and a GPU with no NUMA node.
func sriovHost() *Host {
	h := deviceHost()
	vf := func(addr, pf string, node int) PCIDevice {
		return PCIDevice{Address: addr, VendorID: "8086", ProductID: "154c", DevType: DeviceTypeVF, PhysFunction: pf,
			NUMANode: intp(node), Tags: map[string]string{"physical_network": "physnet1"}}
	}
	h.PCIDevices = []PCIDevice{
		{Address: "0000:81:00.0", VendorID: "8086", ProductID: "1572", DevType: DeviceTypePF, NUMANode: intp(0),
			Tags: map[string]string{"physical_network": "physnet1"}},
		vf("0000:81:02.0", "0000:81:00.0", 0), vf("0000:81:02.1", "0000:81:00.0", 0), vf("0000:81:02.2", "0000:81:00.0", 0),
		{Address: "0000:82:00.0", VendorID: "8086", ProductID: "1572", DevType: DeviceTypePF, NUMANode: intp(1),
			Tags: map[string]string{"physical_network": "physnet1"}},
		vf("0000:82:02.0", "0000:82:00.0", 1),
		{Address: "0000:3b:00.0", VendorID: "10de", ProductID: "1eb8", DevType: DeviceTypePCI},
	}
	return h
}

func pfRequest(count int) PCIRequest {
	return PCIRequest{Count: count, Specs: []DeviceSpec{{"vendor_id": "8086", "product_id": "1572", "dev_type": "type-PF"}}}
}

func sriovVFRequest(count int) PCIRequest {
	return PCIRequest{Count: count, Specs: []DeviceSpec{{"vendor_id": "8086", "product_id": "154c"}}}
}

func takenSet(addrs ...string) func(string) bool {
	return func(a string) bool { return slices.Contains(addrs, a) }
}

func TestFreeDevicePools(t *testing.T) {
	h := sriovHost()
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	summary := func(pools []DevicePool) string {
		var parts []string
		for _, p := range pools {
			parts = append(parts, p.String()+" "+strings.Join(p.Addresses, ","))
		}
		return strings.Join(parts, "; ")
	}
	tests := []struct {
		name  string
		taken []string
		want  string
	}{
		{"all free", nil, "8086:1572 type-PF on cell 0 0000:81:00.0; 8086:154c type-VF on cell 0 0000:81:02.0,0000:81:02.1,0000:81:02.2; " +
			"8086:1572 type-PF on cell 1 0000:82:00.0; 8086:154c type-VF on cell 1 0000:82:02.0; 10de:1eb8 type-PCI on no NUMA node 0000:3b:00.0"},
		// A VF in use keeps its PF from being taken whole.
		{"a VF taken", []string{"0000:81:02.1"},
			"8086:154c type-VF on cell 0 0000:81:02.0,0000:81:02.2; " +
				"8086:1572 type-PF on cell 1 0000:82:00.0; 8086:154c type-VF on cell 1 0000:82:02.0; 10de:1eb8 type-PCI on no NUMA node 0000:3b:00.0"},
		// A PF taken holds its VFs (DeviceHolds), so none of them is free.
		{"a PF taken", h.DeviceHolds("0000:82:00.0"),
			"8086:1572 type-PF on cell 0 0000:81:00.0; 8086:154c type-VF on cell 0 0000:81:02.0,0000:81:02.1,0000:81:02.2; " +
				"10de:1eb8 type-PCI on no NUMA node 0000:3b:00.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := summary(h.FreeDevicePools(takenSet(tt.taken...))); got != tt.want {
				t.Errorf("pools\n got %s\nwant %s", got, tt.want)
			}
		})
	}
	if got := h.DeviceHolds("0000:81:00.0"); !slices.Equal(got, []string{"0000:81:00.0", "0000:81:02.0", "0000:81:02.1", "0000:81:02.2"}) {
		t.Errorf("a PF holds %v, want itself and its three VFs", got)
	}
	if got := h.DeviceHolds("0000:81:02.0"); !slices.Equal(got, []string{"0000:81:02.0"}) {
		t.Errorf("a VF holds %v, want itself", got)
	}
}

// A fit on a host that lists its devices names the devices it takes, and
// PlacementDevices gives what the placement holds: taking them away leaves
// pools from which the next fit takes others.
func TestFitNamesListedDevices(t *testing.T) {
	dedicated := map[string]string{"hw:cpu_policy": "dedicated", "hw:pci_numa_affinity_policy": "required"}
	h := sriovHost()
	var held []string
	fit := func(req PCIRequest) (*Placement, error) {
		host := h.Clone()
		host.Devices = h.FreeDevicePools(takenSet(held...))
		p, err := Fit(host, devicesRequest(t, 2, dedicated, []PCIRequest{req}, nil))
		if err != nil {
			return nil, err
		}
		got, err := h.PlacementDevices(p)
		if err != nil {
			t.Fatalf("PlacementDevices(%s): %v", p, err)
		}
		held = append(held, got...)
		return p, nil
	}
	p, err := fit(sriovVFRequest(2))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0000:81:02.0", "0000:81:02.1"}; !slices.Equal(p.Devices[0].Addresses, want) {
		t.Fatalf("first VFs %v, want %v (%s)", p.Devices[0].Addresses, want, p)
	}
	// Cell 0's PF has VFs in use: a PF comes from cell 1, and holds its VF.
	p, err = fit(pfRequest(1))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0000:82:00.0"}; !slices.Equal(p.Devices[0].Addresses, want) || p.Cells[0].HostCell != 1 {
		t.Fatalf("PF %v on h%d, want %v on h1 (%s)", p.Devices[0].Addresses, p.Cells[0].HostCell, want, p)
	}
	if !slices.Contains(held, "0000:82:02.0") {
		t.Fatalf("the PF's VF is not held: %v", held)
	}
	// One VF is left, on cell 0; two are asked for.
	if _, err := fit(sriovVFRequest(2)); err == nil {
		t.Fatalf("fitted two VFs with one free; held %v", held)
	}
	if p, err = fit(sriovVFRequest(1)); err != nil || !slices.Equal(p.Devices[0].Addresses, []string{"0000:81:02.2"}) {
		t.Fatalf("last VF: %v, %v", p, err)
	}

	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var back Placement
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(p.Devices, back.Devices); diff != "" {
		t.Errorf("devices after a JSON round trip (-want +got):\n%s", diff)
	}
}

func TestPlacementDevicesRefuses(t *testing.T) {
	h := sriovHost()
	take := func(count int, addrs ...string) *Placement {
		return &Placement{Devices: []DeviceTake{{VendorID: "8086", ProductID: "154c", Count: count, Addresses: addrs}}}
	}
	tests := []struct {
		name string
		p    *Placement
		want string
	}{
		{"no addresses", take(1), "takes 1 devices of pool 0 but names 0 addresses"},
		{"unlisted", take(1, "0000:99:00.0"), "PCI device 0000:99:00.0, which the host does not list"},
		{"other product", take(1, "0000:3b:00.0"), "takes PCI device 0000:3b:00.0 as 8086:154c, but it is 10de:1eb8"},
		{"twice", take(2, "0000:81:02.0", "0000:81:02.0"), "takes PCI device 0000:81:02.0 twice"},
		{"a PF and its VF", &Placement{Devices: []DeviceTake{
			{VendorID: "8086", ProductID: "1572", Count: 1, Addresses: []string{"0000:81:00.0"}},
			{VendorID: "8086", ProductID: "154c", Count: 1, Addresses: []string{"0000:81:02.1"}}}}, "takes PCI device 0000:81:02.1 twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.PlacementDevices(tt.p)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("PlacementDevices = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestHostValidatesDevices(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Host)
		want string
	}{
		{"address", func(h *Host) { h.PCIDevices[1].Address = "0000:81:02" }, `pci_devices[1]: address "0000:81:02": allowed is a PCI address`},
		{"upper case", func(h *Host) { h.PCIDevices[6].Address = "0000:3B:00.0" }, `write its hex digits in lower case (0000:3b:00.0)`},
		{"twice", func(h *Host) { h.PCIDevices[2].Address = "0000:81:02.0" }, "address 0000:81:02.0 is listed twice"},
		{"vendor", func(h *Host) { h.PCIDevices[0].VendorID = "808" }, `vendor_id "808": allowed are four hex digits`},
		{"type", func(h *Host) { h.PCIDevices[0].DevType = "type-NIC" }, `dev_type "type-NIC": allowed are type-PCI, type-PF, type-VF or vdpa`},
		{"PF with a parent", func(h *Host) { h.PCIDevices[0].PhysFunction = "0000:80:00.0" }, "only a type-VF or vdpa device has a parent"},
		{"parent not a PF", func(h *Host) { h.PCIDevices[1].PhysFunction = "0000:3b:00.0" }, "parent_addr 0000:3b:00.0 is a type-PCI, not a type-PF"},
		{"node", func(h *Host) { h.PCIDevices[6].NUMANode = intp(9) }, "numa_node 9: allowed are the host's cell ids (0, 1, 2, 3) or null"},
		{"tag", func(h *Host) { h.PCIDevices[6].Tags = map[string]string{"count": "3"} }, `tag "count": tags are named properties`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := sriovHost()
			tt.edit(h)
			err := h.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Validate = %v, want one line containing %q", err, tt.want)
			}
		})
	}
}

// TestFitHoldsWithinOnePlacement takes a VF and a PF in one fit: the PF
// must not be the taken VF's parent, and with only that PF free on the
// cell the guest does not fit there.
func TestFitHoldsWithinOnePlacement(t *testing.T) {
	h := sriovHost()
	h.Devices = h.FreeDevicePools(takenSet())
	spec := map[string]string{"hw:cpu_policy": "dedicated", "hw:pci_numa_affinity_policy": "preferred"}
	p, err := Fit(h.Clone(), devicesRequest(t, 2, spec, []PCIRequest{sriovVFRequest(1), pfRequest(1)}, nil))
	if err != nil {
		t.Fatal(err)
	}
	held, err := h.PlacementDevices(p)
	if err != nil {
		t.Fatalf("the placement holds a device twice: %v (%s)", err, p)
	}
	if !slices.Contains(held, "0000:82:00.0") || slices.Contains(held, "0000:81:00.0") {
		t.Errorf("VF and PF of one fit = %v; want the PF of the other NIC", held)
	}
	// Both PFs' NICs asked for whole, and a VF besides: no device is left
	// for the VF.
	if p, err := Fit(h.Clone(), devicesRequest(t, 2, spec, []PCIRequest{pfRequest(2), sriovVFRequest(1)}, nil)); err == nil {
		t.Errorf("fitted two PFs and a VF of them: %s", p)
	}
}
