package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"

	historypb "go.temporal.io/api/history/v1"

	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// TestSRIOVLiveMigration live-migrates guests with an SR-IOV port: the
// VF is unplugged on the source before the copy, the guest moves without
// it, and the destination's VF, claimed with the pCPUs, is plugged in
// once it runs there; the source's VF is freed at the commit. A cancel
// before the switchover plugs the source's VF in again, a cancel while
// the destination's is plugged in does not stop it, the audit finishes
// a migration terminated on either side of its switchover, and a guest whose
// device cannot be unplugged (a PCI alias's) is refused, or cold-migrated
// under --cold-fallback.
func TestSRIOVLiveMigration(t *testing.T) {
	t.Parallel()
	alias := `[{"name": "gpu", "vendor_id": "10de", "product_id": "1db4", "device_type": "type-PCI"}]`
	s := newStack(t, "PINFLOW_PCI_ALIAS="+alias)
	topo := deviceTopology(t)
	s.ok("host", "add", "a", "--topology", topo)
	s.ok("host", "add", "b", "--topology", topo)
	boot := func(name, host string, extra ...string) string {
		var res struct {
			UUID string `json:"uuid"`
		}
		args := append([]string{"boot", "--name", name, "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated",
			"--host", host, "--port", "name=data,physnet=physnet1,vnic=direct", "--wait", "--json"}, extra...)
		s.jsonOf(&res, args...)
		return res.UUID
	}
	// holding is what uuid holds of host's devices, what its domain there
	// passes through, and what it holds of other's.
	holding := func(uuid, host, other string) (held, used, elsewhere []string) {
		t.Helper()
		for addr, owner := range s.deviceOwners(host) {
			if owner == uuid {
				held = append(held, addr)
			}
		}
		for addr, owner := range s.deviceOwners(other) {
			if owner == uuid {
				elsewhere = append(elsewhere, addr)
			}
		}
		return held, s.guestDevices(host, uuid), elsewhere
	}
	// passesHeld says a guest holds one VF and passes through that one.
	passesHeld := func(held, used []string) bool { return len(held) == 1 && slices.Equal(held, used) }
	// plugged checks that uuid runs on host passing through exactly the
	// devices it holds there, one VF, and holds none elsewhere.
	plugged := func(uuid, host, other string) string {
		t.Helper()
		held, used, elsewhere := holding(uuid, host, other)
		if !passesHeld(held, used) {
			t.Fatalf("%s on %s holds %v and passes through %v; want one VF, the same", uuid, host, held, used)
		}
		if len(elsewhere) != 0 {
			t.Errorf("%s still holds %v on %s", uuid, elsewhere, other)
		}
		s.checkAgreement(uuid, host)
		return held[0]
	}
	// audited audits until uuid is plugged on host, at most a few times:
	// an audit that starts Replug or Settle for the guest keeps the claim
	// the terminated run left on the other host (the guest's workflow
	// runs again, too recently), and the next one frees it.
	audited := func(uuid, host, other string) {
		t.Helper()
		for range 4 {
			s.pastMinGrace()
			s.reconcile("--grace", "0")
			s.waitClosed(uuid)
			held, used, elsewhere := holding(uuid, host, other)
			if passesHeld(held, used) && len(elsewhere) == 0 {
				break
			}
		}
		plugged(uuid, host, other)
	}

	y := boot("Y", "a")
	var recorded []*historypb.History
	var names []string
	record := func(name string) { recorded, names = append(recorded, s.history(y)), append(names, name) }
	plugged(y, "a", "b")
	s.ok("migrate", y, "--dest", "b", "--wait")
	record("live-migration-sriov")
	vf := plugged(y, "b", "a")
	if out := s.ok("show", y); !strings.Contains(out, vf+" (port data)") {
		t.Errorf("show Y = %q; want its VF %s on b", out, vf)
	}

	// A cancel before the switchover rolls back: Y keeps running on b,
	// its own VF plugged in again, and a's claim is gone.
	s.ok("sim", "gate", "--at", "migrate", "--hold")
	s.ok("migrate", y, "--dest", "a")
	s.ok("sim", "gate", "--at", "migrate", "--wait-arrived", "1")
	if used := s.guestDevices("b", y); len(used) != 0 {
		t.Errorf("Y passes through %v while its migration copies; want its VF unplugged", used)
	}
	s.ok("cancel", y)
	s.ok("sim", "gate", "--at", "migrate", "--wait-cancelled", "1")
	s.ok("sim", "gate", "--at", "migrate", "--release")
	s.waitClosed(y)
	record("live-migration-sriov-rolled-back")
	if got := plugged(y, "b", "a"); got != vf {
		t.Errorf("after the rollback Y passes through %s, want its own %s", got, vf)
	}

	// Past the switchover only forwards: a cancel while the destination's
	// VF is plugged in changes nothing.
	s.ok("sim", "gate", "--at", "attach", "--hold")
	s.ok("migrate", y, "--dest", "a")
	s.ok("sim", "gate", "--at", "attach", "--wait-arrived", "1")
	s.ok("cancel", y)
	s.ok("sim", "gate", "--at", "attach", "--release")
	s.waitClosed(y)
	plugged(y, "a", "b")

	// A migration terminated with the VF unplugged leaves the guest
	// running without it: its claim keeps the VF, and the audit says so
	// and plugs it in again.
	s.ok("sim", "gate", "--at", "prepare", "--hold")
	s.ok("migrate", y, "--dest", "b")
	s.ok("sim", "gate", "--at", "prepare", "--wait-arrived", "1")
	if err := s.tc.TerminateWorkflow(context.Background(), guest.InstanceWorkflowID(y), "", "test"); err != nil {
		t.Fatal(err)
	}
	s.ok("sim", "gate", "--at", "prepare", "--release")
	s.waitClosed(y)
	s.pastMinGrace()
	res := s.reconcile("--grace", "0")
	found := false
	for _, h := range res.Hosts {
		for _, d := range h.Drift {
			if d.Kind == audit.DriftDevicesUnplugged && d.Instance == y && h.Host == "a" {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("the audit after a migration terminated with Y's VF unplugged reported %+v; want %s drift of Y on a", res.Hosts, audit.DriftDevicesUnplugged)
	}
	// The audit plugged it in again.
	s.waitClosed(y)
	record("replug")
	audited(y, "a", "b")

	// A migration terminated past its switchover completes on the
	// hypervisor: the audit settles the guest forwards onto b's claim,
	// frees a's, and plugs b's VF in.
	s.ok("sim", "gate", "--at", "switched", "--hold")
	s.ok("migrate", y, "--dest", "b")
	s.ok("sim", "gate", "--at", "switched", "--wait-arrived", "1")
	if err := s.tc.TerminateWorkflow(context.Background(), guest.InstanceWorkflowID(y), "", "test"); err != nil {
		t.Fatal(err)
	}
	s.ok("sim", "gate", "--at", "switched", "--release")
	s.waitClosed(y)
	audited(y, "b", "a") // the first audit settles the guest, the next plugs its VF in

	// A GPU by alias cannot be unplugged: refused, or cold under
	// --cold-fallback.
	x := boot("X", "b", "--spec", "pci_passthrough:alias=gpu:1")
	before := s.ok("host", "show", "a")
	s.refused("the device of PCI alias gpu, which cannot be unplugged for a live migration", "migrate", x, "--dest", "a")
	if after := s.ok("host", "show", "a"); after != before {
		t.Errorf("a refused migration changed host a:\n%s\nthen\n%s", before, after)
	}
	s.ok("migrate", x, "--dest", "a", "--cold-fallback", "--wait")
	s.ok("resize", "confirm", x, "--wait")
	if got := s.guestDevices("a", x); len(got) != 2 {
		t.Errorf("X cold-migrated to a passes through %v; want its VF and GPU", got)
	}
	s.ok("check")
	keepHistories(t, recorded, names)
}

// TestNamedPorts boots guests whose ports reach their device by its
// host-side name (a macvtap on a VF's netdev, a vDPA device), live- and
// cold-migrates them, and checks at each step that the domain names the
// device its claim holds on its host, and only that.
func TestNamedPorts(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	h, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: 4, Threads: 1, MemoryMB: 8192})
	if err != nil {
		t.Fatal(err)
	}
	node := 0
	dev := func(addr string, typ numa.DeviceType, name string) numa.PCIDevice {
		return numa.PCIDevice{Address: addr, VendorID: "15b3", ProductID: "101e", DevType: typ, PhysFunction: "0000:81:00.0",
			NUMANode: &node, Tags: map[string]string{"physical_network": "physnet1"}, DevName: name}
	}
	h.PCIDevices = []numa.PCIDevice{
		{Address: "0000:81:00.0", VendorID: "15b3", ProductID: "101d", DevType: numa.DeviceTypePF, NUMANode: &node},
		dev("0000:81:00.2", numa.DeviceTypeVF, "enp129s0f0v0"),
		dev("0000:81:00.3", numa.DeviceTypeVF, "enp129s0f0v1"),
		dev("0000:81:00.4", numa.DeviceTypeVDPA, "/dev/vhost-vdpa-0"),
	}
	topo := topologyFile(t, h)
	s.ok("host", "add", "a", "--topology", topo)
	s.ok("host", "add", "b", "--topology", topo)
	boot := func(name, port string) string {
		var res struct {
			UUID string `json:"uuid"`
		}
		s.jsonOf(&res, "boot", "--name", name, "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated",
			"--host", "a", "--port", port, "--wait")
		return res.UUID
	}
	// uses checks that uuid's domain on host names exactly the devices it
	// holds there.
	uses := func(uuid, host string) {
		t.Helper()
		dom, err := s.simulator().Lookup(context.Background(), host, uuid)
		if err != nil {
			t.Fatal(err)
		}
		pins, err := xmlpatch.Read(dom.XML)
		if err != nil {
			t.Fatal(err)
		}
		var held []string
		for addr, owner := range s.deviceOwners(host) {
			if owner == uuid {
				held = append(held, addr)
			}
		}
		slices.Sort(held)
		if used := slices.Sorted(slices.Values(pins.DeviceAddresses(h))); len(held) != 1 || !slices.Equal(used, held) || len(pins.Devices) != 0 {
			t.Errorf("%s on %s holds %v and uses %v (names %v, passed through %v); want one device reached by name, the same",
				uuid, host, held, used, pins.DeviceNames, pins.Devices)
		}
		s.checkAgreement(uuid, host)
	}
	tap := boot("T", "name=tap,physnet=physnet1,vnic=macvtap")
	vdpa := boot("V", "name=accel,physnet=physnet1,vnic=vdpa")
	uses(tap, "a")
	uses(vdpa, "a")
	s.ok("migrate", tap, "--dest", "b", "--wait")
	uses(tap, "b")
	s.ok("migrate", vdpa, "--dest", "b", "--cold", "--wait")
	s.ok("resize", "confirm", vdpa, "--wait")
	uses(vdpa, "b")
	if got := s.deviceOwners("a"); len(got) != 0 {
		t.Errorf("a's devices after both guests left = %v; want all free", got)
	}
	res := s.reconcile("--grace", "0")
	if n := res.Total.Freed.Total(); n != 0 || len(res.Hosts) != 2 {
		t.Errorf("the audit freed %d claims: %+v", n, res.Hosts)
	}
	for _, host := range res.Hosts {
		if len(host.Drift) != 0 {
			t.Errorf("the audit found drift on %s: %+v", host.Host, host.Drift)
		}
	}
	s.ok("check")
}
