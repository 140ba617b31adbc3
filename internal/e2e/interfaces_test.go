package e2e

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/placement"
)

// TestOperatorFollows: --wait ends where the operator's next decision is
// and says where the guest runs; an interrupt stops the following, not
// the operation, and follow picks it up again.
func TestOperatorFollows(t *testing.T) {
	t.Parallel()
	s, vmA, vmB := twoHosts(t)

	// A resize --wait returns in VERIFY_RESIZE with both commands to
	// decide; the decision's --wait says where the guest stays.
	out := s.ok("resize", vmB, "--vcpus", "1", "--host", "a", "--confirm-window", "never", "--wait")
	for _, want := range []string{"awaits confirmation (VERIFY_RESIZE)", "it runs on a, pinned to pCPUs 2", "its source on b is held",
		"'pinflow resize confirm " + vmB + "'", "'pinflow resize revert " + vmB + "'"} {
		if !strings.Contains(out, want) {
			t.Errorf("resize --wait: %q, want it to say %q", out, want)
		}
	}
	if strings.Contains(out, "confirms by itself") {
		t.Errorf("resize --wait --confirm-window never: %q says it confirms by itself", out)
	}
	if out := s.ok("resize", "confirm", vmB, "--wait"); !strings.Contains(out, "resize "+vmB+" confirmed: it runs on a, pinned to pCPUs 2") {
		t.Errorf("resize confirm --wait: %q, want the guest on a, pCPU 2", out)
	}

	// Ctrl-C while following a migration held before its switchover.
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	bg := s.start("migrate", vmA, "--dest", "b", "--wait")
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	if err := bg.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := bg.wait(t)
	if code != 130 || !strings.Contains(errOut, "stopped following; the live-migration of "+vmA+" continues ('pinflow cancel "+vmA+"' stops it") {
		t.Errorf("migrate --wait interrupted: exit %d, stderr %q; want 130 and that the migration continues", code, errOut)
	}
	again := s.start("follow", "A") // by name
	s.ok("sim", "gate", "--at", "switchover", "--release")
	out, errOut, code = again.wait(t)
	if code != 0 || !strings.Contains(out, "live-migration "+vmA+" completed: it runs on b") {
		t.Errorf("follow A: exit %d, %q %q; want the migration completed onto b", code, out, errOut)
	}
	// Followed once it ended, an operation says how it ended.
	if out := s.ok("follow", vmA[:8]); !strings.Contains(out, "completed: it runs on b") {
		t.Errorf("follow of an ended migration: %q", out)
	}
}

// TestGuestNames: a guest is named by UUID, unique UUID prefix or unique
// name; an ambiguous or unknown one is refused naming it, with nothing
// started.
func TestGuestNames(t *testing.T) {
	t.Parallel()
	s, vmA, vmB := twoHosts(t)
	for _, ref := range []string{vmA, vmA[:6], "A", strings.ToUpper(vmA)} {
		if g := s.guest(vmA); !strings.Contains(s.ok("show", ref), vmA) {
			t.Errorf("show %s does not show A (%s, %+v)", ref, vmA, g)
		}
	}
	twin := s.boot("A", "b", 1)
	s.refused(`instance "A" is ambiguous`, "migrate", "A", "--dest", "b")
	s.refused(`unknown instance "nobody"`, "show", "nobody")
	if strings.HasPrefix(vmB, vmA[:1]) {
		s.refused("is ambiguous", "show", vmA[:1])
	}
	if g := s.guest(vmA); hostOf(g) != "a" {
		t.Errorf("a refused migration moved A to %q", hostOf(g))
	}
	s.ok("show", twin)
	// A full UUID no guest has names no operation either.
	s.refused("no operation is running on it", "cancel", "00000000-0000-4000-8000-000000000000")
}

// TestHistoryAndFaults: ops lists what ran with one-line reasons, show
// gives the last operation and why it failed.
func TestHistoryAndFaults(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	s.ok("migrate", vmA, "--dest", "b", "--wait")
	s.ok("sim", "fault", "--host", "a", "--op", "prepare", "--times", "100")
	line := s.refused("failed", "migrate", vmA, "--dest", "a", "--wait")
	if strings.Contains(line, "\n") || strings.Contains(line, "wrapError") || strings.Contains(line, "EventID") {
		t.Errorf("failed migrate --wait: %q, want one line with the root cause", line)
	}
	var shown struct {
		LastOperation *client.Record `json:"last_operation"`
	}
	s.jsonOf(&shown, "show", vmA)
	if r := shown.LastOperation; r == nil || r.Status != "failed" || r.Operation != "live-migration" || r.Reason == "" || strings.Contains(r.Reason, "\n") {
		t.Errorf("show: last operation %+v, want the failed live-migration with a one-line reason", r)
	}
	if out := s.ok("show", vmA); !strings.Contains(out, "last operation: live-migration failed") {
		t.Errorf("show: %q, want its last operation", out)
	}
	// Visibility lags behind the runs: wait for both to be listed.
	var recs []client.Record
	s.eventually("the three runs in visibility", time.Minute, func() bool {
		recs = nil
		s.jsonOf(&recs, "ops", vmA)
		return len(recs) >= 3
	})
	if len(recs) < 3 || recs[0].Status != "failed" || recs[0].Reason == "" || recs[1].Status != "completed" || recs[1].Dest != "b" || recs[2].Operation != "boot" {
		t.Fatalf("ops %s: %+v; want the failed migration, the one onto b, then the boot, newest first", vmA, recs)
	}
	if out := s.ok("ops", "--host", "b"); !strings.Contains(out, "live-migration") || !strings.Contains(out, "completed") {
		t.Errorf("ops --host b: %q, want the migration onto b", out)
	}
	s.refused(`unknown host "nowhere"`, "ops", "--host", "nowhere")
	s.refused("--limit 0: allowed are 1 to 1000", "ops", "--limit", "0")
}

// TestExplain: explain says per host, grouped, why a new guest, a guest's
// move or a guest's resize fits or not, changing nothing, and a boot that
// finds no host says the same groups.
func TestExplain(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	s.ok("host", "disable", "b", "--reason", "firmware")
	before := s.ok("host", "list", "--json")

	explain := func(args ...string) (ex placement.Explanation) {
		t.Helper()
		s.jsonOf(&ex, append([]string{"explain"}, args...)...)
		return ex
	}
	ex := explain("--vcpus", "4", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated")
	want := []placement.Group{{Group: "no NUMA cell with enough free pCPUs", Hosts: []string{"a"}}, {Group: "host disabled (takes no new guests)", Hosts: []string{"b"}}}
	if ex.Choice != "" || !reflect.DeepEqual(ex.Groups, want) {
		t.Errorf("explain 4 pinned vCPUs: choice %q, groups %+v; want none, and %+v", ex.Choice, ex.Groups, want)
	}
	ex = explain("--vcpus", "2", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated")
	if ex.Choice != "a" {
		t.Errorf("explain 2 pinned vCPUs: choice %q, want a (b is disabled)", ex.Choice)
	}
	ex = explain("--vcpus", "2", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated", "--host", "b")
	if ex.Choice != "b" {
		t.Errorf("explain --host b: choice %q, want b, which takes a guest that names it", ex.Choice)
	}
	ex = explain("A")
	if ex.Choice != "" || len(ex.Groups) != 2 || ex.Groups[0].Group != "excluded: the guest runs there" {
		t.Errorf("explain A: %+v; want a excluded and b disabled", ex)
	}
	if out := s.ok("explain", "--vcpus", "4", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated"); !strings.Contains(out, "e.g. a: no fit") || !strings.Contains(out, "no host takes it now") {
		t.Errorf("explain: %q", out)
	}
	// A guest with a flavor asks about its resize: its own host counts,
	// holding both placements at once.
	if ex = explain(vmA, "--memory-mb", "1024"); ex.Choice != "a" {
		t.Errorf("explain A --memory-mb 1024: %+v; want a, where its 2 free pCPUs hold the resized guest beside its current claim", ex)
	}
	if ex = explain("A", "--vcpus", "3"); ex.Choice != "" || len(ex.Groups) == 0 || ex.Groups[0].Group != "no NUMA cell with enough free pCPUs" || ex.Groups[0].Hosts[0] != "a" {
		t.Errorf("explain A --vcpus 3: %+v; want no host: a has 2 pCPUs free, b is disabled", ex)
	}
	s.refused("--vcpus -1 --memory-mb 0: allowed are positive numbers", "explain", vmA, "--vcpus", "-1")
	s.refused("name a guest, or give a flavor", "explain")
	s.refused(`unknown host "nowhere"`, "explain", "--vcpus", "1", "--memory-mb", "1", "--host", "nowhere")
	if after := s.ok("host", "list", "--json"); after != before {
		t.Errorf("explain changed the hosts:\nbefore %s\nafter %s", before, after)
	}

	line := s.refused("no host can take", "boot", "--name", "big", "--vcpus", "4", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated", "--wait")
	for _, want := range []string{"no NUMA cell with enough free pCPUs: a (no fit", "host disabled (takes no new guests): b (firmware)"} {
		if !strings.Contains(line, want) {
			t.Errorf("boot that fits nowhere: %q, want it to say %q", line, want)
		}
	}
}

// TestEvacuateAGuestThatStillRuns: an operator fenced a host whose guest
// still runs there; the evacuation is refused, and says so in words the
// operator acts on.
func TestEvacuateAGuestThatStillRuns(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	s.ok("host", "down", "a", "--fence", "--reason", "unreachable")
	line := s.refused("failed", "evacuate", vmA, "--wait")
	if !strings.Contains(line, "may still run on a, which is fenced as down: power it off there, then evacuate again") {
		t.Errorf("evacuate of a guest still running on its fenced host: %q, want it to say the guest still runs on a", line)
	}
	if g := s.guest(vmA); hostOf(g) != "a" {
		t.Errorf("the refused evacuation moved A to %q", hostOf(g))
	}
}
