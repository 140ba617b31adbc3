package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/workflows"
)

// BenchmarkDrain drains a host of 40 pinned guests onto 200 empty hosts
// through a real dev server (simulated hypervisor, no latency) at
// parallelism 1, 5 and 20, and reports each drain's wall time: planning,
// reservations and the moves. Between drains the guests go back.
func BenchmarkDrain(b *testing.B) {
	const guests, targets = 40, 200
	ctx := context.Background()
	redis := testenv.StartRedis(b)
	temporal := testenv.StartTemporal(b)
	led, rdb, err := ledger.Open(ctx, ledger.Config{URL: redis.URL()})
	if err != nil {
		b.Fatal(err)
	}
	defer rdb.Close()
	drv := sim.New(rdb, sim.Options{})
	big, err := numa.Uniform(numa.UniformSpec{Cells: 2, Cores: 24, Threads: 2, MemoryMB: 1 << 18})
	if err != nil {
		b.Fatal(err)
	}
	small, err := numa.Uniform(numa.UniformSpec{Cells: 2, Cores: 4, Threads: 2, MemoryMB: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	add := func(name string, h *numa.Host) {
		if err := drv.AddHost(ctx, name, h); err != nil {
			b.Fatal(err)
		}
		if _, err := led.RegisterHost(ctx, name, h); err != nil {
			b.Fatal(err)
		}
	}
	add("src", big)
	for i := range targets {
		add(fmt.Sprintf("t%03d", i), small)
	}
	if err := api.RegisterSearchAttributes(ctx, temporal.Client.OperatorService(), temporal.Namespace); err != nil {
		b.Fatal(err)
	}
	const queue = "bench-drain"
	w := worker.New(temporal.Client, queue, workflows.Polling(worker.Options{}))
	for _, wf := range []any{workflows.Boot, workflows.LiveMigration, workflows.Resize, workflows.Drain} {
		w.RegisterWorkflow(wf)
	}
	w.RegisterActivity(&activities.Activities{Ledger: led, Driver: drv})
	if err := w.Start(); err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	start := func(id string, wf, in any) client.WorkflowRun {
		run, err := temporal.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue,
			WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL}, wf, in)
		if err != nil {
			b.Fatal(err)
		}
		return run
	}
	waitAll := func(runs []client.WorkflowRun) {
		for _, r := range runs {
			if err := r.Get(ctx, nil); err != nil {
				b.Fatalf("%s: %v", r.GetID(), err)
			}
		}
	}
	flavor := guest.Flavor{VCPUs: 2, MemoryMB: 1024, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
	uuids := make([]string, guests)
	var runs []client.WorkflowRun
	for i := range uuids {
		uuids[i] = newGuestUUID(1000 + i)
		runs = append(runs, start(guest.InstanceWorkflowID(uuids[i]), workflows.Boot,
			api.BootInput{UUID: uuids[i], Name: fmt.Sprintf("g%d", i), Flavor: flavor, Host: "src"}))
	}
	waitAll(runs)

	for _, parallel := range []int{1, 5, 20} {
		t0 := time.Now()
		var res api.DrainResult
		run := start(fmt.Sprintf("%s-%d", api.DrainWorkflowID("src"), parallel), workflows.Drain,
			api.DrainInput{Host: "src", Parallel: parallel})
		if err := run.Get(ctx, &res); err != nil {
			b.Fatal(err)
		}
		took := time.Since(t0)
		if res.Moved != guests {
			b.Fatalf("drain at parallelism %d moved %d of %d guests: %+v", parallel, res.Moved, guests, res.Guests)
		}
		fmt.Printf("drain of a %d-guest host onto %d hosts, parallelism %2d: %6.1f s (%.1f moves/s)\n",
			guests, targets, parallel, took.Seconds(), float64(guests)/took.Seconds())
		b.ReportMetric(took.Seconds(), fmt.Sprintf("s-at-parallel-%d", parallel))

		// Back onto the source for the next drain.
		if _, err := led.SetHostEnabled(ctx, "src"); err != nil {
			b.Fatal(err)
		}
		runs = runs[:0]
		for _, u := range uuids {
			runs = append(runs, start(guest.InstanceWorkflowID(u), workflows.LiveMigration, api.LiveMigrationInput{UUID: u, Dest: "src"}))
		}
		waitAll(runs)
	}
}
