package workflows

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// openOwner is the OwnerChecker of the race tests: the one workflow under
// test runs with its first run id; every other id is not found, as if
// closed long ago (the most an audit could ever be told).
type openOwner struct {
	mu       sync.Mutex
	id, run  string
	override *audit.OwnerStatus
}

func (o *openOwner) open(id, run string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.id, o.run = id, run
}

func (o *openOwner) OwnerStatus(_ context.Context, id string) (audit.OwnerStatus, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.override != nil {
		return *o.override, nil
	}
	if id == o.id && o.id != "" {
		return audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: o.run, Since: time.Now()}, nil
	}
	return audit.OwnerStatus{State: audit.OwnerNotFound}, nil
}

// Retention is none: every claim is older, so a workflow not found is
// gone.
func (o *openOwner) Retention(context.Context) (time.Duration, error) { return 0, nil }

// firstRun gives the workflows under test a first run id, as the server
// would: the test environment leaves it empty, and the ledger refuses a
// claim without an owner run.
type firstRun struct {
	interceptor.WorkerInterceptorBase
	id string
}

func (f *firstRun) InterceptWorkflow(_ workflow.Context, next interceptor.WorkflowInboundInterceptor) interceptor.WorkflowInboundInterceptor {
	return &firstRunInbound{WorkflowInboundInterceptorBase: interceptor.WorkflowInboundInterceptorBase{Next: next}, id: f.id}
}

type firstRunInbound struct {
	interceptor.WorkflowInboundInterceptorBase
	id string
}

func (i *firstRunInbound) Init(outbound interceptor.WorkflowOutboundInterceptor) error {
	return i.Next.Init(&firstRunOutbound{WorkflowOutboundInterceptorBase: interceptor.WorkflowOutboundInterceptorBase{Next: outbound}, id: i.id})
}

type firstRunOutbound struct {
	interceptor.WorkflowOutboundInterceptorBase
	id string
}

func (o *firstRunOutbound) GetInfo(ctx workflow.Context) *workflow.Info {
	info := *o.Next.GetInfo(ctx)
	info.FirstRunID, info.WorkflowExecution.RunID = o.id, o.id
	return &info
}

// raceWorld runs the real activities on a real Redis and the simulated
// hypervisor, and audits every host with a zero grace period at every
// activity boundary of the workflow under test.
type raceWorld struct {
	t      *testing.T
	acts   *activities.Activities
	led    *ledger.Ledger
	drv    *sim.Driver
	owners *openOwner
	runs   int
	audits int
	uuids  []string
}

func newRaceWorld(t *testing.T) *raceWorld {
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	led, err := ledger.New(rdb, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := &raceWorld{t: t, led: led, drv: sim.New(rdb, sim.Options{}), owners: &openOwner{}}
	w.acts = &activities.Activities{Ledger: led, Driver: w.drv, ProgressEvery: 10 * time.Millisecond,
		Audit: &audit.Auditor{Ledger: led, Driver: w.drv, Owners: w.owners}}
	for _, h := range []string{"a", "b"} {
		topo, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: 4, Threads: 1, MemoryMB: 8192})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.drv.AddHost(context.Background(), h, topo); err != nil {
			t.Fatal(err)
		}
		if _, err := led.RegisterHost(context.Background(), h, topo); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// run executes wf on uuid's workflow id with audits at every step
// boundary, and returns the workflow's error.
func (w *raceWorld) run(t *testing.T, uuid string, wf, in any) error {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	env := s.NewTestWorkflowEnvironment()
	env.SetTestTimeout(2 * time.Minute)
	w.runs++
	id, run := guest.InstanceWorkflowID(uuid), fmt.Sprintf("first-run-%d", w.runs)
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: id})
	env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{&firstRun{id: run}}, DeadlockDetectionTimeout: loadedMachine})
	env.RegisterActivity(w.acts)
	w.owners.open(id, run)
	defer w.owners.open("", "")
	// Hypervisor steps are activities, ledger steps local activities,
	// which the test environment names by their input (see localStep).
	env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
		w.auditAll(t, "before "+info.ActivityType.Name)
	})
	env.SetOnActivityCompletedListener(func(info *activity.Info, _ converter.EncodedValue, _ error) {
		w.auditAll(t, "after "+info.ActivityType.Name)
	})
	var step string
	env.SetOnLocalActivityStartedListener(func(_ *activity.Info, _ context.Context, args []any) {
		step = localStep(args)
		w.auditAll(t, "before "+step)
	})
	env.SetOnLocalActivityCompletedListener(func(*activity.Info, converter.EncodedValue, error) { w.auditAll(t, "after "+step) })
	audits := w.audits
	env.ExecuteWorkflow(wf, in)
	if !env.IsWorkflowCompleted() {
		t.Fatalf("%s did not complete", id)
	}
	if w.audits == audits {
		t.Fatalf("%s ran no audit: the step listeners did not fire", id)
	}
	return env.GetWorkflowError()
}

// localStep names a local activity by the type of its input: the test
// environment's listeners get the wrapper the worker registered, not the
// activity's name.
func localStep(args []any) string {
	if len(args) == 0 {
		return "a local activity"
	}
	return fmt.Sprintf("%T", args[0])
}

// auditAll audits every host with grace 0 and checks that nothing was
// freed (no claim here is orphaned: every one belongs to the open workflow
// or is resident) and that every host's ledger verifies.
func (w *raceWorld) auditAll(t *testing.T, where string) {
	ctx := context.Background()
	hosts, err := w.led.Hosts(ctx)
	if err != nil {
		t.Error(err)
		return
	}
	for _, h := range hosts {
		res, err := w.acts.AuditHost(ctx, audit.AuditHostInput{Host: h, Grace: new(time.Duration)})
		w.audits++
		if err != nil {
			t.Errorf("%s: AuditHost(%s): %v", where, h, err)
			continue
		}
		for _, f := range res.Freed {
			t.Errorf("%s: the audit of %s freed %s claim %s of %s (owner %s): %s", where, h, f.State, f.ClaimID, f.Instance, f.Owner, f.Reason)
		}
		if len(res.Errors) > 0 {
			t.Errorf("%s: the audit of %s reported errors: %v", where, h, res.Errors)
		}
		snap, err := w.led.Snapshot(ctx, h)
		if err != nil {
			t.Error(err)
			continue
		}
		if err := snap.Verify(); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	}
}

// consistent checks that the ledger is exactly the instances' placements:
// every claim is committed and named by its instance on its host, and
// every instance on a host has its claim there with its placement.
func (w *raceWorld) consistent(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	named := map[string]bool{}
	for _, u := range w.uuids {
		inst, err := w.led.Instance(ctx, u)
		if err != nil {
			continue // deleted
		}
		if inst.Host == "" {
			if inst.ClaimID != "" || inst.Placement != nil {
				t.Errorf("instance %s has no host but claim %q, placement %v", u, inst.ClaimID, inst.Placement)
			}
			continue
		}
		named[inst.Host+"/"+inst.ClaimID] = true
		c, err := w.led.GetClaim(ctx, inst.Host, inst.ClaimID)
		if err != nil {
			t.Errorf("instance %s names claim %s on %s: %v", u, inst.ClaimID, inst.Host, err)
			continue
		}
		if diff := cmp.Diff(inst.Placement, c.Placement, cmp.Comparer(numa.CPUSet.Equal)); diff != "" {
			t.Errorf("instance %s placement differs from its claim's (-instance +claim):\n%s", u, diff)
		}
	}
	hosts, err := w.led.Hosts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		snap, err := w.led.Snapshot(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		if err := snap.Verify(); err != nil {
			t.Error(err)
		}
		for _, c := range snap.Claims {
			if c.State != ledger.StateCommitted || !named[h+"/"+c.ID] {
				t.Errorf("host %s holds %s claim %s of %s that no instance names", h, c.State, c.ID, c.InstanceUUID)
			}
		}
	}
}

// TestReconcileRacesEveryStep runs every workflow, on its success path and
// on the failure paths that compensate, with an audit of every host (grace
// 0) before and after each of its activities. The audit is told the truth
// (the workflow under test is open with its first run id, every other
// owner is gone), so it judges every claim; it must never free one, and
// each workflow must end with the ledger equal to the instances'
// placements.
func TestReconcileRacesEveryStep(t *testing.T) {
	w := newRaceWorld(t)
	ctx := context.Background()
	vmA, vmB := "0a000000-0000-4000-8000-00000000000a", "0b000000-0000-4000-8000-00000000000b"
	w.uuids = []string{vmA, vmB}
	flavor := guest.Flavor{VCPUs: 2, MemoryMB: 1024, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
	fault := func(host string, op sim.Op, times int) {
		if err := w.drv.SetFault(ctx, host, op, sim.Fault{Times: times}); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name    string
		uuid    string
		setup   func()
		wf, in  any
		wantErr bool
	}{
		{"boot A on a", vmA, nil, Boot, api.BootInput{UUID: vmA, Name: "A", Flavor: flavor, Host: "a"}, false},
		{"boot B on b", vmB, nil, Boot, api.BootInput{UUID: vmB, Name: "B", Flavor: flavor, Host: "b"}, false},
		{"migrate A to b", vmA, nil, LiveMigration, api.LiveMigrationInput{UUID: vmA, Dest: "b"}, false},
		{"migrate A to a, migrate step fails", vmA, func() { fault("b", sim.OpMigrate, 10) }, LiveMigration, api.LiveMigrationInput{UUID: vmA, Dest: "a"}, true},
		{"offload A", vmA, func() { fault("b", sim.OpMigrate, 0) }, ShelveOffload, api.ShelveOffloadInput{UUID: vmA}, false},
		{"unshelve A on a, spawn fails", vmA, func() { fault("a", sim.OpStart, 10) }, Unshelve, api.UnshelveInput{UUID: vmA, Host: "a"}, true},
		{"unshelve A on a", vmA, func() { fault("a", sim.OpStart, 0) }, Unshelve, api.UnshelveInput{UUID: vmA, Host: "a"}, false},
		{"delete A", vmA, nil, Delete, api.DeleteInput{UUID: vmA}, false},
		{"delete B", vmB, nil, Delete, api.DeleteInput{UUID: vmB}, false},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.setup != nil {
				st.setup()
			}
			err := w.run(t, st.uuid, st.wf, st.in)
			if (err != nil) != st.wantErr {
				t.Fatalf("%s: error %v, want error %v", st.name, err, st.wantErr)
			}
			w.consistent(t)
		})
	}
	if w.audits < 100 {
		t.Errorf("ran %d host audits across the workflows, want one per host at every step boundary (100 or more)", w.audits)
	}
}

// TestReconcileRaceDetects is the control of the race test: told that the
// migration's owner is gone, the same audit at the same step would free
// the destination claim. Only the owner's answer protects it.
func TestReconcileRaceDetects(t *testing.T) {
	w := newRaceWorld(t)
	vm := "0c000000-0000-4000-8000-00000000000c"
	w.uuids = []string{vm}
	flavor := guest.Flavor{VCPUs: 2, MemoryMB: 1024, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
	if err := w.run(t, vm, Boot, api.BootInput{UUID: vm, Name: "C", Flavor: flavor, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	env := s.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: guest.InstanceWorkflowID(vm)})
	env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{&firstRun{id: "control"}}, DeadlockDetectionTimeout: loadedMachine})
	env.RegisterActivity(w.acts)
	wouldFree := 0
	var step string
	env.SetOnLocalActivityStartedListener(func(_ *activity.Info, _ context.Context, args []any) { step = localStep(args) })
	env.SetOnLocalActivityCompletedListener(func(*activity.Info, converter.EncodedValue, error) {
		if step != "activities.ClaimInput" {
			return
		}
		w.owners.mu.Lock()
		w.owners.override = &audit.OwnerStatus{State: audit.OwnerNotFound}
		w.owners.mu.Unlock()
		defer func() {
			w.owners.mu.Lock()
			w.owners.override = nil
			w.owners.mu.Unlock()
		}()
		res, err := w.acts.AuditHost(context.Background(), audit.AuditHostInput{Host: "b", Grace: new(time.Duration), DryRun: true})
		if err != nil {
			t.Error(err)
			return
		}
		wouldFree = res.Tally.Freed.Of(audit.FreedOwnerNotFound)
	})
	env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: vm, Dest: "b"})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if wouldFree != 1 {
		t.Errorf("a dry-run audit told the owner is gone would free %d claims on b after the claim step, want 1 (the destination claim)", wouldFree)
	}
	w.consistent(t)
}
