package e2e

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
)

// TestLedgerServesOneNamespace: a CLI or worker configured with another
// Temporal namespace on the same Redis and key prefix refuses the ledger
// with one line naming both namespaces, before any Temporal call, and
// changes no claim.
func TestLedgerServesOneNamespace(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.startWorker()
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4")
	s.boot("vm", "a", 2)
	before := s.rawClaims("a")
	if len(before) == 0 {
		t.Fatal("host a has no claim after the boot")
	}

	want := `serves Temporal namespace "` + s.namespace() + `", not "other"`
	own := s.env
	s.env = append(slices.Clip(own), "PINFLOW_TEMPORAL_NAMESPACE=other")
	s.refused(want, "host", "show", "a")
	s.refused(want, "reconcile", "--grace", "0", "--wait")

	s.workerRefused(want)
	s.env = own

	if diff := cmp.Diff(before, s.rawClaims("a")); diff != "" {
		t.Errorf("claims on a after the refusals (-before +after):\n%s", diff)
	}
}

// namespace is the Temporal namespace the stack's workers serve.
func (s *stack) namespace() string { return s.envOf("PINFLOW_TEMPORAL_NAMESPACE") }

// rawClaims is host's claims as Redis holds them, to compare before and
// after what must change nothing.
func (s *stack) rawClaims(host string) map[string]string {
	s.t.Helper()
	c, err := s.redisClient().HGetAll(context.Background(), ledger.DefaultKeyPrefix+":host:{"+host+"}:claims").Result()
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// workerRefused starts a worker with the stack's environment and expects
// it to exit at once, non-zero, with one line containing want.
func (s *stack) workerRefused(want string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := exec.CommandContext(ctx, s.worker)
	w.Env = s.env
	out, err := w.CombinedOutput()
	line := strings.TrimSpace(string(out))
	if err == nil || strings.Contains(line, "\n") || !strings.HasPrefix(line, "pinflow-worker: ") || !strings.Contains(line, want) {
		s.t.Errorf("worker: exit %v, output %q; want a non-zero exit and one line containing %q", err, line, want)
	}
}

// TestLedgerServesOneCluster: a worker or CLI of a namespace of the same
// name on another Temporal cluster (a staging "default" pointed at
// production's Redis) is refused before it starts a workflow, with one
// line naming both namespace ids, and changes no claim.
func TestLedgerServesOneCluster(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4")
	uuid := s.boot("vm", "a", 2)
	before := s.rawClaims("a")

	staging := testenv.StartTemporal(t)
	own := s.env
	s.env = append(slices.Clip(own), "PINFLOW_TEMPORAL_ADDRESS="+staging.Address)
	want := `serves Temporal namespace "` + s.namespace() + `" of another cluster`
	s.refused(want, "reconcile", "--grace", "0", "--wait")
	s.refused(want, "delete", uuid, "--wait")
	s.refused(want, "boot", "--name", "vm2", "--vcpus", "1", "--memory-mb", "512", "--host", "a", "--wait")

	s.workerRefused(want)
	s.env = own

	if diff := cmp.Diff(before, s.rawClaims("a")); diff != "" {
		t.Errorf("claims on a after the refusals (-before +after):\n%s", diff)
	}
	if g := s.guest(uuid); g.VMState != "active" || g.Host == nil || *g.Host != "a" {
		t.Errorf("guest after the refusals = %+v, want it active on a", g)
	}
	if n, err := staging.Client.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{}); err != nil || len(n.Executions) != 0 {
		t.Errorf("the other cluster ran workflows: %v, %v", n.GetExecutions(), err)
	}
}
