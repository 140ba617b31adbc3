package numa

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func intp(i int) *int { return &i }

func TestDevicePoolJSON(t *testing.T) {
	tests := []struct {
		name, in string
		want     DevicePool
		err      string
	}{
		{"VF with a physnet", `{"vendor_id": "8086", "product_id": "154d", "dev_type": "type-VF", "numa_node": 1, "count": 4, "physical_network": "physnet0"}`,
			DevicePool{VendorID: "8086", ProductID: "154d", DevType: DeviceTypeVF, NUMANode: intp(1), Count: 4, Tags: map[string]string{"physical_network": "physnet0"}}, ""},
		{"defaults", `{"vendor_id": "10de", "product_id": "1eb8", "count": 1}`,
			DevicePool{VendorID: "10de", ProductID: "1eb8", DevType: DeviceTypePCI, Count: 1}, ""},
		{"no NUMA node", `{"vendor_id": "10de", "product_id": "1eb8", "count": 1, "numa_node": null}`,
			DevicePool{VendorID: "10de", ProductID: "1eb8", DevType: DeviceTypePCI, Count: 1}, ""},
		{"missing vendor", `{"product_id": "1eb8", "count": 1}`, DevicePool{}, "vendor_id is missing"},
		{"count not a number", `{"vendor_id": "10de", "product_id": "1eb8", "count": "two"}`, DevicePool{}, `count "two": allowed are whole numbers`},
		{"tag not a string", `{"vendor_id": "10de", "product_id": "1eb8", "count": 1, "physical_network": 3}`, DevicePool{}, "physical_network 3: must be a string"},
		{"numa node not a number", `{"vendor_id": "10de", "product_id": "1eb8", "count": 1, "numa_node": "0"}`, DevicePool{}, `numa_node "0": allowed are a host cell id or null`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got DevicePool
			err := json.Unmarshal([]byte(tt.in), &got)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Unmarshal(%s) = %v, want an error containing %q", tt.in, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Unmarshal(%s): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Fatalf("Unmarshal(%s) (-want +got):\n%s", tt.in, diff)
			}
			out, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			var again DevicePool
			if err := json.Unmarshal(out, &again); err != nil {
				t.Fatalf("Unmarshal(Marshal(%s)) = %s: %v", tt.in, out, err)
			}
			if diff := cmp.Diff(got, again); diff != "" {
				t.Errorf("Marshal round trip of %s (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

// deviceHost is four cells of four pCPUs, cells 0-1 on socket 0 and 2-3
// on socket 1, with the given pools.
func deviceHost(pools ...DevicePool) *Host {
	h := &Host{Devices: pools}
	for i := 0; i < 4; i++ {
		cpus := Range(4*i, 4*i+3)
		h.Cells = append(h.Cells, Cell{ID: i, PCPUs: cpus, Siblings: singles(cpus.String()), MemoryMB: 8192,
			Pages: []PagePool{{SizeKB: 4, Total: 8192 * 256}}, Socket: i / 2})
	}
	return h
}

func vfPool(node *int, count int) DevicePool {
	return DevicePool{VendorID: "8086", ProductID: "154d", DevType: DeviceTypeVF, NUMANode: node, Count: count}
}

func vfRequest(count int) PCIRequest {
	return PCIRequest{Count: count, Specs: []DeviceSpec{{"vendor_id": "8086", "product_id": "154d"}}}
}

func TestHostValidatesPools(t *testing.T) {
	tests := []struct {
		name string
		pool DevicePool
		want string
	}{
		{"vendor", DevicePool{VendorID: "80861", ProductID: "154d", DevType: DeviceTypeVF}, `pci_pools[0]: vendor_id "80861": allowed are four hex digits`},
		{"product", DevicePool{VendorID: "8086", ProductID: "15x4", DevType: DeviceTypeVF}, `product_id "15x4": allowed are four hex digits`},
		{"dev_type", DevicePool{VendorID: "8086", ProductID: "154d", DevType: "type-VFX"}, `dev_type "type-VFX": allowed are type-PCI, type-PF, type-VF or vdpa`},
		{"negative count", DevicePool{VendorID: "8086", ProductID: "154d", DevType: DeviceTypeVF, Count: -2}, "count -2: allowed are 0-1048576"},
		{"unknown cell", DevicePool{VendorID: "8086", ProductID: "154d", DevType: DeviceTypeVF, NUMANode: intp(7)}, "numa_node 7: allowed are the host's cell ids (0, 1, 2, 3) or null"},
		{"bad address", DevicePool{VendorID: "8086", ProductID: "154d", DevType: DeviceTypeVF, Tags: map[string]string{"address": "0000:81:00"}},
			`address "0000:81:00": allowed is a PCI address DDDD:BB:SS.F`},
		{"function out of range", DevicePool{VendorID: "8086", ProductID: "154d", DevType: DeviceTypeVF, Tags: map[string]string{"address": "0000:81:00.8"}},
			`address "0000:81:00.8"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := deviceHost(vfPool(intp(0), 1))
			h.Devices = []DevicePool{tt.pool}
			err := h.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Validate with pool %+v = %v, want one line containing %q", tt.pool, err, tt.want)
			}
		})
	}
	ok := deviceHost(vfPool(intp(0), 1), vfPool(nil, 0))
	ok.Devices[0].Tags = map[string]string{"address": "0000:81:00.1"}
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate of good pools: %v", err)
	}
}

func TestAddDevicesPolicy(t *testing.T) {
	own := vfRequest(1)
	own.Policy = PCIPolicyPreferred
	tests := []struct {
		name          string
		flavor, image map[string]string
		req           PCIRequest
		want          PCIPolicy
		err           string
	}{
		{"default", nil, nil, vfRequest(1), PCIPolicyLegacy, ""},
		{"request's own", nil, nil, own, PCIPolicyPreferred, ""},
		{"flavor over request", map[string]string{"hw:pci_numa_affinity_policy": "required"}, nil, own, PCIPolicyRequired, ""},
		{"image over request", nil, map[string]string{"hw_pci_numa_affinity_policy": "socket"}, own, PCIPolicySocket, ""},
		{"same in both", map[string]string{"hw:pci_numa_affinity_policy": "socket"}, map[string]string{"hw_pci_numa_affinity_policy": "socket"},
			vfRequest(1), PCIPolicySocket, ""},
		{"flavor and image differ", map[string]string{"hw:pci_numa_affinity_policy": "required"}, map[string]string{"hw_pci_numa_affinity_policy": "legacy"},
			vfRequest(1), "", "image hw_pci_numa_affinity_policy=legacy conflicts with flavor hw:pci_numa_affinity_policy=required"},
		{"unknown flavor policy", map[string]string{"hw:pci_numa_affinity_policy": "strict"}, nil, vfRequest(1), "",
			`hw:pci_numa_affinity_policy="strict": allowed values are required, legacy, preferred or socket`},
		{"unknown image policy", nil, map[string]string{"hw_pci_numa_affinity_policy": "Required"}, vfRequest(1), "",
			`hw_pci_numa_affinity_policy="Required": allowed values are required, legacy, preferred or socket`},
		{"unknown request policy", nil, nil, PCIRequest{Count: 1, Specs: own.Specs, Policy: "near"}, "",
			`pci_requests[0].numa_policy="near": allowed values are required, legacy, preferred or socket`},
		{"count zero", nil, nil, vfRequest(0), "", "pci_requests[0].count 0: allowed are whole numbers of at least 1"},
		{"count negative", nil, nil, vfRequest(-1), "", "pci_requests[0].count -1: allowed are whole numbers of at least 1"},
		{"no spec", nil, nil, PCIRequest{Count: 1}, "", "pci_requests[0].spec is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Request{VCPUs: 2, MemoryMB: 1024}
			err := r.AddDevices([]PCIRequest{tt.req}, nil, tt.flavor, tt.image)
			if tt.err != "" {
				var inv *InvalidRequestError
				if !errors.As(err, &inv) || !strings.Contains(err.Error(), tt.err) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("AddDevices(%+v, flavor %v, image %v) = %v, want one line of an *InvalidRequestError containing %q", tt.req, tt.flavor, tt.image, err, tt.err)
				}
				if r.PCI != nil {
					t.Errorf("AddDevices failed but set PCI %+v", r.PCI)
				}
				return
			}
			if err != nil {
				t.Fatalf("AddDevices(%+v, flavor %v, image %v): %v", tt.req, tt.flavor, tt.image, err)
			}
			if got := r.PCI[0].Policy; got != tt.want {
				t.Errorf("AddDevices(%+v, flavor %v, image %v): policy %q, want %q", tt.req, tt.flavor, tt.image, got, tt.want)
			}
		})
	}
}

// An image Nova cannot read refuses the guest whether it asks for devices
// or not; a flavor's unknown policy matters only to a guest with devices.
func TestImagePCIPolicyRefusedWithoutDevices(t *testing.T) {
	in := InstanceSpec{VCPUs: 2, MemoryMB: 1024, ImageProps: map[string]json.RawMessage{"hw_pci_numa_affinity_policy": json.RawMessage(`"strict"`)}}
	if _, err := in.Request(); err == nil || !strings.Contains(err.Error(), `hw_pci_numa_affinity_policy="strict"`) {
		t.Errorf("Request() with image policy strict = %v, want it refused", err)
	}
	in = InstanceSpec{VCPUs: 2, MemoryMB: 1024, ExtraSpecs: map[string]json.RawMessage{"hw:pci_numa_affinity_policy": json.RawMessage(`"strict"`)}}
	if _, err := in.Request(); err != nil {
		t.Errorf("Request() with flavor policy strict and no devices = %v, want a request", err)
	}
	if _, err := NewRequest(2, 1024, map[string]string{"hw:pci_numa_affinity_policy": "strict"}, nil); err == nil {
		t.Errorf("NewRequest with flavor policy strict succeeded; the API refuses it")
	}
}
