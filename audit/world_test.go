package audit_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
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

// fakeSettler records the settles the audit starts.
type fakeSettler struct {
	mu        sync.Mutex
	started   []audit.SettleInput
	replugged []audit.SettleInput
	err       error
}

func (f *fakeSettler) StartSettle(_ context.Context, in audit.SettleInput) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.started = append(f.started, in)
	return nil
}

func (f *fakeSettler) StartReplug(_ context.Context, in audit.SettleInput) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.replugged = append(f.replugged, in)
	return nil
}

var longClosed = audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "run-1", Since: time.Now().Add(-time.Hour)}

// world is a simulated cloud with an Auditor over it whose owner checker
// is fake.
type world struct {
	*simcloud.World
	owners  *fakeOwners
	auditor *audit.Auditor
}

func newWorld(t testing.TB) *world {
	t.Helper()
	w := &world{World: simcloud.New(t), owners: newFakeOwners()}
	// The worker's driver refuses an unfenced change to a domain; so
	// does the audit's here.
	w.auditor = &audit.Auditor{Ledger: w.Ledger, Driver: hypervisor.Guarded(w.Driver), Owners: w.owners, Grace: time.Minute}
	return w
}

func (w *world) audit(t testing.TB, in audit.AuditHostInput) audit.HostAudit {
	t.Helper()
	res, err := w.auditor.AuditHost(context.Background(), in)
	if err != nil {
		t.Fatalf("AuditHost(%+v): %v", in, err)
	}
	return res
}

// claimIn makes a pending claim as a process of Temporal namespace ns
// would, on the world's Redis.
func (w *world) claimIn(t testing.TB, ns, host, id, uuid string, owner activities.Owner) activities.ClaimResult {
	t.Helper()
	led, err := ledger.New(w.RDB, ledger.Options{Now: w.Now, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	acts := *w.Acts
	acts.Ledger = led
	c, err := acts.Claim(context.Background(), activities.ClaimInput{Host: host, ClaimID: id, UUID: uuid, Kind: ledger.KindMigrationDest, Owner: owner, Flavor: simcloud.Flavor()})
	if err != nil {
		t.Fatalf("Claim(%s on %s) in namespace %s: %v", id, host, ns, err)
	}
	return c
}

// loseGuest drops the guest's claim and record from the ledger, as a
// Redis that lost them would; its domain runs on.
func (w *world) loseGuest(t testing.TB, host, uuid, claimID string) {
	t.Helper()
	ctx := context.Background()
	if err := w.Ledger.Release(ctx, host, claimID); err != nil {
		t.Fatal(err)
	}
	if err := w.Ledger.DetachInstance(ctx, uuid, claimID); err != nil {
		t.Fatal(err)
	}
	if err := w.Ledger.DeleteInstance(ctx, uuid); err != nil {
		t.Fatal(err)
	}
}

func (w *world) snapshot(t testing.TB, host string) *ledger.Snapshot {
	t.Helper()
	s, err := w.Ledger.Snapshot(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// noSharedPCPUs fails the test if two domains that run or are paused on
// host use one pCPU.
func (w *world) noSharedPCPUs(t testing.TB, host string) {
	t.Helper()
	doms, err := w.Driver.Domains(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	var seen numa.CPUSet
	for _, d := range doms {
		used, err := hypervisor.UsedCPUs(d)
		if err != nil {
			t.Fatal(err)
		}
		if used.Intersects(seen) {
			t.Errorf("domain %s on %s uses pCPUs %s that another domain uses", d.UUID, host, used.Intersection(seen))
		}
		seen = seen.Union(used)
	}
}

// claimedCPUs is the cpuset list of the pCPUs c pins.
func claimedCPUs(c activities.ClaimResult) string {
	var s numa.CPUSet
	for _, pc := range c.Placement.Cells {
		for _, cpu := range pc.Pins {
			s = s.Union(numa.NewCPUSet(cpu))
		}
	}
	return s.String()
}

// waitLeaseEnds waits until Redis' clock has passed the end of the fence
// lease on claim id, which the ledger keeps in the host's lease hash as
// "token|end in ms". It reads the hash itself because the ledger's only
// look at a lease, the audit's compare-and-delete, would free the claim.
func (w *world) waitLeaseEnds(t testing.TB, host, id string) {
	t.Helper()
	ctx := context.Background()
	key := ledger.DefaultKeyPrefix + ":host:{" + host + "}:lease"
	deadline := time.Now().Add(30 * time.Second)
	for {
		lease, err := w.RDB.HGet(ctx, key, id).Result()
		if errors.Is(err, redis.Nil) {
			return // ended by the step whose call returned
		}
		if err != nil {
			t.Fatal(err)
		}
		end, err := strconv.ParseInt(lease[strings.LastIndex(lease, "|")+1:], 10, 64)
		if err != nil {
			t.Fatalf("fence lease %q of claim %s on %s: %v", lease, id, host, err)
		}
		now, err := w.RDB.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.UnixMilli() > end {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fence lease of claim %s on %s still runs 30s on (ends %d ms, Redis' clock %d ms)", id, host, end, now.UnixMilli())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func dur(d time.Duration) *time.Duration { return &d }
