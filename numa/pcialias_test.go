package numa

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPCIAliasRequests(t *testing.T) {
	aliases, err := ParsePCIAliases([]byte(`[
		{"name": "nic", "vendor_id": "8086", "product_id": "154c", "device_type": "type-VF", "numa_policy": "required"},
		{"name": "nic", "vendor_id": "15b3", "product_id": "101e", "device_type": "type-VF", "numa_policy": "required"},
		{"name": "gpu", "vendor_id": "10de", "product_id": "1eb8", "capability_type": "pci"}]`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := aliases.Requests("nic:2, gpu:1")
	if err != nil {
		t.Fatal(err)
	}
	want := []PCIRequest{
		{Count: 2, Policy: PCIPolicyRequired, Alias: "nic", Specs: []DeviceSpec{
			{"vendor_id": "8086", "product_id": "154c", "dev_type": "type-VF"},
			{"vendor_id": "15b3", "product_id": "101e", "dev_type": "type-VF"}}},
		{Count: 1, Policy: PCIPolicyLegacy, Alias: "gpu", Specs: []DeviceSpec{{"vendor_id": "10de", "product_id": "1eb8"}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	// The flavor's policy comes before the alias's, as in Nova.
	r := devicesRequest(t, 2, map[string]string{"hw:cpu_policy": "dedicated", "hw:pci_numa_affinity_policy": "preferred"}, got, nil)
	if r.PCI[0].Policy != PCIPolicyPreferred || r.PCI[1].Policy != PCIPolicyPreferred {
		t.Errorf("policies after the flavor's: %s, %s; want preferred", r.PCI[0].Policy, r.PCI[1].Policy)
	}

	for _, tt := range []struct{ spec, want string }{
		{"fpga:1", `PCI alias "fpga" is not defined; configured are gpu, nic`},
		{"nic:0", "nic:0: allowed counts are 1-"},
		{"nic", `pci_passthrough:alias="nic": allowed is ALIAS:COUNT`},
		{"nic:two", `allowed is ALIAS:COUNT`},
	} {
		if _, err := aliases.Requests(tt.spec); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Requests(%q) = %v, want an error containing %q", tt.spec, err, tt.want)
		}
	}
	if _, err := PCIAliases(nil).Requests("nic:1"); err == nil || !strings.Contains(err.Error(), "none are configured (PINFLOW_PCI_ALIAS)") {
		t.Errorf("Requests without aliases = %v", err)
	}
}

func TestParsePCIAliasesRefuses(t *testing.T) {
	for _, tt := range []struct{ json, want string }{
		{`{"name": "a"}`, "a JSON array of alias objects"},
		{`[{"name": "a", "device_id": "1502"}]`, `unknown field "device_id"; allowed fields are name, vendor_id`},
		{`[{"name": " "}]`, "name: allowed are 1-256 characters"},
		{`[{"name": "a:b"}]`, "so a name has neither"},
		{`[{"name": "a", "vendor_id": "80861"}]`, `vendor_id "80861": allowed are four hex digits`},
		{`[{"name": "a", "device_type": "vdpa"}]`, `device_type "vdpa": allowed are type-PCI, type-PF or type-VF`},
		{`[{"name": "a", "numa_policy": "strict"}]`, `numa_policy "strict": allowed are required, legacy, preferred or socket`},
		{`[{"name": "a", "capability_type": "usb"}]`, `capability_type "usb": allowed is pci`},
		{`[{"name": "a", "numa_policy": "required"}, {"name": "a"}]`, "numa_policy legacy, but an earlier entry of the alias has required"},
		{`[{"name": "a", "device_type": "type-PF"}, {"name": "a", "device_type": "type-VF"}]`, `device_type "type-VF", but an earlier entry`},
	} {
		_, err := ParsePCIAliases([]byte(tt.json))
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParsePCIAliases(%s) = %v, want one line containing %q", tt.json, err, tt.want)
		}
	}
}

func TestPortRequests(t *testing.T) {
	yes := true
	reqs, net, err := PortRequests([]Port{
		{Name: "data0", Physnet: "physnet1", VNICType: VNICDirect, Policy: PCIPolicyRequired, Trusted: &yes},
		{Name: "data1", Physnet: "physnet2", VNICType: VNICDirectPhysical},
		{Name: "accel", Physnet: "physnet1", VNICType: VNICVDPA},
		{Name: "mgmt", VNICType: VNICNormal},
		{Name: "prov", Physnet: "physnet3", VNICType: VNICNormal},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []PCIRequest{
		{Count: 1, Policy: PCIPolicyRequired, Port: "data0", VNICType: VNICDirect,
			Specs: []DeviceSpec{{"physical_network": "physnet1", "remote_managed": "false", "trusted": "true"}}},
		{Count: 1, Port: "data1", VNICType: VNICDirectPhysical,
			Specs: []DeviceSpec{{"physical_network": "physnet2", "remote_managed": "false", "dev_type": "type-PF"}}},
		{Count: 1, Port: "accel", VNICType: VNICVDPA,
			Specs: []DeviceSpec{{"physical_network": "physnet1", "remote_managed": "false", "dev_type": "vdpa", TagDevNamed: "true"}}},
	}
	if diff := cmp.Diff(want, reqs); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&NetworkAffinity{Physnets: []string{"physnet1", "physnet2", "physnet3"}, Tunneled: true}, net); diff != "" {
		t.Errorf("network affinity (-want +got):\n%s", diff)
	}
	// A port's own policy comes before the flavor's; the others take the
	// flavor's.
	r := devicesRequest(t, 2, map[string]string{"hw:cpu_policy": "dedicated", "hw:pci_numa_affinity_policy": "socket"}, reqs, net)
	if got := []PCIPolicy{r.PCI[0].Policy, r.PCI[1].Policy}; got[0] != PCIPolicyRequired || got[1] != PCIPolicySocket {
		t.Errorf("policies %v, want the port's required, then the flavor's socket", got)
	}

	for _, tt := range []struct {
		ports []Port
		want  string
	}{
		{[]Port{{Name: "p", VNICType: "sriov"}}, `vnic_type "sriov": allowed are normal, direct, direct-physical`},
		{[]Port{{Name: "p", VNICType: VNICDirect}}, "a direct port takes a device on a physical network; give its physical_network"},
		{[]Port{{Name: "p", Physnet: "x", VNICType: VNICDirect, Policy: "near"}}, `numa_policy "near": allowed are`},
		{[]Port{{Name: "p", VNICType: VNICNormal}, {Name: "p", VNICType: VNICNormal}}, "each port needs a name of its own"},
	} {
		if _, _, err := PortRequests(tt.ports); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("PortRequests(%+v) = %v, want an error containing %q", tt.ports, err, tt.want)
		}
	}
}
