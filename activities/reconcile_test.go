package activities

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// fakeOwners is an audit.OwnerChecker that answers exactly what the test set:
// an unknown workflow id is not found, and the namespace keeps closed
// runs for testRetention.
type fakeOwners struct {
	mu     sync.Mutex
	status map[string]audit.OwnerStatus
	errs   map[string]error
	calls  []string
	// retentionReads counts the questions about the retention.
	retentionReads int
	// before, when set, runs at the start of every question, to race the
	// audit.
	before func(workflowID string)
}

func newFakeOwners() *fakeOwners {
	return &fakeOwners{status: map[string]audit.OwnerStatus{}, errs: map[string]error{}}
}

func (f *fakeOwners) set(id string, st audit.OwnerStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status[id] = st
}

func (f *fakeOwners) OwnerStatus(_ context.Context, id string) (audit.OwnerStatus, error) {
	if f.before != nil {
		f.before(id)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, id)
	if err := f.errs[id]; err != nil {
		return audit.OwnerStatus{}, err
	}
	if st, ok := f.status[id]; ok {
		return st, nil
	}
	return audit.OwnerStatus{State: audit.OwnerNotFound}, nil
}

// testRetention is the fake namespace's retention of closed runs.
const testRetention = 24 * time.Hour

func (f *fakeOwners) Retention(context.Context) (time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retentionReads++
	return testRetention, nil
}

// world is a real Redis with a ledger and a simulated hypervisor on it,
// and the activities over them with a fake owner checker. Its ledger's
// clock is the test's, so claims can be made in the past.
type world struct {
	acts   *Activities
	led    *ledger.Ledger
	rdb    *redis.Client
	drv    *sim.Driver
	owners *fakeOwners
	mu     sync.Mutex
	now    time.Time
}

func newWorld(t testing.TB) *world {
	t.Helper()
	srv := testenv.StartRedis(t)
	return newWorldOn(t, srv, srv)
}

// newWorldOn is a world whose ledger and simulated hypervisors keep their
// state in the given servers, which may be one.
func newWorldOn(t testing.TB, ledgerSrv, simSrv *testenv.Redis) *world {
	t.Helper()
	client := func(srv *testenv.Redis) *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	rdb := client(ledgerSrv)
	simRDB := rdb
	if simSrv != ledgerSrv {
		simRDB = client(simSrv)
	}
	w := &world{owners: newFakeOwners(), now: time.Now().Add(-time.Hour)}
	led, err := ledger.New(rdb, ledger.Options{Now: w.clock, Namespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	w.led, w.rdb, w.drv = led, rdb, sim.New(simRDB, sim.Options{})
	w.acts = &Activities{Ledger: led, Driver: w.drv, Audit: &audit.Auditor{Ledger: led, Driver: w.drv, Owners: w.owners, Grace: time.Minute}}
	return w
}

func (w *world) clock() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.now
}

// at makes the ledger stamp what follows with t.
func (w *world) at(t time.Time) {
	w.mu.Lock()
	w.now = t
	w.mu.Unlock()
}

// addHost registers a host of 8 pinnable pCPUs in one cell with the
// ledger and the simulator.
func (w *world) addHost(t testing.TB, name string) {
	t.Helper()
	h, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: 8, Threads: 1, MemoryMB: 16384})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := w.drv.AddHost(ctx, name, h); err != nil {
		t.Fatal(err)
	}
	if _, err := w.led.RegisterHost(ctx, name, h); err != nil {
		t.Fatal(err)
	}
}

var testFlavor = guest.Flavor{VCPUs: 2, MemoryMB: 512, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}

// claim makes a pending claim for uuid on host owned by owner.
func (w *world) claim(t testing.TB, host, id, uuid string, kind ledger.ClaimKind, owner Owner) ClaimResult {
	t.Helper()
	c, err := w.acts.Claim(context.Background(), ClaimInput{Host: host, ClaimID: id, UUID: uuid, Kind: kind, Owner: owner, Flavor: testFlavor})
	if err != nil {
		t.Fatalf("Claim(%s on %s): %v", id, host, err)
	}
	return c
}

// boot boots uuid on host the way the Boot workflow does, owned by owner:
// record, claim, spawn, commit and attach.
func (w *world) boot(t testing.TB, host, uuid string, owner Owner) ClaimResult {
	t.Helper()
	ctx := context.Background()
	if _, err := w.acts.CreateInstance(ctx, CreateInstanceInput{UUID: uuid, Name: "vm-" + uuid[:8], Flavor: testFlavor}); err != nil {
		t.Fatal(err)
	}
	c := w.claim(t, host, "boot-"+owner.FirstRunID, uuid, ledger.KindBoot, owner)
	if err := w.acts.Spawn(ctx, SpawnInput{UUID: uuid, Host: host, Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
		t.Fatal(err)
	}
	if err := w.acts.Attach(ctx, AttachInput{UUID: uuid, Host: host, ClaimID: c.ClaimID}); err != nil {
		t.Fatal(err)
	}
	return c
}

// claimIn makes a pending claim as a process of Temporal namespace ns
// would, on the world's Redis.
func (w *world) claimIn(t testing.TB, ns, host, id, uuid string, owner Owner) ClaimResult {
	t.Helper()
	led, err := ledger.New(w.rdb, ledger.Options{Now: w.clock, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	acts := *w.acts
	acts.Ledger = led
	c, err := acts.Claim(context.Background(), ClaimInput{Host: host, ClaimID: id, UUID: uuid, Kind: ledger.KindMigrationDest, Owner: owner, Flavor: testFlavor})
	if err != nil {
		t.Fatalf("Claim(%s on %s) in namespace %s: %v", id, host, ns, err)
	}
	return c
}

func (w *world) audit(t testing.TB, in audit.AuditHostInput) audit.HostAudit {
	t.Helper()
	res, err := w.acts.AuditHost(context.Background(), in)
	if err != nil {
		t.Fatalf("AuditHost(%+v): %v", in, err)
	}
	return res
}

func (w *world) hasClaim(t testing.TB, host, id string) bool {
	t.Helper()
	_, err := w.led.GetClaim(context.Background(), host, id)
	if errors.Is(err, ledger.ErrUnknownClaim) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

func dur(d time.Duration) *time.Duration { return &d }

func uuidN(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }

func TestAuditHostDecisions(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	old := time.Now().Add(-time.Hour)
	long := audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "run-1", Since: old}
	beyond := time.Now().Add(-testRetention - time.Hour)

	tests := []struct {
		name string
		// setup makes the case's claim on host (uuid u) and the owners'
		// answers; it returns the claim id to watch.
		setup     func(t *testing.T, host, u string) string
		grace     time.Duration
		dryRun    bool
		wantKept  string // the reason the claim was kept, or ""
		wantFreed string // the reason it was freed, or ""
	}{
		{"pending, owner running with its first run id", func(t *testing.T, host, u string) string {
			w.owners.set("wf-"+u, audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "run-1", Since: old})
			return w.claim(t, host, "c-"+u, u, ledger.KindMigrationDest, Owner{"wf-" + u, "run-1"}).ClaimID
		}, 0, false, audit.KeptOwnerRunning, ""},
		{"pending, owner runs another chain", func(t *testing.T, host, u string) string {
			w.owners.set("wf-"+u, audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "run-2", Since: old})
			return w.claim(t, host, "c-"+u, u, ledger.KindMigrationDest, Owner{"wf-" + u, "run-1"}).ClaimID
		}, 0, false, "", audit.FreedOwnerReplaced},
		{"pending, owner closed long ago", func(t *testing.T, host, u string) string {
			w.owners.set("wf-"+u, long)
			return w.claim(t, host, "c-"+u, u, ledger.KindUnshelve, Owner{"wf-" + u, "run-1"}).ClaimID
		}, time.Minute, false, "", audit.FreedOwnerClosed},
		{"pending, owner closed within the grace period", func(t *testing.T, host, u string) string {
			w.owners.set("wf-"+u, audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "run-1", Since: time.Now().Add(-10 * time.Second)})
			return w.claim(t, host, "c-"+u, u, ledger.KindUnshelve, Owner{"wf-" + u, "run-1"}).ClaimID
		}, time.Minute, false, audit.KeptRecentlyClosed, ""},
		{"pending, owner not found, younger than the retention", func(t *testing.T, host, u string) string {
			return w.claim(t, host, "c-"+u, u, ledger.KindBoot, Owner{"wf-" + u, "run-1"}).ClaimID
		}, 0, false, audit.KeptOwnerUnseen, ""},
		{"pending, owner not found, older than the retention", func(t *testing.T, host, u string) string {
			w.at(beyond)
			defer w.at(old)
			return w.claim(t, host, "c-"+u, u, ledger.KindBoot, Owner{"wf-" + u, "run-1"}).ClaimID
		}, 0, false, "", audit.FreedOwnerNotFound},
		{"pending, owner in another namespace", func(t *testing.T, host, u string) string {
			w.owners.set("wf-"+u, long)
			return w.claimIn(t, "other", host, "c-"+u, u, Owner{"wf-" + u, "run-1"}).ClaimID
		}, 0, false, audit.KeptOtherNamespace, ""},
		{"pending, younger than the grace period", func(t *testing.T, host, u string) string {
			w.at(time.Now())
			defer w.at(old)
			return w.claim(t, host, "c-"+u, u, ledger.KindBoot, Owner{"wf-" + u, "run-1"}).ClaimID
		}, time.Minute, false, audit.KeptYoung, ""},
		{"pending, owner closed, dry run", func(t *testing.T, host, u string) string {
			w.owners.set("wf-"+u, long)
			return w.claim(t, host, "c-"+u, u, ledger.KindUnshelve, Owner{"wf-" + u, "run-1"}).ClaimID
		}, 0, true, "", audit.FreedOwnerClosed},
		{"committed and resident, owner long closed", func(t *testing.T, host, u string) string {
			w.owners.set(guest.InstanceWorkflowID(u), long)
			return w.boot(t, host, u, Owner{guest.InstanceWorkflowID(u), "run-" + u}).ClaimID
		}, 0, false, audit.KeptResident, ""},
		{"committed, instance elsewhere, no workflow open", func(t *testing.T, host, u string) string {
			w.boot(t, "elsewhere", u, Owner{guest.InstanceWorkflowID(u), "boot-" + u})
			c := w.claim(t, host, "c-"+u, u, ledger.KindMigrationDest, Owner{guest.InstanceWorkflowID(u), "mig-" + u})
			if _, err := w.led.Commit(ctx, host, c.ClaimID); err != nil {
				t.Fatal(err)
			}
			w.owners.set(guest.InstanceWorkflowID(u), audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "mig-" + u, Since: old})
			return c.ClaimID
		}, 0, false, "", audit.FreedNotResident},
		{"committed, instance elsewhere, another workflow of it open", func(t *testing.T, host, u string) string {
			w.boot(t, "elsewhere", u, Owner{guest.InstanceWorkflowID(u), "boot-" + u})
			c := w.claim(t, host, "c-"+u, u, ledger.KindMigrationDest, Owner{guest.InstanceWorkflowID(u), "mig-" + u})
			if _, err := w.led.Commit(ctx, host, c.ClaimID); err != nil {
				t.Fatal(err)
			}
			w.owners.set(guest.InstanceWorkflowID(u), audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "del-" + u, Since: old})
			return c.ClaimID
		}, 0, false, audit.KeptInstanceBusy, ""},
		{"committed, instance record gone, no workflow known, younger than the retention", func(t *testing.T, host, u string) string {
			c := w.claim(t, host, "c-"+u, u, ledger.KindBoot, Owner{guest.InstanceWorkflowID(u), "boot-" + u})
			if _, err := w.led.Commit(ctx, host, c.ClaimID); err != nil {
				t.Fatal(err)
			}
			return c.ClaimID
		}, 0, false, audit.KeptOwnerUnseen, ""},
		{"committed, instance record gone, no workflow known, older than the retention", func(t *testing.T, host, u string) string {
			w.at(beyond)
			defer w.at(old)
			c := w.claim(t, host, "c-"+u, u, ledger.KindBoot, Owner{guest.InstanceWorkflowID(u), "boot-" + u})
			if _, err := w.led.Commit(ctx, host, c.ClaimID); err != nil {
				t.Fatal(err)
			}
			return c.ClaimID
		}, 0, false, "", audit.FreedInstanceGone},
		{"pending, owner cannot be asked", func(t *testing.T, host, u string) string {
			w.owners.mu.Lock()
			w.owners.errs["wf-"+u] = errors.New("deadline exceeded")
			w.owners.mu.Unlock()
			return w.claim(t, host, "c-"+u, u, ledger.KindMigrationDest, Owner{"wf-" + u, "run-1"}).ClaimID
		}, 0, false, audit.KeptDoubt, ""},
	}
	w.at(old)
	w.addHost(t, "elsewhere")
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host, u := fmt.Sprintf("h%d", i), uuidN(i+1)
			w.addHost(t, host)
			id := tt.setup(t, host, u)
			res := w.audit(t, audit.AuditHostInput{Host: host, Grace: dur(tt.grace), DryRun: tt.dryRun})
			var want decision
			if tt.wantKept != "" {
				want.kept.Add(tt.wantKept, 1)
			}
			if tt.wantFreed != "" {
				want.freed.Add(tt.wantFreed, 1)
			}
			got := decision{kept: res.Tally.Kept, freed: res.Tally.Freed}
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(decision{})); diff != "" {
				t.Errorf("AuditHost(%s, grace %s): tally (-want +got):\n%s\nerrors: %v", host, tt.grace, diff, res.Errors)
			}
			stillThere := tt.wantFreed == "" || tt.dryRun
			if got := w.hasClaim(t, host, id); got != stillThere {
				t.Errorf("AuditHost(%s): claim %s still there = %v, want %v", host, id, got, stillThere)
			}
			if tt.wantKept == audit.KeptDoubt && len(res.Errors) == 0 {
				t.Errorf("AuditHost(%s): kept in doubt but reported no error", host)
			}
			snap, err := w.led.Snapshot(ctx, host)
			if err != nil {
				t.Fatal(err)
			}
			if err := snap.Verify(); err != nil {
				t.Errorf("after AuditHost(%s): %v", host, err)
			}
		})
	}
}

// decision is the part of a audit.Tally the decision test compares.
type decision struct {
	kept, freed audit.ReasonCounts
}

// TestAuditHostResidentNeedsNoDescribe: a host of resident claims costs
// no question to Temporal.
func TestAuditHostResidentNeedsNoDescribe(t *testing.T) {
	w := newWorld(t)
	w.addHost(t, "a")
	for i := range 3 {
		u := uuidN(100 + i)
		w.boot(t, "a", u, Owner{guest.InstanceWorkflowID(u), "run-" + u})
	}
	w.owners.calls = nil
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if got := res.Tally.Kept.Of(audit.KeptResident); got != 3 {
		t.Errorf("AuditHost(a): kept resident %d, want 3 (%+v)", got, res.Tally)
	}
	if len(w.owners.calls) != 0 {
		t.Errorf("AuditHost(a) asked about %v, want no question for resident claims", w.owners.calls)
	}
}

// TestAuditHostReleaseRace: a claim released and made again (same id, new
// token) between the audit's read and its compare-and-delete survives.
func TestAuditHostReleaseRace(t *testing.T) {
	w := newWorld(t)
	w.addHost(t, "a")
	u := uuidN(200)
	owner := Owner{"wf-race", "run-1"}
	w.owners.set(owner.WorkflowID, audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: owner.FirstRunID, Since: time.Now().Add(-time.Hour)})
	c := w.claim(t, "a", "c-race", u, ledger.KindUnshelve, owner)
	before, err := w.led.GetClaim(context.Background(), "a", c.ClaimID)
	if err != nil {
		t.Fatal(err)
	}
	w.owners.before = func(string) {
		w.owners.before = nil
		if err := w.led.Release(context.Background(), "a", c.ClaimID); err != nil {
			t.Error(err)
		}
		w.claim(t, "a", c.ClaimID, u, ledger.KindUnshelve, owner)
	}
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if got := res.Tally.Kept.Of(audit.KeptChanged); got != 1 || res.Tally.Freed.Total() != 0 {
		t.Errorf("AuditHost(a) with the claim made again meanwhile: tally %+v, want kept changed 1 and nothing freed", res.Tally)
	}
	after, err := w.led.GetClaim(context.Background(), "a", c.ClaimID)
	if err != nil {
		t.Fatalf("the claim made again is gone: %v", err)
	}
	if after.Token == before.Token {
		t.Errorf("claim %s kept its token %s; the test did not make it again", c.ClaimID, after.Token)
	}
}

func TestAuditHostDrift(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.addHost(t, "a")
	// X runs on a at 0,1 but its claim is lost; Y's pending claim then
	// takes 0,1: X is pinned to Y's pCPUs.
	x, y, z := uuidN(301), uuidN(302), uuidN(303)
	cx := w.boot(t, "a", x, Owner{guest.InstanceWorkflowID(x), "run-x"})
	if err := w.led.Release(ctx, "a", cx.ClaimID); err != nil {
		t.Fatal(err)
	}
	cy := w.claim(t, "a", "c-y", y, ledger.KindUnshelve, Owner{guest.InstanceWorkflowID(y), "run-y"})
	w.owners.set(guest.InstanceWorkflowID(y), audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "run-y", Since: time.Now()})
	// Z is resident but its domain is gone.
	cz := w.boot(t, "a", z, Owner{guest.InstanceWorkflowID(z), "run-z"})
	if err := w.acts.DestroyDomain(ctx, DomainInput{UUID: z, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	before, err := w.led.Snapshot(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	want := []audit.Drift{
		{Kind: audit.DriftPinnedToOther, Instance: x, CPUs: claimedCPUs(cy)},
		{Kind: audit.DriftDomainWithoutClaim, Instance: x, CPUs: "0-1"},
		{Kind: audit.DriftClaimWithoutDomain, Instance: z, ClaimID: cz.ClaimID, CPUs: "2-3"},
	}
	got := make([]audit.Drift, len(res.Drift))
	for i, d := range res.Drift {
		got[i] = d
		got[i].Detail = ""
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("AuditHost(a) drift (-want +got):\n%s", diff)
	}
	after, err := w.led.Snapshot(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before.Pins, after.Pins); diff != "" {
		t.Errorf("AuditHost(a) changed the pins while only reporting drift (-before +after):\n%s", diff)
	}
	doms, err := w.drv.Domains(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(doms) != 1 || doms[0].UUID != x {
		t.Errorf("domains on a after the audit: %+v, want X's alone, untouched", doms)
	}

	// Y's workflow is open: drift about Y would be marked in flight. Make
	// Z's instance workflow open too and check the mark.
	w.owners.set(guest.InstanceWorkflowID(z), audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "del-z", Since: time.Now()})
	res = w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	for _, d := range res.Drift {
		if wantFlight := d.Instance == z; d.InFlight != wantFlight {
			t.Errorf("drift %s of %s: in flight %v, want %v", d.Kind, d.Instance, d.InFlight, wantFlight)
		}
	}
}

func claimedCPUs(c ClaimResult) string {
	var s numa.CPUSet
	for _, pc := range c.Placement.Cells {
		for _, cpu := range pc.Pins {
			s = s.Union(numa.NewCPUSet(cpu))
		}
	}
	return s.String()
}

func TestAuditHostUnknownHostFails(t *testing.T) {
	w := newWorld(t)
	if _, err := w.acts.AuditHost(context.Background(), audit.AuditHostInput{Host: "nowhere"}); err == nil {
		t.Fatal("AuditHost(nowhere) succeeded, want an unknown host error")
	}
	if _, err := w.acts.AuditHost(context.Background(), audit.AuditHostInput{Host: "nowhere", Grace: dur(-time.Second)}); err == nil {
		t.Fatal("AuditHost with a negative grace succeeded, want a bad request")
	}
}

// TestAuditSettlesOnlyWhatItSees: a resize waiting in VERIFY_RESIZE
// whose workflow Temporal does not know keeps its source hold, and the
// audit starts no Settle (which would end the hold a revert needs),
// unless the resize is older than the namespace's retention.
func TestAuditSettlesOnlyWhatItSees(t *testing.T) {
	for _, tt := range []struct {
		name        string
		age         time.Duration
		wantKept    string
		wantSettles int
	}{
		{"younger than the retention", time.Hour, audit.KeptOwnerUnseen, 0},
		{"older than the retention", testRetention + time.Hour, audit.KeptSettling, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t)
			w.at(time.Now().Add(-tt.age))
			settler := &fakeSettler{}
			w.acts.Audit.Settler = settler
			w.addHost(t, "a")
			w.addHost(t, "b")
			u := uuidN(30)
			src := w.boot(t, "a", u, Owner{guest.InstanceWorkflowID(u), "boot-1"})
			bigger := testFlavor
			bigger.VCPUs = 3
			w.resizeTo(t, u, "a", src.ClaimID, "b", bigger)
			res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
			if got := res.Tally.Kept.Of(tt.wantKept); got != 1 || res.Tally.Freed.Total() != 0 {
				t.Errorf("AuditHost(a): tally %+v, want the source hold kept %s", res.Tally, tt.wantKept)
			}
			if len(settler.started) != tt.wantSettles {
				t.Errorf("AuditHost(a) started %d settles (%+v), want %d", len(settler.started), settler.started, tt.wantSettles)
			}
			if !w.hasClaim(t, "a", src.ClaimID) {
				t.Errorf("AuditHost(a) freed the source hold %s", src.ClaimID)
			}
		})
	}
}
