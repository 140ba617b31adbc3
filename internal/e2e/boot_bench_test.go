package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/workflows"
)

// burstBoots is the size of a mass boot: a tenant's autoscaling group
// coming up, or a cloud starting again after an outage.
const burstBoots = 500

// BenchmarkBootBurst starts 500 boots at once onto four hosts (every
// claim of a host contends for the same ledger key) and reports boots per
// second until the last completes, with each boot's p50 and p99, against
// the ceiling in the same run: as many bare workflows of as many no-op
// activities, started at once. It runs on a dev server and one
// redis-server with one worker (or the cluster, under
// PINFLOW_E2E_TARGET=cluster).
func BenchmarkBootBurst(b *testing.B) {
	ctx := context.Background()
	redisConfig, clients, namespace := benchBackend(b)
	tc := clients[0]
	led, rdb, err := ledger.Open(ctx, redisConfig)
	if err != nil {
		b.Fatal(err)
	}
	defer rdb.Close()
	drv := sim.New(rdb, sim.Options{})
	hosts := []string{"h0", "h1", "h2", "h3"}
	host, err := numa.Uniform(numa.UniformSpec{Cells: 2, Cores: 64 * b.N, Threads: 1, MemoryMB: 1 << 22})
	if err != nil {
		b.Fatal(err)
	}
	const queue = "bench-boot"
	counted := benchWorkers(b, clients, namespace, queue, led, drv, drv, hosts, host, workflows.Boot)

	// burst starts n workflows at once and returns how long each took and
	// how long until the last completed.
	burst := func(n int, wf any, input func(i int) (string, any)) ([]time.Duration, time.Duration) {
		var wg sync.WaitGroup
		took := make([]time.Duration, n)
		t0 := time.Now()
		for i := range n {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				id, in := input(i)
				start := time.Now()
				run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue,
					WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL}, wf, in)
				if err == nil {
					err = run.Get(ctx, nil)
				}
				if err != nil {
					b.Errorf("%s: %v", id, err)
				}
				took[i] = time.Since(start)
			}(i)
		}
		wg.Wait()
		return took, time.Since(t0)
	}
	flavor := guest.Flavor{VCPUs: 1, MemoryMB: 64, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
	var boots, bare []time.Duration
	var bootWall, bareWall time.Duration
	// How long the slowest boot, and the slowest bare workflow, waited
	// for its first workflow task: time in Temporal's queue, before any of
	// pinflow's steps.
	var firstTaskWait, bareFirstTaskWait time.Duration
	for round := range b.N {
		took, wall := burst(burstBoots, workflows.Boot, func(i int) (string, any) {
			uuid := newGuestUUID(round*burstBoots + i)
			return guest.InstanceWorkflowID(uuid), workflows.BootInput{UUID: uuid, Name: fmt.Sprintf("g%d", i), Flavor: flavor, Host: hosts[i%len(hosts)]}
		})
		boots, bootWall = append(boots, took...), bootWall+wall
		firstTaskWait = max(firstTaskWait, firstTaskWaited(b, tc, guest.InstanceWorkflowID(newGuestUUID(round*burstBoots+slowest(took)))))
		// The steps a boot on a given host runs: create, claim, spawn, attach.
		bareID := func(i int) string { return fmt.Sprintf("bare-%d-%d", round, i) }
		took, wall = burst(burstBoots, bareWorkflow, func(i int) (string, any) { return bareID(i), 4 })
		bare, bareWall = append(bare, took...), bareWall+wall
		bareFirstTaskWait = max(bareFirstTaskWait, firstTaskWaited(b, tc, bareID(slowest(took))))
	}
	bootsPerSec := float64(len(boots)) / bootWall.Seconds()
	barePerSec := float64(len(bare)) / bareWall.Seconds()
	boot50, boot99 := percentiles(boots)
	bare50, bare99 := percentiles(bare)
	b.ReportMetric(bootsPerSec, "boots/s")
	b.ReportMetric(barePerSec, "ceiling-workflows/s")
	b.ReportMetric(bootsPerSec/barePerSec, "ratio")
	b.ReportMetric(boot50, "boot-p50-ms")
	b.ReportMetric(boot99, "boot-p99-ms")
	b.ReportMetric(float64(firstTaskWait.Milliseconds()), "slowest-first-task-wait-ms")
	b.ReportMetric(float64(bareFirstTaskWait.Milliseconds()), "bare-slowest-first-task-wait-ms")
	b.ReportMetric(float64(counted.pinflow.Load()), "redispatched-steps")
	b.ReportMetric(float64(counted.bare.Load()), "redispatched-bare-activities")
	b.Logf("%d boots at once onto %d hosts: %.1f/s, each p50 %.0f ms, p99 %.0f ms (the slowest waited %.1f s for its first workflow task); as many bare workflows of 4 no-op activities: %.1f/s, p50 %.0f ms, p99 %.0f ms (the slowest waited %.1f s); ratio %.2f",
		burstBoots, len(hosts), bootsPerSec, boot50, boot99, firstTaskWait.Seconds(), barePerSec, bare50, bare99, bareFirstTaskWait.Seconds(), bootsPerSec/barePerSec)
}

// slowest is the index of the longest of took.
func slowest(took []time.Duration) int {
	at := 0
	for i := range took {
		if took[i] > took[at] {
			at = i
		}
	}
	return at
}

// firstTaskWaited returns how long the workflow's latest run waited
// between its start and its first workflow task's start.
func firstTaskWaited(b *testing.B, tc client.Client, id string) time.Duration {
	it := tc.GetWorkflowHistory(context.Background(), id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var started time.Time
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			b.Fatal(err)
		}
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
			started = ev.GetEventTime().AsTime()
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED:
			return ev.GetEventTime().AsTime().Sub(started)
		}
	}
	return 0
}
