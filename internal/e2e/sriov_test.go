package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"

	historypb "go.temporal.io/api/history/v1"

	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
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
	// plugged checks that uuid runs on host passing through exactly the
	// devices it holds there, one VF, and holds none elsewhere.
	plugged := func(uuid, host, other string) string {
		t.Helper()
		var held []string
		for addr, owner := range s.deviceOwners(host) {
			if owner == uuid {
				held = append(held, addr)
			}
		}
		used := s.guestDevices(host, uuid)
		if len(held) != 1 || !slices.Equal(held, used) {
			t.Fatalf("%s on %s holds %v and passes through %v; want one VF, the same", uuid, host, held, used)
		}
		for addr, owner := range s.deviceOwners(other) {
			if owner == uuid {
				t.Errorf("%s still holds %s on %s", uuid, addr, other)
			}
		}
		s.checkAgreement(uuid, host)
		return held[0]
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
	plugged(y, "a", "b")

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
	s.pastMinGrace()
	for range 2 { // the first settles the guest, the second plugs its VF in
		s.reconcile("--grace", "0")
		s.waitClosed(y)
	}
	plugged(y, "b", "a")

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
