package libvirt

import (
	"errors"
	"testing"

	"github.com/pinflow/pinflow/hypervisor"
)

// TestRepin re-pins a running QEMU guest in place: each vCPU thread and
// the emulator may run only on their new CPUs at once, as /proc says, the
// guest keeps its QEMU process, and the definition keeps the pins across
// a restart. A re-pin that would move the guest's memory to another node
// changes nothing.
func TestRepin(t *testing.T) {
	if testing.Short() {
		t.Skip("starts libvirtd and QEMU")
	}
	e := startMigrationEnv(t)
	g := newGuest(40)
	e.boot(t, "src", g)
	e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
	pid, err := e.hosts["src"].QEMUPid(g.name)
	if err != nil {
		t.Fatal(err)
	}
	ctx := opContext(t)
	dom, err := e.d.Lookup(ctx, "src", g.uuid)
	if err != nil {
		t.Fatal(err)
	}

	moved := repin(t, dom.XML, g.vcpuPins, g.emulator, "1")
	if err := e.d.Repin(ctx, "src", g.uuid, moved); !errors.Is(err, hypervisor.ErrRejected) {
		t.Fatalf("Repin with memory on node 1 = %v, want ErrRejected", err)
	}
	e.runsOn(t, "src", g, g.vcpuPins, g.emulator)

	pins, emulator := [2]string{"1", "0"}, "1"
	def := repin(t, dom.XML, pins, emulator, g.nodeset)
	if err := e.d.Repin(ctx, "src", g.uuid, def); err != nil {
		t.Fatalf("Repin: %v", err)
	}
	e.runsOn(t, "src", g, pins, emulator)
	if now, err := e.hosts["src"].QEMUPid(g.name); err != nil || now != pid {
		t.Errorf("after the re-pin the guest's QEMU pid is %d (%v), want %d: a re-pin must not restart it", now, err, pid)
	}
	if err := e.d.Repin(ctx, "src", g.uuid, def); err != nil {
		t.Errorf("Repin again to the same pins: %v", err)
	}

	// The definition has the new pins: a restart keeps them.
	if err := e.d.Stop(ctx, "src", g.uuid); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Start(ctx, "src", g.uuid); err != nil {
		t.Fatal(err)
	}
	e.runsOn(t, "src", g, pins, emulator)
}
