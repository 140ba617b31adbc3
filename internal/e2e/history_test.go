package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/workflows"
)

// TestHistoriesReplay runs every workflow through its main paths on a real
// server and replays each recorded history against the current workflow
// code. With PINFLOW_RECORD_HISTORIES=1 it also stores them as the golden
// histories of the release in the making, which workflows' replay test
// uses, in workflows/testdata/history/unreleased; a release's own are
// never recorded again (docs/versioning.md).
func TestHistoriesReplay(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	var recorded []*historypb.History
	names := []string{}
	record := func(uuid, name string) {
		t.Helper()
		h := s.history(uuid)
		recorded, names = append(recorded, h), append(names, name)
	}
	recordHost := func(host, name string) {
		t.Helper()
		recorded, names = append(recorded, s.historyOf(api.HostWorkflowID(host))), append(names, name)
	}
	recordHost("a", "host-add")
	record(vmA, "boot")
	// Refused by the client, naming the guests: no run to record.
	s.refused("evacuate, migrate or delete", "host", "remove", "a")
	s.ok("host", "disable", "b", "--reason", "firmware update")
	recordHost("b", "host-disable")
	s.ok("host", "enable", "b")
	recordHost("b", "host-enable")
	s.ok("host", "add", "c", "--cells", "1", "--cores", "2", "--memory-mb", "4096")
	s.ok("host", "remove", "c")
	recordHost("c", "host-remove")
	s.ok("migrate", vmA, "--dest", "b", "--wait")
	record(vmA, "live-migration")
	// An audit of every registered host, so the history holds the host
	// listing and one audit activity per host.
	var audit struct {
		WorkflowID string `json:"workflow_id"`
	}
	s.jsonOf(&audit, "reconcile", "--grace", "0")
	var res api.ReconcileResult
	if err := s.tc.GetWorkflow(context.Background(), audit.WorkflowID, "").Get(context.Background(), &res); err != nil {
		t.Fatalf("reconcile %s: %v", audit.WorkflowID, err)
	}
	if len(res.Hosts) != 2 || res.Total.Freed.Total() != 0 || res.Total.Errors != 0 {
		t.Fatalf("reconcile audited %d hosts, freed %d claims with %d errors; want 2 hosts, none freed, no errors: %+v",
			len(res.Hosts), res.Total.Freed.Total(), res.Total.Errors, res.Hosts)
	}
	recorded, names = append(recorded, s.historyOf(audit.WorkflowID)), append(names, "reconcile")
	s.ok("sim", "fault", "--host", "b", "--op", "migrate", "--times", "5")
	s.refused("failed", "migrate", vmA, "--dest", "a", "--wait")
	record(vmA, "live-migration-rolled-back")
	s.ok("shelve", vmA, "--offload", "--wait")
	record(vmA, "shelve-offload")
	s.ok("sim", "fault", "--host", "a", "--op", "spawn", "--times", "5")
	s.refused("failed", "unshelve", vmA, "--host", "a", "--wait")
	record(vmA, "unshelve-spawn-failed")
	s.ok("unshelve", vmA, "--host", "b", "--wait")
	record(vmA, "unshelve")
	s.ok("migrate", vmA, "--cold", "--dest", "a", "--confirm-window", "1s", "--wait")
	s.ok("follow", vmA)
	record(vmA, "cold-migration")
	s.refused("no fit", "resize", vmA, "--vcpus", "3", "--host", "b", "--wait")
	record(vmA, "resize-no-fit")
	s.ok("resize", vmA, "--vcpus", "2", "--memory-mb", "2048", "--host", "a", "--confirm-window", "never")
	s.waitResized(vmA)
	s.ok("resize", "confirm", vmA, "--wait")
	record(vmA, "resize-confirmed")
	s.ok("resize", vmA, "--vcpus", "1", "--host", "b", "--confirm-window", "never")
	s.waitResized(vmA)
	s.ok("resize", "revert", vmA, "--wait")
	record(vmA, "resize-reverted")
	s.ok("sim", "power", "--host", "a", "--off")
	s.ok("host", "down", "a", "--fence", "--reason", "test")
	recordHost("a", "host-down")
	s.ok("evacuate", vmA, "--wait")
	record(vmA, "evacuation")
	s.ok("host", "evacuate", "a", "--retry")
	recordHost("a", "host-auto-evacuate")
	s.ok("sim", "power", "--host", "a", "--on")
	s.ok("host", "up", "a", "--wait")
	recordHost("a", "host-up")
	s.ok("delete", vmA, "--wait")
	record(vmA, "delete")

	// A drain of b's two guests onto a, one move at a time: paused while
	// its first move is held before its switchover, resumed once that
	// move has finished.
	vmC := s.boot("C", "b", 1)
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("host", "drain", "b", "--parallel", "1")
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	s.ok("host", "drain", "pause", "b")
	s.ok("sim", "gate", "--at", "switchover", "--release")
	s.eventually("the drain's first move finished while it is paused", time.Minute, func() bool {
		var st api.DrainStatus
		s.jsonOf(&st, "host", "drain", "status", "b", "--json")
		return st.Paused && st.Moving == 0 && len(st.Guests) == 2 &&
			(st.Guests[0].State == api.GuestMoved) != (st.Guests[1].State == api.GuestMoved)
	})
	s.ok("host", "drain", "resume", "b")
	var drained api.DrainResult
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := s.tc.GetWorkflow(ctx, api.DrainWorkflowID("b"), "").Get(ctx, &drained); err != nil || drained.Moved != 2 {
		t.Fatalf("drain of b = %+v, %v; want both guests moved", drained, err)
	}
	recorded, names = append(recorded, s.historyOf(api.DrainWorkflowID("b"))), append(names, "drain")
	record(vmC, "live-migration-reserved")
	// C re-pinned in place, onto the lowest pCPUs of its cell free or its own.
	s.ok("repin", vmC, "--wait")
	record(vmC, "repin")
	// a defragmented: its cores have one thread each, so whole cores
	// are free already and the plan has no step.
	s.ok("host", "defrag", "a", "--wait")
	recorded, names = append(recorded, s.historyOf(api.DefragWorkflowID("a"))), append(names, "defrag")

	// Redis loses a's keys while both guests run there; a recovery
	// restores their claims from the hypervisor.
	s.loseHost("a")
	s.ok("recover", "--host", "a")
	var recoverID string
	s.eventually("the recovery listed", time.Minute, func() bool {
		page, err := s.tc.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: "WorkflowType = 'Recover'"})
		if err != nil || len(page.Executions) != 1 {
			return false
		}
		recoverID = page.Executions[0].GetExecution().GetWorkflowId()
		return true
	})
	recorded, names = append(recorded, s.historyOf(recoverID)), append(names, "recover")

	// C's migration back to b, terminated past its switchover: the audit
	// settles C forwards onto b's claim.
	s.ok("sim", "gate", "--at", "switched", "--hold")
	s.ok("migrate", vmC, "--dest", "b")
	s.ok("sim", "gate", "--at", "switched", "--wait-arrived", "1")
	if err := s.tc.TerminateWorkflow(ctx, guest.InstanceWorkflowID(vmC), "", "test"); err != nil {
		t.Fatal(err)
	}
	s.ok("sim", "gate", "--at", "switched", "--release")
	s.waitClosed(vmC)
	s.pastMinGrace()
	s.reconcile("--grace", "0")
	s.waitRun(guest.InstanceWorkflowID(vmC), api.WorkflowSettle)
	if g := s.guest(vmC); g.Host == nil || *g.Host != "b" {
		t.Fatalf("C after the audit settled it: %+v, want it on b", g)
	}
	record(vmC, "settle")

	// Redis loses b's keys and C's record while C runs: recover
	// quarantines its pCPUs, released once C is stopped.
	s.loseHost("b")
	rdb := s.redisClient()
	defer rdb.Close()
	if err := rdb.Del(ctx, ledger.DefaultKeyPrefix+":inst:{"+vmC+"}").Err(); err != nil {
		t.Fatal(err)
	}
	s.ok("recover", "--host", "b")
	q := s.hostClaimOf("b", vmC)
	if err := s.simulator().Stop(ctx, "b", vmC); err != nil {
		t.Fatal(err)
	}
	s.ok("quarantine", "release", "--host", "b", q)
	recorded, names = append(recorded, s.historyOf(api.QuarantineReleaseWorkflowID("b", q))), append(names, "release-quarantine")
	keepHistories(t, recorded, names)
}

// waitRun waits until the latest run of workflow id is one of type
// typeName, and closed.
func (s *stack) waitRun(id, typeName string) {
	s.t.Helper()
	s.eventually("a closed "+typeName+" run of "+id, 2*time.Minute, func() bool {
		d, err := s.tc.DescribeWorkflow(context.Background(), id, "")
		if err != nil {
			return false
		}
		return d.WorkflowType.Name == typeName && d.Status != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
	})
}

// keepHistories replays each recorded history against the workflows as
// they are, checks that it carries no domain XML, and under
// PINFLOW_RECORD_HISTORIES=1 writes it, by its name, among the histories
// of the release in the making.
func keepHistories(t *testing.T, recorded []*historypb.History, names []string) {
	t.Helper()
	replayer := worker.NewWorkflowReplayer()
	for _, wf := range workflows.All() {
		replayer.RegisterWorkflow(wf)
	}
	dir := filepath.Join(testenv.ModuleRoot(t), "workflows", "testdata", "history", "unreleased")
	if os.Getenv("PINFLOW_RECORD_HISTORIES") == "1" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i, h := range recorded {
		if err := replayer.ReplayWorkflowHistory(nil, h); err != nil {
			t.Errorf("replay of the %s history: %v", names[i], err)
		}
		// Domain XML is staged in the ledger, kilobytes a history need
		// not carry. Payloads are JSON, where Go writes "<" as \u003c.
		if data, err := proto.Marshal(h); err != nil {
			t.Fatal(err)
		} else if bytes.Contains(data, []byte("<domain")) || bytes.Contains(data, []byte(`\u003cdomain`)) {
			t.Errorf("the %s history carries domain XML", names[i])
		}
		if os.Getenv("PINFLOW_RECORD_HISTORIES") == "1" {
			data, err := protojson.MarshalOptions{Indent: " "}.Marshal(h)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, names[i]+".json"), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// history returns the full history of the guest's latest workflow run.
func (s *stack) history(uuid string) *historypb.History {
	s.t.Helper()
	return s.historyOf(guest.InstanceWorkflowID(uuid))
}

// historyOf returns the full history of the workflow id's latest run.
func (s *stack) historyOf(id string) *historypb.History {
	s.t.Helper()
	it := s.tc.GetWorkflowHistory(context.Background(), id, "", false,
		enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	h := &historypb.History{}
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			s.t.Fatal(err)
		}
		h.Events = append(h.Events, ev)
	}
	return h
}
