package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pinflow/pinflow/hypervisor/libvirt"
	"github.com/pinflow/pinflow/internal/testenv"
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
	} {
		t.Run(tt.name, tt.run)
	}
}

// libvirtMigration runs pinflow's workflows against two real libvirtd
// hosts with QEMU (software emulation) guests: a pinned guest boots on h1,
// live-migrates to h2 onto other pCPUs, and its vCPU threads on h2 really
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
	before := s.guest(a).pcpus()
	if got := affinity(t, h1, a); got != before {
		t.Fatalf("guest-a's vCPU runs on %q on h1, but the ledger pinned it to %q", got, before)
	}

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
