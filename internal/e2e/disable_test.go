package e2e

import (
	"encoding/json"
	"strings"
	"testing"
)

// hostLine is the summary line `host list` prints for host.
func (s *stack) hostLine(host string) string {
	s.t.Helper()
	for _, l := range strings.Split(s.ok("host", "list"), "\n") {
		if strings.HasPrefix(l, host+" ") || strings.HasPrefix(l, host+":") {
			return l
		}
	}
	s.t.Fatalf("host list has no line for %s", host)
	return ""
}

// TestHostDisable disables a host before maintenance: its guest stays, no
// boot that leaves the choice to pinflow lands there, even with room
// there and none elsewhere, while a boot and a migration that name it
// do; once enabled, pinflow chooses it again.
func TestHostDisable(t *testing.T) {
	t.Parallel()
	s, vmA, vmB := twoHosts(t) // A on a 0-1, B on b 0-1
	s.ok("host", "disable", "a", "--reason", "firmware update")
	if l := s.hostLine("a"); !strings.Contains(l, "[disabled: firmware update]") {
		t.Errorf("host list shows a as %q, want it disabled with the reason", l)
	}
	var hosts []struct {
		Host   string `json:"host"`
		Status struct {
			State  string `json:"state"`
			Reason string `json:"reason"`
		} `json:"status"`
	}
	s.jsonOf(&hosts, "host", "list")
	if len(hosts) != 2 || hosts[0].Status.State != "disabled" || hosts[0].Status.Reason != "firmware update" || hosts[1].Status.State != "up" {
		t.Errorf("host list --json = %+v, want a disabled for the firmware update, b up", hosts)
	}
	if g := s.guest(vmA); hostOf(g) != "a" || g.VMState != "active" || g.pcpus() != "0-1" {
		t.Errorf("A on the disabled host is %s on %q pinned %q, want active on a, 0-1", g.VMState, hostOf(g), g.pcpus())
	}

	x1, x2 := s.boot("X1", "", 1), s.boot("X2", "", 1)
	for _, u := range []string{x1, x2} {
		if h := hostOf(s.guest(u)); h != "b" {
			t.Errorf("a boot without --host landed on %q, want b (a is disabled)", h)
		}
	}
	// a has two pCPUs free and b none: still nothing lands on a.
	s.refused("disabled", "boot", "--name", "X3", "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated", "--wait")
	if got := s.pinned("a"); got != "0-1" {
		t.Errorf("after the refused boot a has %q pinned, want A's 0-1 alone", got)
	}

	// Named, the disabled host takes a boot (with a note) and a migration.
	out, errOut, code := s.run("boot", "--name", "C", "--host", "a", "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated", "--wait", "--json")
	if code != 0 || !strings.Contains(errOut, "host a is disabled (firmware update)") {
		t.Fatalf("boot --host a on the disabled host: exit %d, stderr %q; want success with a note", code, errOut)
	}
	vmC := jsonField(t, out, "uuid")
	if h := hostOf(s.guest(vmC)); h != "a" {
		t.Errorf("boot --host a landed on %q, want a", h)
	}
	s.ok("migrate", x1, "--dest", "a", "--wait")
	if g := s.guest(x1); hostOf(g) != "a" || g.pcpus() != "3" {
		t.Errorf("migrate --dest a: X1 is on %q pinned %q, want a, 3", hostOf(g), g.pcpus())
	}
	s.boot("X4", "", 1) // takes b's last pCPU
	s.ok("delete", vmC, "--wait")

	// Only a has room now: refused while it is disabled, taken once enabled.
	s.refused("disabled", "boot", "--name", "Y", "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated", "--wait")
	if out := s.ok("host", "enable", "a"); !strings.Contains(out, "host a is up") {
		t.Errorf("host enable a printed %q, want it to say a is up", out)
	}
	if l := s.hostLine("a"); strings.Contains(l, "disabled") {
		t.Errorf("host list shows a as %q after the enable, want it up", l)
	}
	if g := s.guest(s.boot("Y", "", 1)); hostOf(g) != "a" || g.pcpus() != "2" {
		t.Errorf("a boot after the enable is on %q pinned %q, want a, 2", hostOf(g), g.pcpus())
	}
	for _, u := range []string{vmA, vmB, x1, x2} {
		s.checkAgreement(u, hostOf(s.guest(u)))
	}
	s.ok("check")
}

// TestHostDisableBadInput: each refusal is one line, a non-zero exit, and
// no change to any host's state or ledger.
func TestHostDisableBadInput(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	for _, h := range []string{"a", "b", "c"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	s.ok("host", "down", "b", "--fence", "--reason", "power supply failed")
	s.ok("host", "disable", "c", "--reason", "kernel update")
	state := func() string {
		var hosts []json.RawMessage
		s.jsonOf(&hosts, "host", "list")
		out, _ := json.Marshal(hosts)
		return string(out)
	}
	before := state()
	s.refused(`unknown host "nowhere"; registered hosts are a, b, c`, "host", "disable", "nowhere", "--reason", "x")
	s.refused(`unknown host "nowhere"`, "host", "enable", "nowhere")
	s.refused("--reason is required", "host", "disable", "a")
	s.refused("--reason is required", "host", "disable", "a", "--reason", "   ")
	s.refused(`reason "two\nlines": invalid input: reasons are 1-200 printable characters`, "host", "disable", "a", "--reason", "two\nlines")
	s.refused("reasons are 1-200 printable characters", "host", "disable", "a", "--reason", strings.Repeat("x", 201))
	s.refused("host disable takes one host NAME, got 2", "host", "disable", "a", "c", "--reason", "x")
	s.refused("host enable b: the host is down, not disabled", "host", "enable", "b")
	s.refused("host disable b: the host is down", "host", "disable", "b", "--reason", "x")
	s.refused("the host is disabled, not down; enable it to let pinflow choose it again", "host", "up", "c")
	s.refused("only from a host marked down (fenced)", "host", "evacuate", "c")
	if after := state(); after != before {
		t.Errorf("the refusals changed the hosts:\nbefore %s\nafter  %s", before, after)
	}
	// A disabled host may be fenced, and comes back up, enabled.
	s.ok("host", "down", "c", "--fence", "--reason", "died during the update")
	s.ok("host", "up", "c", "--wait")
	if l := s.hostLine("c"); strings.Contains(l, "[") {
		t.Errorf("host list shows c as %q after host up, want it up", l)
	}
}
