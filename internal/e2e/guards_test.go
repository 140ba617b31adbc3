package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/ledger"
)

// TestLedgerKeepsItsNamespaceWithoutItsKey: with the ledger's deployment
// key deleted, a CLI of another Temporal namespace is refused with one
// line naming the namespace the claims record, binds nothing, and changes
// no claim; the stack's own CLI binds the ledger again.
func TestLedgerKeepsItsNamespaceWithoutItsKey(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4")
	s.boot("vm", "a", 2)
	before := s.rawClaims("a")
	key := ledger.DefaultKeyPrefix + ":deployment"
	rdb := s.redisClient()
	if err := rdb.Del(context.Background(), key).Err(); err != nil {
		t.Fatal(err)
	}
	want := `serves Temporal namespace "` + s.namespace() + `", not "other"`
	own := s.env
	s.env = append(slices.Clip(own), "PINFLOW_TEMPORAL_NAMESPACE=other")
	s.refused(want, "host", "show", "a")
	s.env = own
	if n, err := rdb.Exists(context.Background(), key).Result(); err != nil || n != 0 {
		t.Errorf("the refused CLI bound the ledger (exists %d, %v)", n, err)
	}
	if diff := cmp.Diff(before, s.rawClaims("a")); diff != "" {
		t.Errorf("claims on a after the refusal (-before +after):\n%s", diff)
	}
	s.ok("host", "show", "a")
	if n, _ := rdb.Exists(context.Background(), key).Result(); n != 1 {
		t.Errorf("the stack's own CLI did not bind the ledger again")
	}
}

// TestCrashedHostsGuestsAreRecordedStopped: a host that crashed and came
// back without its guests evacuated runs them no more; the audit reports
// each as power-state drift and records it stopped, check names it until
// then, and nothing starts it. A guest started again through the
// hypervisor is recorded active by the next audit.
func TestCrashedHostsGuestsAreRecordedStopped(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4")
	vm := s.boot("vm", "a", 2)
	s.ok("sim", "power", "--host", "a", "--off")
	s.ok("host", "down", "a", "--fence", "--reason", "power supply failed")
	s.ok("sim", "power", "--host", "a", "--on")
	s.ok("host", "up", "a", "--wait")
	if st := s.simulatorState("a", vm); st != "shutoff" {
		t.Fatalf("vm on a after the crash is %q, want shutoff", st)
	}
	out, _, code := s.run("check")
	if code == 0 || !strings.Contains(out, "instance vm is recorded active but its domain is shutoff") {
		t.Errorf("check before the audit: rc %d\n%s\nwant the guest named as a problem", code, out)
	}
	s.pastMinGrace()
	res := s.reconcile("--grace", "0")
	if n := res.Total.Drift.Of("power-state"); n != 1 {
		t.Errorf("the audit found %d power-state drifts, want 1: %+v", n, res.Hosts)
	}
	if g := s.guest(vm); g.VMState != "stopped" {
		t.Errorf("vm's record after the audit says %q, want stopped", g.VMState)
	}
	if st := s.simulatorState("a", vm); st != "shutoff" {
		t.Errorf("vm on a after the audit is %q: the audit must not start a guest", st)
	}
	s.ok("check")
	if err := s.simulator().Start(context.Background(), "a", vm); err != nil {
		t.Fatal(err)
	}
	s.reconcile("--grace", "0")
	if g := s.guest(vm); g.VMState != "active" {
		t.Errorf("vm's record after it was started by hand and audited says %q, want active", g.VMState)
	}
	s.noDoublePins("a")
}

// simulatorState is the run state of uuid's domain on host.
func (s *stack) simulatorState(host, uuid string) string {
	s.t.Helper()
	d, err := s.simulator().Lookup(context.Background(), host, uuid)
	if err != nil {
		return err.Error()
	}
	return string(d.State)
}
