package numa

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func devicesRequest(t *testing.T, vcpus int, flavor map[string]string, pci []PCIRequest, net *NetworkAffinity) *Request {
	t.Helper()
	r, err := NewRequest(vcpus, int64(1024*vcpus), flavor, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.AddDevices(pci, net, flavor, nil); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestFitDevices(t *testing.T) {
	dedicated := map[string]string{"hw:cpu_policy": "dedicated"}
	with := func(policy string) map[string]string {
		return map[string]string{"hw:cpu_policy": "dedicated", "hw:pci_numa_affinity_policy": policy}
	}
	busy := func(h *Host, cells ...int) *Host {
		for _, c := range cells {
			h.Cells[c].PinnedCPUs = h.Cells[c].PCPUs
		}
		return h
	}
	tests := []struct {
		name    string
		host    *Host
		req     *Request
		cells   string // guest cell -> host cell, "" for no fit
		devices string // Placement.String's pci part, or the no-fit error's
	}{
		{"devices first", deviceHost(vfPool(intp(2), 2)), devicesRequest(t, 2, dedicated, []PCIRequest{vfRequest(1)}, nil),
			"0->2", "pci 8086:154d x1 from pool 0 (h2)"},
		{"no devices, device cells last", deviceHost(vfPool(intp(0), 2), vfPool(intp(1), 2)), devicesRequest(t, 2, dedicated, nil, nil),
			"0->2", ""},
		{"required on a busy cell", busy(deviceHost(vfPool(intp(0), 2)), 0), devicesRequest(t, 2, with("required"), []PCIRequest{vfRequest(1)}, nil),
			"", "on host cells 1: PCI request 0 wants 1 of 8086:154d (required) and finds 0"},
		{"legacy with no NUMA node", deviceHost(vfPool(intp(3), 1), vfPool(nil, 2)), devicesRequest(t, 2, dedicated, []PCIRequest{vfRequest(2)}, nil),
			"0->3", "pci 8086:154d x1 from pool 0 (h3), 8086:154d x1 from pool 1 (no NUMA node)"},
		{"preferred far", busy(deviceHost(vfPool(intp(0), 2)), 0), devicesRequest(t, 2, with("preferred"), []PCIRequest{vfRequest(1)}, nil),
			"0->1", "pci 8086:154d x1 from pool 0 (h0)"},
		{"socket", busy(deviceHost(vfPool(intp(0), 2)), 0), devicesRequest(t, 2, with("socket"), []PCIRequest{vfRequest(1)}, nil),
			"0->1", "pci 8086:154d x1 from pool 0 (h0)"},
		{"socket elsewhere", busy(deviceHost(vfPool(intp(0), 2)), 0, 1), devicesRequest(t, 2, with("socket"), []PCIRequest{vfRequest(1)}, nil),
			"", "and finds 0"},
		{"two cells for two devices", deviceHost(vfPool(intp(0), 1), vfPool(intp(3), 1)),
			devicesRequest(t, 4, map[string]string{"hw:cpu_policy": "dedicated", "hw:numa_nodes": "2", "hw:pci_numa_affinity_policy": "required"},
				[]PCIRequest{vfRequest(2)}, nil),
			"0->0,1->3", "pci 8086:154d x1 from pool 0 (h0), 8086:154d x1 from pool 1 (h3)"},
		{"no NUMA topology", deviceHost(vfPool(intp(1), 1)), devicesRequest(t, 2, nil, []PCIRequest{vfRequest(1)}, nil),
			"", "no NUMA placement, floating on 0-15; pci 8086:154d x1 from pool 0 (h1)"},
		{"no NUMA topology, too few", deviceHost(vfPool(intp(1), 1)), devicesRequest(t, 2, nil, []PCIRequest{vfRequest(2)}, nil),
			"", "without a NUMA placement: PCI request 0 wants 2 of 8086:154d (legacy) and finds 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.host.Limits == nil {
				tt.host.Limits = &Limits{CPUAllocationRatio: 16, RAMAllocationRatio: 1.5}
			}
			for i := range tt.host.Cells {
				tt.host.Cells[i].CPUs = tt.host.Cells[i].PCPUs
			}
			if err := tt.host.Validate(); err != nil {
				t.Fatal(err)
			}
			p, err := Fit(tt.host, tt.req)
			switch {
			case err != nil && (tt.cells != "" || strings.HasPrefix(tt.devices, "no NUMA")):
				t.Fatalf("Fit: %v, want %s %s", err, tt.cells, tt.devices)
			case err != nil:
				var nf *NoFitError
				if !errors.As(err, &nf) || !strings.Contains(err.Error(), tt.devices) || nf.Lacks()[0] != ResourceDevices {
					t.Fatalf("Fit: %v, want a no fit lacking devices that says %q", err, tt.devices)
				}
				return
			case tt.cells == "" && !strings.HasPrefix(tt.devices, "no NUMA"):
				t.Fatalf("Fit = %s, want no fit: %s", p, tt.devices)
			}
			if got := cellMapOf(p); got != tt.cells {
				t.Errorf("Fit = %s, want host cells %s", p, tt.cells)
			}
			if tt.devices != "" && !strings.HasSuffix(p.String(), tt.devices) {
				t.Errorf("Fit = %q, want it to end %q", p, tt.devices)
			}
			for _, prob := range deviceProblems(tt.host, tt.req, p) {
				t.Errorf("Fit = %s: %s", p, prob)
			}
		})
	}
}

func TestFitNetworks(t *testing.T) {
	h := deviceHost()
	h.Cells[0].Network = &NetworkAffinity{Physnets: []string{"physnet0"}, Tunneled: true}
	h.Cells[2].Network = &NetworkAffinity{Physnets: []string{"physnet1"}}
	h.Cells[3].Network = &NetworkAffinity{Physnets: []string{"physnet1"}}
	for i := range h.Cells {
		h.Cells[i].CPUs = h.Cells[i].PCPUs
	}
	dedicated := map[string]string{"hw:cpu_policy": "dedicated"}
	for _, tt := range []struct {
		net  NetworkAffinity
		want string
	}{
		{NetworkAffinity{Physnets: []string{"physnet1"}}, "0->2"},
		{NetworkAffinity{Tunneled: true}, "0->0"},
		{NetworkAffinity{Physnets: []string{"physnet2"}}, "0->0"}, // affine nowhere: no constraint
		{NetworkAffinity{Physnets: []string{"physnet0", "physnet1"}}, ""},
	} {
		r := devicesRequest(t, 2, dedicated, nil, &tt.net)
		p, err := Fit(h, r)
		if tt.want == "" {
			var nf *NoFitError
			if !errors.As(err, &nf) || nf.Lacks()[0] != ResourceNetworks {
				t.Errorf("Fit with networks %+v = %v, %v; want no fit lacking networks", tt.net, p, err)
			}
			continue
		}
		if err != nil || cellMapOf(p) != tt.want {
			t.Errorf("Fit with networks %+v = %v, %v; want %s", tt.net, p, err, tt.want)
		}
	}
}

// randomDevices gives a random host pools, sockets and networks, and
// returns PCI requests and network affinity for a guest on it.
func randomDevices(rng *rand.Rand, h *Host) ([]PCIRequest, *NetworkAffinity) {
	pick := func(opts ...string) string { return opts[rng.IntN(len(opts))] }
	kinds := []struct{ vendor, product string }{{"8086", "154d"}, {"15b3", "101e"}, {"10de", "1eb8"}}
	types := []DeviceType{DeviceTypeVF, DeviceTypeVF, DeviceTypePF, DeviceTypePCI, DeviceTypeVDPA}
	for i := 0; i < rng.IntN(5); i++ {
		k := kinds[rng.IntN(len(kinds))]
		p := DevicePool{VendorID: k.vendor, ProductID: k.product, DevType: types[rng.IntN(len(types))], Count: rng.IntN(5)}
		if rng.IntN(6) > 0 {
			p.NUMANode = intp(h.Cells[rng.IntN(len(h.Cells))].ID)
		}
		if rng.IntN(3) == 0 {
			p.Tags = map[string]string{"physical_network": pick("physnet0", "physnet1")}
		}
		if rng.IntN(10) == 0 {
			if p.Tags == nil {
				p.Tags = map[string]string{}
			}
			p.Tags["remote_managed"] = "true"
		}
		h.Devices = append(h.Devices, p)
	}
	for i := range h.Cells {
		if rng.IntN(12) == 0 {
			h.Cells[i].SocketUnknown = true
		}
		if rng.IntN(3) == 0 {
			h.Cells[i].Network = &NetworkAffinity{Physnets: []string{pick("physnet0", "physnet1", "physnet2")}, Tunneled: rng.IntN(4) == 0}
		}
	}
	var reqs []PCIRequest
	for i := 0; i < rng.IntN(3); i++ {
		k := kinds[rng.IntN(len(kinds))]
		spec := DeviceSpec{"vendor_id": k.vendor, "product_id": k.product}
		if len(h.Devices) > 0 && rng.IntN(5) > 0 {
			// Mostly a kind the host has.
			p := h.Devices[rng.IntN(len(h.Devices))]
			spec = DeviceSpec{"vendor_id": p.VendorID, "product_id": p.ProductID}
			if rng.IntN(3) == 0 {
				spec["dev_type"] = string(p.DevType)
			}
		} else if rng.IntN(3) == 0 {
			spec["dev_type"] = string(types[rng.IntN(len(types))])
		}
		reqs = append(reqs, PCIRequest{Count: 1 + rng.IntN(2), Specs: []DeviceSpec{spec},
			Policy: PCIPolicy(pick("", "required", "legacy", "preferred", "socket"))})
	}
	var net *NetworkAffinity
	if rng.IntN(3) == 0 {
		net = &NetworkAffinity{Physnets: []string{pick("physnet0", "physnet1")}, Tunneled: rng.IntN(3) == 0}
	}
	return reqs, net
}

// TestFitDevicesRandom holds Fit's search to a walk of every permutation
// of host cells on random hosts with devices and networks, and checks the
// devices of every fit.
func TestFitDevicesRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	fits, withDevices := 0, 0
	for i := 0; i < 6000; i++ {
		h := randomHost(rng)
		reqs, net := randomDevices(rng, h)
		vcpus := 1 + rng.IntN(8)
		specs := randomSpecs(rng, vcpus)
		r, err := NewRequest(vcpus, int64(512*(1+rng.IntN(8))), specs, nil)
		if err != nil {
			continue
		}
		if err := r.AddDevices(reqs, net, nil, nil); err != nil {
			t.Fatalf("AddDevices(%+v): %v", reqs, err)
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("random host invalid: %v", err)
		}
		p, err := Fit(h, r)
		walk := cleanWalk(h, r)
		if err != nil {
			var nf *NoFitError
			if !errors.As(err, &nf) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Fit error %q is not a one-line *NoFitError", err)
			}
			if walk.fit && r.HasNUMA() && !strings.Contains(err.Error(), "no fit: host ") {
				t.Errorf("Fit(%+v) on %+v: %v; walking every permutation fits %v", r, SpecOf(h), err, walk.mapping)
			}
			continue
		}
		fits++
		if len(p.Devices) > 0 {
			withDevices++
		}
		if r.HasNUMA() {
			var got []int
			for _, c := range p.Cells {
				got = append(got, c.HostCell)
			}
			if !walk.fit || !cmp.Equal(got, walk.mapping) {
				t.Errorf("Fit(%+v) on %+v = %s; walking every permutation: fit=%v %v", r, SpecOf(h), p, walk.fit, walk.mapping)
			}
		}
		for _, prob := range append(placementProblems(h, r, p), deviceProblems(h, r, p)...) {
			t.Errorf("Fit(%+v) = %s: %s", r, p, prob)
		}
	}
	if fits < 250 || withDevices < 80 {
		t.Errorf("%d of 6000 random requests fit, %d with devices; the generator or Fit is broken", fits, withDevices)
	}
}

// A guest whose devices sit on a cell it cannot use is refused without
// trying every set of host cells, however many the host has.
func TestFitDevicesUnreachableOnBigHost(t *testing.T) {
	h := &Host{}
	for i := 0; i < 64; i++ {
		cpus := Range(8*i, 8*i+7)
		h.Cells = append(h.Cells, Cell{ID: i, PCPUs: cpus, CPUs: cpus, Siblings: singles(cpus.String()), MemoryMB: 65536,
			Pages: []PagePool{{SizeKB: 4, Total: 65536 * 256}}, Socket: i / 8})
	}
	last := &h.Cells[63]
	last.PinnedCPUs = last.PCPUs
	h.Devices = []DevicePool{vfPool(intp(63), 1)}
	r := devicesRequest(t, 16, map[string]string{"hw:cpu_policy": "dedicated", "hw:numa_nodes": "8", "hw:pci_numa_affinity_policy": "required"},
		[]PCIRequest{vfRequest(1)}, nil)
	_, err := Fit(h, r)
	var nf *NoFitError
	if !errors.As(err, &nf) || nf.Resource != ResourceDevices {
		t.Fatalf("Fit = %v, want no fit lacking devices", err)
	}
	// Devices on every cell, one each, three wanted on two cells: no
	// set of cells works, and the bound says so at once.
	h.Devices = nil
	for i := 0; i < 64; i++ {
		h.Devices = append(h.Devices, vfPool(intp(i), 1))
	}
	r = devicesRequest(t, 4, map[string]string{"hw:cpu_policy": "dedicated", "hw:numa_nodes": "2", "hw:pci_numa_affinity_policy": "required"},
		[]PCIRequest{vfRequest(3)}, nil)
	if _, err := Fit(h, r); !errors.As(err, &nf) {
		t.Fatalf("Fit = %v, want no fit", err)
	}
}

func TestPlacementDevicesJSON(t *testing.T) {
	h := deviceHost(vfPool(intp(2), 2), vfPool(nil, 1))
	for i := range h.Cells {
		h.Cells[i].CPUs = h.Cells[i].PCPUs
	}
	r := devicesRequest(t, 2, map[string]string{"hw:cpu_policy": "dedicated"}, []PCIRequest{vfRequest(1)}, nil)
	p, err := Fit(h, r)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"pci_devices":[{"request":0,"pool":0,"host_cell":2,"vendor_id":"8086","product_id":"154d","count":1}]`) {
		t.Errorf("Marshal(%s) = %s, want its pci_devices", p, data)
	}
	var back Placement
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(p.Devices, back.Devices); diff != "" {
		t.Errorf("round trip of devices (-want +got):\n%s", diff)
	}
	// Without devices the wire form is what it always was.
	r.PCI = nil
	p, _ = Fit(h, r)
	if data, _ := json.Marshal(p); strings.Contains(string(data), "pci_devices") || strings.Contains(p.String(), "pci") {
		t.Errorf("placement without devices = %s, %q; want no pci_devices", data, p)
	}
	bad := Placement{Devices: []DeviceTake{{Request: 0, Pool: -1, Count: 1}}}
	if err := bad.Check(); err == nil {
		t.Errorf("Check of a take from pool -1 succeeded")
	}
}

func TestAnswerDevicesWithoutNUMA(t *testing.T) {
	c := Case{ID: json.RawMessage(`"x"`),
		Host: HostSpec{Cells: []CellSpec{{ID: 0, CPUs: []int{0, 1, 2, 3}, MemoryMB: 4096, MemPages: []PagePool{{SizeKB: 4, Total: 1 << 20}}}},
			PCIPools: []DevicePool{vfPool(intp(0), 2)}},
		Instance: InstanceSpec{VCPUs: 2, MemoryMB: 1024, PCIRequests: []PCIRequest{vfRequest(2)}}}
	ans := c.Solve()
	data, err := json.Marshal(ans)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"x","fit":true,"numa":false,"pci_devices":[{"request":0,"pool":0,"host_cell":0,"vendor_id":"8086","product_id":"154d","count":2}]}`
	if string(data) != want {
		t.Errorf("Marshal(Solve()) = %s, want %s", data, want)
	}
	var back Answer
	if err := json.Unmarshal(data, &back); err != nil || back.Placement == nil || len(back.Placement.Devices) != 1 {
		t.Errorf("Unmarshal(%s) = %+v, %v; want its devices back", data, back, err)
	}
}

// FuzzFitDevices holds Fit to the walk of every permutation on random
// hosts with devices and networks, as TestFitDevicesRandom does.
func FuzzFitDevices(f *testing.F) {
	for i := uint64(0); i < 16; i++ {
		f.Add(i, i*11+5)
	}
	f.Fuzz(func(t *testing.T, a, b uint64) {
		rng := rand.New(rand.NewPCG(a, b))
		h := randomHost(rng)
		reqs, net := randomDevices(rng, h)
		vcpus := 1 + rng.IntN(12)
		r, err := NewRequest(vcpus, int64(256*(1+rng.IntN(16))), randomSpecs(rng, vcpus), nil)
		if err != nil || r.AddDevices(reqs, net, nil, nil) != nil {
			return
		}
		p, err := Fit(h, r)
		walk := cleanWalk(h, r)
		if err != nil {
			if walk.fit && r.HasNUMA() && !strings.Contains(err.Error(), "no fit: host ") {
				t.Errorf("Fit: %v; walking every permutation fits %v", err, walk.mapping)
			}
			return
		}
		for _, prob := range append(placementProblems(h, r, p), deviceProblems(h, r, p)...) {
			t.Errorf("Fit(%+v) = %s: %s", r, p, prob)
		}
	})
}
