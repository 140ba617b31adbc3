package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/workflows"
	"github.com/pinflow/pinflow/xmlpatch"
)

// doublePins returns what breaks pinflow's promise on a host's domains:
// a pCPU that a running or paused domain pins (a <vcpupin>, <emulatorpin>
// or <iothreadpin> of that CPU alone) within reach of another running or
// paused domain (on its own pin, else its <vcpu cpuset>, else the whole
// host); a PCI device two running domains use; and the run's server group
// if more of its members run on the host than it allows.
func (c *chaos) doublePins(ctx context.Context, host string) (string, error) {
	doms, err := c.drv.Domains(ctx, host)
	if err != nil {
		return "", err
	}
	topo, err := c.led.Host(ctx, host)
	if err != nil {
		return "", err
	}
	var pinnable, all numa.CPUSet
	for _, cell := range topo.Cells {
		pinnable = pinnable.Union(cell.PCPUs)
		all = all.Union(cell.CPUs).Union(cell.PCPUs)
	}
	// live is a running or paused domain: what it holds, and where its
	// threads may run.
	type live struct {
		uuid, name  string
		held, reach numa.CPUSet
	}
	var lives []live
	devOwner := map[string]string{}
	var clashes, members []string
	for _, d := range doms {
		if d.State != hypervisor.StateRunning && d.State != hypervisor.StatePaused {
			continue
		}
		pins, err := xmlpatch.Read(d.XML)
		if err != nil {
			return "", fmt.Errorf("domain %s on %s: %w", d.UUID, host, err)
		}
		l := live{uuid: d.UUID, name: fmt.Sprintf("%s (%s)", d.UUID, d.State),
			held: pins.PinnedCPUs().Intersection(pinnable), reach: pins.Reach(all)}
		lives = append(lives, l)
		if d.State != hypervisor.StateRunning {
			continue
		}
		if !l.reach.Difference(l.held).IsEmpty() {
			c.floating.Add(1)
		}
		if c.isMember(d.UUID) {
			members = append(members, d.UUID)
		}
		if len(pins.Devices) > 0 {
			c.passing.Add(1)
		}
		// A PF passed through uses its VFs too.
		for _, a := range pins.DeviceAddresses(topo) {
			for _, held := range topo.DeviceHolds(a) {
				if other, ok := devOwner[held]; ok && other != d.UUID {
					clashes = append(clashes, fmt.Sprintf("PCI device %s: %s and %s", held, other, d.UUID))
				}
				devOwner[held] = d.UUID
			}
		}
	}
	for i, a := range lives {
		for _, b := range lives[i+1:] {
			if a.uuid == b.uuid {
				continue
			}
			ab, ba := a.held.Intersection(b.reach), b.held.Intersection(a.reach)
			switch {
			case !ab.IsEmpty() && ab.Equal(ba):
				clashes = append(clashes, fmt.Sprintf("pCPUs %s pinned by both %s and %s", ab, a.name, b.name))
			default:
				if !ab.IsEmpty() {
					clashes = append(clashes, fmt.Sprintf("pCPUs %s pinned by %s are within reach of %s", ab, a.name, b.name))
				}
				if !ba.IsEmpty() {
					clashes = append(clashes, fmt.Sprintf("pCPUs %s pinned by %s are within reach of %s", ba, b.name, a.name))
				}
			}
		}
	}
	if len(members) > chaosGroupMax {
		clashes = append(clashes, fmt.Sprintf("%d members of anti-affinity group %s run on %s, at most %d may: %v", len(members), chaosGroup, host, chaosGroupMax, members))
	}
	return strings.Join(clashes, "; "), nil
}

// The chaos runs' server group: every third guest is a member.
const (
	chaosGroup    = "spread"
	chaosGroupMax = 1
)

func (c *chaos) isMember(uuid string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[uuid]
}

// sample checks, every 50 ms until stop, that no pCPU any domain of a
// host pins is within reach of another (doublePins) and that every host's
// ledger verifies.
func (c *chaos) sample(ctx context.Context, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(50 * time.Millisecond):
		}
		for _, h := range c.hosts {
			clash, err := c.doublePins(ctx, h)
			if err != nil {
				// Redis restarting or the host powered off: this
				// sample sees nothing.
				c.unreadable.Add(1)
				continue
			}
			if clash != "" {
				c.suspect(uuidsIn(clash)...)
				c.report("sample %d: the promise is broken on %s: %s", c.samples.Load(), h, clash)
			}
			snap, err := c.led.Snapshot(ctx, h)
			if err != nil {
				c.unreadable.Add(1)
				continue
			}
			if err := snap.Verify(); err != nil {
				c.report("sample %d: %v", c.samples.Load(), err)
			}
		}
		c.samples.Add(1)
	}
}

// audit runs one audit of every host with no grace and counts what it
// freed.
func (c *chaos) audit(ctx context.Context, id string) (*api.ReconcileResult, error) {
	zero := time.Duration(0)
	run, err := c.start(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: c.queue},
		workflows.Reconcile, api.ReconcileInput{Grace: &zero})
	if err != nil {
		return nil, err
	}
	var res api.ReconcileResult
	if err := c.await(ctx, run, &res); err != nil {
		return nil, err
	}
	c.audits.Add(1)
	c.noteAudit(id, res.Hosts)
	for _, h := range res.Hosts {
		c.freed.Add(int64(len(h.Freed)))
	}
	return &res, nil
}

// finalAudits bounds the audits a chaos run makes to settle at its end.
const finalAudits = 30

// unsettled says what an audit found that time or its own work will
// change: claims it freed or settled, and those it kept only for now (an
// owner closed less than the minimum grace ago, a fence lease running, an
// error, an operation still open); "" when it found none.
func unsettled(res *api.ReconcileResult) string {
	t := res.Total
	var left []string
	if n := t.Freed.Total(); n > 0 {
		left = append(left, fmt.Sprintf("%d freed", n))
	}
	if t.Errors > 0 {
		left = append(left, fmt.Sprintf("%d errors", t.Errors))
	}
	for _, r := range []string{audit.KeptRecentlyClosed, audit.KeptChanged, audit.KeptSettling, audit.KeptDoubt,
		audit.KeptOwnerRunning, audit.KeptInstanceBusy, audit.KeptYoung} {
		if n := t.Kept.Of(r); n > 0 {
			left = append(left, fmt.Sprintf("%d kept %s", n, r))
		}
	}
	if n := t.Drift.Of(audit.DriftDevicesUnplugged); n > 0 {
		left = append(left, fmt.Sprintf("%d guests with devices unplugged", n))
	}
	if len(left) == 0 {
		return ""
	}
	return strings.Join(left, ", ") + ":\n" + api.ReconcileReport(res)
}

// waitIdle waits until no workflow of any guest or drain is open.
func (c *chaos) waitIdle(ctx context.Context) {
	c.t.Helper()
	ids := append([]string{}, c.drainIDs...)
	for _, u := range c.uuids {
		ids = append(ids, guest.InstanceWorkflowID(u))
	}
	for _, id := range ids {
		for {
			d, err := c.tc.DescribeWorkflow(ctx, id, "")
			if err != nil || d.RawResponse.GetWorkflowExecutionInfo().GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
				break
			}
			if ctx.Err() != nil {
				c.t.Fatalf("workflow %s is still open", id)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// checkEnd checks the settled state: the promise kept on every host
// (doublePins), every running guest pinned exactly to the committed claim
// its record names on its host and floating over its host's shared CPUs
// alone, passing through exactly its devices, and no claim that no record
// names.
func (c *chaos) checkEnd(ctx context.Context) {
	t := c.t
	named := map[string]string{} // host/claim -> uuid
	records := map[string]*ledger.Instance{}
	for _, u := range c.uuids {
		inst, err := c.led.Instance(ctx, u)
		if errors.Is(err, ledger.ErrUnknownInstance) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		records[u] = inst
		if inst.Host != "" {
			named[inst.Host+"/"+inst.ClaimID] = u
		}
	}
	running := map[string][]string{}
	for _, h := range c.hosts {
		if clash, err := c.doublePins(ctx, h); err != nil || clash != "" {
			t.Errorf("at the end, host %s: %s %v", h, clash, err)
		}
		snap, err := c.led.Snapshot(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		if err := snap.Verify(); err != nil {
			t.Error(err)
		}
		claims := map[string]ledger.Claim{}
		for _, cl := range snap.Claims {
			claims[cl.ID] = cl
			if named[h+"/"+cl.ID] == "" {
				c.suspect(cl.InstanceUUID)
				t.Errorf("host %s holds %s claim %s of %s (%s) that no record names", h, cl.State, cl.ID, cl.InstanceUUID, cl.Kind)
			}
		}
		doms, err := c.drv.Domains(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range doms {
			if d.State != hypervisor.StateRunning {
				continue
			}
			running[d.UUID] = append(running[d.UUID], h)
			inst := records[d.UUID]
			if inst == nil || inst.Host != h {
				c.suspect(d.UUID)
				t.Errorf("guest %s runs on %s, but its record says host %q", d.UUID, h, recordHost(inst))
				continue
			}
			cl, ok := claims[inst.ClaimID]
			if !ok || cl.State != ledger.StateCommitted {
				c.suspect(d.UUID)
				t.Errorf("guest %s runs on %s on claim %s, which is not committed there (%q)", d.UUID, h, inst.ClaimID, cl.State)
				continue
			}
			pins, err := xmlpatch.Read(d.XML)
			if err != nil {
				t.Fatal(err)
			}
			var want numa.CPUSet
			for _, u := range cl.Usage {
				want = want.Union(u.PinnedCPUs)
			}
			if got := pins.HostCPUs().Intersection(want.Union(pinnableOf(snap))); !got.Equal(want) {
				c.suspect(d.UUID)
				t.Errorf("guest %s on %s is pinned to %s, its claim %s holds %s", d.UUID, h, got, cl.ID, want)
			}
			// What does not run on its own pCPUs floats over the host's
			// shared CPUs, not over the source's of a move.
			shared := snap.Topology.SharedCPUs()
			if far := pins.Reach(shared.Union(pinnableOf(snap))).Difference(want).Difference(shared); !far.IsEmpty() {
				c.suspect(d.UUID)
				t.Errorf("guest %s on %s may run on %s, which are neither its claim %s's pCPUs %s nor the host's shared CPUs %s", d.UUID, h, far, cl.ID, want, shared)
			}
			var used []string
			for _, a := range pins.Devices {
				used = append(used, snap.Topology.DeviceHolds(a)...)
			}
			slices.Sort(used)
			if !slices.Equal(used, cl.Devices) {
				c.suspect(d.UUID)
				t.Errorf("guest %s on %s passes through PCI devices %v, its claim %s holds %v", d.UUID, h, used, cl.ID, cl.Devices)
			}
		}
	}
	var twice []string
	for u, hs := range running {
		if len(hs) > 1 {
			twice = append(twice, fmt.Sprintf("%s on %v", u, hs))
		}
	}
	sort.Strings(twice)
	for _, s := range twice {
		t.Errorf("guest runs on two hosts: %s", s)
	}
}

func pinnableOf(s *ledger.Snapshot) numa.CPUSet {
	var p numa.CPUSet
	for _, c := range s.Topology.Cells {
		p = p.Union(c.PCPUs)
	}
	return p
}

func recordHost(inst *ledger.Instance) string {
	if inst == nil {
		return "(no record)"
	}
	return inst.Host
}
