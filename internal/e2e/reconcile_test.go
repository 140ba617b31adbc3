package e2e

import (
	"context"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// reconcile runs `pinflow reconcile --wait --json` with args and returns
// its result.
func (s *stack) reconcile(args ...string) api.ReconcileResult {
	s.t.Helper()
	var res api.ReconcileResult
	s.jsonOf(&res, append([]string{"reconcile", "--wait"}, args...)...)
	return res
}

func hostAudit(res api.ReconcileResult, host string) audit.HostAudit {
	for _, h := range res.Hosts {
		if h.Host == host {
			return h
		}
	}
	return audit.HostAudit{}
}

// TestReconcileDuringMigration is Nova bug 1845146 with the audit that
// caused it: an audit with no grace period, run while A's migration to b,
// its copy done, is held before its switchover with b's destination claim,
// keeps that claim; b stays 0-3 and a 0,1, and after the migration a is
// empty and b is 0-3.
func TestReconcileDuringMigration(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("migrate", vmA, "--dest", "b")
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	res := s.reconcile("--grace", "0")
	if n := res.Total.Freed.Total(); n != 0 {
		t.Errorf("the audit during the migration freed %d claims: %+v", n, res.Hosts)
	}
	if got := hostAudit(res, "b").Tally.Kept.Of(audit.KeptOwnerRunning); got != 1 {
		t.Errorf("the audit kept %d claims on b because their owner runs, want 1 (the destination claim): %+v", got, hostAudit(res, "b").Tally)
	}
	if len(res.Hosts) != 2 || res.Total.Errors != 0 {
		t.Errorf("the audit covered %d hosts with %d errors, want 2 and none: %+v", len(res.Hosts), res.Total.Errors, res.Hosts)
	}
	if got := s.pinned("b"); got != "0-3" {
		t.Errorf("after the audit b has %q pinned, want 0-3", got)
	}
	if got := s.pinned("a"); got != "0-1" {
		t.Errorf("after the audit a has %q pinned, want 0-1", got)
	}
	s.ok("sim", "gate", "--at", "switchover", "--release")
	s.eventually("A to land on b", 2*time.Minute, func() bool {
		g := s.guest(vmA)
		return hostOf(g) == "b" && g.TaskState == nil
	})
	if got := s.pinned("a"); got != "" {
		t.Errorf("host a has %q pinned after A left, want nothing", got)
	}
	if got := s.pinned("b"); got != "0-3" {
		t.Errorf("host b has %q pinned, want 0-3", got)
	}
	s.checkAgreement(vmA, "b")
}

// TestReconcileFreesTerminatedOwner: a migration terminated in its migrate
// step runs no compensation. Terminated while held before its switchover,
// its attempt aborts when its heartbeat finds the workflow gone, and its
// destination claim is orphaned: an audit past the grace period frees it,
// and nothing else. Terminated while held past its switchover, the guest
// runs on the destination claim, which no audit may free (even a dry run
// says so), and once the attempt completes the audit settles A there.
// Either way one claim per guest, agreeing with the hypervisor.
func TestReconcileFreesTerminatedOwner(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ gate, host string }{{"switchover", "a"}, {"switched", "b"}} {
		t.Run(tt.gate, func(t *testing.T) {
			s, vmA, vmB := twoHosts(t)
			s.ok("sim", "gate", "--at", tt.gate, "--hold")
			s.ok("migrate", vmA, "--dest", "b")
			s.ok("sim", "gate", "--at", tt.gate, "--wait-arrived", "1")
			if err := s.tc.TerminateWorkflow(context.Background(), guest.InstanceWorkflowID(vmA), "", "e2e: terminated in the migrate step"); err != nil {
				t.Fatal(err)
			}
			s.ok("sim", "gate", "--at", tt.gate, "--wait-cancelled", "1")
			if got := s.pinned("b"); got != "0-3" {
				t.Fatalf("after the termination b has %q pinned, want 0-3 (the destination claim still held)", got)
			}
			if tt.host == "b" {
				dry := s.reconcile("--grace", "0", "--dry-run")
				if got := dry.Total.Freed.Total(); got != 0 || s.pinned("b") != "0-3" {
					t.Errorf("the dry run with A past its switchover would free %d claims, b pinned %q; want none and 0-3", got, s.pinned("b"))
				}
			}
			s.ok("sim", "gate", "--at", tt.gate, "--release")
			s.pastMinGrace()
			// The fence lease of the aborted attempt may still run for a
			// while; the audit keeps the claim until it has.
			var res api.ReconcileResult
			s.eventually("the audit to free or settle the destination claim", time.Minute, func() bool {
				res = s.reconcile("--grace", "0")
				g := s.guest(vmA)
				return res.Total.Freed.Total() > 0 || hostOf(g) == "b" && g.TaskState == nil
			})
			if tt.host == "a" {
				freed := hostAudit(res, "b").Freed
				if len(freed) != 1 || freed[0].Instance != vmA || freed[0].Kind != ledger.KindMigrationDest || freed[0].Reason != audit.FreedOwnerClosed {
					t.Errorf("the audit freed %+v on b, want A's migration-dest claim, owner closed", freed)
				}
				if n := res.Total.Freed.Total(); n != 1 {
					t.Errorf("the audit freed %d claims in all, want 1: %+v", n, res.Hosts)
				}
				if got := s.pinned("b"); got != "0-1" {
					t.Errorf("after the audit b has %q pinned, want B's 0-1", got)
				}
				if got := s.pinned("a"); got != "0-1" {
					t.Errorf("after the audit a has %q pinned, want A's 0-1", got)
				}
			} else {
				if n := res.Total.Freed.Total(); n != 0 {
					t.Errorf("the audit freed %d claims with A running on b, want none: %+v", n, res.Hosts)
				}
				s.eventually("the audit to settle A on b", time.Minute, func() bool {
					g := s.guest(vmA)
					if hostOf(g) != "b" || g.TaskState != nil || s.pinned("a") != "" {
						s.reconcile("--grace", "0")
						return false
					}
					return true
				})
			}
			s.checkAgreement(vmA, tt.host)
			s.checkAgreement(vmB, "b")
			again := s.reconcile("--grace", "0")
			if n := again.Total.Freed.Total(); n != 0 {
				t.Errorf("a second audit freed %d more claims, want none", n)
			}
		})
	}
}

const canTaskQueue = "e2e-continue-as-new"

// claimThenContinue claims pCPUs on host a as its chain's first run, then
// continues as new and waits for a "finish" signal, holding the claim.
func claimThenContinue(ctx workflow.Context, continued bool) error {
	if !continued {
		info := workflow.GetInfo(ctx)
		actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 30 * time.Second})
		if err := workflow.ExecuteActivity(actx, "E2EClaim", info.WorkflowExecution.ID, info.FirstRunID).Get(ctx, nil); err != nil {
			return err
		}
		return workflow.NewContinueAsNewError(ctx, "E2EClaimThenContinue", true)
	}
	workflow.GetSignalChannel(ctx, "finish").Receive(ctx, nil)
	return nil
}

// TestReconcileKeepsContinuedAsNewOwner: a workflow that claimed with its
// first run id and then continued as new is still the claim's owner (the
// first run id does not change); the audit keeps its claim until it ends,
// then frees it.
func TestReconcileKeepsContinuedAsNewOwner(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4")
	ctx := context.Background()
	rdb := s.redisClient()
	defer rdb.Close()
	led, err := ledger.New(rdb, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const uuid = "0d000000-0000-4000-8000-00000000000d"
	req, err := numa.NewRequest(2, 512, map[string]string{"hw:cpu_policy": "dedicated"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := worker.New(s.tc, canTaskQueue, worker.Options{})
	w.RegisterWorkflowWithOptions(claimThenContinue, workflow.RegisterOptions{Name: "E2EClaimThenContinue"})
	w.RegisterActivityWithOptions(func(ctx context.Context, wfID, firstRun string) error {
		_, err := led.Claim(ctx, ledger.ClaimSpec{ID: "can-" + firstRun, Host: "a", InstanceUUID: uuid, Kind: ledger.KindUnshelve,
			OwnerWorkflowID: wfID, OwnerRunID: firstRun, Request: req})
		return err
	}, activity.RegisterOptions{Name: "E2EClaim"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "e2e-continue-as-new", TaskQueue: canTaskQueue}, "E2EClaimThenContinue", false)
	if err != nil {
		t.Fatal(err)
	}
	s.eventually("the workflow to continue as new", time.Minute, func() bool {
		d, err := s.tc.DescribeWorkflow(ctx, run.GetID(), "")
		if err != nil {
			return false
		}
		info := d.RawResponse.GetWorkflowExecutionInfo()
		return info.GetExecution().GetRunId() != info.GetFirstRunId()
	})
	claimID := "can-" + run.GetRunID()
	if _, err := led.GetClaim(ctx, "a", claimID); err != nil {
		t.Fatalf("the first run's claim: %v", err)
	}
	res := s.reconcile("--grace", "0", "--host", "a")
	if got := res.Total.Kept.Of(audit.KeptOwnerRunning); got != 1 || res.Total.Freed.Total() != 0 {
		t.Errorf("the audit of a continued-as-new owner: %+v; want its claim kept (owner running) and nothing freed", res.Total)
	}
	if _, err := led.GetClaim(ctx, "a", claimID); err != nil {
		t.Errorf("after the audit the claim is gone: %v", err)
	}
	if err := s.tc.SignalWorkflow(ctx, run.GetID(), "", "finish", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.tc.GetWorkflow(ctx, run.GetID(), "").Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// The owner's last attempts may still write for the minimum grace.
	s.pastMinGrace()
	res = s.reconcile("--grace", "0", "--host", "a")
	if got := res.Total.Freed.Of(audit.FreedOwnerClosed); got != 1 {
		t.Errorf("the audit after the owner ended freed %d claims (owner closed), want 1: %+v", got, res.Total)
	}
	if got := s.pinned("a"); got != "" {
		t.Errorf("host a has %q pinned after the audit, want nothing", got)
	}
}

// TestReconcileBadInput: refused with one clear line, nothing started.
func TestReconcileBadInput(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4")
	s.refused("--grace", "reconcile", "--grace", "-1s")
	s.refused("--grace", "reconcile", "--grace", "soon")
	s.refused("unknown host", "reconcile", "--host", "nowhere")
	s.refused("no positional", "reconcile", "a")
}
