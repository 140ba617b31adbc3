package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pinflow/pinflow/hypervisor/libvirt"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// TestLibvirt runs the tests against real libvirtd hosts and QEMU guests
// one after the other, alongside the other end-to-end tests: each starts
// two daemons and QEMU guests, so one at a time is what the machine's
// cores give them without starving the rest.
func TestLibvirt(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Migration", libvirtMigration},
		{"ResizeConfirm", libvirtResizeConfirm},
		{"ResizeRevert", libvirtResizeRevert},
		{"ColdMigration", libvirtColdMigration},
		{"Evacuation", libvirtEvacuation},
		{"SharedPool", libvirtSharedPool},
	} {
		t.Run(tt.name, tt.run)
	}
}

// libvirtMigration runs pinflow's workflows against two real libvirtd
// hosts with QEMU (software emulation) guests: a pinned guest boots on h1,
// is re-pinned there while it runs, live-migrates to h2 onto other pCPUs, and its vCPU threads on h2 really
// run on the pCPUs the ledger gave it; then a migration whose rewrite real
// libvirt refuses fails, leaves the guest running on its source, and
// releases the destination claim.
func libvirtMigration(t *testing.T) {
	h1 := testenv.StartLibvirtHost(t, "h1")
	h2 := testenv.StartLibvirtHost(t, "h2")
	s := newStack(t, "PINFLOW_DRIVER=libvirt")
	s.ok("host", "add", "h1", "--libvirt", h1.URI, "--migrate-uri", "tcp://127.0.0.1")
	s.ok("host", "add", "h2", "--libvirt", h2.URI, "--migrate-uri", "tcp://127.0.0.1")

	boot := func(name, host string) string {
		var res struct{ UUID string }
		s.jsonOf(&res, "boot", "--name", name, "--host", host, "--vcpus", "1", "--memory-mb", "128",
			"--spec", "hw:cpu_policy=dedicated", "--wait")
		return res.UUID
	}
	// B takes h2's first pCPU, so A must land on another one there.
	a := boot("guest-a", "h1")
	b := boot("guest-b", "h2")
	first := s.guest(a).pcpus()
	if got := affinity(t, h1, a); got != first {
		t.Fatalf("guest-a's vCPU runs on %q on h1, but the ledger pinned it to %q", got, first)
	}
	// Re-pinned in place to h1's other pCPU while it runs: its vCPU
	// thread runs there at once, and the record and the persistent
	// definition say so.
	before := map[string]string{"0": "1", "1": "0"}[first]
	s.ok("repin", a, "--pcpus", before, "--wait")
	if got := s.guest(a).pcpus(); got != before {
		t.Errorf("after the re-pin the ledger pins guest-a to %q, want %q", got, before)
	}
	if got := affinity(t, h1, a); got != before {
		t.Errorf("after the re-pin guest-a's vCPU runs on %q on h1, want %q", got, before)
	}
	s.ok("check")

	s.ok("migrate", a, "--dest", "h2", "--wait")
	g := s.guest(a)
	if hostOf(g) != "h2" {
		t.Fatalf("after the migration guest-a is on %q, want h2", hostOf(g))
	}
	after := g.pcpus()
	if after == s.guest(b).pcpus() {
		t.Errorf("guest-a and guest-b share pCPU %s on h2", after)
	}
	if got := affinity(t, h2, a); got != after {
		t.Errorf("guest-a's vCPU runs on %q on h2, but the ledger pinned it to %q", got, after)
	}
	if _, err := os.Stat(filepath.Join(h1.Dir, "run", "qemu", "guest-a.pid")); err == nil {
		t.Errorf("guest-a still runs on h1 after the migration")
	}

	// h3 is h1's daemon registered with a topology whose pCPUs do not exist,
	// so the destination pins are ones libvirt refuses.
	bogus := t.TempDir() + "/bogus.json"
	spec := map[string]any{"cells": []map[string]any{{"id": 0, "cpus": []int{60, 61}, "memory_mb": 4096,
		"mempages": []map[string]int{{"size_kb": 4, "total": 1048576}}}}}
	data, _ := json.Marshal(spec)
	if err := os.WriteFile(bogus, data, 0o644); err != nil {
		t.Fatal(err)
	}
	s.ok("host", "add", "h3", "--libvirt", h1.URI, "--migrate-uri", "tcp://127.0.0.1")
	s.ok("host", "add", "h3", "--topology", bogus)
	s.refused("failed", "migrate", a, "--dest", "h3", "--wait")
	g = s.guest(a)
	if hostOf(g) != "h2" || g.pcpus() != after || g.VMState != "active" {
		t.Errorf("after the refused migration guest-a is on %q pinned %q (%s), want h2 pinned %q", hostOf(g), g.pcpus(), g.VMState, after)
	}
	if got := affinity(t, h2, a); got != after {
		t.Errorf("after the refused migration guest-a's vCPU runs on %q, want %q", got, after)
	}
	if got := s.pinned("h3"); got != "" {
		t.Errorf("h3 keeps %q pinned after the refused migration, want its claim released", got)
	}
	_, _, rdb := s.checkClaims(context.Background(), a, "h2")
	rdb.Close()
	s.ok("delete", a, "--wait")
	s.ok("delete", b, "--wait")
}

// libvirtSharedPool checks on real libvirtd hosts that a floating guest
// runs on its host's shared CPUs alone: its vCPU and emulator threads
// keep off the pCPU a pinned guest holds, on the host it boots on and,
// after a live migration, on the shared CPUs of the destination; and a
// host registered without shared CPUs refuses it. The machine's two CPUs
// are split both ways: h1 shares 0 and pins 1, h2 shares 1 and pins 0.
func libvirtSharedPool(t *testing.T) {
	h1 := testenv.StartLibvirtHost(t, "h1")
	h2 := testenv.StartLibvirtHost(t, "h2")
	s := newStack(t, "PINFLOW_DRIVER=libvirt")
	s.ok("host", "add", "h1", "--libvirt", h1.URI, "--migrate-uri", "tcp://127.0.0.1", "--shared", "0", "--dedicated", "1")
	s.ok("host", "add", "h2", "--libvirt", h2.URI, "--migrate-uri", "tcp://127.0.0.1", "--shared", "1", "--dedicated", "0")

	p := lvmBoot(s, "pinned-p", "h1")
	if _, pcpus := lvmCheckRuns(s, h1, p, 1, "after the boot"); pcpus != "1" {
		t.Errorf("pinned-p is pinned to %q on h1, want h1's only dedicated CPU 1", pcpus)
	}
	var res struct {
		UUID string `json:"uuid"`
	}
	s.jsonOf(&res, "boot", "--name", "floating-f", "--host", "h1", "--vcpus", "1", "--memory-mb", "128", "--wait")
	f := res.UUID
	if f == "" {
		t.Fatalf("boot floating-f: no uuid in the result")
	}
	lvmFloats(t, h1, f, "0", "1", "after the boot")
	if got := s.pinned("h1"); got != "1" {
		t.Errorf("after the boots h1 has %q pinned, want pinned-p's 1 alone: a floating guest pins nothing", got)
	}

	name := domainName(t, h1, f)
	s.ok("migrate", f, "--dest", "h2", "--wait")
	if g := s.guest(f); hostOf(g) != "h2" || g.VMState != "active" {
		t.Fatalf("after the migration floating-f is on %q (%s), want active on h2", hostOf(g), g.VMState)
	}
	if _, err := os.Stat(filepath.Join(h1.Dir, "run", "qemu", name+".pid")); err == nil {
		t.Errorf("floating-f still runs on h1 after the migration")
	}
	lvmFloats(t, h2, f, "1", "", "after the migration")
	if got := s.pinned("h2"); got != "" {
		t.Errorf("after the migration h2 has %q pinned, want none: a floating guest pins nothing", got)
	}

	// A pinned guest booted on h2 now takes h2's only dedicated CPU, 0;
	// the floating guest's threads must keep off it.
	q := lvmBoot(s, "pinned-q", "h2")
	_, held := lvmCheckRuns(s, h2, q, 1, "a pinned boot next to the migrated floating guest")
	if held != "0" {
		t.Errorf("pinned-q is pinned to %q on h2, want h2's only dedicated CPU 0", held)
	}
	lvmFloats(t, h2, f, "1", held, "next to pinned-q")
	s.ok("check")

	// h3 is h1's daemon registered with neither set: every CPU is
	// pinnable, none shared, so a floating guest has nowhere to run.
	s.ok("host", "add", "h3", "--libvirt", h1.URI, "--migrate-uri", "tcp://127.0.0.1")
	line := s.refused("has no shared CPUs", "boot", "--name", "floating-g", "--host", "h3", "--vcpus", "1", "--memory-mb", "128", "--wait")
	v := s.host("h3")
	if len(v.Claims) != 0 {
		t.Errorf("h3 keeps claims %v after the refused boot, want none", v.Claims)
	}
	if got := s.pinned("h3"); got != "" {
		t.Errorf("h3 has %q pinned after the refused boot, want none", got)
	}
	// The line is "pinflow: boot UUID failed: ...": the refused guest's
	// record stays, in error, until it is deleted.
	if fields := strings.Fields(line); len(fields) > 2 && fields[1] == "boot" {
		g := fields[2]
		lvmNotDefined(t, h1, g, "after the refused boot")
		s.ok("delete", g, "--wait")
	} else {
		t.Errorf("the refused boot's line %q names no guest", line)
	}

	s.ok("delete", p, "--wait")
	s.ok("delete", f, "--wait")
	s.ok("delete", q, "--wait")
}

// lvmFloats checks that the floating guest's QEMU on h has one vCPU thread
// and an emulator thread, each allowed on exactly shared, off the pinned
// CPUs (a cpuset list, or "") of other guests, and that h's libvirtd keeps
// shared as the guest's <vcpu cpuset> in its persistent definition.
func lvmFloats(t *testing.T, h *testenv.LibvirtHost, uuid, shared, pinned, when string) {
	t.Helper()
	vcpus, emulator := lvmAffinities(t, h, uuid, 1)
	if len(vcpus) != 1 {
		t.Errorf("%s: %s's QEMU on %s has %d vCPU threads (%v), want 1", when, uuid, h.Name, len(vcpus), vcpus)
	}
	off := numa.MustParse(pinned)
	threads := map[string]string{"emulator thread": emulator}
	for v, allowed := range vcpus {
		threads[fmt.Sprintf("vCPU %d", v)] = allowed
	}
	for thread, allowed := range threads {
		if allowed != shared {
			t.Errorf("%s: %s's %s may run on %q on %s, want its shared CPUs %q", when, uuid, thread, allowed, h.Name, shared)
		}
		if set, err := numa.Parse(allowed); err != nil || set.Intersects(off) {
			t.Errorf("%s: %s's %s may run on %q on %s, which overlaps pinned pCPUs %q", when, uuid, thread, allowed, h.Name, pinned)
		}
	}
	virsh := exec.Command(testenv.LibvirtVirshBin, "-c", h.URI, "dumpxml", "--inactive", uuid)
	var stderr bytes.Buffer
	virsh.Stderr = &stderr
	out, err := virsh.Output()
	if err != nil {
		t.Fatalf("%s: virsh dumpxml --inactive %s on %s: %v\n%s", when, uuid, h.Name, err, stderr.String())
	}
	pins, err := xmlpatch.Read(string(out))
	if err != nil {
		t.Fatalf("%s: the persistent XML of %s on %s: %v", when, uuid, h.Name, err)
	}
	if got := pins.DefaultCPUs.String(); got != shared {
		t.Errorf("%s: %s's persistent XML on %s has <vcpu cpuset=%q>, want %q", when, uuid, h.Name, got, shared)
	}
}

// affinity returns the host CPUs the guest's only vCPU thread may run on.
func affinity(t *testing.T, h *testenv.LibvirtHost, uuid string) string {
	t.Helper()
	var vcpus map[int]string
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for {
		vcpus, _, err = h.VCPUAffinity(domainName(t, h, uuid))
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("vCPU affinity of %s on %s: %v", uuid, h.Name, err)
	}
	return vcpus[0]
}

// domainName returns the libvirt name of the guest with that uuid on h.
func domainName(t testing.TB, h *testenv.LibvirtHost, uuid string) string {
	t.Helper()
	drv, err := libvirt.New(libvirt.Config{Hosts: libvirt.HostMap{h.Name: h.URI}})
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close()
	dom, err := drv.Lookup(context.Background(), h.Name, uuid)
	if err != nil {
		return ""
	}
	return dom.Name
}
