package e2e

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/workflows"
)

// BenchmarkAuditFleet audits a fleet of simulated hosts (20,000, or
// PINFLOW_BENCH_AUDIT_HOSTS) through the Reconcile workflow, one guest on
// every tenth host, in pages of the default size: on a dev server and one
// redis-server with one worker, or, under PINFLOW_E2E_TARGET=cluster, on
// the cluster with three workers and every ledger change waiting for a
// replica. It reports the audit's wall time, the history events of its
// run and of its largest page, and next to them the floor: the same
// ledger and hypervisor reads, host by host at the same concurrency, with
// no decision and no Temporal.
func BenchmarkAuditFleet(b *testing.B) {
	hosts := 20000
	if v := os.Getenv("PINFLOW_BENCH_AUDIT_HOSTS"); v != "" {
		fmt.Sscan(v, &hosts)
	}
	ctx := context.Background()
	redisConfig, clients, namespace := benchBackend(b)
	tc := clients[0]
	led, rdb, err := ledger.Open(ctx, redisConfig)
	if err != nil {
		b.Fatal(err)
	}
	defer rdb.Close()
	drv := sim.New(rdb, sim.Options{})
	acts := &activities.Activities{Ledger: led, Driver: drv,
		Audit: &audit.Auditor{Ledger: led, Driver: drv, Owners: audit.TemporalOwners{Client: tc, Namespace: namespace}}}
	topo, err := numa.Uniform(numa.UniformSpec{Cells: 2, Cores: 8, Threads: 2, MemoryMB: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, hosts)
	for i := range names {
		names[i] = fmt.Sprintf("fleet-%05d", i)
	}
	flavor := guest.Flavor{VCPUs: 2, MemoryMB: 1024, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
	setup := time.Now()
	var failed atomic.Bool
	parallel(names, 16, func(i int, h string) {
		if err := drv.AddHost(ctx, h, topo); err != nil {
			b.Error(err)
			failed.Store(true)
			return
		}
		if _, err := led.RegisterHost(ctx, h, topo); err != nil {
			b.Error(err)
			failed.Store(true)
			return
		}
		if i%10 == 0 {
			if err := bootDirect(ctx, acts, h, newGuestUUID(500000+i), flavor); err != nil {
				b.Error(err)
				failed.Store(true)
			}
		}
	})
	if failed.Load() {
		b.FailNow()
	}
	b.Logf("setup: %d hosts, %d guests in %s", hosts, (hosts+9)/10, time.Since(setup).Round(time.Millisecond))

	if err := api.RegisterSearchAttributes(ctx, tc.OperatorService(), namespace); err != nil {
		b.Fatal(err)
	}
	const queue = "bench-audit"
	for _, c := range clients {
		w := worker.New(c, queue, workflows.Polling(worker.Options{}))
		w.RegisterWorkflow(workflows.Reconcile)
		w.RegisterActivity(acts)
		if err := w.Start(); err != nil {
			b.Fatal(err)
		}
		defer w.Stop()
	}

	zero := time.Duration(0)
	b.ResetTimer()
	for n := range b.N {
		id := fmt.Sprintf("%s-bench-%d", api.ReconcileWorkflowIDPrefix, n)
		t0 := time.Now()
		run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue}, workflows.Reconcile,
			api.ReconcileInput{Grace: &zero})
		if err != nil {
			b.Fatal(err)
		}
		var res api.ReconcileResult
		if err := run.Get(ctx, &res); err != nil {
			b.Fatal(err)
		}
		took := time.Since(t0)
		b.StopTimer()
		if res.Audited != hosts || res.Total.Errors != 0 || res.Total.Freed.Total() != 0 || res.Total.Claims != (hosts+9)/10 {
			b.Fatalf("audit of %d hosts: audited %d, total %+v; want every host, one claim on every tenth, nothing freed, no error", hosts, res.Audited, res.Total)
		}
		events := historyLength(ctx, b, tc, id)
		page := 0
		for p := 1; p <= res.Pages; p++ {
			page = max(page, historyLength(ctx, b, tc, fmt.Sprintf("%s-page-%d", id, p)))
		}
		f0 := time.Now()
		parallel(names, api.DefaultReconcileConcurrency, func(_ int, h string) {
			if _, err := led.Snapshot(ctx, h); err != nil {
				b.Error(err)
			}
			if _, err := drv.Domains(ctx, h); err != nil {
				b.Error(err)
			}
		})
		floor := time.Since(f0)
		fmt.Printf("audit of %d hosts: %.1f s in %d pages; %d history events in its run, at most %d in a page; floor (same reads, no decisions, no Temporal): %.1f s\n",
			hosts, took.Seconds(), res.Pages, events, page, floor.Seconds())
		b.ReportMetric(took.Seconds(), "audit-s")
		b.ReportMetric(floor.Seconds(), "floor-s")
		b.ReportMetric(float64(events), "run-events")
		b.ReportMetric(float64(page), "page-events")
		b.StartTimer()
	}
}

// bootDirect books a guest on host through the activities a Boot runs,
// with an owner that closed long ago.
func bootDirect(ctx context.Context, acts *activities.Activities, host, uuid string, flavor guest.Flavor) error {
	if _, err := acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: uuid, Name: "g-" + uuid[len(uuid)-6:], Flavor: flavor}); err != nil {
		return err
	}
	c, err := acts.Claim(ctx, activities.ClaimInput{Host: host, ClaimID: "boot-" + uuid, UUID: uuid, Kind: ledger.KindBoot,
		Owner: activities.Owner{WorkflowID: guest.InstanceWorkflowID(uuid), FirstRunID: "closed-" + uuid}, Flavor: flavor})
	if err != nil {
		return err
	}
	if err := acts.Spawn(ctx, activities.SpawnInput{UUID: uuid, Host: host, Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
		return err
	}
	return acts.Attach(ctx, activities.AttachInput{UUID: uuid, Host: host, ClaimID: c.ClaimID})
}

// historyLength counts the events of the workflow's latest run.
func historyLength(ctx context.Context, b *testing.B, c client.Client, id string) int {
	it := c.GetWorkflowHistory(ctx, id, "", false, 0)
	n := 0
	for it.HasNext() {
		if _, err := it.Next(); err != nil {
			b.Fatal(err)
		}
		n++
	}
	return n
}

// parallel runs f for every item, n at a time.
func parallel(items []string, n int, f func(i int, item string)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(items) {
					return
				}
				f(i, items[i])
			}
		}()
	}
	wg.Wait()
}
