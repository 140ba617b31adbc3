package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/workflows"
)

// Bounds of the randomized test, sized for a 2-core machine.
const (
	randomSlots    = 8                // guests operated on at once
	randomOps      = 64               // operations in all
	randomDeadline = 75 * time.Second // no new operation after this
)

// TestReconcileRandomized runs many concurrent boots, migrations,
// offloads, unshelves and deletes of pinned, floating and mixed guests on
// hosts with and without shared CPUs (chaosHostSets), with hypervisor
// faults injected, while an audit with no grace period runs every second.
// At every sample no pCPU a domain pins is within reach of another domain
// and every host's ledger verifies; a floating or mixed guest asked onto a
// host without shared CPUs is refused; no audit frees anything (no
// workflow here is terminated, so nothing is orphaned); and when
// everything has ended the ledger is exactly the instances' placements,
// and each running guest agrees with its record.
func TestReconcileRandomized(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	hosts := []string{"h0", "h1", "h2", "h3"}
	shared := map[string]bool{}
	for i, h := range hosts {
		sh, ded := chaosHostSets(i, 3)
		shared[h] = !sh.IsEmpty()
		s.ok(append([]string{"host", "add", h, "--cells", "2", "--memory-mb", "8192"}, hostSetArgs(3, sh, ded)...)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rdb := s.redisClient()
	defer rdb.Close()
	led, err := ledger.New(rdb, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	drv := s.simulator()
	// The hypervisors' sampler, which counts the floating guests it saw.
	hv := &chaos{s: s, t: t, led: led, drv: drv}
	for _, h := range hosts {
		for op, rate := range map[sim.Op]float64{sim.OpMigrate: 0.2, sim.OpStart: 0.15, sim.OpPrepare: 0.1, sim.OpStop: 0.05} {
			if err := drv.SetFault(ctx, h, op, sim.Fault{Rate: rate}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := drv.SetLatency(ctx, "", sim.OpMigrate, time.Second); err != nil {
		t.Fatal(err)
	}
	tc := s.tc
	queue := "e2e-" + strings.ReplaceAll(t.Name(), "/", "-")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)

	var (
		mu        sync.Mutex
		uuids     []string
		outcomes  = map[string]int{}
		violation []string
	)
	report := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(violation) < 20 {
			violation = append(violation, fmt.Sprintf(format, args...))
		}
	}
	stop := make(chan struct{})
	var bg sync.WaitGroup

	// The sampler: the promise kept on every host's domains, every
	// host's ledger verifies.
	var samples atomic.Int64
	bg.Add(1)
	go func() {
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			for _, h := range hosts {
				if clash, err := hv.doublePins(ctx, h); err != nil || clash != "" {
					report("sample %d: the promise on %s: %s %v", samples.Load(), h, clash, err)
				}
				snap, err := led.Snapshot(ctx, h)
				if err != nil {
					report("snapshot %s: %v", h, err)
					continue
				}
				if err := snap.Verify(); err != nil {
					report("sample %d: %v", samples.Load(), err)
				}
			}
			samples.Add(1)
		}
	}()

	// The auditor: grace 0, every second; told the truth by the server,
	// it must keep every claim of these never-terminated workflows.
	var audits atomic.Int64
	zero := time.Duration(0)
	bg.Add(1)
	go func() {
		defer bg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: fmt.Sprintf("reconcile-random-%d", i), TaskQueue: queue},
				workflows.Reconcile, api.ReconcileInput{Grace: &zero})
			if err != nil {
				report("start audit %d: %v", i, err)
				continue
			}
			var res api.ReconcileResult
			if err := run.Get(ctx, &res); err != nil {
				report("audit %d: %v", i, err)
				continue
			}
			audits.Add(1)
			for _, h := range res.Hosts {
				for _, f := range h.Freed {
					report("audit %d freed %s claim %s of %s on %s (owner %s): %s", i, f.State, f.ClaimID, f.Instance, h.Host, f.Owner, f.Reason)
				}
				for _, e := range h.Errors {
					report("audit %d on %s: %s", i, h.Host, e)
				}
			}
		}
	}()

	// The operators: each slot runs one guest's operations one after the
	// other (the workflow id lock allows no more), all slots at once; its
	// guests are of the kinds slotKind says.
	var started atomic.Int64
	deadline := time.Now().Add(randomDeadline)
	var ops sync.WaitGroup
	for slot := range randomSlots {
		ops.Add(1)
		go func() {
			defer ops.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(slot)))
			uuid, kind, boots := "", kindPinned, 0
			// Operations that fail fast (a full cloud refuses boots at
			// once) can spend the budget before the audits have run
			// alongside them: then they go on until three have.
			for n := 0; (started.Add(1) <= randomOps || audits.Load() < 3) && time.Now().Before(deadline); n++ {
				var op api.Operation
				var wf, in any
				var inst *ledger.Instance
				aimed := "" // the host a boot asks for
				if uuid != "" {
					if got, err := led.Instance(ctx, uuid); err == nil {
						inst = got
					}
				}
				switch {
				case inst == nil:
					uuid = fmt.Sprintf("5107%04x-0000-4000-8000-%012x", slot, n)
					kind = slotKind(slot, boots)
					boots++
					mu.Lock()
					uuids = append(uuids, uuid)
					mu.Unlock()
					boot := api.BootInput{UUID: uuid, Name: fmt.Sprintf("r%d-%d", slot, n), Flavor: kind.flavor()}
					// Some floating and mixed guests ask for a host, any:
					// one without shared CPUs must refuse them.
					if kind.floats() && rng.IntN(3) == 0 {
						aimed = hosts[rng.IntN(len(hosts))]
						boot.Host = aimed
					}
					op, wf, in = api.OpBoot, workflows.Boot, boot
				case inst.VMState == guest.VMActive && rng.IntN(10) < 5:
					op, wf, in = api.OpLiveMigration, workflows.LiveMigration, api.LiveMigrationInput{UUID: uuid}
				case inst.VMState == guest.VMActive && rng.IntN(10) < 6:
					op, wf, in = api.OpShelveOffload, workflows.ShelveOffload, api.ShelveOffloadInput{UUID: uuid}
				case inst.VMState == guest.VMShelvedOffloaded && rng.IntN(10) < 7:
					op, wf, in = api.OpUnshelve, workflows.Unshelve, api.UnshelveInput{UUID: uuid}
				default:
					op, wf, in = api.OpDelete, workflows.Delete, api.DeleteInput{UUID: uuid}
				}
				run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
					ID: guest.InstanceWorkflowID(uuid), TaskQueue: queue,
					WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
					WorkflowExecutionErrorWhenAlreadyStarted: true,
				}, wf, in)
				if err != nil {
					report("start %s of %s: %v", op, uuid, err)
					return
				}
				outcome := "ok"
				err = run.Get(ctx, nil)
				switch {
				case aimed != "" && !shared[aimed] && noSharedCPUs(err):
					outcome = "refused on a host without shared CPUs"
				case aimed != "" && !shared[aimed] && err == nil:
					report("the boot of %s guest %s on %s, a host without shared CPUs, went through", kind, uuid, aimed)
				case err != nil:
					outcome = "failed"
				}
				mu.Lock()
				outcomes[fmt.Sprintf("%s %s %s", op, kind, outcome)]++
				mu.Unlock()
			}
		}()
	}
	ops.Wait()
	close(stop)
	bg.Wait()
	t.Logf("operations: %v; %d audits, %d samples", outcomes, audits.Load(), samples.Load())
	for _, v := range violation {
		t.Error(v)
	}
	if audits.Load() < 3 || samples.Load() < 20 {
		t.Errorf("only %d audits and %d samples ran alongside the operations; the test proves little", audits.Load(), samples.Load())
	}
	if hv.floating.Load() == 0 {
		t.Errorf("no sample found a running floating or mixed guest: the run did not check them")
	}

	// Everything has ended: the ledger is exactly the instances' placements.
	named := map[string]bool{}
	for _, u := range uuids {
		inst, err := led.Instance(ctx, u)
		if err != nil {
			continue // deleted
		}
		if inst.TaskState != guest.TaskNone {
			t.Errorf("instance %s ended with task_state %s", u, inst.TaskState)
		}
		if inst.Host == "" {
			continue
		}
		named[inst.Host+"/"+inst.ClaimID] = true
		c, err := led.GetClaim(ctx, inst.Host, inst.ClaimID)
		if err != nil {
			t.Errorf("instance %s names claim %s on %s: %v", u, inst.ClaimID, inst.Host, err)
			continue
		}
		if c.State != ledger.StateCommitted || c.Placement.String() != inst.Placement.String() {
			t.Errorf("instance %s: claim %s is %s with %s, the record says %s", u, c.ID, c.State, c.Placement, inst.Placement)
		}
		if inst.VMState == guest.VMActive {
			s.agrees(u, inst.Host)
		}
	}
	s.noDoublePins(hosts...)
	for _, h := range hosts {
		snap, err := led.Snapshot(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		if err := snap.Verify(); err != nil {
			t.Error(err)
		}
		for _, c := range snap.Claims {
			if !named[h+"/"+c.ID] {
				t.Errorf("host %s holds %s claim %s of %s that no instance names", h, c.State, c.ID, c.InstanceUUID)
			}
		}
	}
}
