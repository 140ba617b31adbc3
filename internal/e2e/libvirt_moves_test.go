package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	enumspb "go.temporal.io/api/enums/v1"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/libvirt"
	"github.com/pinflow/pinflow/internal/testenv"
)

// These tests move pinned guests between two real libvirtd hosts with
// QEMU guests, through the CLI, the way libvirtMigration does for a
// live migration: a resize confirmed and one reverted, a cold migration
// that confirms itself, and the evacuation of a fenced host that comes
// back. Each checks, besides the ledger, what the hosts really do: which
// libvirtd defines the guest, how many vCPU threads its QEMU has, and
// the pCPUs each of them may run on (/proc).

// lvmStack starts two libvirt hosts, h1 and h2, and a stack whose worker
// drives them.
func lvmStack(t *testing.T) (s *stack, h1, h2 *testenv.LibvirtHost) {
	t.Helper()
	h1 = testenv.StartLibvirtHost(t, "h1")
	h2 = testenv.StartLibvirtHost(t, "h2")
	s = newStack(t, "PINFLOW_DRIVER=libvirt")
	s.ok("host", "add", "h1", "--libvirt", h1.URI, "--migrate-uri", "tcp://127.0.0.1")
	s.ok("host", "add", "h2", "--libvirt", h2.URI, "--migrate-uri", "tcp://127.0.0.1")
	return s, h1, h2
}

// lvmBoot boots a small pinned guest on host and returns its uuid.
func lvmBoot(s *stack, name, host string) string {
	s.t.Helper()
	var res struct {
		UUID string `json:"uuid"`
	}
	s.jsonOf(&res, "boot", "--name", name, "--host", host, "--vcpus", "1", "--memory-mb", "128",
		"--spec", "hw:cpu_policy=dedicated", "--wait")
	if res.UUID == "" {
		s.t.Fatalf("boot %s: no uuid in the result", name)
	}
	return res.UUID
}

// lvmPinning returns the guest's vCPU → pCPU pinning as its record has it.
func lvmPinning(g shownGuest) map[int]int {
	out := map[int]int{}
	if g.Placement == nil {
		return out
	}
	for _, c := range g.Placement.Cells {
		for v, p := range c.CPUPinning {
			n, err := strconv.Atoi(v)
			if err != nil {
				continue
			}
			out[n] = p
		}
	}
	return out
}

// lvmGuest is `pinflow show --json` with the flavor's vCPU count.
type lvmGuest struct {
	shownGuest
	Flavor struct {
		VCPUs int `json:"vcpus"`
	} `json:"flavor"`
}

func lvmShow(s *stack, uuid string) lvmGuest {
	s.t.Helper()
	var g lvmGuest
	s.jsonOf(&g, "show", uuid)
	return g
}

// lvmClaimIn returns the id and the pCPUs (a cpuset list, from the
// host's pin owners) of uuid's claim in the given state on the host
// shown, or "" and "" when it has none there.
func lvmClaimIn(t testing.TB, v hostView, uuid, state string) (id, pcpus string) {
	t.Helper()
	for _, c := range v.Claims {
		if c.Instance == uuid && c.State == state {
			id = c.ID
		}
	}
	if id == "" {
		return "", ""
	}
	var ids []int
	for _, cell := range v.Cells {
		for cpu, o := range cell.Owners {
			if o.Claim != id {
				continue
			}
			n, err := strconv.Atoi(cpu)
			if err != nil {
				t.Fatalf("host show %s: pin owner key %q is not a pCPU", v.Host, cpu)
			}
			ids = append(ids, n)
		}
	}
	return id, cpuList(ids)
}

// lvmStatesIn returns the states of uuid's claims on the host shown.
func lvmStatesIn(v hostView, uuid string) []string {
	out := []string{}
	for _, c := range v.Claims {
		if c.Instance == uuid {
			out = append(out, c.State)
		}
	}
	sort.Strings(out)
	return out
}

// lvmPinnedIn returns the pinned pCPUs of the host shown.
func lvmPinnedIn(v hostView) string {
	var ids []int
	for _, c := range v.Cells {
		ids = append(ids, c.PinnedCPUs...)
	}
	return cpuList(ids)
}

// lvmEmpty checks that h's ledger keeps no claim of uuid and no pinned
// pCPU at all, and that h's libvirtd does not define uuid.
func lvmEmpty(s *stack, h *testenv.LibvirtHost, uuid, when string) {
	t := s.t
	t.Helper()
	v := s.host(h.Name)
	if got := lvmStatesIn(v, uuid); len(got) != 0 {
		t.Errorf("%s: %s keeps claims %v of %s, want none", when, h.Name, got, uuid)
	}
	if got := lvmPinnedIn(v); got != "" {
		t.Errorf("%s: %s has pCPUs %q pinned, want none", when, h.Name, got)
	}
	lvmNotDefined(t, h, uuid, when)
}

// lvmLookup looks the guest up on h's libvirtd itself.
func lvmLookup(t testing.TB, h *testenv.LibvirtHost, uuid string) (*hypervisor.Domain, error) {
	t.Helper()
	drv, err := libvirt.New(libvirt.Config{Hosts: libvirt.HostMap{h.Name: h.URI}})
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close()
	return drv.Lookup(context.Background(), h.Name, uuid)
}

// lvmNotDefined fails the test unless h's libvirtd has no domain uuid.
func lvmNotDefined(t testing.TB, h *testenv.LibvirtHost, uuid, when string) {
	t.Helper()
	dom, err := lvmLookup(t, h, uuid)
	switch {
	case err == nil:
		t.Errorf("%s: %s still has domain %s (%s, %s), want it undefined", when, h.Name, uuid, dom.Name, dom.State)
	case !errors.Is(err, hypervisor.ErrNotFound):
		t.Errorf("%s: looking up %s on %s: %v", when, uuid, h.Name, err)
	}
}

// lvmAffinities returns, for each vCPU thread of the guest's QEMU on h,
// the host CPUs it may run on, and those of its emulator thread. It waits
// (up to 30 s) until the guest runs with want vCPU threads, and returns
// what it saw last.
func lvmAffinities(t testing.TB, h *testenv.LibvirtHost, uuid string, want int) (vcpus map[int]string, emulator string) {
	t.Helper()
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for {
		name := domainName(t, h, uuid)
		if name == "" {
			err = fmt.Errorf("no domain %s", uuid)
		} else {
			vcpus, emulator, err = h.VCPUAffinity(name)
		}
		if (err == nil && len(vcpus) == want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("vCPU affinity of %s on %s: %v", uuid, h.Name, err)
	}
	return vcpus, emulator
}

// lvmCheckAffinity checks that the guest's QEMU on h has one vCPU thread
// per pinned vCPU, each allowed on its pinned pCPU only, and an emulator
// thread on the guest's pCPUs (the default emulator policy).
func lvmCheckAffinity(t testing.TB, h *testenv.LibvirtHost, uuid string, pin map[int]int, pcpus, when string) {
	t.Helper()
	got, emulator := lvmAffinities(t, h, uuid, len(pin))
	if len(got) != len(pin) {
		t.Errorf("%s: %s's QEMU on %s has %d vCPU threads (%v), want %d", when, uuid, h.Name, len(got), got, len(pin))
	}
	for v, p := range pin {
		if got[v] != strconv.Itoa(p) {
			t.Errorf("%s: vCPU %d of %s runs on %q on %s, but the claim pins it to %d", when, v, uuid, got[v], h.Name, p)
		}
	}
	if emulator != pcpus {
		t.Errorf("%s: %s's emulator thread runs on %q on %s, want the guest's pCPUs %q", when, uuid, emulator, h.Name, pcpus)
	}
}

// lvmCheckRuns checks that the guest runs on h, its record's host, with
// vcpus vCPUs, on its committed claim there: the record's pinning names
// exactly the claim's pCPUs, and each vCPU thread of its QEMU may run on
// its pinned pCPU only. It returns the pinning and the pCPUs.
func lvmCheckRuns(s *stack, h *testenv.LibvirtHost, uuid string, vcpus int, when string) (map[int]int, string) {
	t := s.t
	t.Helper()
	g := lvmShow(s, uuid)
	if hostOf(g.shownGuest) != h.Name || g.VMState != "active" || g.TaskState != nil {
		t.Errorf("%s: %s is on %q (vm_state %s, task_state %v), want active on %s with no task", when, uuid, hostOf(g.shownGuest), g.VMState, g.TaskState, h.Name)
	}
	if g.Flavor.VCPUs != vcpus {
		t.Errorf("%s: %s's flavor has %d vCPUs, want %d", when, uuid, g.Flavor.VCPUs, vcpus)
	}
	pin := lvmPinning(g.shownGuest)
	if len(pin) != vcpus {
		t.Errorf("%s: %s's placement pins %d vCPUs (%v), want %d", when, uuid, len(pin), pin, vcpus)
	}
	claim, claimed := lvmClaimIn(t, s.host(h.Name), uuid, "committed")
	if claim == "" {
		t.Errorf("%s: %s has no committed claim on %s", when, uuid, h.Name)
	} else if g.pcpus() != claimed {
		t.Errorf("%s: %s's record pins pCPUs %q, but its claim %s on %s owns %q", when, uuid, g.pcpus(), claim, h.Name, claimed)
	}
	dom, err := lvmLookup(t, h, uuid)
	if err != nil {
		t.Fatalf("%s: %s on %s's libvirtd: %v", when, uuid, h.Name, err)
	}
	if dom.State != hypervisor.StateRunning {
		t.Errorf("%s: domain %s on %s is %s, want running", when, uuid, h.Name, dom.State)
	}
	lvmCheckAffinity(t, h, uuid, pin, g.pcpus(), when)
	return pin, g.pcpus()
}

// lvmWaitState polls `pinflow show` until the guest has vm_state state and
// no task; it fails at once when the guest's workflow closes before.
func lvmWaitState(s *stack, uuid, state string, timeout time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		g := s.guest(uuid)
		if g.VMState == state && g.TaskState == nil {
			return
		}
		if err := lvmClosed(s, uuid); err != nil {
			s.t.Fatalf("waiting for %s to be %s (now %s, task %v): %v", uuid, state, g.VMState, g.TaskState, err)
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out after %s waiting for %s to be %s (now %s, task %v)", timeout, uuid, state, g.VMState, g.TaskState)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// lvmClosed returns an error when the guest's workflow is not running,
// with how it ended.
func lvmClosed(s *stack, uuid string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := guest.InstanceWorkflowID(uuid)
	d, err := s.tc.DescribeWorkflow(ctx, id, "")
	if err != nil {
		return nil // not started yet, or the server is slow: keep polling
	}
	st := d.RawResponse.GetWorkflowExecutionInfo().GetStatus()
	if st == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
		return nil
	}
	werr := s.tc.GetWorkflow(ctx, id, "").Get(ctx, nil)
	return fmt.Errorf("workflow %s is %s: %v", id, st, werr)
}

// lvmResult waits for the guest's workflow and decodes its result.
func lvmResult(s *stack, uuid string, res any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return s.tc.GetWorkflow(ctx, guest.InstanceWorkflowID(uuid), "").Get(ctx, res)
}

// lvmHostScript runs deploy/libvirt-host.sh cmd for h, as testenv does:
// stop destroys the host's guests and stops its daemon (a host that
// died), start brings the daemon back on the same directory, with its
// persistent domains shut off.
func lvmHostScript(t *testing.T, h *testenv.LibvirtHost, cmd string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bash", testenv.LibvirtHostScript(), cmd, h.Name, h.Dir).CombinedOutput()
	if err != nil {
		t.Fatalf("deploy/libvirt-host.sh %s %s: %v\n%s", cmd, h.Name, err, out)
	}
}

// lvmVerifyResize resizes a 1-vCPU guest on h1 to 2 vCPUs on h2 and checks
// VERIFY_RESIZE: the guest runs on h2 with 2 vCPUs on its new claim, its
// h1 claim is a source hold on the same pCPUs as before, and h1's
// libvirtd no longer defines it.
func lvmVerifyResize(s *stack, h1, h2 *testenv.LibvirtHost, uuid, before string) {
	t := s.t
	t.Helper()
	s.ok("resize", uuid, "--vcpus", "2", "--host", "h2", "--confirm-window", "never")
	lvmWaitState(s, uuid, "resized", 3*time.Minute)

	g := lvmShow(s, uuid)
	if hostOf(g.shownGuest) != "h2" {
		t.Fatalf("in VERIFY_RESIZE %s is on %q, want h2", uuid, hostOf(g.shownGuest))
	}
	if g.Flavor.VCPUs != 2 {
		t.Errorf("in VERIFY_RESIZE %s's flavor has %d vCPUs, want 2", uuid, g.Flavor.VCPUs)
	}
	pin := lvmPinning(g.shownGuest)
	if len(pin) != 2 {
		t.Errorf("in VERIFY_RESIZE %s's placement pins %d vCPUs (%v), want 2", uuid, len(pin), pin)
	}
	claim, claimed := lvmClaimIn(t, s.host("h2"), uuid, "committed")
	if claim == "" || claimed != g.pcpus() {
		t.Errorf("in VERIFY_RESIZE %s's record pins %q, its committed claim %q on h2 owns %q", uuid, g.pcpus(), claim, claimed)
	}
	lvmCheckAffinity(t, h2, uuid, pin, g.pcpus(), "in VERIFY_RESIZE")
	src := s.host("h1")
	hold, held := lvmClaimIn(t, src, uuid, "held")
	if hold == "" {
		t.Errorf("in VERIFY_RESIZE h1 holds no claim of %s in state held; its claims there: %v", uuid, lvmStatesIn(src, uuid))
	} else if held != before {
		t.Errorf("in VERIFY_RESIZE the source hold %s owns pCPUs %q on h1, want the guest's old %q", hold, held, before)
	}
	lvmNotDefined(t, h1, uuid, "in VERIFY_RESIZE")
	s.ok("check")
}

// libvirtResizeConfirm resizes a pinned guest to more vCPUs onto the
// other host, checks VERIFY_RESIZE on both libvirtds, confirms, and
// checks that the source hold is freed and the guest keeps running on
// its new claim.
func libvirtResizeConfirm(t *testing.T) {
	s, h1, h2 := lvmStack(t)
	a := lvmBoot(s, "guest-a", "h1")
	_, before := lvmCheckRuns(s, h1, a, 1, "after the boot")

	lvmVerifyResize(s, h1, h2, a, before)

	s.ok("resize", "confirm", a, "--wait")
	pin, _ := lvmCheckRuns(s, h2, a, 2, "after the confirm")
	lvmEmpty(s, h1, a, "after the confirm")
	s.ok("check")
	_, _, rdb := s.checkClaims(context.Background(), a, "h2")
	rdb.Close()

	// The freed source takes a new guest; the resized one keeps its pins.
	b := lvmBoot(s, "guest-b", "h1")
	lvmCheckRuns(s, h1, b, 1, "a boot on the freed source")
	if diff := cmp.Diff(pin, lvmPinning(s.guest(a))); diff != "" {
		t.Errorf("a boot on h1 changed %s's pins on h2 (-before +after):\n%s", a, diff)
	}
}

// libvirtResizeRevert resizes a pinned guest onto the other host and
// reverts: the guest runs on its source again with its old vCPU count on
// exactly its old pCPUs, not on a new fit (the pCPU a fit would choose
// first is free then), and the destination keeps neither domain nor
// claim.
func libvirtResizeRevert(t *testing.T) {
	s, h1, h2 := lvmStack(t)
	// A filler takes h1's first pCPU, so the guest gets another; with the
	// filler gone, a re-fit on revert would pick the first one.
	filler := lvmBoot(s, "filler", "h1")
	a := lvmBoot(s, "guest-a", "h1")
	before, old := lvmCheckRuns(s, h1, a, 1, "after the boot")
	s.ok("delete", filler, "--wait")
	if got := s.pinned("h1"); got != old {
		t.Fatalf("after deleting the filler h1 has %q pinned, want only %s's %q", got, a, old)
	}

	lvmVerifyResize(s, h1, h2, a, old)

	s.ok("resize", "revert", a, "--wait")
	after, _ := lvmCheckRuns(s, h1, a, 1, "after the revert")
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("after the revert %s's pins on h1 differ from its old pins (-old +after):\n%s", a, diff)
	}
	lvmEmpty(s, h2, a, "after the revert")
	if got := lvmStatesIn(s.host("h1"), a); len(got) != 1 || got[0] != "committed" {
		t.Errorf("after the revert %s's claims on h1 are %v, want one committed", a, got)
	}
	s.ok("check")
	_, _, rdb := s.checkClaims(context.Background(), a, "h1")
	rdb.Close()
}

// libvirtColdMigration cold-migrates a pinned guest to the other host,
// where another guest takes the first pCPU, with a short confirm window:
// it confirms itself and the guest runs on the pCPU it claimed there.
func libvirtColdMigration(t *testing.T) {
	s, h1, h2 := lvmStack(t)
	a := lvmBoot(s, "guest-a", "h1")
	b := lvmBoot(s, "guest-b", "h2")
	lvmCheckRuns(s, h1, a, 1, "after the boot")

	// The wait ends in VERIFY_RESIZE, where the guest already runs on h2;
	// following it again waits for the window to confirm it.
	var verify, end client.Outcome
	s.jsonOf(&verify, "migrate", a, "--cold", "--dest", "h2", "--confirm-window", "2s", "--wait")
	if !verify.AwaitingDecision() || verify.Host != "h2" || verify.Source != "h1" || verify.ConfirmBy.IsZero() {
		t.Errorf("cold migration --wait: %+v; want it awaiting a decision on h2, from h1, with a time it confirms itself", verify)
	}
	s.jsonOf(&end, "follow", a)
	var res api.ResizeResult
	if err := json.Unmarshal(end.Result, &res); err != nil {
		t.Fatalf("follow: result %s: %v", end.Result, err)
	}
	if res.Outcome != "auto-confirmed" || res.Host != "h2" || res.Source != "h1" {
		t.Errorf("cold migration result: outcome %q, from %q to %q; want auto-confirmed from h1 to h2", res.Outcome, res.Source, res.Host)
	}
	_, pa := lvmCheckRuns(s, h2, a, 1, "after the cold migration")
	_, pb := lvmCheckRuns(s, h2, b, 1, "beside the cold-migrated guest")
	if pa == pb {
		t.Errorf("guest-a and guest-b share pCPU %s on h2", pa)
	}
	lvmEmpty(s, h1, a, "after the cold migration")
	s.ok("check")
	_, _, rdb := s.checkClaims(context.Background(), a, "h2")
	rdb.Close()
}

// libvirtEvacuation kills host h1 with its two guests, fences it,
// evacuates both to h2, where they run on their new claims while h1's
// claims are tombstones, then brings h1 back: its libvirtd defines the
// two guests again (shut off), and host up destroys those leftovers and
// clears the tombstones.
func libvirtEvacuation(t *testing.T) {
	s, h1, h2 := lvmStack(t)
	guests := []string{lvmBoot(s, "guest-a", "h1"), lvmBoot(s, "guest-b", "h1")}
	for _, g := range guests {
		lvmCheckRuns(s, h1, g, 1, "after the boot")
	}
	src := s.host("h1")
	oldClaims := map[string]string{}
	for _, g := range guests {
		oldClaims[g], _ = lvmClaimIn(t, src, g, "committed")
	}
	tombstoned := lvmPinnedIn(src)

	// h1 dies with its guests.
	var qemus []int
	for _, g := range guests {
		pid, err := h1.QEMUPid(domainName(t, h1, g))
		if err != nil {
			t.Fatal(err)
		}
		qemus = append(qemus, pid)
	}
	lvmHostScript(t, h1, "stop")
	for i, pid := range qemus {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil && !strings.Contains(string(b), "State:\tZ") {
			t.Fatalf("QEMU %d of %s still runs after h1 stopped", pid, guests[i])
		}
	}
	if _, err := lvmLookup(t, h1, guests[0]); err == nil || errors.Is(err, hypervisor.ErrNotFound) {
		t.Fatalf("h1's libvirtd still answers after it stopped: %v", err)
	}

	s.ok("host", "down", "h1", "--fence", "--reason", "test")
	var started []struct {
		UUID  string `json:"uuid"`
		RunID string `json:"run_id"`
		Error string `json:"error"`
	}
	s.jsonOf(&started, "host", "evacuate", "h1")
	if len(started) != len(guests) {
		t.Fatalf("host evacuate h1 started %d evacuations (%+v), want %d", len(started), started, len(guests))
	}
	for _, g := range guests {
		var res api.EvacuateResult
		if err := lvmResult(s, g, &res); err != nil {
			t.Fatalf("evacuation of %s: %v", g, err)
		}
		if res.Host != "h2" || res.Source != "h1" {
			t.Errorf("evacuation of %s went from %q to %q, want h1 to h2", g, res.Source, res.Host)
		}
	}
	pins := map[string]string{}
	for _, g := range guests {
		_, pins[g] = lvmCheckRuns(s, h2, g, 1, "after the evacuation")
	}
	if pins[guests[0]] == pins[guests[1]] {
		t.Errorf("the evacuated guests share pCPU %s on h2", pins[guests[0]])
	}
	src = s.host("h1")
	for _, g := range guests {
		if got := lvmStatesIn(src, g); len(got) != 1 || got[0] != "tombstone" {
			t.Errorf("after the evacuation %s's claims on h1 are %v, want one tombstone", g, got)
		}
		if id, _ := lvmClaimIn(t, src, g, "tombstone"); id != oldClaims[g] {
			t.Errorf("after the evacuation %s's tombstone on h1 is claim %q, want its old claim %q", g, id, oldClaims[g])
		}
	}
	if got := lvmPinnedIn(src); got != tombstoned {
		t.Errorf("after the evacuation h1's tombstones pin %q, want the guests' old pCPUs %q", got, tombstoned)
	}
	s.ok("check")

	// h1 boots again: its libvirtd has the two guests' persistent
	// definitions, shut off.
	lvmHostScript(t, h1, "start")
	for _, g := range guests {
		dom, err := lvmLookup(t, h1, g)
		if err != nil {
			t.Fatalf("after h1 came back its libvirtd has no %s: %v (the leftover host up must clear)", g, err)
		}
		if dom.State != hypervisor.StateShutoff {
			t.Errorf("after h1 came back %s is %s there, want shut off", g, dom.State)
		}
	}
	var up api.HostUpResult
	s.jsonOf(&up, "host", "up", "h1", "--wait")
	if len(up.Leftovers) != len(guests) {
		t.Errorf("host up h1 destroyed %d leftovers (%+v), want %d", len(up.Leftovers), up.Leftovers, len(guests))
	}
	for _, g := range guests {
		lvmEmpty(s, h1, g, "after host up")
		if _, got := lvmCheckRuns(s, h2, g, 1, "after host up"); got != pins[g] {
			t.Errorf("host up h1 moved %s's pins on h2 from %q to %q", g, pins[g], got)
		}
	}
	var hv struct {
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	}
	s.jsonOf(&hv, "host", "show", "h1")
	if hv.Status.State != "up" {
		t.Errorf("after host up h1 is %q, want up", hv.Status.State)
	}
	s.ok("check")
	for _, g := range guests {
		_, _, rdb := s.checkClaims(context.Background(), g, "h2")
		rdb.Close()
	}
	// h1 takes guests again.
	c := lvmBoot(s, "guest-c", "h1")
	lvmCheckRuns(s, h1, c, 1, "a boot on the returned host")
}
