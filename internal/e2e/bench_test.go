package e2e

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/workflows"
)

// inFlight is how many operations the benchmarks keep running at once
// unless they say otherwise.
const inFlight = 32

// timedDriver measures the time the hypervisor itself spends migrating.
type timedDriver struct {
	hypervisor.Driver
	mu      sync.Mutex
	migrate map[string]time.Duration
}

func (d *timedDriver) Migrate(ctx context.Context, req hypervisor.MigrateRequest, progress func(hypervisor.Progress)) error {
	start := time.Now()
	err := d.Driver.Migrate(ctx, req, progress)
	d.mu.Lock()
	d.migrate[req.UUID] += time.Since(start)
	d.mu.Unlock()
	return err
}

// noop is an activity that does nothing, for the ceiling.
func noop(context.Context) error { return nil }

// bareWorkflow runs n no-op activities one after another: what a live
// migration costs Temporal without any of pinflow's work. Its activities
// are bounded as tightly as pinflow's remote steps are by their heartbeat
// timeout, so an attempt Temporal records as started but never delivers
// costs both sides of a comparison the same (docs/benchmarks.md, "Lost
// dispatches").
func bareWorkflow(ctx workflow.Context, n int) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 5 * time.Second})
	for i := 0; i < n; i++ {
		if err := workflow.ExecuteActivity(ctx, noop).Get(ctx, nil); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkLiveMigration measures completed live migrations per second
// (simulated hypervisor, no latency) with 32 and 128 in flight, against
// the ceiling in the same run: a bare workflow with as many no-op
// activities as a migration runs. It also reports the latency pinflow
// adds to one migration: the whole workflow minus the hypervisor's own
// migrate time. It runs on a dev server and one redis-server with one
// worker, or, under PINFLOW_E2E_TARGET=cluster, on the cluster
// deploy/cluster.sh runs with three workers, each with its own client of
// both frontends, and the ledger waiting for a replica of every change.
func BenchmarkLiveMigration(b *testing.B) {
	for _, n := range []int{inFlight, 4 * inFlight} {
		b.Run(fmt.Sprintf("in-flight-%d", n), func(b *testing.B) { benchLiveMigration(b, n) })
	}
}

// benchBackend starts what a benchmark runs on and returns the ledger's
// Redis config, one Temporal client per worker (the first also starts
// the workflows) and their namespace.
func benchBackend(b *testing.B) (ledger.Config, []client.Client, string) {
	if !onCluster() {
		redis := testenv.StartRedis(b)
		temporal := testenv.StartTemporal(b)
		return ledger.Config{URL: redis.URL()}, []client.Client{temporal.Client}, temporal.Namespace
	}
	cl := testenv.StartCluster(b)
	var clients []client.Client
	for range 3 {
		clients = append(clients, dialCluster(b, cl))
	}
	return clusterLedger(cl), clients, cl.Env["PINFLOW_TEMPORAL_NAMESPACE"]
}

func benchLiveMigration(b *testing.B, inFlight int) {
	ctx := context.Background()
	redisConfig, clients, namespace := benchBackend(b)
	tc := clients[0]
	led, rdb, err := ledger.Open(ctx, redisConfig)
	if err != nil {
		b.Fatal(err)
	}
	defer rdb.Close()
	drv := &timedDriver{Driver: sim.New(rdb, sim.Options{}), migrate: map[string]time.Duration{}}
	simDrv := drv.Driver.(*sim.Driver)

	// Two hosts, each with room for all guests: the guests move back and
	// forth between them.
	host, err := numa.Uniform(numa.UniformSpec{Cells: 2, Cores: inFlight, Threads: 1, MemoryMB: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	const queue = "bench"
	counted := benchWorkers(b, clients, namespace, queue, led, simDrv, drv, []string{"left", "right"}, host, workflows.Boot, workflows.LiveMigration)

	start := func(id string, wf, in any) client.WorkflowRun {
		run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue,
			WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL}, wf, in)
		if err != nil {
			b.Fatal(err)
		}
		return run
	}
	flavor := guest.Flavor{VCPUs: 1, MemoryMB: 64, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
	guests := make([]string, inFlight)
	where := make([]string, inFlight)
	var boots []client.WorkflowRun
	for i := range guests {
		guests[i] = newGuestUUID(i)
		where[i] = "left"
		boots = append(boots, start(guest.InstanceWorkflowID(guests[i]), workflows.Boot,
			api.BootInput{UUID: guests[i], Name: fmt.Sprintf("g%d", i), Flavor: flavor, Host: "left"}))
	}
	for _, r := range boots {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := r.Get(wctx, nil)
		cancel()
		if err != nil {
			d, derr := tc.DescribeWorkflow(ctx, r.GetID(), "")
			if derr == nil {
				for _, pa := range d.RawResponse.GetPendingActivities() {
					b.Logf("pending %s attempt %d: %v", pa.GetActivityType().GetName(), pa.GetAttempt(), pa.GetLastFailure().GetMessage())
				}
			}
			it := tc.GetWorkflowHistory(ctx, r.GetID(), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
			for it.HasNext() {
				ev, _ := it.Next()
				b.Logf("event %s %v", ev.GetEventType(), ev.GetWorkflowTaskFailedEventAttributes().GetFailure().GetMessage())
			}
			b.Fatalf("boot %s: %v", r.GetID(), err)
		}
	}

	// The activities a migration with a given destination runs: load,
	// task state, claim, prepare, migrate, commit.
	const steps = 6
	rounds := max(1, b.N/inFlight)
	var latencies []time.Duration
	migrationRound := func(int) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i, uuid := range guests {
			dst := map[string]string{"left": "right", "right": "left"}[where[i]]
			wg.Add(1)
			go func(i int, uuid, dst string) {
				defer wg.Done()
				t0 := time.Now()
				run := start(guest.InstanceWorkflowID(uuid), workflows.LiveMigration, api.LiveMigrationInput{UUID: uuid, Dest: dst})
				if err := run.Get(ctx, nil); err != nil {
					b.Error(err)
					return
				}
				total := time.Since(t0)
				drv.mu.Lock()
				migrate := drv.migrate[uuid]
				drv.migrate[uuid] = 0
				drv.mu.Unlock()
				mu.Lock()
				latencies = append(latencies, total-migrate)
				where[i] = dst
				mu.Unlock()
			}(i, uuid, dst)
		}
		wg.Wait()
	}
	ceilingRound := func(round int) {
		var wg sync.WaitGroup
		for i := 0; i < inFlight; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				run := start(fmt.Sprintf("bare-%d-%d", round, i), bareWorkflow, steps)
				if err := run.Get(ctx, nil); err != nil {
					b.Error(err)
				}
			}(i)
		}
		wg.Wait()
	}
	// Rounds alternate, so a server that slows as its history grows
	// slows both sides of the ratio alike.
	migrationsPerSec, ceilingPerSec := measurePaired(rounds, migrationRound, ceilingRound, inFlight)

	// One migration at a time: what pinflow adds to a migration when it is
	// not queueing behind 31 others.
	var solo []time.Duration
	for i := 0; i < min(40, max(8, b.N/8)); i++ {
		uuid := guests[i%inFlight]
		dst := map[string]string{"left": "right", "right": "left"}[where[i%inFlight]]
		t0 := time.Now()
		run := start(guest.InstanceWorkflowID(uuid), workflows.LiveMigration, api.LiveMigrationInput{UUID: uuid, Dest: dst})
		if err := run.Get(ctx, nil); err != nil {
			b.Fatal(err)
		}
		total := time.Since(t0)
		drv.mu.Lock()
		migrate := drv.migrate[uuid]
		drv.migrate[uuid] = 0
		drv.mu.Unlock()
		solo = append(solo, total-migrate)
		where[i%inFlight] = dst
	}

	var bare []time.Duration
	for i := 0; i < len(solo); i++ {
		t0 := time.Now()
		if err := start(fmt.Sprintf("bare-solo-%d", i), bareWorkflow, steps).Get(ctx, nil); err != nil {
			b.Fatal(err)
		}
		bare = append(bare, time.Since(t0))
	}

	loaded50, loaded99 := percentiles(latencies)
	bare50, _ := percentiles(bare)
	solo50, solo99 := percentiles(solo)
	b.ReportMetric(migrationsPerSec, "migrations/s")
	b.ReportMetric(ceilingPerSec, "ceiling-workflows/s")
	b.ReportMetric(migrationsPerSec/ceilingPerSec, "ratio")
	b.ReportMetric(solo50, "added-p50-ms")
	b.ReportMetric(solo99, "added-p99-ms")
	b.ReportMetric(loaded50, "added-loaded-p50-ms")
	b.Logf("%d migrations, %d in flight: %.1f/s; ceiling (%d no-op activities per workflow) %.1f/s; ratio %.2f",
		len(latencies), inFlight, migrationsPerSec, steps, ceilingPerSec, migrationsPerSec/ceilingPerSec)
	b.Logf("latency pinflow adds to one migration (workflow minus the hypervisor's migrate): alone p50 %.1f ms, p99 %.1f ms; with %d in flight p50 %.1f ms, p99 %.1f ms; a bare workflow of %d no-op activities alone takes p50 %.1f ms",
		solo50, solo99, inFlight, loaded50, loaded99, steps, bare50)
	b.ReportMetric(bare50, "bare-alone-p50-ms")
	b.ReportMetric(float64(counted.pinflow.Load()), "redispatched-steps")
	b.ReportMetric(float64(counted.bare.Load()), "redispatched-bare-activities")
	b.Logf("activity attempts recorded as started and never delivered, run again after their timeout: %d of pinflow's steps, %d of the bare workflows' activities",
		counted.pinflow.Load(), counted.bare.Load())
}

// benchWorkers adds hosts to the simulator and the ledger, registers the
// search attributes, and starts a worker on every client polling queue
// with wfs, the bare workflow and its no-op activity, and pinflow's
// activities on led and drv.
func benchWorkers(b *testing.B, clients []client.Client, namespace, queue string, led *ledger.Ledger, simDrv *sim.Driver, drv hypervisor.Driver,
	hosts []string, host *numa.Host, wfs ...any) *redispatches {
	ctx := context.Background()
	for _, h := range hosts {
		if err := simDrv.AddHost(ctx, h, host); err != nil {
			b.Fatal(err)
		}
		if _, err := led.RegisterHost(ctx, h, host); err != nil {
			b.Fatal(err)
		}
	}
	if err := api.RegisterSearchAttributes(ctx, clients[0].OperatorService(), namespace); err != nil {
		b.Fatal(err)
	}
	counted := &redispatches{}
	for _, c := range clients {
		w := worker.New(c, queue, workflows.Polling(worker.Options{Interceptors: []interceptor.WorkerInterceptor{counted}}))
		for _, wf := range wfs {
			w.RegisterWorkflow(wf)
		}
		w.RegisterWorkflow(bareWorkflow)
		w.RegisterActivity(noop)
		w.RegisterActivity(&activities.Activities{Ledger: led, Driver: drv})
		if err := w.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(w.Stop)
	}
	return counted
}

// redispatches counts the activity attempts after a first one, for the
// bare workflows and for pinflow's steps. Nothing in a benchmark fails an
// activity, so each is an attempt Temporal recorded as started and never
// delivered, run again after its timeout. A bare activity's next attempt
// is Temporal's retry; a step of pinflow's tries is dispatched again by
// its workflow as a new activity, so a remote step that runs a second time
// in the same run counts too (each runs once in a benchmark's operation).
type redispatches struct {
	interceptor.WorkerInterceptorBase
	bare, pinflow atomic.Int64
	seen          sync.Map // run id and activity type of pinflow's remote steps
}

func (r *redispatches) InterceptActivity(ctx context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	return &countingActivity{ActivityInboundInterceptorBase: interceptor.ActivityInboundInterceptorBase{Next: next}, r: r}
}

type countingActivity struct {
	interceptor.ActivityInboundInterceptorBase
	r *redispatches
}

func (c *countingActivity) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (any, error) {
	info := activity.GetInfo(ctx)
	switch {
	case info.ActivityType.Name == "noop":
		if info.Attempt > 1 {
			c.r.bare.Add(1)
		}
	case info.Attempt > 1:
		c.r.pinflow.Add(1)
	case !info.IsLocalActivity:
		if _, again := c.r.seen.LoadOrStore(info.WorkflowExecution.RunID+"/"+info.ActivityType.Name, true); again {
			c.r.pinflow.Add(1)
		}
	}
	return c.Next.ExecuteActivity(ctx, in)
}

// percentiles returns the p50 and p99 of ds in milliseconds.
func percentiles(ds []time.Duration) (p50, p99 float64) {
	if len(ds) == 0 {
		return 0, 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	at := func(p float64) float64 {
		return float64(ds[min(len(ds)-1, int(p*float64(len(ds))))].Microseconds()) / 1000
	}
	return at(0.50), at(0.99)
}

// measurePaired runs rounds of n operations of a and of b, alternating,
// and returns each one's operations per second.
func measurePaired(rounds int, a, b func(int), n int) (aPerSec, bPerSec float64) {
	var ta, tb time.Duration
	for r := 0; r < rounds; r++ {
		t0 := time.Now()
		a(r)
		ta += time.Since(t0)
		t0 = time.Now()
		b(r)
		tb += time.Since(t0)
	}
	return float64(rounds*n) / ta.Seconds(), float64(rounds*n) / tb.Seconds()
}

func newGuestUUID(i int) string {
	return fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
}
