package e2e

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/api"
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
	// The first workflow tasks of each side: how long they queued in
	// Temporal before any of pinflow's steps ran.
	var bootQueue, bareQueue firstTasks
	for round := range b.N {
		bootID := func(i int) string { return guest.InstanceWorkflowID(newGuestUUID(round*burstBoots + i)) }
		took, wall := burst(burstBoots, workflows.Boot, func(i int) (string, any) {
			uuid := newGuestUUID(round*burstBoots + i)
			return bootID(i), api.BootInput{UUID: uuid, Name: fmt.Sprintf("g%d", i), Flavor: flavor, Host: hosts[i%len(hosts)]}
		})
		boots, bootWall = append(boots, took...), bootWall+wall
		bootQueue.add(readFirstTasks(b, tc, burstBoots, bootID))
		// The steps a boot on a given host runs: create, claim, spawn, attach.
		bareID := func(i int) string { return fmt.Sprintf("bare-%d-%d", round, i) }
		took, wall = burst(burstBoots, bareWorkflow, func(i int) (string, any) { return bareID(i), 4 })
		bare, bareWall = append(bare, took...), bareWall+wall
		bareQueue.add(readFirstTasks(b, tc, burstBoots, bareID))
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
	b.ReportMetric(ms(bootQueue.slowest), "slowest-first-task-wait-ms")
	b.ReportMetric(ms(bootQueue.stall), "longest-stall-ms")
	b.ReportMetric(float64(bootQueue.lost), "lost-first-tasks")
	b.ReportMetric(ms(bootQueue.longestTask), "longest-workflow-task-ms")
	b.ReportMetric(float64(bootQueue.timedOut), "workflow-tasks-timed-out")
	b.ReportMetric(ms(bareQueue.slowest), "bare-slowest-first-task-wait-ms")
	b.ReportMetric(ms(bareQueue.stall), "bare-longest-stall-ms")
	b.ReportMetric(float64(bareQueue.lost), "bare-lost-first-tasks")
	b.ReportMetric(float64(counted.pinflow.Load()), "redispatched-steps")
	b.ReportMetric(float64(counted.bare.Load()), "redispatched-bare-activities")
	b.Logf("%d boots at once onto %d hosts: %.1f/s, each p50 %.0f ms, p99 %.0f ms (first workflow tasks: %s); as many bare workflows of 4 no-op activities: %.1f/s, p50 %.0f ms, p99 %.0f ms (%s); ratio %.2f",
		burstBoots, len(hosts), bootsPerSec, boot50, boot99, bootQueue, barePerSec, bare50, bare99, bareQueue, bootsPerSec/barePerSec)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// firstTasks sums up how a burst's first workflow tasks were dispatched.
//
// slowest is the longest any workflow waited between its start and the
// start of its first workflow task that completed: the queue of a burst,
// which grows with its size and with how fast Temporal dispatches.
// stall is the longest time in which some workflow waited for its first
// task and none got one: a queue that stopped moving (a stall) rather
// than one that moved slowly. lost counts first tasks recorded as started
// that timed out, never delivered to a worker (docs/benchmarks.md, "Lost
// dispatches"). Of every workflow task of the burst, longestTask is the
// longest from its start to its completion, the margin a workflow task
// timeout must keep, and timedOut counts those that timed out after they
// started (lost, or slower than the timeout), first tasks included.
type firstTasks struct {
	slowest, stall, longestTask time.Duration
	lost, timedOut              int
}

func (f *firstTasks) add(g firstTasks) {
	f.slowest, f.stall, f.longestTask = max(f.slowest, g.slowest), max(f.stall, g.stall), max(f.longestTask, g.longestTask)
	f.lost, f.timedOut = f.lost+g.lost, f.timedOut+g.timedOut
}

func (f firstTasks) String() string {
	return fmt.Sprintf("the slowest waited %.1f s, the queue stood still for at most %.2f s, %d lost; the longest workflow task took %.2f s, %d timed out",
		f.slowest.Seconds(), f.stall.Seconds(), f.lost, f.longestTask.Seconds(), f.timedOut)
}

// readFirstTasks reads the workflow tasks of the n workflows named by id
// from their histories.
func readFirstTasks(b *testing.B, tc client.Client, n int, id func(int) string) firstTasks {
	runs, errs := make([]taskTimes, n), make([]error, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				runs[i], errs[i] = readTaskTimes(tc, id(i))
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	var f firstTasks
	started, first := make([]time.Time, n), make([]time.Time, n)
	for i, r := range runs {
		started[i], first[i] = r.started, r.first
		f.slowest, f.longestTask = max(f.slowest, r.first.Sub(r.started)), max(f.longestTask, r.longestTask)
		f.lost, f.timedOut = f.lost+r.lost, f.timedOut+r.timedOut
	}
	f.stall = longestStall(started, first)
	return f
}

// taskTimes are the workflow tasks of one run: when it started, when its
// first workflow task that completed started, how many attempts of that
// task timed out before it, how many of all its tasks timed out after
// they started, and the longest any took from its start to its
// completion.
type taskTimes struct {
	started, first time.Time
	delivered      bool // a workflow task completed
	lost, timedOut int
	longestTask    time.Duration
}

// readTaskTimes reads the workflow tasks of the workflow id's latest run
// from its history.
func readTaskTimes(tc client.Client, id string) (taskTimes, error) {
	var r taskTimes
	var taskStarted time.Time
	it := tc.GetWorkflowHistory(context.Background(), id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return r, err
		}
		at := ev.GetEventTime().AsTime()
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
			r.started = at
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED:
			taskStarted = at
			if !r.delivered {
				r.first = at
			}
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
			// Not those a sticky queue's worker left waiting: Temporal
			// hands them to any worker at once.
			if ev.GetWorkflowTaskTimedOutEventAttributes().GetTimeoutType() != enumspb.TIMEOUT_TYPE_START_TO_CLOSE {
				break
			}
			r.timedOut++
			if !r.delivered {
				r.lost++
			}
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
			r.longestTask = max(r.longestTask, at.Sub(taskStarted))
			r.delivered = true
		}
	}
	if !r.delivered {
		return r, fmt.Errorf("%s: no workflow task completed", id)
	}
	return r, nil
}

// longestStall is the longest time in which at least one workflow had
// started and not yet got its first task, and no workflow got its first
// task. started[i] and first[i] are workflow i's.
func longestStall(started, first []time.Time) time.Duration {
	order := make([]int, len(first))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return first[order[a]].Before(first[order[b]]) })
	// waitingSince[k]: the earliest start among the workflows whose first
	// task came k-th or later; just before the k-th first task, that one
	// has waited since then, unless an earlier first task came after it.
	waitingSince := make([]time.Time, len(order)+1)
	for k := len(order) - 1; k >= 0; k-- {
		waitingSince[k] = started[order[k]]
		if k+1 < len(order) && waitingSince[k+1].Before(waitingSince[k]) {
			waitingSince[k] = waitingSince[k+1]
		}
	}
	var stall time.Duration
	for k, i := range order {
		since := waitingSince[k]
		if k > 0 && first[order[k-1]].After(since) {
			since = first[order[k-1]]
		}
		stall = max(stall, first[i].Sub(since))
	}
	return stall
}

func TestLongestStall(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(0, 0).Add(time.Duration(s * float64(time.Second))) }
	for _, c := range []struct {
		name           string
		started, first []float64
		want           float64
	}{
		{"one workflow waits from its start", []float64{1}, []float64{4}, 3},
		{"a queue that moves", []float64{0, 0, 0, 0}, []float64{1, 2, 3, 4}, 1},
		{"a queue that stops", []float64{0, 0, 0, 0}, []float64{0.5, 1, 9, 9.5}, 8},
		{"an idle time is no stall", []float64{0, 10}, []float64{1, 12}, 2},
		{"the stall ends a wait that began before the last task", []float64{0, 1, 2}, []float64{3, 3.5, 7}, 3.5},
	} {
		t.Run(c.name, func(t *testing.T) {
			started, first := make([]time.Time, len(c.started)), make([]time.Time, len(c.first))
			for i := range started {
				started[i], first[i] = at(c.started[i]), at(c.first[i])
			}
			if got := longestStall(started, first); got != time.Duration(c.want*float64(time.Second)) {
				t.Errorf("longestStall = %v, want %vs", got, c.want)
			}
		})
	}
}
