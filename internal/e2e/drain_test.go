package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/drain"
)

// TestPlanDrain: host plan-drain plans every guest of a host onto the
// others, NUMA-cell exact and packed, changing nothing; a guest that fits
// nowhere is reported before anything moves, with a non-zero exit; a
// disabled host is no target; bad input is one line.
func TestPlanDrain(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	for _, h := range []string{"a", "b", "c"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	vmA := s.boot("A", "a", 2)
	vmB := s.boot("B", "a", 2)
	s.boot("C", "b", 2)
	before := s.ok("host", "list", "--json")

	var plan drain.Plan
	s.jsonOf(&plan, "host", "plan-drain", "a")
	if !plan.Complete() || len(plan.Moves) != 2 {
		t.Fatalf("plan of a = %+v, want both guests moved", plan)
	}
	targets := map[string]string{}
	for _, m := range plan.Moves {
		targets[m.UUID] = m.Target
		if m.Placement == nil || len(m.Placement.Cells) != 1 || len(m.Placement.Cells[0].Pins) != 2 {
			t.Errorf("move of %s has placement %+v, want one cell of 2 pins", m.UUID, m.Placement)
		}
	}
	// Packing: the first guest fills b's last two pCPUs, the second goes
	// to the empty c.
	if got := []string{targets[vmA], targets[vmB]}; !(got[0] == "b" && got[1] == "c" || got[0] == "c" && got[1] == "b") {
		t.Errorf("targets of A and B = %v, want b and c", got)
	}
	out := s.ok("host", "plan-drain", "a")
	if !strings.Contains(out, "2 guests to move, 0 fitting nowhere") {
		t.Errorf("plan-drain a says:\n%s", out)
	}
	if after := s.ok("host", "list", "--json"); after != before {
		t.Errorf("planning changed the ledger:\nbefore %s\nafter  %s", before, after)
	}

	// With c disabled, only one of A and B has a place: the other is
	// reported, and the exit says the drain cannot complete.
	s.ok("host", "disable", "c", "--reason", "maintenance")
	stdout, stderr, code := s.run("host", "plan-drain", "a", "--json")
	if code == 0 || !strings.Contains(stderr, "1 fitting nowhere") {
		t.Errorf("plan-drain a with c disabled: exit %d, stderr %q", code, stderr)
	}
	plan = drain.Plan{}
	if err := json.Unmarshal([]byte(stdout), &plan); err != nil {
		t.Fatalf("plan-drain --json printed %q: %v", stdout, err)
	}
	if len(plan.Moves) != 1 || plan.Moves[0].Target != "b" || len(plan.Unplaceable) != 1 {
		t.Errorf("plan with c disabled = %+v, want one move onto b and one unplaceable", plan)
	}
	if u := plan.Unplaceable; len(u) == 1 && !strings.Contains(u[0].Reason, "b:") {
		t.Errorf("unplaceable reason %q does not say why b cannot take it", u[0].Reason)
	}

	s.refused("nowhere", "host", "plan-drain", "nowhere")
	s.refused("one host NAME", "host", "plan-drain")
}

// drainDone waits until no drain of host runs.
func (s *stack) drainDone(host string) {
	s.t.Helper()
	s.eventually("the drain of "+host+" ends", 3*time.Minute, func() bool { return !s.drainState(host).Running() })
}

// drainState is `host drain status HOST --json`: printed whether the last
// drain runs, completed (exit 0), or failed or was cancelled (exit 1).
func (s *stack) drainState(host string) client.DrainState {
	s.t.Helper()
	// A running drain answers a query through a worker: right after a
	// test killed one, until its replacement polls, Temporal says none
	// is there. Wait for that, as an operator would try again.
	var out, errOut string
	var code int
	s.eventually("a worker answers the status of the drain of "+host, time.Minute, func() bool {
		out, errOut, code = s.run("host", "drain", "status", host, "--json")
		return code == 0 || out != "" || !strings.Contains(errOut, "worker may be down")
	})
	var st client.DrainState
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		s.t.Fatalf("host drain status %s --json: exit %d: %v\n%s%s", host, code, err, out, errOut)
	}
	if want := map[bool]int{true: 0, false: 1}[st.Running() || st.Completed()]; code != want {
		s.t.Errorf("host drain status %s --json of a drain %s: exit %d, want %d: %s", host, st.Status, code, want, errOut)
	}
	return st
}

// claimsOfKind counts host's claims of kind.
func (s *stack) claimsOfKind(host, kind string) int {
	n := 0
	for _, c := range s.host(host).Claims {
		if c.Kind == kind {
			n++
		}
	}
	return n
}

// TestDrain: a drain of a full host onto a cloud with just enough room.
// Its guests' targets are reserved before anything moves, so a stream of
// boots started meanwhile never takes them; the moves respect the
// parallelism; every guest lands NUMA-exact where the plan put it; the
// host ends empty and disabled, and check and the hypervisors agree.
func TestDrain(t *testing.T) {
	t.Parallel()
	s := newStack(t, heldLong)
	for _, h := range []string{"a", "b", "c"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	vmA := s.boot("A", "a", 2)
	vmB := s.boot("B", "a", 2)
	s.boot("C", "b", 1)
	// The first move is held before its switchover while guests boot.
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("host", "drain", "a", "--parallel", "1", "--reason", "kernel upgrade")
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	if n := s.claimsOfKind("b", "reservation") + s.claimsOfKind("c", "reservation") + s.claimsOfKind("b", "migration-dest") + s.claimsOfKind("c", "migration-dest"); n != 2 {
		t.Fatalf("a drain moving its first guest holds %d reservations and destination claims, want 2", n)
	}
	// Boots that leave the choice to pinflow take only what no reservation
	// holds: three 1-vCPU guests fit (b's last pCPU, c's last two), the
	// fourth fits nowhere.
	var booted []string
	for i := range 4 {
		out, errOut, code := s.run("boot", "--name", fmt.Sprintf("D%d", i), "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated", "--wait", "--json")
		if code == 0 {
			var g struct{ UUID string }
			if err := json.Unmarshal([]byte(out), &g); err != nil {
				t.Fatal(err)
			}
			booted = append(booted, g.UUID)
		} else if !strings.Contains(errOut, "no host can take") {
			t.Errorf("boot D%d during the drain: %s", i, errOut)
		}
		s.noDoublePins("a", "b", "c")
	}
	if len(booted) != 3 {
		t.Errorf("%d boots landed during the drain, want 3 (the reservations hold the rest)", len(booted))
	}
	s.ok("sim", "gate", "--at", "switchover", "--release")
	// Sampled until it ends: never more than one move at a time.
	s.eventually("the drain of a ends", 3*time.Minute, func() bool {
		st := s.drainState("a")
		if st.Moving > 1 || st.MaxMoving > 1 {
			t.Errorf("drain with --parallel 1 ran %d moves at once (at most %d)", st.Moving, st.MaxMoving)
		}
		return !st.Running()
	})
	// Its status after its end is how it ended, guest by guest.
	if out := s.ok("host", "drain", "status", "a"); !strings.Contains(out, "drain of a completed at ") ||
		!strings.Contains(out, "2 of 2 guests moved, 0 left on a") || !strings.Contains(out, vmA+" (A) moved to ") {
		t.Errorf("host drain status a after the drain:\n%s", out)
	}

	for _, g := range []string{vmA, vmB} {
		h := hostOf(s.guest(g))
		if h != "b" && h != "c" {
			t.Errorf("guest %s is on %q after the drain, want b or c", g, h)
		}
		s.checkAgreement(g, h)
	}
	if n := len(s.host("a").Claims); n != 0 {
		t.Errorf("host a holds %d claims after its drain: %+v", n, s.host("a").Claims)
	}
	for _, h := range []string{"b", "c"} {
		if n := s.claimsOfKind(h, "reservation"); n != 0 {
			t.Errorf("host %s still holds %d reservations", h, n)
		}
	}
	if out := s.ok("host", "list"); !strings.Contains(out, "disabled: drain: kernel upgrade") {
		t.Errorf("host list after the drain does not show a disabled:\n%s", out)
	}
	s.noDoublePins("a", "b", "c")
	s.ok("check")
	var plan drain.Plan
	s.jsonOf(&plan, "host", "drain", "a", "--dry-run", "--json")
	if len(plan.Moves) != 0 || !plan.Complete() {
		t.Errorf("a drained host plans %+v, want nothing left", plan)
	}

	// After the maintenance, undrain enables a and moves A and B back.
	s.ok("host", "undrain", "a", "--wait")
	for _, g := range []string{vmA, vmB} {
		s.checkAgreement(g, "a")
	}
	if out := s.ok("host", "list"); strings.Contains(out, "disabled") {
		t.Errorf("host list after undrain still shows a disabled host:\n%s", out)
	}
	s.noDoublePins("a", "b", "c")
	s.refused("no drain of b has run", "host", "undrain", "b")
}

// TestDrainRefusals: a guest that fits nowhere stops the drain before
// anything moves (the host is not even disabled); a second drain of a
// draining host, bad limits, a bad policy and an unknown host are one line
// and change nothing.
func TestDrainRefusals(t *testing.T) {
	t.Parallel()
	s := newStack(t, heldLong)
	for _, h := range []string{"a", "b"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	s.boot("A", "a", 3)
	s.boot("B", "b", 2)
	before := s.ok("host", "list", "--json")
	s.refused("fits nowhere", "host", "drain", "a", "--wait")
	if after := s.ok("host", "list", "--json"); after != before {
		t.Errorf("a refused drain changed the ledger:\nbefore %s\nafter  %s", before, after)
	}
	// Its status says why it failed, in one line, and exits 1.
	s.refused("the last drain of a failed at ", "host", "drain", "status", "a")
	if st := s.drainState("a"); st.Status != "failed" || !strings.Contains(st.Reason, "fits nowhere") || strings.Contains(st.Reason, "\n") {
		t.Errorf("host drain status a --json of the failed drain: status %s, reason %q; want failed, saying what fits nowhere in one line", st.Status, st.Reason)
	}
	s.refused("drain parallel 0: it must be 1 to 64", "host", "drain", "a", "--parallel", "0")
	s.refused("drain parallel 1000000: it must be 1 to 64", "host", "drain", "a", "--parallel", "1000000")
	s.refused(`drain policy "fast": policies are live, cold and live-then-cold`, "host", "drain", "a", "--policy", "fast")
	s.refused("nowhere", "host", "drain", "nowhere")
	s.refused("no drain of a is running", "host", "drain", "pause", "a")

	// b can take a's guest once B is gone; a migration held before its
	// switchover keeps the drain running while a second one is refused.
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("delete", firstGuest(s, "b"), "--wait")
	s.ok("host", "drain", "a")
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	s.refused("being drained already", "host", "drain", "a")
	s.ok("sim", "gate", "--at", "switchover", "--release")
	s.drainDone("a")
}

// TestDrainWaitsForOperationsInFlight: a drain started while a migration
// onto its host is in flight waits for it and then moves that guest too;
// one whose --settle runs out first changes nothing.
func TestDrainWaitsForOperationsInFlight(t *testing.T) {
	t.Parallel()
	s := newStack(t, heldLong)
	for _, h := range []string{"a", "b", "c"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	vmA := s.boot("A", "a", 1)
	vmB := s.boot("B", "b", 1)
	// B's migration onto a is held before its switchover until a drain
	// of a has seen it in flight and waits for it.
	s.ok("sim", "gate", "--at", "switchover", "--guest", vmB, "--hold")
	s.ok("migrate", vmB, "--dest", "a")
	s.ok("sim", "gate", "--at", "switchover", "--guest", vmB, "--wait-arrived", "1")
	s.refused("cannot complete", "host", "drain", "a", "--settle", "1s", "--wait")
	if out := s.ok("host", "list"); strings.Contains(out, "disabled") {
		t.Errorf("a drain that gave up waiting disabled a host:\n%s", out)
	}
	s.refused("drain settle 0s: it must be more than 0s", "host", "drain", "a", "--settle", "0")
	drainA := s.start("host", "drain", "a", "--wait")
	s.eventually("the drain waits for B's migration", time.Minute, func() bool {
		var st api.Status
		return s.queryStatus(api.DrainWorkflowID("a"), &st) && strings.Contains(st.Detail, "to settle")
	})
	s.ok("sim", "gate", "--at", "switchover", "--guest", vmB, "--release")
	out, errOut, code := drainA.wait(t)
	if code != 0 {
		t.Fatalf("drain a --wait: exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "2 guests moved") {
		t.Errorf("drain a --wait after the migration onto it:\n%s", out)
	}
	for _, g := range []string{vmA, vmB} {
		h := hostOf(s.guest(g))
		if h != "b" && h != "c" {
			t.Errorf("guest %s is on %q after the drain, want b or c", g, h)
		}
		s.checkAgreement(g, h)
	}
	s.noDoublePins("a", "b", "c")
}

func firstGuest(s *stack, host string) string {
	s.t.Helper()
	for _, c := range s.host(host).Claims {
		return c.Instance
	}
	s.t.Fatalf("no guest on %s", host)
	return ""
}

// TestDrainCancel: a drain cancelled while a guest moves rolls that move
// back, releases every reservation no move adopted, and leaves each guest
// running on exactly one host; an audit afterwards frees nothing. Its
// status afterwards shows what it moved before it ended, and an undrain
// moves that back.
func TestDrainCancel(t *testing.T) {
	t.Parallel()
	s := newStack(t, heldLong)
	for _, h := range []string{"a", "b", "c"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	vmA := s.boot("A", "a", 2)
	vmB := s.boot("B", "a", 2)
	// B's move is held before its switchover until the cancel has reached
	// it; A's moves.
	gate := []string{"sim", "gate", "--at", "switchover", "--guest", vmB}
	s.ok(append(gate, "--hold")...)
	s.ok("host", "drain", "a", "--parallel", "2")
	s.ok(append(gate, "--wait-arrived", "1")...)
	s.eventually("A moved off a", time.Minute, func() bool {
		for _, g := range s.drainState("a").Guests {
			if g.UUID == vmA && g.State == api.GuestMoved {
				return true
			}
		}
		return false
	})
	s.ok("host", "drain", "pause", "a")
	s.ok("host", "drain", "cancel", "a")
	s.ok(append(gate, "--wait-cancelled", "1")...)
	s.ok(append(gate, "--release")...)
	s.drainDone("a")
	out, errOut, code := s.run("host", "drain", "status", "a")
	if code != 1 || !strings.Contains(errOut, "the last drain of a was cancelled at ") ||
		!strings.Contains(out, "drain of a was cancelled at ") || !strings.Contains(out, "1 of 2 guests moved before it ended") ||
		!strings.Contains(out, vmA+" (A) moved") {
		t.Errorf("host drain status a after the cancel: exit %d, want 1 with the guests (A moved) and why it ended:\n%s%s", code, out, errOut)
	}
	for _, h := range []string{"b", "c"} {
		for _, c := range s.host(h).Claims {
			// A's claim became its resident claim when its move committed.
			if (c.Kind == "reservation" || c.Kind == "migration-dest") && c.State != "committed" {
				t.Errorf("host %s holds a %s claim %s of %s after the cancel, state %s", h, c.Kind, c.ID, c.Instance, c.State)
			}
		}
	}
	s.checkAgreement(vmB, "a")
	s.checkAgreement(vmA, hostOf(s.guest(vmA)))
	s.noDoublePins("a", "b", "c")
	s.pastMinGrace()
	if res := s.reconcile("--grace", "0"); res.Total.Freed.Total() != 0 {
		t.Errorf("the audit after the cancelled drain freed %d claims: %+v", res.Total.Freed.Total(), res.Hosts)
	}
	s.ok("check")

	// The undrain takes back what the cancelled drain moved, and enables a.
	s.ok("host", "undrain", "a", "--wait")
	s.checkAgreement(vmA, "a")
	if line := s.hostLine("a"); strings.Contains(line, "disabled") {
		t.Errorf("host a after the undrain: %s, want enabled", line)
	}
	s.noDoublePins("a", "b", "c")
}

// TestDrainPauseResume: a paused drain lets the running move finish and
// starts no other, keeps the next guests' reservations, and says so in
// its status; resumed, it moves the rest. A resume of a drain not paused
// and a second pause are refused with one line. --wait prints each
// guest's step.
func TestDrainPauseResume(t *testing.T) {
	t.Parallel()
	s := newStack(t, heldLong)
	for _, h := range []string{"a", "b", "c"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	vms := []string{s.boot("A", "a", 1), s.boot("B", "a", 1), s.boot("C", "a", 1)}
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("host", "drain", "a", "--parallel", "1")
	status := func() api.DrainStatus {
		var st api.DrainStatus
		s.jsonOf(&st, "host", "drain", "status", "a", "--json")
		return st
	}
	moved := func(st api.DrainStatus) int {
		n := 0
		for _, g := range st.Guests {
			if g.State == api.GuestMoved {
				n++
			}
		}
		return n
	}
	// The first move is held before its switchover while the drain is
	// paused.
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	if st := status(); st.Moving != 1 {
		t.Errorf("drain status with its first move held: %d moving, want 1", st.Moving)
	}
	s.refused("the drain of a is not paused", "host", "drain", "resume", "a")
	s.ok("host", "drain", "pause", "a")
	s.refused("the drain of a is paused already; 'pinflow host drain resume a' resumes it", "host", "drain", "pause", "a")
	if st := status(); !st.Paused || st.Moving != 1 {
		t.Errorf("drain status after a pause and a refused second one: paused %v, %d moving; want paused, 1 moving", st.Paused, st.Moving)
	}
	s.ok("sim", "gate", "--at", "switchover", "--release")
	s.eventually("the running move finished", time.Minute, func() bool {
		st := status()
		return st.Moving == 0 && moved(st) == 1
	})
	// The workflow task that saw the move end started nothing after it:
	// the paused drain has no move or step in flight and waits for a
	// message, and the guests still to move keep their reservations.
	if st := status(); !st.Paused || st.Moving != 0 || moved(st) != 1 {
		t.Fatalf("paused drain: paused %v, %d moving, %d moved; want paused, 0 moving, 1 moved", st.Paused, st.Moving, moved(st))
	}
	d, err := s.tc.DescribeWorkflow(context.Background(), api.DrainWorkflowID("a"), "")
	if err != nil {
		t.Fatal(err)
	}
	if kids, acts := len(d.RawResponse.GetPendingChildren()), len(d.RawResponse.GetPendingActivities()); kids != 0 || acts != 0 {
		t.Errorf("a paused drain whose running move ended has %d moves and %d steps in flight, want none", kids, acts)
	}
	if n := s.claimsOfKind("b", "reservation") + s.claimsOfKind("c", "reservation"); n != 2 {
		t.Errorf("a paused drain holds %d reservations, want 2 (the guests still to move)", n)
	}
	if out := s.ok("host", "drain", "status", "a"); !strings.Contains(out, "paused") || !strings.Contains(out, "reserved, target") {
		t.Errorf("status of a paused drain does not show it paused with reserved guests:\n%s", out)
	}
	s.ok("host", "drain", "resume", "a")
	s.drainDone("a")
	for _, g := range vms {
		h := hostOf(s.guest(g))
		if h != "b" && h != "c" {
			t.Errorf("guest %s is on %q after the resumed drain, want b or c", g, h)
		}
		s.checkAgreement(g, h)
	}
	s.noDoublePins("a", "b", "c")

	// --wait follows a drain guest by guest, then prints where each went.
	s.ok("host", "enable", "a")
	vmD := s.boot("D", "b", 1)
	s.ok("sim", "gate", "--at", "switchover", "--guest", vmD, "--hold")
	follow := s.start("host", "drain", "b", "--wait")
	s.eventually("drain --wait shows D moving", time.Minute, func() bool {
		return strings.Contains(follow.stderr.String(), vmD+" (D) moving, target ")
	})
	s.ok("sim", "gate", "--at", "switchover", "--guest", vmD, "--release")
	out, errOut, code := follow.wait(t)
	if code != 0 {
		t.Fatalf("drain b --wait: exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, vmD+" (D) moved to ") {
		t.Errorf("drain --wait did not follow D's move:\nstdout:\n%s\nstderr:\n%s", out, errOut)
	}
}

// TestDrainSurvivesWorkerKills: the worker is killed with SIGKILL again
// and again while a drain reserves and moves; the drain carries on from
// its history, every guest lands on one host, no reservation is left and
// an audit afterwards frees nothing.
func TestDrainSurvivesWorkerKills(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	for _, h := range []string{"a", "b", "c"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	vms := []string{s.boot("A", "a", 2), s.boot("B", "a", 1), s.boot("C", "a", 1)}
	// The worker is killed while the drain plans and reserves, with
	// moves held before their switchover, and with one held past it.
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("host", "drain", "a", "--parallel", "2")
	s.killWorker()
	s.startWorker()
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	s.killWorker()
	s.startWorker()
	s.ok("sim", "gate", "--at", "switched", "--hold")
	s.ok("sim", "gate", "--at", "switchover", "--release")
	s.ok("sim", "gate", "--at", "switched", "--wait-arrived", "1")
	s.killWorker()
	s.startWorker()
	s.ok("sim", "gate", "--at", "switched", "--release")
	s.drainDone("a")
	for _, g := range vms {
		h := hostOf(s.guest(g))
		if h != "b" && h != "c" {
			t.Errorf("guest %s is on %q after the drain, want b or c", g, h)
		}
		s.checkAgreement(g, h)
	}
	for _, h := range []string{"a", "b", "c"} {
		if n := s.claimsOfKind(h, "reservation"); n != 0 {
			t.Errorf("host %s holds %d reservations after the drain", h, n)
		}
	}
	s.noDoublePins("a", "b", "c")
	s.pastMinGrace()
	if res := s.reconcile("--grace", "0"); res.Total.Freed.Total() != 0 {
		t.Errorf("the audit after the drain freed %d claims: %+v", res.Total.Freed.Total(), res.Hosts)
	}
	s.ok("check")
}

// TestDrainsShareCloudLimits: two drains at once, each allowed two moves,
// in a cloud that allows one (PINFLOW_DRAIN_MAX_MOVES=1): at no sampled
// instant does more than one guest move, a drain says it is waiting for
// the cloud's limit, and both complete.
func TestDrainsShareCloudLimits(t *testing.T) {
	t.Parallel()
	s := newStack(t, "PINFLOW_DRAIN_MAX_MOVES=1", heldLong)
	for _, h := range []string{"a1", "a2", "t1", "t2"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	var vms []string
	for _, h := range []string{"a1", "a2"} {
		vms = append(vms, s.boot(h+"-x", h, 1), s.boot(h+"-y", h, 1))
	}
	// Neither source is the other's target. The first move is held
	// before its switchover until a drain says it waits for the cloud.
	s.ok("host", "disable", "a2", "--reason", "next")
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("host", "drain", "a1", "--parallel", "2")
	s.ok("host", "drain", "a2", "--parallel", "2")
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	waiting := func(h string) bool {
		var st api.DrainStatus
		out, _, code := s.run("host", "drain", "status", h, "--json")
		return code == 0 && json.Unmarshal([]byte(out), &st) == nil && strings.Contains(st.Waiting, "in the cloud")
	}
	s.eventually("a drain waits for the cloud's limit", time.Minute, func() bool { return waiting("a1") || waiting("a2") })
	moving := func() int {
		n := 0
		for _, h := range []string{"t1", "t2"} {
			for _, c := range s.host(h).Claims {
				if c.Kind == "migration-dest" && c.State == "pending" {
					n++
				}
			}
		}
		return n
	}
	if n := moving(); n != 1 {
		t.Errorf("%d guests move while a drain waits for the cloud's limit of 1, want 1", n)
	}
	s.ok("sim", "gate", "--at", "switchover", "--release")
	s.eventually("both drains end", 3*time.Minute, func() bool {
		if n := moving(); n > 1 {
			t.Errorf("%d guests move at once in a cloud that allows 1", n)
		}
		running := false
		for _, h := range []string{"a1", "a2"} {
			if s.drainState(h).Running() {
				running = true
			}
		}
		return !running
	})
	for _, g := range vms {
		h := hostOf(s.guest(g))
		if h != "t1" && h != "t2" {
			t.Errorf("guest %s is on %q after the drains, want t1 or t2", g, h)
		}
	}
	s.noDoublePins("a1", "a2", "t1", "t2")
	s.ok("check")
}

// TestDrainRetriesFailedMoves: moves that fail on the hypervisor are
// planned again onto another target while the other moves run, and each
// retried guest starts its next move only after its failed one gave its
// slot back: the drain ends with every guest moved, none twice in flight.
func TestDrainRetriesFailedMoves(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	for _, h := range []string{"a", "b", "c", "d"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	var vms []string
	for i := range 4 {
		vms = append(vms, s.boot(fmt.Sprintf("V%d", i), "a", 1))
	}
	s.ok("sim", "fault", "--host", "b", "--op", "prepare", "--times", "100")
	s.ok("host", "drain", "a", "--parallel", "4")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var res api.DrainResult
	if err := s.tc.GetWorkflow(ctx, api.DrainWorkflowID("a"), "").Get(ctx, &res); err != nil {
		t.Fatalf("the drain of a: %v", err)
	}
	retried := 0
	for _, g := range res.Guests {
		if g.State != api.GuestMoved {
			t.Errorf("guest %s ended %s (%s), want moved", g.UUID, g.State, g.Error)
		}
		if g.Attempts > 0 {
			retried++
			if slices.Contains(g.Tried, g.Target) {
				t.Errorf("guest %s moved to %s, a target its move failed on (%v)", g.UUID, g.Target, g.Tried)
			}
		}
	}
	if res.Moved != len(vms) || retried == 0 {
		t.Errorf("the drain moved %d of %d guests, %d of them after a failed move; want all, some retried: %+v", res.Moved, len(vms), retried, res.Guests)
	}
	for _, g := range vms {
		s.checkAgreement(g, hostOf(s.guest(g)))
	}
	for _, h := range []string{"b", "c", "d"} {
		if n := s.claimsOfKind(h, "reservation"); n != 0 {
			t.Errorf("host %s holds %d reservations after the drain", h, n)
		}
	}
	s.noDoublePins("a", "b", "c", "d")
	s.ok("check")
}

// TestDrainFailedMoveInOneLine: a move that fails on the hypervisor is
// recorded with its root cause in one line, in the drain's status (JSON
// and text) and its result, without the child and activity errors around
// it; once the drain completed, its status is how it ended (exit 0).
func TestDrainFailedMoveInOneLine(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	for _, h := range []string{"a", "b"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	vms := []string{s.boot("A", "a", 1), s.boot("B", "a", 1)}
	// One move at a time, and one target each: the first move's prepare
	// on b fails all its three tries and leaves its guest on a; the
	// second moves.
	s.ok("sim", "fault", "--host", "b", "--op", "prepare", "--times", "3")
	out, errOut, code := s.run("host", "drain", "a", "--parallel", "1", "--attempts", "1", "--wait")
	if code != 1 || !strings.Contains(errOut, "1 guest left on the host") {
		t.Fatalf("host drain a --wait with a failing move: exit %d, want 1 with a guest left:\n%s%s", code, out, errOut)
	}
	st := s.drainState("a")
	if !st.Completed() || st.Moved != 1 || st.Failed != 1 || len(st.Guests) != 2 {
		t.Fatalf("host drain status a --json after the drain: %s, %d moved, %d failed, %d guests; want completed, 1 moved, 1 failed of 2", st.Status, st.Moved, st.Failed, len(st.Guests))
	}
	var left api.DrainGuest
	for _, g := range st.Guests {
		if g.State == api.GuestFailed {
			left = g
		}
	}
	why := "tried 1 targets (b); last: its move to b failed: prepare the destination b failed after 3 attempts: sim: prepare migration of " +
		left.UUID + " to b: injected fault (one of the counted failures); instance " + left.UUID + " stays on a"
	if left.Error != why || !slices.Contains(vms, left.UUID) {
		t.Errorf("the guest left on a has error %q, want %q", left.Error, why)
	}
	text := s.ok("host", "drain", "status", "a")
	for _, w := range []string{"drain of a completed at ", "1 of 2 guests moved, 1 left on a",
		left.UUID + " (" + left.Name + ") failed, left on a, 1 failed attempts: " + why + "\n"} {
		if !strings.Contains(text, w) {
			t.Errorf("host drain status a after the drain lacks %q:\n%s", w, text)
		}
	}
	for _, raw := range []string{"child workflow execution error", "EventID", "wrapError"} {
		if strings.Contains(out+errOut+text, raw) {
			t.Errorf("the drain's output holds the raw error chain (%q):\n%s%s\n%s", raw, out, errOut, text)
		}
	}
	for _, g := range vms {
		s.checkAgreement(g, hostOf(s.guest(g)))
	}
	s.noDoublePins("a", "b")
}
