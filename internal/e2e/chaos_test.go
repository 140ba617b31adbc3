package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/workflows"
)

// chaos is one run of guests operated on, interrupted and audited at
// once, with the hypervisors sampled for breaks of pinflow's promise all
// along.
type chaos struct {
	s      *stack
	t      testing.TB
	ctx    context.Context
	tc     client.Client
	queue  string
	led    *ledger.Ledger
	drv    *sim.Driver
	hosts  []string
	shared map[string]bool // the hosts with shared CPUs (chaosHostSets)
	seed   uint64
	slots  int
	ops    int
	window time.Duration // no new operation after this
	// interrupt picks what happens to an operation: "" lets it run,
	// "cancel", "terminate".
	interrupt func(rng *rand.Rand) string
	// killEvery, when set, kills the worker with SIGKILL this often and
	// starts a new one.
	killEvery time.Duration
	// freezeEvery, when set, freezes the newest worker (SIGSTOP) this long
	// after the last one resumed, with a new worker beside it, for
	// freezeFor, longer than the fence lease and the steps' heartbeat
	// timeout: its steps are tried again elsewhere, their operations
	// interrupted, settled and overtaken meanwhile, and then it resumes
	// (SIGCONT) inside whatever step it was in.
	freezeEvery, freezeFor time.Duration
	// restartRedisEvery, when set, restarts Redis cleanly this often.
	restartRedisEvery time.Duration
	// drainEvery, when set, drains a random host this long after the
	// last drain ended, interrupting some drains as operations are.
	drainEvery time.Duration
	// fenceEvery, when set, fences a random host this long after the
	// last fence cycle ended: power off, host down, evacuate, power on,
	// host up.
	fenceEvery time.Duration
	// recoverEvery, when set, recovers a random host's ledger this often
	// and releases the quarantines found.
	recoverEvery time.Duration
	// foreignWorkerEvery, when set, starts a worker of another Temporal
	// namespace this often, which must refuse the ledger.
	foreignWorkerEvery time.Duration
	// idle, when set, rests each guest up to this long between its
	// operations, so that a drain finds some guests at rest.
	idle time.Duration
	// calm leaves out the hypervisor faults, so that every operation that
	// is not interrupted must succeed.
	calm bool
	// devices gives each host cell an SR-IOV NIC and every other guest an
	// SR-IOV port, so its VF is claimed, moved and freed with its pCPUs,
	// and unplugged and plugged in around its live migrations.
	devices bool
	// events happen once each, at their offset from the start of the run:
	// a node killed, a Redis master lost, workers restarted.
	events []chaosEvent

	mu sync.Mutex
	// members are the guests booted into the run's anti-affinity group,
	// of which no host may run more than chaosGroupMax.
	members    map[string]bool
	begun      time.Time
	spans      []span
	finished   int
	uuids      []string
	drainIDs   []string
	outcomes   map[string]int
	violations []string
	samples    atomic.Int64
	// passing counts the domain reads that found a running guest passing
	// a device through: a run with devices must have some.
	passing    atomic.Int64
	audits     atomic.Int64
	freed      atomic.Int64
	kills      atomic.Int64
	restarts   atomic.Int64
	drains     atomic.Int64
	started    atomic.Int64
	unreadable atomic.Int64
	fences     atomic.Int64
	freezes    atomic.Int64
	recovers   atomic.Int64
	foreign    atomic.Int64
	// floating counts the domain reads that found a running guest with
	// threads beside its pins (a floating or mixed guest): every run must
	// have some.
	floating atomic.Int64
	// held are the hosts a drain, a fence cycle or a recovery works on,
	// and which: no two of them take one host at once.
	held map[string]string
	// suspects are the guests a violation named; audited is what the
	// audits freed and found of each guest (trace_test.go).
	suspects map[string]bool
	audited  map[string][]string
}

// chaosEvent is something done to the deployment during a chaos run.
type chaosEvent struct {
	at   time.Duration
	what string
	do   func()
}

// span is when one operation ran, from its start to its result.
type span struct {
	op         string
	start, end time.Time
}

// newChaos starts a stack with hosts h0.. of two cells of cores pCPUs
// each, some with shared CPUs beside them (chaosHostSets), with SR-IOV
// NICs when devices is set; a durable Redis (an fsync per write) when it
// is to be restarted.
func newChaos(t *testing.T, hosts, cores int, durable, devices bool) *chaos {
	var opts []testenv.RedisOption
	if durable {
		opts = append(opts, testenv.AppendOnly())
	}
	return chaosOn(newStackWith(t, opts), hosts, cores, devices)
}

// chaosOn is a chaos run on a stack already started.
func chaosOn(s *stack, hosts, cores int, devices bool) *chaos {
	t := s.t
	c := &chaos{s: s, t: t, tc: s.tc, queue: "e2e-" + strings.ReplaceAll(t.Name(), "/", "-"), devices: devices,
		outcomes: map[string]int{}, held: map[string]string{}, shared: map[string]bool{}, seed: uint64(time.Now().UnixNano())}
	if v := os.Getenv("PINFLOW_CHAOS_SEED"); v != "" {
		fmt.Sscan(v, &c.seed)
	}
	t.Logf("seed %d (PINFLOW_CHAOS_SEED repeats it)", c.seed)
	for i := range hosts {
		h := fmt.Sprintf("h%d", i)
		c.hosts = append(c.hosts, h)
		shared, dedicated := chaosHostSets(i, cores)
		c.shared[h] = !shared.IsEmpty()
		if devices {
			s.ok("host", "add", h, "--topology", chaosTopology(t, cores, shared, dedicated))
			continue
		}
		s.ok(append([]string{"host", "add", h, "--cells", "2", "--memory-mb", "16384"}, hostSetArgs(cores, shared, dedicated)...)...)
	}
	s.ok("group", "create", chaosGroup, "--policy", "anti-affinity", "--max-per-host", fmt.Sprint(chaosGroupMax))
	c.members = map[string]bool{}
	rdb := s.redisClient()
	var err error
	if c.led, err = ledger.New(rdb, ledger.Options{}); err != nil {
		t.Fatal(err)
	}
	c.drv = s.simulator()
	return c
}

// slow gives every hypervisor step a latency and a few faults, so that
// interruptions land inside steps and in retry backoffs.
func (c *chaos) slow(ctx context.Context) {
	c.t.Helper()
	lat := map[sim.Op]time.Duration{sim.OpDefine: 150 * time.Millisecond, sim.OpStart: 300 * time.Millisecond,
		sim.OpStop: 150 * time.Millisecond, sim.OpShutdown: 400 * time.Millisecond, sim.OpUndefine: 100 * time.Millisecond,
		sim.OpPrepare: 150 * time.Millisecond, sim.OpMigrate: 1500 * time.Millisecond}
	for op, l := range lat {
		if err := c.drv.SetLatency(ctx, "", op, l); err != nil {
			c.t.Fatal(err)
		}
	}
	for _, h := range c.hosts {
		if c.calm {
			break
		}
		for op, rate := range map[sim.Op]float64{sim.OpMigrate: 0.1, sim.OpStart: 0.1, sim.OpPrepare: 0.05} {
			if err := c.drv.SetFault(ctx, h, op, sim.Fault{Rate: rate}); err != nil {
				c.t.Fatal(err)
			}
		}
	}
}

// report notes a violation of what the run checks.
func (c *chaos) report(format string, args ...any) {
	v := fmt.Sprintf(format, args...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.violations) < 30 {
		c.violations = append(c.violations, v)
		// Said at once too: a run that then hangs still shows it.
		c.t.Logf("violation: %s", v)
	}
}

// Audits and samples a chaos run needs alongside its operations to prove
// anything: operations go on past their budget and window until they ran.
const (
	minAudits  = 5
	minSamples = 50
)

func (c *chaos) enoughAlongside() bool {
	return c.audits.Load() >= minAudits && c.samples.Load() >= minSamples
}

// operate runs one guest's operations one after the other, interrupting
// some, until the operation budget or the window is spent.
func (c *chaos) operate(ctx context.Context, slot int, started *atomic.Int64, deadline time.Time) {
	rng := rand.New(rand.NewPCG(c.seed, uint64(slot)))
	withDevices := c.devices && slot%2 == 1
	uuid, kind, boots := "", kindPinned, 0
	var flavor guest.Flavor
	for n := 0; started.Add(1) <= int64(c.ops) && time.Now().Before(deadline) || !c.enoughAlongside(); n++ {
		if ctx.Err() != nil {
			return
		}
		var op api.Operation
		var wf, in any
		var inst *ledger.Instance
		aimed := "" // the host a boot asks for
		if uuid != "" {
			got, err := c.led.Instance(ctx, uuid)
			switch {
			case err == nil:
				inst = got
			case !errors.Is(err, ledger.ErrUnknownInstance):
				time.Sleep(500 * time.Millisecond) // Redis restarting
				continue
			}
		}
		switch {
		case inst == nil || inst.VMState == guest.VMDeleted:
			uuid = fmt.Sprintf("c4a0%04x-0000-4000-8000-%012x", slot, n)
			kind = slotKind(slot, boots)
			boots++
			flavor = kind.flavor()
			if withDevices {
				flavor.Ports = []numa.Port{{Name: "data", Physnet: "physnet1", VNICType: numa.VNICDirect}}
			}
			boot := api.BootInput{UUID: uuid, Name: fmt.Sprintf("c%d-%d", slot, n), Flavor: flavor}
			// Some floating and mixed guests ask for a host, any: one
			// without shared CPUs must refuse them. A calm run expects
			// every operation to complete, and asks for none.
			if kind.floats() && !c.calm && rng.IntN(3) == 0 {
				aimed = c.hosts[rng.IntN(len(c.hosts))]
				boot.Host = aimed
			}
			c.mu.Lock()
			c.uuids = append(c.uuids, uuid)
			// A calm run expects every operation to complete, and a
			// member's move may find no host that keeps the rule.
			if slot%3 == 0 && !c.calm {
				boot.Group = chaosGroup
				c.members[uuid] = true
			}
			c.mu.Unlock()
			op, wf, in = api.OpBoot, workflows.Boot, boot
		case inst.VMState == guest.VMActive && inst.Host != "" && rng.IntN(10) < 4:
			op, wf, in = api.OpLiveMigration, workflows.LiveMigration, api.LiveMigrationInput{UUID: uuid}
		case inst.VMState == guest.VMActive && inst.Host != "" && rng.IntN(10) < 3:
			// A resize one vCPU up from the flavor's size or back, or a
			// cold migration; its confirm window is short, and some get a
			// confirm or a revert.
			var f *guest.Flavor
			if rng.IntN(3) > 0 {
				resized := flavor
				resized.VCPUs = 2*flavor.VCPUs + 1 - inst.Request.VCPUs
				f = &resized
			}
			op, wf, in = api.OpResize, workflows.Resize, api.ResizeInput{UUID: uuid, Flavor: f,
				ConfirmWindow: time.Duration(500+rng.IntN(2500)) * time.Millisecond}
			if f == nil {
				op = api.OpColdMigration
			}
		case inst.VMState == guest.VMActive && inst.Host != "" && rng.IntN(10) < 6:
			op, wf, in = api.OpShelveOffload, workflows.ShelveOffload, api.ShelveOffloadInput{UUID: uuid}
		case inst.VMState == guest.VMShelvedOffloaded && rng.IntN(10) < 7:
			op, wf, in = api.OpUnshelve, workflows.Unshelve, api.UnshelveInput{UUID: uuid}
		default:
			op, wf, in = api.OpDelete, workflows.Delete, api.DeleteInput{UUID: uuid}
		}
		id := guest.InstanceWorkflowID(uuid)
		// Half the interruptions come at a gate of one of the operation's
		// hypervisor steps, held until the interruption has reached it;
		// the others at a random moment, between steps too.
		how := c.interrupt(rng)
		gate := sim.Gate("")
		gates := opGates[op]
		if withDevices && op == api.OpLiveMigration {
			gates = append(slices.Clip(gates), sim.GateDetach, sim.GateAttach)
		}
		if how != "" && len(gates) > 0 && rng.IntN(2) == 0 {
			gate = gates[rng.IntN(len(gates))]
			if err := c.drv.HoldGate(ctx, gate, uuid); err != nil {
				gate = "" // Redis restarting: a random moment instead
			}
		}
		began := time.Now()
		run, err := c.start(ctx, client.StartWorkflowOptions{
			ID: id, TaskQueue: c.queue,
			WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
			WorkflowExecutionErrorWhenAlreadyStarted: true,
		}, wf, in)
		var already *serviceerror.WorkflowExecutionAlreadyStarted
		if err != nil && gate != "" {
			_ = c.drv.ClearGate(context.WithoutCancel(ctx), gate, uuid)
		}
		if errors.As(err, &already) {
			// The audit settles the guest: wait for it.
			time.Sleep(500 * time.Millisecond)
			continue
		}
		if err != nil {
			c.report("start %s of %s: %v", op, uuid, err)
			return
		}
		if gate != "" {
			c.interruptAtGate(ctx, gate, uuid, how, run, fmt.Sprintf("%s of %s", op, uuid))
			how += " at " + string(gate)
		} else if how == "" && (op == api.OpResize || op == api.OpColdMigration) && rng.IntN(2) == 0 {
			decision := []string{api.DecisionConfirm, api.DecisionRevert}[rng.IntN(2)]
			how = decision
			time.Sleep(time.Duration(rng.Int64N(int64(3 * time.Second))))
			// Refused unless in VERIFY_RESIZE: it races the window too.
			h, err := c.tc.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{WorkflowID: id, RunID: run.GetRunID(),
				UpdateName: api.ResizeDecisionUpdate, Args: []any{decision}, WaitForStage: client.WorkflowUpdateStageCompleted})
			if err == nil {
				_ = h.Get(ctx, nil)
			}
		} else if how != "" {
			// Anywhere in the operation: before, inside or after any step.
			c.interruptRun(ctx, rng, 3*time.Second, how, run, fmt.Sprintf("%s of %s", op, uuid))
		}
		err = c.await(ctx, run, nil)
		outcome := c.outcomeOf(err, fmt.Sprintf("%s %s of %s", op, how, uuid))
		if aimed != "" && !c.shared[aimed] {
			how = strings.TrimSpace("on a host without shared CPUs " + how)
			switch {
			case noSharedCPUs(err):
				outcome = "refused"
			case err == nil:
				c.suspect(uuid)
				c.report("the boot of %s guest %s on %s, a host without shared CPUs, went through", kind, uuid, aimed)
			}
		}
		if c.idle > 0 {
			time.Sleep(time.Duration(rng.Int64N(int64(c.idle))))
		}
		c.mu.Lock()
		c.spans = append(c.spans, span{op: string(op), start: began, end: time.Now()})
		c.outcomes[strings.Join(strings.Fields(fmt.Sprintf("%s %s %s", op, kind, how)), " ")+"->"+outcome]++
		c.finished++
		if c.finished%500 == 0 {
			c.t.Logf("%s: %d operations done, %d audits, %d claims freed, %d worker kills, %d Redis restarts, %d violations",
				time.Now().Format(time.TimeOnly), c.finished, c.audits.Load(), c.freed.Load(), c.kills.Load(), c.restarts.Load(), len(c.violations))
		}
		c.mu.Unlock()
	}
}

// freezeWorker freezes the newest worker for c.freezeFor with a new one
// beside it, then lets it resume; a run that ends meanwhile resumes it at
// once. At most maxWorkers run, the frozen one among them.
func (c *chaos) freezeWorker(stop <-chan struct{}) {
	const maxWorkers = 4
	w := c.s.workers[len(c.s.workers)-1]
	running := 0
	for _, w := range c.s.workers {
		if w.ProcessState == nil {
			running++
		}
	}
	if running < maxWorkers {
		c.s.startWorker()
	}
	if err := w.Process.Signal(syscall.SIGSTOP); err != nil {
		c.report("freeze worker %d: %v", w.Process.Pid, err)
		return
	}
	c.freezes.Add(1)
	select {
	case <-stop:
	case <-time.After(c.freezeFor):
	}
	if err := w.Process.Signal(syscall.SIGCONT); err != nil {
		c.report("resume worker %d: %v", w.Process.Pid, err)
	}
}

// start starts wf as ExecuteWorkflow does, and rides out a Temporal node
// failing over as a client that retries would: a start the cluster did
// not answer in time is asked again for up to a minute, and a run that
// the unanswered start did create is followed.
func (c *chaos) start(ctx context.Context, opts client.StartWorkflowOptions, wf, in any) (client.WorkflowRun, error) {
	deadline := time.Now().Add(time.Minute)
	for retried := false; ; retried = true {
		run, err := c.tc.ExecuteWorkflow(ctx, opts, wf, in)
		var already *serviceerror.WorkflowExecutionAlreadyStarted
		switch {
		case retried && errors.As(err, &already):
			return c.tc.GetWorkflow(ctx, opts.ID, ""), nil
		case err == nil || !unanswered(err) || ctx.Err() != nil || time.Now().After(deadline):
			return run, err
		}
		time.Sleep(time.Second)
	}
}

// await waits for run's result as run.Get does, and rides out a Temporal
// node failing over as start does: a wait the cluster did not answer is
// asked again, for up to two minutes.
func (c *chaos) await(ctx context.Context, run client.WorkflowRun, out any) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := run.Get(ctx, out)
		if err == nil || !unanswered(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		c.t.Logf("waiting again for %s: %v", run.GetID(), err)
		time.Sleep(time.Second)
		run = c.tc.GetWorkflow(ctx, run.GetID(), run.GetRunID())
	}
}

// unanswered says whether a Temporal call failed for want of an answer
// (a node down, its shards moving) rather than with one.
func unanswered(err error) bool {
	var unavailable *serviceerror.Unavailable
	var deadline *serviceerror.DeadlineExceeded
	return errors.As(err, &unavailable) || errors.As(err, &deadline) || errors.Is(err, context.DeadlineExceeded)
}

// opGates are the simulator's gates each operation's hypervisor steps
// pass, where the chaos run may hold one and interrupt it there.
var opGates = map[api.Operation][]sim.Gate{
	api.OpBoot:          {sim.GateDefine, sim.GateStart},
	api.OpLiveMigration: {sim.GatePrepare, sim.GateMigrate, sim.GateCopy, sim.GateSwitchover, sim.GateSwitched},
	api.OpResize:        {sim.GateShutdown, sim.GateDefine, sim.GateStart},
	api.OpColdMigration: {sim.GateShutdown, sim.GateDefine, sim.GateStart},
	api.OpShelveOffload: {sim.GateShutdown, sim.GateUndefine},
	api.OpUnshelve:      {sim.GateDefine, sim.GateStart},
	api.OpDelete:        {sim.GateStop, sim.GateUndefine},
}

// interruptAtGate interrupts run (how) once a call of its guest has
// arrived at gate, which the caller held for the guest, and releases the
// gate once the interruption has reached that call. A step the
// interruption does not reach (a compensation, a worker killed meanwhile)
// is released after a while, and a run that ends without arriving is
// not interrupted.
func (c *chaos) interruptAtGate(ctx context.Context, gate sim.Gate, uuid, how string, run client.WorkflowRun, what string) {
	defer func() { _ = c.drv.ClearGate(context.WithoutCancel(ctx), gate, uuid) }()
	closed := make(chan struct{})
	go func() { _ = run.Get(ctx, nil); close(closed) }()
	until := func(limit time.Duration, cond func(sim.GateState) bool) bool {
		deadline := time.Now().Add(limit)
		for time.Now().Before(deadline) {
			if st, err := c.drv.GateState(ctx, gate, uuid); err == nil && cond(st) {
				return true
			}
			select {
			case <-closed:
				return false
			case <-ctx.Done():
				return false
			case <-time.After(50 * time.Millisecond):
			}
		}
		return false
	}
	if !until(time.Minute, func(st sim.GateState) bool { return st.Arrived > 0 }) {
		return
	}
	c.interruptRun(ctx, nil, 0, how, run, what+" at gate "+string(gate))
	until(10*time.Second, func(st sim.GateState) bool { return st.Cancelled > 0 })
}

// interruptRun cancels or terminates run (how) at a random moment within
// up to (none when rng is nil), and reports an error other than the run
// having ended.
func (c *chaos) interruptRun(ctx context.Context, rng *rand.Rand, upTo time.Duration, how string, run client.WorkflowRun, what string) {
	if rng != nil {
		time.Sleep(time.Duration(rng.Int64N(int64(upTo))))
	}
	var err error
	switch how {
	case "cancel":
		err = c.tc.CancelWorkflow(ctx, run.GetID(), run.GetRunID())
	case "terminate":
		err = c.tc.TerminateWorkflow(ctx, run.GetID(), run.GetRunID(), "chaos")
	}
	var nf *serviceerror.NotFound
	if err != nil && !errors.As(err, &nf) && !strings.Contains(err.Error(), "already completed") {
		c.report("%s %s: %v", how, what, err)
	}
}

// outcomeOf names how a run ended from its result: ok, cancelled,
// terminated or failed.
func (c *chaos) outcomeOf(err error, what string) string {
	switch {
	case err == nil:
		return "ok"
	case os.Getenv("PINFLOW_CHAOS_DEBUG") != "":
		c.t.Logf("%s: %v", what, err)
	}
	switch msg := err.Error(); {
	case strings.Contains(msg, "terminated"):
		return "terminated"
	case strings.Contains(msg, "canceled"):
		return "cancelled"
	}
	return "failed"
}

// drain empties a random host with a drain workflow, interrupted as an
// operation would be, and enables the host again once the drain has
// ended: its maintenance is over.
func (c *chaos) drain(ctx context.Context, rng *rand.Rand) {
	h := c.takeHost(rng, "drain")
	if h == "" {
		return
	}
	defer c.freeHost(h)
	id := api.DrainWorkflowID(h)
	c.mu.Lock()
	c.drainIDs = append(c.drainIDs, id)
	c.mu.Unlock()
	run, err := c.start(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: c.queue,
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE},
		workflows.Drain, api.DrainInput{Host: h, Policy: api.DrainLiveThenCold, Reason: "chaos", Settle: 10 * time.Second})
	if err != nil {
		c.report("start the drain of %s: %v", h, err)
		return
	}
	how := c.interrupt(rng)
	if how != "" {
		c.interruptRun(ctx, rng, 5*time.Second, how, run, "the drain of "+h)
	}
	// A drain that has not ended in minutes is stuck: say where, and
	// cancel it so the run can settle.
	gctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	err = run.Get(gctx, nil)
	stuck := gctx.Err() != nil && ctx.Err() == nil
	cancel()
	if stuck {
		var st api.DrainStatus
		if v, qerr := c.tc.QueryWorkflow(ctx, id, run.GetRunID(), api.DrainStatusQuery); qerr == nil {
			_ = v.Get(&st)
		}
		c.report("the drain of %s (%s) has not ended after 4 minutes: %s; %+v", h, how, st.Summary(), st.Guests)
		// The end tells the story of each guest it still held.
		for _, g := range st.Guests {
			if g.State != api.GuestMoved && g.State != api.GuestFailed {
				c.suspect(g.UUID)
			}
		}
		_ = c.tc.CancelWorkflow(ctx, id, run.GetRunID())
		err = run.Get(ctx, nil)
	}
	outcome := c.outcomeOf(err, fmt.Sprintf("drain %s of %s", how, h))
	c.drains.Add(1)
	c.mu.Lock()
	c.outcomes["drain "+how+"->"+outcome]++
	c.mu.Unlock()
	for ctx.Err() == nil {
		_, err := c.led.SetHostEnabled(ctx, h)
		if err == nil || errors.Is(err, ledger.ErrConflict) { // down: nothing to enable
			return
		}
		time.Sleep(500 * time.Millisecond) // Redis restarting
	}
}

// run operates, interrupts, audits and samples, then lets everything
// settle and checks the end state.
func (c *chaos) run() {
	t := c.t
	// Only a hang reaches this deadline, on a machine as loaded as any.
	ctx, cancel := context.WithTimeout(context.Background(), c.window+15*time.Minute)
	defer cancel()
	c.ctx = ctx
	c.slow(ctx)
	stop := make(chan struct{})
	// The audits outlast the other interruptions: a fenced host comes
	// back only once the audit has freed what interrupted operations left
	// on its guests, and its operator keeps trying past the end.
	stopAudits := make(chan struct{})
	var bg, audits sync.WaitGroup
	bg.Add(1)
	audits.Add(1)
	go func() { defer bg.Done(); c.sample(ctx, stop) }()
	go func() {
		defer audits.Done()
		for i := 0; ; i++ {
			select {
			case <-stopAudits:
				return
			case <-time.After(time.Second):
			}
			if _, err := c.audit(ctx, fmt.Sprintf("chaos-audit-%d", i)); err != nil {
				c.report("audit %d: %v", i, err)
			}
		}
	}()
	every := func(d time.Duration, do func()) {
		if d <= 0 {
			return
		}
		bg.Add(1)
		go func() {
			defer bg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(d):
				}
				do()
			}
		}()
	}
	every(c.killEvery, func() {
		c.s.killWorker()
		c.s.startWorker()
		c.kills.Add(1)
	})
	every(c.freezeEvery, func() { c.freezeWorker(stop) })
	drainRNG := rand.New(rand.NewPCG(c.seed, 1<<32))
	every(c.drainEvery, func() { c.drain(ctx, drainRNG) })
	fenceRNG, recoverRNG := rand.New(rand.NewPCG(c.seed, 2<<32)), rand.New(rand.NewPCG(c.seed, 3<<32))
	every(c.fenceEvery, func() { c.fence(ctx, fenceRNG) })
	every(c.recoverEvery, func() { c.recoverHost(ctx, recoverRNG) })
	every(c.foreignWorkerEvery, func() { c.foreignWorker(ctx) })
	every(c.restartRedisEvery, func() {
		c.s.redis.Restart(c.t)
		c.restarts.Add(1)
	})
	c.begun = time.Now()
	for _, e := range c.events {
		bg.Add(1)
		go func() {
			defer bg.Done()
			select {
			case <-stop:
				c.report("the run ended before %s at %s", e.what, e.at)
			case <-time.After(e.at):
				c.t.Logf("%s: %s", e.at, e.what)
				e.do()
			}
		}()
	}
	deadline := c.begun.Add(c.window)
	var ops sync.WaitGroup
	for slot := range c.slots {
		ops.Add(1)
		go func() { defer ops.Done(); c.operate(ctx, slot, &c.started, deadline) }()
	}
	ops.Wait()
	close(stop)
	bg.Wait()
	close(stopAudits)
	audits.Wait()

	// Let what the interruptions left behind settle. Every workflow closes
	// first: a drain that ended asked its moves to cancel, and they
	// compensate after it. Then audits run until one finds nothing that
	// time or its own work will change (activity attempts of terminated
	// workflows end, fence leases run out, owners pass the minimum grace,
	// the settles an audit starts finish), or finalAudits of them ran; the
	// end checks then say whether what remains is right.
	c.waitIdle(ctx)
	for i := 1; ; i++ {
		res, err := c.audit(ctx, fmt.Sprintf("chaos-final-%d", i))
		if err != nil {
			t.Fatalf("final audit %d: %v", i, err)
		}
		c.waitIdle(ctx)
		left := unsettled(res)
		if left == "" {
			t.Logf("settled after %d final audits", i)
			break
		}
		if i == finalAudits {
			t.Logf("after %d final audits the last still found %s", i, left)
			break
		}
		time.Sleep(time.Second)
	}
	c.summary()
	for _, v := range c.violations {
		t.Error(v)
	}
	if !c.enoughAlongside() {
		t.Errorf("only %d audits and %d samples ran alongside the operations; the test proves little", c.audits.Load(), c.samples.Load())
	}
	c.checkEnd(ctx)
	c.traceSuspects(ctx)
}

// summary logs the run's figures: operations and operator actions by
// kind, interruption and outcome, audits, freed claims, samples, kills,
// restarts, violations.
func (c *chaos) summary() {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]string, 0, len(c.outcomes))
	total := 0
	for k, n := range c.outcomes {
		keys = append(keys, k)
		total += n
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %-40s %d", k, c.outcomes[k])
	}
	c.t.Logf("%d operations on %d guests over %d hosts:%s", total, len(c.uuids), len(c.hosts), b.String())
	c.t.Logf("%d audits freed %d claims; %d samples of every host (%d host reads failed, Redis restarting or host off); %d drains; %d fence cycles; %d recoveries; %d workers of another namespace; %d worker kills; %d worker freezes; %d Redis restarts; %d violations",
		c.audits.Load(), c.freed.Load(), c.samples.Load(), c.unreadable.Load(), c.drains.Load(), c.fences.Load(), c.recovers.Load(), c.foreign.Load(),
		c.kills.Load(), c.freezes.Load(), c.restarts.Load(), len(c.violations))
	c.t.Logf("%d reads of a running guest with floating threads", c.floating.Load())
	if c.floating.Load() == 0 {
		c.t.Errorf("no sample found a running floating or mixed guest: the run did not check them")
	}
	if c.devices {
		c.t.Logf("%d reads of a running guest passing a device through", c.passing.Load())
		if c.passing.Load() == 0 {
			c.t.Errorf("no sample found a running guest with a device: the run did not exercise devices")
		}
	}
}
