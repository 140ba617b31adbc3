package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinflow/pinflow/guest"
)

// claimStates lists a host's claims of uuid as kind/state, sorted.
func (s *stack) claimStates(host, uuid string) string {
	s.t.Helper()
	var out []string
	for _, c := range s.host(host).Claims {
		if c.Instance == uuid {
			out = append(out, c.Kind+"/"+c.State)
		}
	}
	return strings.Join(out, ",")
}

// waitResized waits until the guest is in VERIFY_RESIZE.
func (s *stack) waitResized(uuid string) {
	s.t.Helper()
	s.eventually("VERIFY_RESIZE of "+uuid, 2*time.Minute, func() bool { return s.guest(uuid).VMState == "resized" })
}

// vcpusOf is the guest's vCPU count by its record.
func (s *stack) vcpusOf(uuid string) int {
	s.t.Helper()
	var g struct {
		Flavor struct {
			VCPUs int `json:"vcpus"`
		} `json:"flavor"`
	}
	s.jsonOf(&g, "show", uuid)
	return g.Flavor.VCPUs
}

// TestResizeHoldsTheSource is Nova's resize record in one run: in
// VERIFY_RESIZE the source claim is a hold that an audit with no grace
// keeps (1944759, 1879878) and a boot cannot take (1647370); a revert
// brings the guest back onto exactly its old pCPUs with its old flavor
// (1805767, 1953359), the destination freed; a confirm frees the hold at
// once, not at the next audit (1818914).
func TestResizeHoldsTheSource(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t) // A on a 0-1, B on b 0-1; 4 cores each
	s.ok("resize", vmA, "--vcpus", "2", "--memory-mb", "2048", "--host", "b", "--confirm-window", "never")
	s.waitResized(vmA)
	if got := s.claimStates("a", vmA); got != "boot/held" {
		t.Errorf("in VERIFY_RESIZE a holds %q of A, want its boot claim held", got)
	}
	if got := s.claimStates("b", vmA); got != "resize-dest/committed" {
		t.Errorf("in VERIFY_RESIZE b holds %q of A, want the committed resize-dest claim", got)
	}
	s.pastMinGrace()
	if res := s.reconcile("--grace", "0"); res.Total.Freed.Total() != 0 {
		t.Errorf("the audit in VERIFY_RESIZE freed %d claims: %+v", res.Total.Freed.Total(), res.Hosts)
	}
	c := s.boot("C", "a", 2) // the two pCPUs left on a
	if got := s.guest(c).pcpus(); got != "2-3" {
		t.Errorf("a boot on a in VERIFY_RESIZE got %q, want 2-3 (0-1 are A's hold)", got)
	}
	s.refused("no fit", "boot", "--name", "D", "--host", "a", "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated", "--wait")
	s.noDoublePins("a", "b")

	s.ok("resize", "revert", vmA, "--wait")
	g := s.guest(vmA)
	if hostOf(g) != "a" || g.pcpus() != "0-1" || g.VMState != "active" || s.vcpusOf(vmA) != 2 {
		t.Errorf("after the revert A is %s on %q pinned %q, want active on a pinned 0-1", g.VMState, hostOf(g), g.pcpus())
	}
	if got := s.claimStates("b", vmA); got != "" {
		t.Errorf("after the revert b still holds %q of A", got)
	}
	s.checkAgreement(vmA, "a")

	s.ok("resize", vmA, "--vcpus", "2", "--memory-mb", "2048", "--host", "b", "--confirm-window", "never")
	s.waitResized(vmA)
	s.ok("resize", "confirm", vmA, "--wait")
	if got := s.claimStates("a", vmA); got != "" {
		t.Errorf("right after the confirm a still holds %q of A", got)
	}
	if got := s.pinned("a"); got != "2-3" {
		t.Errorf("after the confirm a has %q pinned, want only C's 2-3", got)
	}
	s.checkAgreement(vmA, "b")
	s.noDoublePins("a", "b")
	s.ok("check")
}

// TestResizeOnItsHost resizes a guest on the host it runs on, which can
// hold both placements at once, and reverts and confirms there.
func TestResizeOnItsHost(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	s.ok("resize", vmA, "--vcpus", "2", "--memory-mb", "2048", "--host", "a", "--confirm-window", "never")
	s.waitResized(vmA)
	if got := s.claimStates("a", vmA); got != "boot/held,resize-dest/committed" {
		t.Errorf("same-host VERIFY_RESIZE: a holds %q of A, want the hold and the new claim", got)
	}
	if got := s.guest(vmA).pcpus(); got != "2-3" {
		t.Errorf("same-host resize placed A on %q, want 2-3 beside its hold on 0-1", got)
	}
	s.ok("resize", "revert", vmA, "--wait")
	if g := s.guest(vmA); g.pcpus() != "0-1" || hostOf(g) != "a" {
		t.Errorf("after the same-host revert A is on %q pinned %q, want a 0-1", hostOf(g), g.pcpus())
	}
	s.checkAgreement(vmA, "a")
	s.ok("resize", vmA, "--vcpus", "2", "--memory-mb", "2048", "--host", "a", "--confirm-window", "1s", "--wait")
	s.ok("follow", vmA)
	if g := s.guest(vmA); g.pcpus() != "2-3" || s.claimStates("a", vmA) != "resize-dest/committed" {
		t.Errorf("after the auto-confirm A is pinned %q with claims %q, want 2-3 and the one claim", g.pcpus(), s.claimStates("a", vmA))
	}
	s.checkAgreement(vmA, "a")
	s.ok("check")
}

// TestResizeRacingDecisions sends a confirm and a revert at once (Nova
// 1879878 freed the pins twice): exactly one is taken, and the guest ends
// where that one says, on one claim.
func TestResizeRacingDecisions(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	s.ok("resize", vmA, "--vcpus", "2", "--memory-mb", "2048", "--host", "b", "--confirm-window", "never")
	s.waitResized(vmA)
	var wg sync.WaitGroup
	codes := map[string]int{}
	var mu sync.Mutex
	for _, d := range []string{"confirm", "revert"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, code := s.run("resize", d, vmA)
			mu.Lock()
			codes[d] = code
			mu.Unlock()
		}()
	}
	wg.Wait()
	if (codes["confirm"] == 0) == (codes["revert"] == 0) {
		t.Fatalf("confirm exit %d and revert exit %d: want exactly one taken", codes["confirm"], codes["revert"])
	}
	want := "b"
	if codes["revert"] == 0 {
		want = "a"
	}
	g := s.waitClosed(vmA)
	if hostOf(g) != want || g.VMState != "active" {
		t.Errorf("after the race A is %s on %q, want active on %s", g.VMState, hostOf(g), want)
	}
	s.checkAgreement(vmA, want)
	s.ok("check")
}

// TestResizeInterrupted cancels a resize at each of its steps while the
// step is held at the simulator's gate: the guest runs on its source as
// before, with its flavor and exactly its pins, and nothing is left behind
// for an audit to free.
func TestResizeInterrupted(t *testing.T) {
	t.Parallel()
	steps := []struct {
		name, op string
	}{
		{"powering off", "shutdown"},
		{"defining on the destination", "define"},
		{"starting on the destination", "start"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			s, vmA, _ := twoHosts(t)
			s.ok("sim", "gate", "--at", st.op, "--hold")
			s.ok("resize", vmA, "--vcpus", "2", "--memory-mb", "2048", "--host", "b", "--confirm-window", "never")
			s.ok("sim", "gate", "--at", st.op, "--wait-arrived", "1")
			s.ok("cancel", vmA)
			s.ok("sim", "gate", "--at", st.op, "--wait-cancelled", "1")
			s.ok("sim", "gate", "--at", st.op, "--release")
			g := s.waitClosed(vmA)
			if hostOf(g) != "a" || g.pcpus() != "0-1" || g.VMState != "active" || g.TaskState != nil || s.vcpusOf(vmA) != 2 {
				t.Errorf("after the cancel A is %s/%v on %q pinned %q with %d vCPUs, want active on a pinned 0-1 with 2",
					g.VMState, g.TaskState, hostOf(g), g.pcpus(), s.vcpusOf(vmA))
			}
			s.checkAgreement(vmA, "a")
			if got := s.claimStates("a", vmA) + "|" + s.claimStates("b", vmA); got != "boot/committed|" {
				t.Errorf("after the cancel A's claims are %q, want only its committed boot claim on a", got)
			}
			s.pastMinGrace()
			if res := s.reconcile("--grace", "0"); res.Total.Freed.Total() != 0 {
				t.Errorf("the audit after the cancel freed %d claims: %+v", res.Total.Freed.Total(), res.Hosts)
			}
			s.noDoublePins("a", "b")
		})
	}
}

// TestResizeTerminatedInVerify terminates a resize in VERIFY_RESIZE: no
// workflow will ever decide, so the audit settles it as confirmed (the
// guest lives on its new claim): the hold goes and the record is active.
func TestResizeTerminatedInVerify(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	s.ok("resize", vmA, "--vcpus", "2", "--memory-mb", "2048", "--host", "b", "--confirm-window", "never")
	s.waitResized(vmA)
	if err := s.tc.TerminateWorkflow(context.Background(), guest.InstanceWorkflowID(vmA), "", "test"); err != nil {
		t.Fatal(err)
	}
	s.pastMinGrace()
	s.reconcile("--grace", "0")
	s.eventually("the audit to settle the resize", time.Minute, func() bool {
		return s.guest(vmA).VMState == "active" && s.claimStates("a", vmA) == ""
	})
	s.checkAgreement(vmA, "b")
	s.ok("check")
}

// TestColdMigration moves a guest with its own flavor, confirmed by the
// confirm window, and refuses one onto its own host; a live migration
// the hypervisor refuses falls back to a cold one when asked.
func TestColdMigration(t *testing.T) {
	t.Parallel()
	s, vmA, vmB := twoHosts(t)
	s.ok("sim", "fault", "--host", "a", "--op", "prepare", "--times", "5")
	s.refused("failed", "migrate", vmB, "--dest", "a", "--wait")
	s.ok("migrate", vmB, "--dest", "a", "--cold-fallback", "--confirm-window", "1s", "--wait")
	if g := s.guest(vmB); hostOf(g) != "a" || g.pcpus() != "2-3" {
		t.Errorf("after the fallback B is on %q pinned %q, want a 2-3", hostOf(g), g.pcpus())
	}
	s.checkAgreement(vmB, "a")
	s.ok("migrate", vmB, "--cold", "--dest", "b", "--confirm-window", "1s", "--wait")
	s.ok("follow", vmB)
	s.ok("sim", "fault", "--host", "a", "--op", "prepare", "--clear")
	s.refused("already runs on a", "migrate", vmA, "--cold", "--dest", "a")
	s.ok("migrate", vmA, "--cold", "--confirm-window", "1s", "--wait")
	s.ok("follow", vmA)
	g := s.guest(vmA)
	if hostOf(g) != "b" || g.pcpus() != "2-3" || s.vcpusOf(vmA) != 2 {
		t.Errorf("after the cold migration A is on %q pinned %q with %d vCPUs, want b pinned 2-3 with 2", hostOf(g), g.pcpus(), s.vcpusOf(vmA))
	}
	s.checkAgreement(vmA, "b")
	s.ok("check")
}

// TestMovesBadInput: each refusal is one line, a non-zero exit, and no
// change to any claim or record.
func TestMovesBadInput(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	state := func() string {
		out, _ := json.Marshal([]any{s.host("a"), s.host("b"), s.guest(vmA)})
		return string(out)
	}
	before := state()
	s.refused("current flavor", "resize", vmA, "--vcpus", "2", "--memory-mb", "1024")
	s.refused("no resize awaiting confirmation", "resize", "confirm", vmA)
	s.refused("no resize awaiting confirmation", "resize", "revert", vmA)
	s.refused("no fit", "resize", vmA, "--vcpus", "64", "--wait")
	s.refused("allowed are a positive duration", "resize", vmA, "--vcpus", "2", "--confirm-window", "-1s")
	s.refused("only from a host marked down (fenced)", "evacuate", vmA)
	s.refused("add --fence", "host", "down", "a", "--reason", "maybe")
	s.refused("unknown host", "host", "down", "nowhere", "--fence", "--reason", "x")
	s.refused("is up already", "host", "up", "a")
	s.refused("only from a host marked down (fenced)", "host", "evacuate", "a")
	if after := state(); after != before {
		t.Errorf("the refusals changed the state:\nbefore %s\nafter  %s", before, after)
	}
	s.checkAgreement(vmA, "a")
}

// TestEvacuation crashes a host, fences it, evacuates its two guests at
// once (they race for the same best destination: the loser takes the
// next host, Nova 1791075), and brings the host back: its leftovers are
// destroyed and its tombstones cleared before it takes a guest again.
func TestEvacuation(t *testing.T) {
	t.Parallel()
	s, vmA, vmB := twoHosts(t) // A on a 0-1, B on b 0-1
	s.ok("host", "add", "c", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	vmC := s.boot("C", "a", 2) // a 2-3
	s.ok("sim", "power", "--host", "a", "--off")
	s.refused("only from a host marked down (fenced)", "evacuate", vmA)
	s.ok("host", "down", "a", "--fence", "--reason", "power supply failed")
	s.refused("is down", "boot", "--name", "X", "--host", "a", "--vcpus", "1", "--memory-mb", "512")
	s.ok("host", "evacuate", "a")
	for _, u := range []string{vmA, vmC} {
		g := s.waitClosed(u)
		if h := hostOf(g); g.VMState != "active" || h == "a" || h == "" {
			t.Fatalf("after the evacuation %s is %s on %q, want active on b or c", u, g.VMState, h)
		}
		if got := s.claimStates("a", u); got != "boot/tombstone" {
			t.Errorf("a holds %q of %s, want its boot claim as a tombstone", got, u)
		}
	}
	if got := s.pinned("b") + "|" + s.pinned("c"); got != "0-3|0-1" {
		t.Errorf("after the evacuation b|c have %q pinned, want 0-3|0-1 (one guest beside B, one on c)", got)
	}
	s.noDoublePins("b", "c")
	s.pastMinGrace()
	if res := s.reconcile("--grace", "0"); res.Total.Freed.Total() != 0 {
		t.Errorf("the audit after the evacuation freed %d claims: %+v", res.Total.Freed.Total(), res.Hosts)
	}

	s.ok("sim", "power", "--host", "a", "--on")
	s.ok("host", "up", "a", "--wait")
	if claims := s.host("a").Claims; len(claims) != 0 {
		t.Errorf("after host up a still has claims %+v", claims)
	}
	for _, u := range []string{vmA, vmB, vmC} {
		s.checkAgreement(u, hostOf(s.guest(u)))
	}
	if d := s.boot("D", "a", 2); s.guest(d).pcpus() != "0-1" {
		t.Errorf("a boot on the returned host got %q, want 0-1", s.guest(d).pcpus())
	}
	s.ok("check")
}

// TestRevertToAFencedHost resizes A from a to b, fences a and lets it
// come back by itself: the revert must not start A on a, which the ledger
// says is down (an evacuation of a would rebuild it beside itself). A
// keeps running on b alone, its hold on a is a tombstone, and host up
// clears it.
func TestRevertToAFencedHost(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t) // A on a 0-1, B on b 0-1
	s.ok("resize", vmA, "--vcpus", "2", "--memory-mb", "2048", "--host", "b", "--confirm-window", "never")
	s.waitResized(vmA)
	s.ok("sim", "power", "--host", "a", "--off")
	s.ok("host", "down", "a", "--fence", "--reason", "power supply failed")
	s.ok("sim", "power", "--host", "a", "--on")
	s.refused("keeps running on b", "resize", "revert", vmA, "--wait")
	if g := s.guest(vmA); hostOf(g) != "b" || g.VMState != "active" {
		t.Errorf("after the refused revert A is %s on %q, want active on b", g.VMState, hostOf(g))
	}
	if dom, err := s.simulator().Lookup(context.Background(), "a", vmA); err == nil {
		t.Errorf("after the refused revert a has A %s, want nothing there", dom.State)
	}
	if got := s.claimStates("a", vmA); got != "boot/tombstone" {
		t.Errorf("after the refused revert a holds %q of A, want its hold as a tombstone", got)
	}
	s.ok("host", "up", "a", "--wait")
	s.checkAgreement(vmA, "b")
	s.ok("check")
}

// TestEvacuatedHostRemoved removes a fenced host that never comes back,
// with the tombstones of its evacuated guest.
func TestEvacuatedHostRemoved(t *testing.T) {
	t.Parallel()
	s, _, vmB := twoHosts(t)
	s.ok("sim", "power", "--host", "b", "--off")
	s.ok("host", "down", "b", "--fence", "--reason", "mainboard died")
	s.refused("evacuate, migrate or delete", "host", "remove", "a")
	s.ok("evacuate", vmB, "--wait")
	s.ok("host", "remove", "b")
	s.refused("unknown host", "host", "show", "b")
	s.checkAgreement(vmB, "a")
	s.ok("check")
}

// TestEvacuationInterrupted cancels an evacuation while its rebuild's
// start is held at the simulator's gate (the guest stays the fenced
// host's, nothing is left on the destination), then terminates a second
// one there: the start, cancelled when its heartbeat finds the workflow
// gone, never happens, and the audit frees the orphaned claim; the dead
// host's claim stays resident. Never a leak, never a guest on b.
func TestEvacuationInterrupted(t *testing.T) {
	t.Parallel()
	s, vmA, vmB := twoHosts(t)
	s.ok("sim", "power", "--host", "a", "--off")
	s.ok("host", "down", "a", "--fence", "--reason", "test")
	s.ok("sim", "gate", "--at", "start", "--hold")
	s.ok("evacuate", vmA)
	s.ok("sim", "gate", "--at", "start", "--wait-arrived", "1")
	s.ok("cancel", vmA)
	s.ok("sim", "gate", "--at", "start", "--wait-cancelled", "1")
	s.ok("sim", "gate", "--at", "start", "--release")
	g := s.waitClosed(vmA)
	if hostOf(g) != "a" || g.TaskState != nil || s.claimStates("b", vmA) != "" || s.claimStates("a", vmA) != "boot/committed" {
		t.Errorf("after the cancel A is on %q (task %v) with claims a %q b %q; want its record and committed claim on a, nothing on b",
			hostOf(g), g.TaskState, s.claimStates("a", vmA), s.claimStates("b", vmA))
	}
	s.noDoublePins("b")

	s.ok("sim", "gate", "--at", "start", "--hold")
	s.ok("evacuate", vmA)
	s.ok("sim", "gate", "--at", "start", "--wait-arrived", "1")
	if err := s.tc.TerminateWorkflow(context.Background(), guest.InstanceWorkflowID(vmA), "", "test"); err != nil {
		t.Fatal(err)
	}
	s.ok("sim", "gate", "--at", "start", "--wait-cancelled", "1")
	s.ok("sim", "gate", "--at", "start", "--release")
	s.pastMinGrace()
	s.eventually("the audit to free the terminated evacuation's claim", time.Minute, func() bool {
		s.reconcile("--grace", "0")
		return s.claimStates("b", vmA) == ""
	})
	if g := s.guest(vmA); hostOf(g) != "a" || s.claimStates("a", vmA) != "boot/committed" {
		t.Errorf("after the terminated evacuation A is on %q with claim %q on a; want its record and committed claim on a",
			hostOf(g), s.claimStates("a", vmA))
	}
	if dom, err := s.simulator().Lookup(context.Background(), "b", vmA); err == nil {
		t.Errorf("after the audit b still has A's domain, %s", dom.State)
	}
	s.noDoublePins("b")
	s.checkAgreement(vmB, "b")
}
