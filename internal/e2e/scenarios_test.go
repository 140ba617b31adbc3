package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/libvirt"
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/workflows"
)

// twoHosts registers hosts a and b with 4 pinnable CPUs each and boots VM A
// on a and VM B on b, each pinned to 0,1.
func twoHosts(t *testing.T, env ...string) (s *stack, vmA, vmB string) {
	s = newStack(t, env...)
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

func hostOf(g shownGuest) string {
	if g.Host == nil {
		return ""
	}
	return *g.Host
}

// TestNovaBug1845146 is Nova's live-migration race: while A's migration to
// b holds b's remaining CPUs, nothing else may get them, and afterwards A
// owns them.
func TestNovaBug1845146(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("migrate", vmA, "--dest", "b")
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	if got := s.pinned("b"); got != "0-3" {
		t.Errorf("during the migration b has %q pinned, want 0-3", got)
	}
	s.refused("no", "boot", "--name", "C", "--host", "b", "--vcpus", "2", "--memory-mb", "1024", "--spec", "hw:cpu_policy=dedicated", "--wait")
	if got := s.pinned("b"); got != "0-3" {
		t.Errorf("after the refused boot b has %q pinned, want 0-3", got)
	}
	s.ok("sim", "gate", "--at", "switchover", "--release")
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// TestWorkerKilledDuringMigration kills the workers while a migration,
// its copy done, is held before the switchover, and starts a new one: the
// new worker's attempt takes over what the dead one left, the migration
// completes, and the ledger, the record and the hypervisor agree.
func TestWorkerKilledDuringMigration(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("migrate", vmA, "--dest", "b")
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	s.killWorkers()
	s.startWorker()
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "2")
	s.ok("sim", "gate", "--at", "switchover", "--release")
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

// TestOrphanedPastSwitchover: a live migration held past its switchover
// loses both its workflow (terminated) and its worker (killed), so no
// attempt will ever finish it. The guest's next migration must not wait
// on it forever: the hypervisor finishes the orphan (A runs on b), the
// next migration, which started from a, fails and rolls back, and the
// audit settles A on b. Nothing runs twice, the ledger agrees, and A
// migrates on from there.
func TestOrphanedPastSwitchover(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	s.ok("host", "add", "c", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	s.ok("sim", "gate", "--at", "switched", "--hold")
	s.ok("migrate", vmA, "--dest", "b")
	s.ok("sim", "gate", "--at", "switched", "--wait-arrived", "1")
	if err := s.tc.TerminateWorkflow(context.Background(), guest.InstanceWorkflowID(vmA), "", "e2e: terminated past the switchover"); err != nil {
		t.Fatal(err)
	}
	s.killWorkers()
	s.ok("sim", "gate", "--at", "switched", "--release")
	s.startWorker()
	if out, errOut, code := s.run("migrate", vmA, "--dest", "c", "--wait"); code == 0 {
		t.Fatalf("migrate A to c from a, which the orphan left for b, succeeded: %s%s", out, errOut)
	}
	s.noDoublePins("a", "b", "c")
	s.pastMinGrace()
	s.eventually("the audit to settle A on b", 2*time.Minute, func() bool {
		s.reconcile("--grace", "0")
		g := s.guest(vmA)
		return hostOf(g) == "b" && g.TaskState == nil && s.pinned("a") == "" && s.pinned("c") == ""
	})
	s.checkAgreement(vmA, "b")
	s.ok("migrate", vmA, "--dest", "c", "--wait")
	s.noDoublePins("a", "b", "c")
	s.checkAgreement(vmA, "c")
}

// TestBadInput: each refused with one clear line, nothing changed.
func TestBadInput(t *testing.T) {
	t.Parallel()
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
	badNames(t, s, vmA)
	badHostAdds(t, s)

	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("migrate", vmA, "--dest", "b")
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	s.refused("busy", "shelve", vmA, "--offload")
	s.ok("sim", "gate", "--at", "switchover", "--release")
	s.eventually("the migration to finish", 2*time.Minute, func() bool { return hostOf(s.guest(vmA)) == "b" })

	s.ok("shelve", vmA, "--offload", "--wait")
	s.refused("shelved_offloaded", "migrate", vmA, "--dest", "a")
	s.refused("no operation is running on it (the last one, ShelveOffload, is completed)", "cancel", vmA)
	s.refused("no operation is running on it", "cancel", "00000000-0000-4000-8000-000000000000")
	after := s.pinned("a") + "|" + s.pinned("b")
	if after != "|0-1" {
		t.Errorf("pinned after the refusals and the shelve = %q (before %q), want only B's 0-1 on b", after, before)
	}
}

// badNames: sizes past numa's bounds, names the ledger cannot hold and
// empty host flags are refused before a workflow starts, and leave no
// record of a guest behind.
func badNames(t *testing.T, s *stack, vmA string) {
	state := func() string { return s.ok("list", "--json") + s.ok("host", "list", "--json") }
	before := state()
	boot := func(want string, args ...string) {
		s.refused(want, append([]string{"boot", "--vcpus", "1", "--memory-mb", "512"}, args...)...)
	}
	// A flag that takes one value is refused when given twice, so these
	// name every flag themselves.
	s.refused("memory_mb 9223372036854775807: allowed are 1-1099511627776 MiB", "boot", "--name", "X", "--vcpus", "1", "--memory-mb", "9223372036854775807")
	s.refused("vcpus 8193: allowed are 1-8192", "boot", "--name", "X", "--vcpus", "8193", "--memory-mb", "512")
	boot(`guest name "`+strings.Repeat("x", 64)+`"... (10000 bytes): invalid input: guest names are 1-255`, "--name", strings.Repeat("x", 10000))
	boot(`guest name "two\nlines": invalid input`, "--name", "two\nlines")
	boot(`guest name "bell\a": invalid input`, "--name", "bell\a")
	boot("--name is empty", "--name", "")
	boot("--host is empty; give a name, or leave --host out", "--name", "X", "--host", "")
	boot(`host name "a{b}": invalid input: host names are 1-253 characters of letters, digits, '.', '_' and '-'`, "--name", "X", "--host", "a{b}")
	boot(`host name "a:b": invalid input`, "--name", "X", "--host", "a:b")
	s.refused("--dest is empty; give a name, or leave --dest out", "migrate", vmA, "--dest", "")
	s.refused("--host is empty", "unshelve", vmA, "--host", "")
	s.refused(`host name "a\nb": invalid input`, "list", "--host", "a\nb")
	s.refused(`host name "a\x01b": invalid input`, "host", "show", "a\x01b")
	// Another client starting the workflow itself is refused by the
	// ledger the workers use, with the value named.
	for want, in := range map[string]api.BootInput{
		`guest name "` + strings.Repeat("x", 64) + `"... (10000 bytes)`:  {Name: strings.Repeat("x", 10000), Flavor: guest.Flavor{VCPUs: 1, MemoryMB: 512}},
		"memory_mb 9223372036854775807: allowed are 1-1099511627776 MiB": {Name: "X", Flavor: guest.Flavor{VCPUs: 1, MemoryMB: 1<<63 - 1}},
	} {
		in.UUID = uuid.NewString()
		ctx := context.Background()
		run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: guest.InstanceWorkflowID(in.UUID),
			TaskQueue: "e2e-" + strings.ReplaceAll(t.Name(), "/", "-")}, workflows.Boot, in)
		if err == nil {
			err = run.Get(ctx, nil)
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Boot workflow of %.40q with %d MiB = %v, want it refused with %q", in.Name, in.Flavor.MemoryMB, err, want)
		}
	}
	if after := state(); after != before {
		t.Errorf("the refused boots and moves changed the guests or hosts:\nbefore %s\nafter  %s", before, after)
	}
}

// badHostAdds: shapes whose products overflow, huge memory and page
// counts, and bad names are refused; a libvirt host that cannot be
// reached is not registered, nor does it change a registered host's URI.
func badHostAdds(t *testing.T, s *stack) {
	ctx := context.Background()
	reg := libvirt.NewRegistry(s.redisClient(), ledger.DefaultKeyPrefix)
	if err := reg.Put(ctx, "a", libvirthost.Config{URI: "qemu+tcp://a.example/system"}); err != nil {
		t.Fatal(err)
	}
	state := func() string { return s.ok("host", "list", "--json") }
	before := state()
	add := func(want string, args ...string) {
		s.refused(want, append([]string{"host", "add"}, args...)...)
	}
	add("host shape 4294967296 cells x 4294967296 cores x 1 threads: at most 1024 cells", "h", "--cells", "4294967296", "--cores", "4294967296")
	add("host shape 1024 cells x 18014398509481984 cores x 1 threads: more than 8192 CPUs", "h", "--cells", "1024", "--cores", "18014398509481984")
	add("host shape 1 cells x 4 cores x 4294967296 threads: at most 8 threads per core", "h", "--cells", "1", "--cores", "4", "--threads", "4294967296")
	add("memory 9223372036854775807 MiB per cell: allowed are 1-1073741824 MiB", "h", "--cells", "1", "--cores", "4",
		"--memory-mb", "9223372036854775807", "--hugepages", "1G:9223372036854775807")
	add("9223372036854775807 huge pages of 1048576 KiB: allowed are 0-8", "h", "--cells", "1", "--cores", "4", "--memory-mb", "8192",
		"--hugepages", "1G:9223372036854775807")
	add(`page size "9223372036854775807G": allowed are sizes up to 16777216 KiB`, "h", "--cells", "1", "--cores", "4", "--hugepages", "9223372036854775807G:1")
	add(`host name "h:1": invalid input`, "h:1", "--cells", "1", "--cores", "4")
	add(`host name "h{1}": invalid input`, "h{1}", "--cells", "1", "--cores", "4")
	add(`host name "h\n1": invalid input`, "h\n1", "--cells", "1", "--cores", "4")
	const unreachable = "qemu+tcp://127.0.0.1:1/system"
	add("connect", "a", "--libvirt", unreachable)
	add("connect", "zz", "--libvirt", unreachable)
	if hc, err := reg.Resolve(ctx, "a"); err != nil || hc.URI != "qemu+tcp://a.example/system" {
		t.Errorf("registry entry of a after a failed libvirt add = %+v, %v; want its URI qemu+tcp://a.example/system", hc, err)
	}
	if hc, err := reg.Resolve(ctx, "zz"); !errors.Is(err, hypervisor.ErrUnknownHost) {
		t.Errorf("registry entry of zz after a failed libvirt add = %+v, %v; want none", hc, err)
	}
	if after := state(); after != before {
		t.Errorf("the refused host adds changed the hosts:\nbefore %s\nafter  %s", before, after)
	}
}
