package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// deviceTopology writes a host file of one cell of four cores with an
// SR-IOV NIC (a PF and two VFs on physnet1) and a GPU.
func deviceTopology(t *testing.T) string {
	t.Helper()
	h, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: 4, Threads: 1, MemoryMB: 8192})
	if err != nil {
		t.Fatal(err)
	}
	node := 0
	h.PCIDevices = append(nic(0, node, 2), numa.PCIDevice{Address: "0000:3b:00.0", VendorID: "10de", ProductID: "1db4", DevType: numa.DeviceTypePCI, NUMANode: &node})
	return topologyFile(t, h)
}

// nicTopology writes a host file of cells cells of cores cores, 16 GiB
// each, with an SR-IOV NIC of vfs VFs on physnet1 on every cell.
func nicTopology(t testing.TB, cells, cores, vfs int) string {
	t.Helper()
	h, err := numa.Uniform(numa.UniformSpec{Cells: cells, Cores: cores, Threads: 1, MemoryMB: 16384})
	if err != nil {
		t.Fatal(err)
	}
	for c := range cells {
		h.PCIDevices = append(h.PCIDevices, nic(c, c, vfs)...)
	}
	return topologyFile(t, h)
}

// nic is the i-th SR-IOV NIC of a host, on cell node: PF 0000:8i:00.0 and
// its VFs 0000:8i:10.0.., all on physnet1.
func nic(i, node, vfs int) []numa.PCIDevice {
	pf := fmt.Sprintf("0000:%02x:00.0", 0x81+i)
	dev := func(addr string, typ numa.DeviceType, product, parent string) numa.PCIDevice {
		return numa.PCIDevice{Address: addr, VendorID: "8086", ProductID: product, DevType: typ, PhysFunction: parent,
			NUMANode: &node, Tags: map[string]string{"physical_network": "physnet1"}}
	}
	out := []numa.PCIDevice{dev(pf, numa.DeviceTypePF, "1572", "")}
	for v := range vfs {
		out = append(out, dev(fmt.Sprintf("0000:%02x:%02x.%x", 0x81+i, 0x10+v/8, v%8), numa.DeviceTypeVF, "154c", pf))
	}
	return out
}

func topologyFile(t testing.TB, h *numa.Host) string {
	t.Helper()
	data, err := json.Marshal(numa.SpecOf(h))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "host.json")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// shownDevices is the devices part of `pinflow host show --json`.
type shownDevices struct {
	Devices []struct {
		Address string `json:"address"`
		Owner   *struct {
			Instance string `json:"instance"`
			State    string `json:"state"`
		} `json:"owner"`
	} `json:"devices"`
}

// deviceOwners maps each device of host to the instance that holds it.
func (s *stack) deviceOwners(host string) map[string]string {
	s.t.Helper()
	var v shownDevices
	s.jsonOf(&v, "host", "show", host)
	out := map[string]string{}
	for _, d := range v.Devices {
		if d.Owner != nil {
			out[d.Address] = d.Owner.Instance
		}
	}
	return out
}

// guestDevices are the PCI devices the guest's domain on host passes
// through, as the simulator has it.
func (s *stack) guestDevices(host, uuid string) []string {
	s.t.Helper()
	dom, err := s.simulator().Lookup(context.Background(), host, uuid)
	if err != nil {
		s.t.Fatalf("domain of %s on %s: %v", uuid, host, err)
	}
	pins, err := xmlpatch.Read(dom.XML)
	if err != nil {
		s.t.Fatal(err)
	}
	return pins.Devices
}

// TestPCIDevices: guests take SR-IOV VFs by port and a GPU by alias; the
// ledger gives each device to one guest, a PF with VFs in use is not
// given whole, the domain passes through what the claim holds, a cold
// migration moves the devices to the destination's, the live migration
// of a guest with an alias's device is refused, and a delete frees them. Bad device requests are refused with
// one line and change nothing.
func TestPCIDevices(t *testing.T) {
	t.Parallel()
	alias := `[{"name": "gpu", "vendor_id": "10de", "product_id": "1db4", "device_type": "type-PCI"}]`
	s := newStack(t, "PINFLOW_PCI_ALIAS="+alias)
	topo := deviceTopology(t)
	s.ok("host", "add", "a", "--topology", topo)
	s.ok("host", "add", "b", "--topology", topo)
	port := "name=data,physnet=physnet1,vnic=direct"
	boot := func(name, host string, extra ...string) string {
		var res struct {
			UUID string `json:"uuid"`
		}
		args := append([]string{"boot", "--name", name, "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated",
			"--host", host, "--wait", "--json"}, extra...)
		s.jsonOf(&res, args...)
		return res.UUID
	}

	// Refused before anything starts.
	before := s.ok("host", "show", "a")
	s.refused(`PCI alias "nic" is not defined; configured are gpu`, "boot", "--name", "x", "--vcpus", "1", "--memory-mb", "512",
		"--spec", "pci_passthrough:alias=nic:1")
	s.refused(`physical network "physnet9": hosts have devices on physnet1`, "boot", "--name", "x", "--vcpus", "1", "--memory-mb", "512",
		"--port", "name=p,physnet=physnet9,vnic=direct")
	s.refused("vnic_type macvtap reaches its device by the device's host-side name, and no host names a device on physnet1", "boot", "--name", "x", "--vcpus", "1", "--memory-mb", "512",
		"--port", "name=p,physnet=physnet1,vnic=macvtap")
	s.refused(`vnic_type "fast": allowed are`, "boot", "--name", "x", "--vcpus", "1", "--memory-mb", "512",
		"--port", "name=p,physnet=physnet1,vnic=fast")
	if after := s.ok("host", "show", "a"); after != before {
		t.Errorf("refused boots changed host a:\n%s\nthen\n%s", before, after)
	}

	x := boot("X", "a", "--port", port, "--spec", "pci_passthrough:alias=gpu:1")
	y := boot("Y", "a", "--port", port)
	owners := s.deviceOwners("a")
	var vfX, vfY string
	for addr, inst := range owners {
		switch {
		case inst == x && strings.HasPrefix(addr, "0000:81:10."):
			vfX = addr
		case inst == y:
			vfY = addr
		}
	}
	if vfX == "" || vfY == "" || owners["0000:3b:00.0"] != x || len(owners) != 3 {
		t.Fatalf("device owners on a = %v; want X with a VF and the GPU, Y with the other VF", owners)
	}
	if out := s.ok("show", x); !strings.Contains(out, vfX+" (port data)") || !strings.Contains(out, "0000:3b:00.0 (alias gpu)") {
		t.Errorf("show X = %q; want its VF and GPU named", out)
	}
	if got := s.guestDevices("a", x); len(got) != 2 {
		t.Errorf("X's domain passes through %v; want its two devices", got)
	}
	// Both VFs are taken and the PF is held by them: a third port finds
	// no device on a.
	s.refused("PCI request 0 wants 1 of physical_network=physnet1", "boot", "--name", "Z", "--vcpus", "1", "--memory-mb", "512",
		"--spec", "hw:cpu_policy=dedicated", "--host", "a", "--port", port, "--wait")
	if out := s.ok("host", "show", "a"); !strings.Contains(out, "0000:81:00.0  8086:1572 type-PF on physnet1, cell 0  (its VFs are in use)") {
		t.Errorf("host show a = %q; want the PF shown held by its VFs", out)
	}
	s.refused("which cannot be unplugged for a live migration", "migrate", x, "--dest", "b")

	// A cold migration takes b's devices and frees a's once confirmed.
	s.ok("migrate", x, "--cold", "--dest", "b", "--wait")
	s.ok("resize", "confirm", x, "--wait")
	bOwners := s.deviceOwners("b")
	if len(bOwners) != 2 || bOwners["0000:3b:00.0"] != x {
		t.Errorf("device owners on b after X's cold migration = %v; want X's VF and GPU", bOwners)
	}
	if aOwners := s.deviceOwners("a"); len(aOwners) != 1 || aOwners[vfY] != y {
		t.Errorf("device owners on a after X left = %v; want only Y's %s", aOwners, vfY)
	}
	if got := s.guestDevices("b", x); len(got) != 2 {
		t.Errorf("X's domain on b passes through %v; want two devices", got)
	}
	z := boot("Z", "a", "--port", port)
	if got := s.deviceOwners("a"); got[vfX] != z {
		t.Errorf("device owners on a = %v; want Z on the VF %s X left", got, vfX)
	}
	s.ok("reconcile", "--grace", "0", "--wait")
	if got := s.deviceOwners("a"); len(got) != 2 {
		t.Errorf("the audit changed a's devices: %v", got)
	}
	s.ok("delete", x, "--wait")
	if got := s.deviceOwners("b"); len(got) != 0 {
		t.Errorf("b's devices after X's delete = %v; want all free", got)
	}

	// Shelve-offload frees Y's VF; unshelve takes one on the new host.
	s.ok("shelve", y, "--offload", "--wait")
	if got := s.deviceOwners("a"); len(got) != 1 || got[vfX] != z {
		t.Errorf("a's devices after Y's shelve = %v; want only Z's %s", got, vfX)
	}
	s.ok("unshelve", y, "--host", "b", "--wait")
	ownedOn := func(host, uuid string) []string {
		var out []string
		for addr, inst := range s.deviceOwners(host) {
			if inst == uuid {
				out = append(out, addr)
			}
		}
		return out
	}
	if held, used := ownedOn("b", y), s.guestDevices("b", y); len(held) != 1 || len(used) != 1 || held[0] != used[0] {
		t.Errorf("Y unshelved on b holds %v and its domain passes through %v; want one VF, the same", held, used)
	}

	// Evacuation rebuilds Z with c's VF; a's stays held by the tombstone
	// until the host is back.
	s.ok("host", "add", "c", "--topology", topo)
	s.ok("sim", "power", "--host", "a", "--off")
	s.ok("host", "down", "a", "--fence", "--reason", "power supply failed")
	s.ok("evacuate", z, "--host", "c", "--wait")
	if held, used := ownedOn("c", z), s.guestDevices("c", z); len(held) != 1 || len(used) != 1 || held[0] != used[0] {
		t.Errorf("Z evacuated to c holds %v and its domain passes through %v; want one VF, the same", held, used)
	}
	if got := s.deviceOwners("a"); got[vfX] != z {
		t.Errorf("a's devices while it is down = %v; want Z's tombstone on %s", got, vfX)
	}
	s.ok("sim", "power", "--host", "a", "--on")
	s.ok("host", "up", "a", "--wait")
	if got := s.deviceOwners("a"); len(got) != 0 {
		t.Errorf("a's devices after it came back = %v; want all free", got)
	}
	s.ok("check")
}

// TestDrainPlanPolicy: a live drain's plan names a guest whose GPU cannot
// be unplugged as one it cannot move and the policy that moves it cold;
// the drain refuses it in one short line, moving nothing, and the plan
// under that policy moves it.
func TestDrainPlanPolicy(t *testing.T) {
	t.Parallel()
	alias := `[{"name": "gpu", "vendor_id": "10de", "product_id": "1db4", "device_type": "type-PCI"}]`
	s := newStack(t, "PINFLOW_PCI_ALIAS="+alias)
	topo := deviceTopology(t)
	s.ok("host", "add", "a", "--topology", topo)
	s.ok("host", "add", "b", "--topology", topo)
	var g struct {
		UUID string `json:"uuid"`
	}
	s.jsonOf(&g, "boot", "--name", "G", "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated",
		"--spec", "pci_passthrough:alias=gpu:1", "--host", "a", "--wait")
	why := g.UUID + " (G) cannot move live: it passes through the device of PCI alias gpu, which cannot be unplugged; " +
		"--policy live-then-cold moves it cold"
	out, errOut, code := s.run("host", "plan-drain", "a")
	if code != 1 || !strings.Contains(out, "0 guests to move, 0 fitting nowhere, 1 not movable live") || !strings.Contains(out, why) {
		t.Errorf("host plan-drain a: exit %d, %q %q; want exit 1 and the guest that cannot move live: %q", code, out, errOut, why)
	}
	if out := s.ok("host", "plan-drain", "a", "--policy", "live-then-cold"); !strings.Contains(out, g.UUID+" (G) -> b") {
		t.Errorf("host plan-drain a --policy live-then-cold:\n%s\nwant G moved to b", out)
	}
	s.refused(`drain policy "fast": policies are live, cold and live-then-cold`, "host", "plan-drain", "a", "--policy", "fast")
	line := s.refused(why, "host", "drain", "a", "--wait")
	if len(line) > 300 {
		t.Errorf("host drain a refused in %d characters, want a short line: %q", len(line), line)
	}
	if got := s.guest(g.UUID); hostOf(got) != "a" {
		t.Errorf("after the refused drain G is on %q, want a", hostOf(got))
	}
}
