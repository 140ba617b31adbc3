package e2e

import (
	"strings"
	"testing"
	"time"
)

// twoHosts registers hosts a and b with 4 pinnable CPUs each and boots VM A
// on a and VM B on b, each pinned to 0,1.
func twoHosts(t *testing.T) (s *stack, vmA, vmB string) {
	s = newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	s.ok("host", "add", "b", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	vmA = s.boot("A", "a", 2)
	vmB = s.boot("B", "b", 2)
	if got := s.guest(vmA).pcpus(); got != "0-1" {
		t.Fatalf("A pinned to %q, want 0-1", got)
	}
	if got := s.guest(vmB).pcpus(); got != "0-1" {
		t.Fatalf("B pinned to %q, want 0-1", got)
	}
	return s, vmA, vmB
}

func hostOf(g guest) string {
	if g.Host == nil {
		return ""
	}
	return *g.Host
}

// waitPhase waits until the migration's destination claim exists, i.e. the
// migration is past accepted.
func (s *stack) waitDestClaim(host, uuid string) {
	s.eventually("the migration's destination claim on "+host, time.Minute, func() bool {
		for _, c := range s.host(host).Claims {
			if c.Instance == uuid && c.Kind == "migration-dest" {
				return true
			}
		}
		return false
	})
}

// TestNovaBug1845146 is Nova's live-migration race: while A's migration to
// b holds b's remaining CPUs, nothing else may get them, and afterwards A
// owns them.
func TestNovaBug1845146(t *testing.T) {
	s, vmA, _ := twoHosts(t)
	s.ok("sim", "latency", "--op", "migrate", "--seconds", "6")
	s.ok("migrate", vmA, "--dest", "b")
	s.waitDestClaim("b", vmA)
	if got := s.pinned("b"); got != "0-3" {
		t.Errorf("during the migration b has %q pinned, want 0-3", got)
	}
	s.refused("no", "boot", "--name", "C", "--host", "b", "--vcpus", "2", "--memory-mb", "1024", "--spec", "hw:cpu_policy=dedicated", "--wait")
	if got := s.pinned("b"); got != "0-3" {
		t.Errorf("after the refused boot b has %q pinned, want 0-3", got)
	}
	s.eventually("A to land on b", 2*time.Minute, func() bool {
		g := s.guest(vmA)
		return hostOf(g) == "b" && g.TaskState == nil
	})
	if got := s.guest(vmA).pcpus(); got != "2-3" {
		t.Errorf("A pinned to %q on b, want 2-3", got)
	}
	if got := s.pinned("a"); got != "" {
		t.Errorf("host a has %q pinned after A left, want nothing", got)
	}
	if got := s.pinned("b"); got != "0-3" {
		t.Errorf("host b has %q pinned, want 0-3", got)
	}
}

// TestMigrationFailureLeavesTheSource: a migration that fails at the
// migrate step leaves A on a with 0,1 and b without the claim.
func TestMigrationFailureLeavesTheSource(t *testing.T) {
	s, vmA, _ := twoHosts(t)
	for _, h := range []string{"a", "b"} {
		s.ok("sim", "fault", "--host", h, "--op", "migrate", "--times", "10")
	}
	s.refused("failed", "migrate", vmA, "--dest", "b", "--wait")
	g := s.guest(vmA)
	if hostOf(g) != "a" || g.pcpus() != "0-1" || g.VMState != "active" || g.TaskState != nil {
		t.Errorf("after the failed migration A is on %q pinned %q, %s/%v; want a, 0-1, active, no task", hostOf(g), g.pcpus(), g.VMState, g.TaskState)
	}
	if got := s.pinned("b"); got != "0-1" {
		t.Errorf("host b has %q pinned, want only B's 0-1", got)
	}
	for _, c := range s.host("b").Claims {
		if c.Instance == vmA {
			t.Errorf("host b still holds claim %s of A", c.ID)
		}
	}
}

// TestShelveUnshelveSpawnFailure: offload frees the pins before the
// workflow completes, with no audit; an unshelve whose spawn fails leaves
// the instance shelved_offloaded with no host and no placement and the
// host without its pins; a later delete succeeds.
func TestShelveUnshelveSpawnFailure(t *testing.T) {
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4")
	vm := s.boot("A", "a", 2)
	s.ok("shelve", vm, "--offload", "--wait")
	g := s.guest(vm)
	if g.VMState != "shelved_offloaded" || g.Host != nil || g.Placement != nil {
		t.Errorf("after shelve: %s host %v placement %v; want shelved_offloaded, no host, no placement", g.VMState, g.Host, g.Placement)
	}
	if got := s.pinned("a"); got != "" {
		t.Errorf("after shelve host a has %q pinned, want nothing", got)
	}
	s.ok("sim", "fault", "--host", "a", "--op", "spawn", "--times", "10")
	s.refused("failed", "unshelve", vm, "--host", "a", "--wait")
	g = s.guest(vm)
	if g.VMState != "shelved_offloaded" || g.Host != nil || g.Placement != nil || g.TaskState != nil {
		t.Errorf("after the failed unshelve: %s/%v host %v placement %v; want shelved_offloaded, no task, host or placement", g.VMState, g.TaskState, g.Host, g.Placement)
	}
	if got := s.pinned("a"); got != "" {
		t.Errorf("after the failed unshelve host a has %q pinned, want nothing", got)
	}
	s.ok("delete", vm, "--wait")
	if _, errOut, code := s.run("show", vm); code == 0 || !strings.Contains(errOut, "unknown instance") {
		t.Errorf("show after delete: exit %d %q, want unknown instance", code, errOut)
	}
}

// TestUnshelveAfterShelve brings a shelved guest back with new pins.
func TestUnshelveAfterShelve(t *testing.T) {
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4")
	s.ok("host", "add", "b", "--cells", "2", "--cores", "2")
	vm := s.boot("A", "a", 2)
	s.ok("shelve", vm, "--offload", "--wait")
	s.ok("unshelve", vm, "--host", "b", "--wait")
	g := s.guest(vm)
	if hostOf(g) != "b" || g.VMState != "active" || g.pcpus() == "" {
		t.Errorf("after unshelve A is on %q (%s) pinned %q; want b, active, pinned", hostOf(g), g.VMState, g.pcpus())
	}
	if s.pinned("b") != g.pcpus() {
		t.Errorf("host b has %q pinned but A holds %q", s.pinned("b"), g.pcpus())
	}
}

// TestWorkerKilledDuringMigration kills the worker in the slow migrate step
// and starts a new one: the migration completes and the ledger, the record
// and the hypervisor agree.
func TestWorkerKilledDuringMigration(t *testing.T) {
	s, vmA, _ := twoHosts(t)
	s.ok("sim", "latency", "--op", "migrate", "--seconds", "4")
	s.ok("migrate", vmA, "--dest", "b")
	s.waitDestClaim("b", vmA)
	time.Sleep(time.Second)
	s.killWorker()
	s.startWorker()
	s.eventually("A to land on b after the worker restart", 3*time.Minute, func() bool {
		g := s.guest(vmA)
		return hostOf(g) == "b" && g.TaskState == nil
	})
	if got := s.guest(vmA).pcpus(); got != "2-3" {
		t.Errorf("A pinned to %q on b, want 2-3", got)
	}
	if got := s.pinned("a"); got != "" {
		t.Errorf("host a has %q pinned, want nothing", got)
	}
	s.checkAgreement(vmA, "b")
}

// TestBadInput: each refused with one clear line, nothing changed.
func TestBadInput(t *testing.T) {
	s, vmA, _ := twoHosts(t)
	before := s.pinned("a") + "|" + s.pinned("b")
	s.refused("unknown instance", "migrate", "00000000-0000-4000-8000-000000000000", "--dest", "b")
	s.refused("unknown host", "migrate", vmA, "--dest", "nowhere")
	s.refused("hw:cpu_policy", "boot", "--name", "X", "--vcpus", "2", "--memory-mb", "1024", "--spec", "hw:cpu_policy=pinned")
	// Each of these booted a floating guest: a typo of a key Nova knows, a
	// flavor key as an image property, a trait value Nova refuses.
	guests := len(s.listRows())
	s.refused("did you mean hw:cpu_policy", "boot", "--name", "X", "--vcpus", "2", "--memory-mb", "1024", "--spec", "hw:cpu_polcy=dedicated")
	s.refused("hw_cpu_policy", "boot", "--name", "X", "--vcpus", "2", "--memory-mb", "1024", "--image-prop", "hw:cpu_policy=dedicated")
	s.refused("required or forbidden", "boot", "--name", "X", "--vcpus", "2", "--memory-mb", "1024", "--spec", "trait:HW_CPU_HYPERTHREADING=bogus")
	s.refused("did you mean hw:cpu_policy", "resize", vmA, "--spec", "hw:cpu_polcy=dedicated")
	if n := len(s.listRows()); n != guests {
		t.Errorf("pinflow list has %d guests after the refused boots, want %d", n, guests)
	}
	s.refused("is active", "unshelve", vmA)
	s.refused("unknown host", "boot", "--name", "X", "--host", "nowhere", "--vcpus", "1", "--memory-mb", "512")

	s.ok("sim", "latency", "--op", "migrate", "--seconds", "5")
	s.ok("migrate", vmA, "--dest", "b")
	s.refused("busy", "shelve", vmA, "--offload")
	s.eventually("the migration to finish", 2*time.Minute, func() bool { return hostOf(s.guest(vmA)) == "b" })

	s.ok("shelve", vmA, "--offload", "--wait")
	s.refused("shelved_offloaded", "migrate", vmA, "--dest", "a")
	after := s.pinned("a") + "|" + s.pinned("b")
	if after != "|0-1" {
		t.Errorf("pinned after the refusals and the shelve = %q (before %q), want only B's 0-1 on b", after, before)
	}
}
