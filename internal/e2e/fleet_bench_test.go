package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	pclient "github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// The fleet of BenchmarkFleet: hosts of 64 pCPUs, each with 20 guests of
// 2 pCPUs, so a host has room for a dozen more.
const (
	fleetGuestsPerHost = 20
	fleetClients       = 16
)

// fleetFlavor is the seeded guests' flavor; a resize alternates between
// it and twice its vCPUs.
var fleetFlavor = guest.Flavor{VCPUs: 2, MemoryMB: 2048, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}

// The kinds of operation the fleet's clients run, with their weights.
var fleetMix = []struct {
	kind   string
	weight int
}{{"boot", 2}, {"delete", 2}, {"live-migrate", 4}, {"resize", 2}}

// BenchmarkFleet runs an operator's fleet: 1,000 simulated hosts
// (PINFLOW_BENCH_FLEET_HOSTS) holding 20,000 guests, and 16 clients
// keeping a steady mix of boots, deletes, live migrations and resizes
// (confirmed by their window) in flight through pinflow's client, with a
// drain of one host a third of the way in, for 3 minutes
// (PINFLOW_BENCH_FLEET_DURATION). It runs twice on a fresh stack of the
// real worker each time: with the audit on its production schedule (every
// minute) and with it off, and prints for each operations per second and
// each kind's p50 and p99, then the audit's cost as the ratio of the two.
func BenchmarkFleet(b *testing.B) {
	hosts := 1000
	if v := os.Getenv("PINFLOW_BENCH_FLEET_HOSTS"); v != "" {
		fmt.Sscan(v, &hosts)
	}
	duration := 3 * time.Minute
	if v := os.Getenv("PINFLOW_BENCH_FLEET_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("PINFLOW_BENCH_FLEET_DURATION=%q: %v", v, err)
		}
		duration = d
	}
	off := runFleet(b, hosts, duration, "0")
	on := runFleet(b, hosts, duration, "1m")
	// The report goes to stdout: a benchmark's log keeps only its first
	// lines.
	fmt.Printf("%d hosts, %d guests, %d clients, %s each run\naudit off: %s\naudit on:  %s\n",
		hosts, hosts*fleetGuestsPerHost, fleetClients, duration, off, on)
	for _, k := range append(fleetKinds(), "all") {
		_, p99off := percentiles(off.took[k])
		_, p99on := percentiles(on.took[k])
		if p99off > 0 {
			fmt.Printf("%s: p99 with the audit / without: %.2f\n", k, p99on/p99off)
			b.ReportMetric(p99on/p99off, k+"-p99-ratio")
		}
	}
	b.ReportMetric(off.perSec(), "ops/s-audit-off")
	b.ReportMetric(on.perSec(), "ops/s-audit-on")
}

func fleetKinds() []string {
	var kinds []string
	for _, m := range fleetMix {
		kinds = append(kinds, m.kind)
	}
	return kinds
}

// fleetRun is what one run measured.
type fleetRun struct {
	wall   time.Duration
	took   map[string][]time.Duration // by kind, and "all"
	failed map[string]int
	errors []string // the first few failures
	drain  string
	audits []time.Duration // the completed audits' wall times
}

func (r *fleetRun) perSec() float64 { return float64(len(r.took["all"])) / r.wall.Seconds() }

func (r *fleetRun) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d operations in %s, %.1f/s; audits: %d %v; %s", len(r.took["all"]), r.wall.Round(time.Second), r.perSec(), len(r.audits), r.audits, r.drain)
	for _, k := range append(fleetKinds(), "all") {
		p50, p99 := percentiles(r.took[k])
		fmt.Fprintf(&b, "\n  %-13s %5d done, %3d failed, p50 %7.1f ms, p99 %7.1f ms", k, len(r.took[k]), r.failed[k], p50, p99)
	}
	for _, e := range r.errors {
		fmt.Fprintf(&b, "\n  failure: %s", e)
	}
	return b.String()
}

// fleetGuests are the guests no client is working on, with their vCPUs.
type fleetGuests struct {
	mu    sync.Mutex
	uuids []string
	vcpus map[string]int
}

// take removes a guest at random, or returns "" when none is free.
func (g *fleetGuests) take(rng *rand.Rand) (string, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.uuids) == 0 {
		return "", 0
	}
	i := rng.IntN(len(g.uuids))
	u := g.uuids[i]
	g.uuids[i] = g.uuids[len(g.uuids)-1]
	g.uuids = g.uuids[:len(g.uuids)-1]
	return u, g.vcpus[u]
}

// put gives a guest back, with its vCPUs now.
func (g *fleetGuests) put(u string, vcpus int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.uuids = append(g.uuids, u)
	g.vcpus[u] = vcpus
}

// runFleet runs the fleet on a fresh stack whose workers audit every
// interval ("0": never).
func runFleet(b *testing.B, hosts int, duration time.Duration, interval string) *fleetRun {
	ctx := context.Background()
	s := newStack(b, "PINFLOW_RECONCILE_INTERVAL="+interval)
	guests := &fleetGuests{vcpus: map[string]int{}}
	led, names := seedFleet(b, s, "fleet-%05d", hosts, fleetGuestsPerHost, guests.put)

	pc := pclient.New(led, s.tc, s.envOf("PINFLOW_TEMPORAL_TASK_QUEUE"))
	run := &fleetRun{took: map[string][]time.Duration{}, failed: map[string]int{}}
	var mu sync.Mutex
	record := func(kind string, took time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			run.failed[kind]++
			if len(run.errors) < 5 {
				run.errors = append(run.errors, fmt.Sprintf("%s: %v", kind, err))
			}
			return
		}
		run.took[kind] = append(run.took[kind], took)
		run.took["all"] = append(run.took["all"], took)
	}
	// finish waits for op's workflow to end.
	finish := func(op *pclient.Operation, err error) error {
		if err != nil {
			return err
		}
		return s.tc.GetWorkflow(ctx, op.WorkflowID, op.RunID).Get(ctx, nil)
	}
	var booted atomic.Int64
	operate := func(rng *rand.Rand, kind string) {
		t0 := time.Now()
		switch kind {
		case "boot":
			op, err := pc.Boot(ctx, pclient.BootRequest{Name: fmt.Sprintf("fleet-new-%d", booted.Add(1)), Flavor: fleetFlavor})
			err = finish(op, err)
			record(kind, time.Since(t0), err)
			if err == nil {
				guests.put(op.UUID, fleetFlavor.VCPUs)
			}
			return
		}
		u, vcpus := guests.take(rng)
		if u == "" {
			return
		}
		switch kind {
		case "delete":
			err := finish(pc.Delete(ctx, u))
			record(kind, time.Since(t0), err)
			if err != nil {
				guests.put(u, vcpus)
			}
		case "live-migrate":
			err := finish(pc.Migrate(ctx, u, pclient.MigrateRequest{}))
			record(kind, time.Since(t0), err)
			guests.put(u, vcpus)
		case "resize":
			to := 3*fleetFlavor.VCPUs - vcpus // 2 <-> 4
			err := finish(pc.Resize(ctx, u, pclient.ResizeRequest{VCPUs: to, MemoryMB: fleetFlavor.MemoryMB,
				ExtraSpecs: fleetFlavor.ExtraSpecs, ConfirmWindow: time.Millisecond}))
			record(kind, time.Since(t0), err)
			if err != nil {
				to = vcpus
			}
			guests.put(u, to)
		}
	}

	total := 0
	for _, m := range fleetMix {
		total += m.weight
	}
	start := time.Now()
	deadline := start.Add(duration)
	var wg sync.WaitGroup
	for c := range fleetClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for time.Now().Before(deadline) {
				n := rng.IntN(total)
				for _, m := range fleetMix {
					if n -= m.weight; n < 0 {
						operate(rng, m.kind)
						break
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(duration / 3)
		host := names[len(names)/2]
		t0 := time.Now()
		dr, err := pc.Drain(ctx, api.DrainInput{Host: host, Reason: "fleet benchmark"})
		var res api.DrainResult
		if err == nil {
			err = s.tc.GetWorkflow(ctx, dr.WorkflowID, dr.RunID).Get(ctx, &res)
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			run.drain = fmt.Sprintf("drain of %s failed after %s: %v", host, time.Since(t0).Round(time.Millisecond), err)
			return
		}
		run.drain = fmt.Sprintf("drain of %s (%d guests moved, %d failed) in %s", host, res.Moved, res.Failed, time.Since(t0).Round(time.Millisecond))
		for _, g := range res.Guests {
			if g.Error != "" {
				run.drain += fmt.Sprintf("; a failed move: %s", g.Error)
				break
			}
		}
	}()
	wg.Wait()
	run.wall = time.Since(start)
	audits, err := s.tc.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: "WorkflowType = 'Reconcile'"})
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range audits.GetExecutions() {
		if e.GetCloseTime() != nil {
			run.audits = append(run.audits, e.GetCloseTime().AsTime().Sub(e.GetStartTime().AsTime()))
		}
	}
	sort.Strings(run.errors)
	return run
}

// seedFleet registers hosts named by format with the simulator and the
// ledger, each with perHost guests of fleetFlavor booted directly (their
// owner's run long closed), and returns the ledger, closed when b ends,
// and the hosts' names; seeded sees every guest.
func seedFleet(b *testing.B, s *stack, format string, hosts, perHost int, seeded func(uuid string, vcpus int)) (*ledger.Ledger, []string) {
	ctx := context.Background()
	led, rdb, err := ledger.Open(ctx, s.redisConfig)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rdb.Close() })
	drv := s.simulator()
	acts := &activities.Activities{Ledger: led, Driver: drv}
	topo, err := numa.Uniform(numa.UniformSpec{Cells: 2, Cores: 16, Threads: 2, MemoryMB: 1 << 18})
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, hosts)
	for i := range names {
		names[i] = fmt.Sprintf(format, i)
	}
	var seedErr atomic.Value
	t0 := time.Now()
	parallel(names, 32, func(i int, h string) {
		if err := drv.AddHost(ctx, h, topo); err != nil {
			seedErr.Store(err)
			return
		}
		if _, err := led.RegisterHost(ctx, h, topo); err != nil {
			seedErr.Store(err)
			return
		}
		for j := range perHost {
			u := newGuestUUID(i*perHost + j)
			if err := bootDirect(ctx, acts, h, u, fleetFlavor); err != nil {
				seedErr.Store(fmt.Errorf("seed guest %s on %s: %w", u, h, err))
				return
			}
			seeded(u, fleetFlavor.VCPUs)
		}
	})
	if err, _ := seedErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("seeded %d hosts with %d guests each in %s\n", hosts, perHost, time.Since(t0).Round(time.Second))
	return led, names
}
