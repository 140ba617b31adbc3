package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/xmlpatch"
)

// Hosts keep their shared CPUs apart from their pinnable ones, and a
// guest's threads that are not pinned one to one run on its host's shared
// CPUs alone: no pCPU a guest pins is within reach of another guest's
// running or paused domain.

// The two hosts of these tests: one cell of six CPUs, the shared two at
// either end, so that a guest moved with its source's cpuset would float
// over its destination's pinnable CPUs.
var (
	sharedLow  = []string{"--cells", "1", "--cores", "6", "--memory-mb", "8192", "--shared", "0-1", "--dedicated", "2-5"}
	sharedHigh = []string{"--cells", "1", "--cores", "6", "--memory-mb", "8192", "--shared", "4-5", "--dedicated", "0-3"}
)

// bootKind boots a guest on host with the extra specs given (none: a
// floating guest without a NUMA topology) and returns its uuid.
func (s *stack) bootKind(name, host string, vcpus int, specs ...string) string {
	s.t.Helper()
	args := append([]string{"boot", "--name", name, "--host", host, "--vcpus", strconv.Itoa(vcpus), "--memory-mb", "512", "--wait"}, specArgs(specs)...)
	var res struct {
		UUID string `json:"uuid"`
	}
	s.jsonOf(&res, args...)
	if res.UUID == "" {
		s.t.Fatalf("boot %s: no uuid in the result", name)
	}
	return res.UUID
}

// specArgs are the boot flags of extra specs.
func specArgs(specs []string) []string {
	var out []string
	for _, sp := range specs {
		out = append(out, "--spec", sp)
	}
	return out
}

// The specs of the floating and mixed guests.
var (
	floatingNUMA = []string{"hw:numa_nodes=1"}
	mixed        = []string{"hw:cpu_policy=mixed", "hw:cpu_dedicated_mask=^0"}
)

// keepsToShared fails the test if pinflow's promise is broken on host:
// a running or paused domain within reach of a pCPU another guest's claim
// dedicates (hypervisor.Breaches, against the ledger's pins), or of one
// another domain pins (noDoublePins). Each of uuids, floating or mixed
// guests, must run there, and every thread of it not pinned to a pCPU of
// its own may run on the host's shared CPUs, all of them, and nowhere
// else.
func (s *stack) keepsToShared(host string, uuids ...string) {
	t := s.t
	t.Helper()
	ctx := context.Background()
	led, rdb, err := ledger.Open(ctx, s.redisConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	snap, err := led.Snapshot(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	owners := map[int]hypervisor.Owner{}
	for _, p := range snap.Pins {
		owners[p.CPU] = hypervisor.Owner{Claim: p.ClaimID, Guest: p.InstanceUUID}
	}
	shared := snap.Topology.SharedCPUs()
	all := shared.Union(pinnableOf(snap))
	doms, err := s.simulator().Domains(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range hypervisor.Breaches(doms, all, owners) {
		t.Errorf("host %s: %s", host, b)
	}
	s.noDoublePins(host)
	byUUID := map[string]hypervisor.Domain{}
	for _, d := range doms {
		byUUID[d.UUID] = d
	}
	for _, u := range uuids {
		d, ok := byUUID[u]
		if !ok || d.State != hypervisor.StateRunning {
			t.Errorf("guest %s does not run on %s (domain %q)", u, host, d.State)
			continue
		}
		pins, err := xmlpatch.Read(d.XML)
		if err != nil {
			t.Fatal(err)
		}
		if floats := pins.Reach(all).Difference(pins.PinnedCPUs()); !floats.Equal(shared) {
			t.Errorf("guest %s (%s) on %s floats over CPUs %q, want the host's shared CPUs %q", d.Name, u, host, floats, shared)
		}
	}
}

// agrees is checkAgreement for a guest of any kind. One without a NUMA
// topology has no vCPU pins to compare (checkAgreement's comparison tells
// its placement's empty pins from its domain's none): its claims must
// agree, and its domain run on host alone with its placement's <vcpu
// cpuset>.
func (s *stack) agrees(uuid, host string) {
	t := s.t
	t.Helper()
	ctx := context.Background()
	led, rdb, err := ledger.Open(ctx, s.redisConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if inst, err := led.Instance(ctx, uuid); err != nil {
		t.Fatal(err)
	} else if inst.Placement != nil && inst.Placement.HasNUMA() {
		s.checkAgreement(uuid, host)
		return
	}
	inst, hosts, rdb2 := s.checkClaims(ctx, uuid, host)
	defer rdb2.Close()
	for _, h := range hosts {
		dom, err := s.simulator().Lookup(ctx, h, uuid)
		switch {
		case h == host && err != nil:
			t.Errorf("the hypervisor has no domain %s on %s: %v", uuid, h, err)
		case h == host:
			pins, err := xmlpatch.Read(dom.XML)
			if err != nil {
				t.Fatal(err)
			}
			if dom.State != hypervisor.StateRunning || inst.Placement == nil || !pins.DefaultCPUs.Equal(inst.Placement.FloatCPUs) {
				t.Errorf("domain %s on %s is %s with <vcpu cpuset=%q>, want running with its placement's %v", uuid, h, dom.State, pins.DefaultCPUs, inst.Placement)
			}
		case err == nil:
			t.Errorf("the hypervisor still has domain %s on %s", uuid, h)
		}
	}
}

// TestHostSetsApart: a host whose shared and dedicated CPUs overlap is
// refused with one line naming the CPUs, and not registered; a host given
// neither set has every CPU pinnable and none shared, so a floating or
// mixed guest is refused there with a line saying so, and a pinned guest
// may take every CPU.
func TestHostSetsApart(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	file := filepath.Join(t.TempDir(), "overlap.json")
	spec := `{"cells": [{"id": 0, "cpus": [0, 1, 2, 3, 4, 5], "memory_mb": 8192}], "cpu_shared_set": "0-3", "cpu_dedicated_set": "2-5"}`
	if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"host", "add", "x", "--topology", file},
		{"host", "add", "x", "--cells", "1", "--cores", "6", "--shared", "0-3", "--dedicated", "2-5"},
	} {
		out, errOut, code := s.run(args...)
		line := strings.TrimSpace(errOut)
		if code == 0 || strings.Contains(line, "\n") || !strings.HasPrefix(line, "pinflow: ") || !strings.Contains(line, "cpus 2-3 are both") {
			t.Errorf("pinflow %s: exit %d, stdout %q, stderr %q; want a non-zero exit and one line naming cpus 2-3", strings.Join(args, " "), code, out, errOut)
		}
	}
	if out := s.ok("host", "list", "--json"); strings.Contains(out, `"x"`) {
		t.Errorf("a refused host was registered:\n%s", out)
	}

	s.ok("host", "add", "n", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	var shown struct {
		Cells []struct {
			PCPUs  []int `json:"pcpus"`
			Shared []int `json:"shared_cpus"`
		} `json:"cells"`
	}
	s.jsonOf(&shown, "host", "show", "n")
	if len(shown.Cells) != 1 || cpuList(shown.Cells[0].PCPUs) != "0-3" || len(shown.Cells[0].Shared) != 0 {
		t.Errorf("host n registered with neither set has cells %+v, want pCPUs 0-3 and no shared CPUs", shown.Cells)
	}
	s.refused("the host has no shared CPUs", "boot", "--name", "F", "--host", "n", "--vcpus", "2", "--memory-mb", "512", "--wait")
	s.refused("shared CPUs, the cell has 0", append([]string{"boot", "--name", "N", "--host", "n", "--vcpus", "2", "--memory-mb", "512",
		"--wait"}, specArgs(floatingNUMA)...)...)
	s.refused("shared CPUs, the cell has 0", append([]string{"boot", "--name", "M", "--host", "n", "--vcpus", "2", "--memory-mb", "512",
		"--wait"}, specArgs(mixed)...)...)
	p := s.boot("P", "n", 4)
	if got := s.guest(p).pcpus(); got != "0-3" {
		t.Errorf("a pinned guest of four vCPUs on n is pinned to %q, want 0-3", got)
	}
	s.keepsToShared("n")
	s.ok("check")
}

// TestFloatingGuestsKeepToTheSharedSet boots a pinned guest, a floating
// one without a NUMA topology (<vcpu cpuset>), a floating one with a NUMA
// cell (<vcpupin> to the cell's shared CPUs) and a mixed one on a host of
// two shared and four dedicated CPUs: every domain's threads keep off the
// others' pCPUs, and the floating ones run on the shared set, all of it.
func TestFloatingGuestsKeepToTheSharedSet(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok(append([]string{"host", "add", "a"}, sharedLow...)...)
	p := s.boot("P", "a", 2)
	f := s.bootKind("F", "a", 2)
	n := s.bootKind("N", "a", 2, floatingNUMA...)
	m := s.bootKind("M", "a", 3, mixed...)
	if got := s.pinned("a"); got != "2-5" {
		t.Errorf("a has %q pinned, want 2-5: P's two pCPUs and M's two", got)
	}
	s.keepsToShared("a", f, n, m)
	for _, u := range []string{p, f, n, m} {
		s.agrees(u, "a")
	}
	s.ok("check")
}

// TestMovesFloatOverTheDestinationsSharedSet moves floating and mixed
// guests between two hosts whose shared sets differ, onto pinned guests:
// a live migration, a cold migration and resizes, before and after their
// confirm, each write the destination's shared set.
func TestMovesFloatOverTheDestinationsSharedSet(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok(append([]string{"host", "add", "a"}, sharedLow...)...)
	s.ok(append([]string{"host", "add", "b"}, sharedHigh...)...)
	pa, pb := s.boot("Pa", "a", 1), s.boot("Pb", "b", 1)
	f := s.bootKind("F", "a", 2)
	n := s.bootKind("N", "a", 2, floatingNUMA...)
	m := s.bootKind("M", "a", 2, mixed...)
	s.keepsToShared("a", f, n, m)

	s.ok("migrate", f, "--dest", "b", "--wait")
	s.keepsToShared("b", f)
	s.agrees(f, "b")

	s.ok("migrate", n, "--cold", "--dest", "b", "--wait")
	s.keepsToShared("b", f, n)
	s.ok("resize", "confirm", n, "--wait")
	s.keepsToShared("b", f, n)
	s.agrees(n, "b")

	s.ok("resize", m, "--vcpus", "3", "--memory-mb", "1024", "--host", "b", "--confirm-window", "never")
	s.waitResized(m)
	s.keepsToShared("b", f, n, m)
	s.keepsToShared("a")
	s.ok("resize", "confirm", m, "--wait")
	s.keepsToShared("b", f, n, m)
	s.agrees(m, "b")

	// The other way, onto Pa, and back with a resize.
	s.ok("migrate", f, "--dest", "a", "--wait")
	s.keepsToShared("a", f)
	s.ok("resize", f, "--vcpus", "3", "--memory-mb", "1024", "--host", "b", "--confirm-window", "never")
	s.waitResized(f)
	s.keepsToShared("b", f, n, m)
	s.ok("resize", "confirm", f, "--wait")
	s.keepsToShared("b", f, n, m)
	s.keepsToShared("a")
	for _, g := range []struct{ uuid, host string }{{pa, "a"}, {pb, "b"}, {f, "b"}, {n, "b"}, {m, "b"}} {
		s.agrees(g.uuid, g.host)
	}
	s.ok("check")
}

// TestEvacuationAndDrainFloatOverTheDestinationsSharedSet evacuates the
// floating and mixed guests of a fenced host onto one with a pinned guest,
// then drains that host, pinned guest and all, onto one with a pinned and
// a floating guest: each move writes the destination's shared set.
func TestEvacuationAndDrainFloatOverTheDestinationsSharedSet(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok(append([]string{"host", "add", "a"}, sharedLow...)...)
	s.ok(append([]string{"host", "add", "b"}, sharedHigh...)...)
	pb := s.boot("Pb", "b", 1)
	f := s.bootKind("F", "a", 2)
	n := s.bootKind("N", "a", 2, floatingNUMA...)
	m := s.bootKind("M", "a", 2, mixed...)

	s.ok("sim", "power", "--host", "a", "--off")
	s.ok("host", "down", "a", "--fence", "--reason", "power supply failed")
	s.ok("host", "evacuate", "a", "--wait")
	s.keepsToShared("b", f, n, m)
	s.ok("sim", "power", "--host", "a", "--on")
	s.ok("host", "up", "a", "--wait")
	for _, u := range []string{pb, f, n, m} {
		s.agrees(u, "b")
	}

	pa := s.boot("Pa", "a", 1)
	f2 := s.bootKind("F2", "a", 2)
	s.ok("host", "drain", "b", "--wait")
	s.keepsToShared("a", f, n, m, f2)
	for _, u := range []string{pa, pb, f, n, m, f2} {
		s.agrees(u, "a")
	}
	s.keepsToShared("b")
	s.ok("check")
}
