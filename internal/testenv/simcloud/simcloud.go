// Package simcloud is a small cloud for tests: a ledger on a real Redis,
// simulated hypervisors, and the workflows' steps (package activities)
// over them. A test sets its guests up by running the steps a workflow
// runs, so the state it audits or moves is the state a workflow leaves.
// The tests of activities and of audit share it, from package
// activities_test and audit_test; the package itself imports activities,
// so a test inside package activities cannot use it.
package simcloud

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// World is a ledger and simulated hypervisors on a real Redis, and the
// activities over them. Its ledger's clock is the test's (At), so claims
// can be made in the past; it starts an hour ago.
type World struct {
	// Acts has no Auditor: a test of the audit builds its own over
	// Ledger and Driver.
	Acts   *activities.Activities
	Ledger *ledger.Ledger
	// RDB is the ledger's Redis client.
	RDB    *redis.Client
	Driver *sim.Driver

	mu  sync.Mutex
	now time.Time
}

// New is a World whose ledger and simulated hypervisors share one new
// redis-server.
func New(t testing.TB) *World {
	t.Helper()
	srv := testenv.StartRedis(t)
	return NewOn(t, srv, srv)
}

// NewOn is a World whose ledger and simulated hypervisors keep their
// state in the given servers, which may be one: a test that stops the
// ledger's server keeps the hypervisors.
func NewOn(t testing.TB, ledgerSrv, simSrv *testenv.Redis) *World {
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
	w := &World{RDB: rdb, now: time.Now().Add(-time.Hour)}
	led, err := ledger.New(rdb, ledger.Options{Now: w.Now, Namespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	w.Ledger, w.Driver = led, sim.New(simRDB, sim.Options{})
	w.Acts = &activities.Activities{Ledger: led, Driver: hypervisor.Guarded(w.Driver), Simulated: w.Driver}
	return w
}

// Now is the ledger's clock.
func (w *World) Now() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.now
}

// At makes the ledger stamp what follows with t.
func (w *World) At(t time.Time) {
	w.mu.Lock()
	w.now = t
	w.mu.Unlock()
}

// AddHost registers a host of one cell of 8 cores, every one of them
// pinnable and none shared, in the simulator and the ledger.
func (w *World) AddHost(t testing.TB, name string) {
	t.Helper()
	w.addHost(t, name, numa.CPUSet{}, false)
}

// AddDeviceHost registers a host as AddHost does, with an SR-IOV NIC on
// its cell: PF 0000:81:00.0 and its VFs 0000:81:10.0 and 0000:81:10.1,
// all on physical network physnet1.
func (w *World) AddDeviceHost(t testing.TB, name string) {
	t.Helper()
	w.addHost(t, name, numa.CPUSet{}, true)
}

// AddSharedHost registers a host as AddDeviceHost does whose CPUs 0-1 are
// shared, for guests that float, and 2-7 pinnable.
func (w *World) AddSharedHost(t testing.TB, name string) {
	t.Helper()
	w.addHost(t, name, numa.Range(0, 1), true)
}

func (w *World) addHost(t testing.TB, name string, shared numa.CPUSet, devices bool) {
	t.Helper()
	spec := numa.UniformSpec{Cells: 1, Cores: 8, Threads: 1, MemoryMB: 16384}
	if !shared.IsEmpty() {
		spec.Shared, spec.Dedicated = shared, numa.Range(0, 7).Difference(shared)
	}
	h, err := numa.Uniform(spec)
	if err != nil {
		t.Fatal(err)
	}
	if devices {
		node := 0
		dev := func(addr string, typ numa.DeviceType, product, parent string) numa.PCIDevice {
			return numa.PCIDevice{Address: addr, VendorID: "8086", ProductID: product, DevType: typ, PhysFunction: parent,
				NUMANode: &node, Tags: map[string]string{"physical_network": "physnet1"}}
		}
		h.PCIDevices = []numa.PCIDevice{
			dev("0000:81:00.0", numa.DeviceTypePF, "1572", ""),
			dev("0000:81:10.0", numa.DeviceTypeVF, "154c", "0000:81:00.0"),
			dev("0000:81:10.1", numa.DeviceTypeVF, "154c", "0000:81:00.0"),
		}
	}
	ctx := context.Background()
	if err := w.Driver.AddHost(ctx, name, h); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Ledger.RegisterHost(ctx, name, h); err != nil {
		t.Fatal(err)
	}
}

// DeviceFlavor is Flavor with an SR-IOV port on physnet1, so the guest
// takes a VF; floating drops the dedicated CPUs, so the VF is all it
// holds besides memory.
func DeviceFlavor(floating bool) guest.Flavor {
	f := Flavor()
	if floating {
		f.ExtraSpecs = nil
	}
	f.Ports = []numa.Port{{Name: "data", Physnet: "physnet1", VNICType: numa.VNICDirect}}
	return f
}

// Flavor is the guests' flavor: two dedicated vCPUs and 512 MB. Each call
// returns a new copy, so a test may change its own.
func Flavor() guest.Flavor {
	return guest.Flavor{VCPUs: 2, MemoryMB: 512, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
}

// UUID is the n-th instance uuid.
func UUID(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }

// Claim makes a pending claim of Flavor for uuid on host, owned by owner.
func (w *World) Claim(t testing.TB, host, id, uuid string, kind ledger.ClaimKind, owner activities.Owner) activities.ClaimResult {
	t.Helper()
	return w.ClaimFlavor(t, host, id, uuid, kind, owner, Flavor())
}

// ClaimFlavor is Claim of flavor f.
func (w *World) ClaimFlavor(t testing.TB, host, id, uuid string, kind ledger.ClaimKind, owner activities.Owner, f guest.Flavor) activities.ClaimResult {
	t.Helper()
	c, err := w.Acts.Claim(context.Background(), activities.ClaimInput{Host: host, ClaimID: id, UUID: uuid, Kind: kind, Owner: owner, Flavor: f})
	if err != nil {
		t.Fatalf("Claim(%s on %s): %v", id, host, err)
	}
	return c
}

// Boot boots uuid on host the way the Boot workflow does, owned by owner:
// record, claim, spawn, commit and attach.
func (w *World) Boot(t testing.TB, host, uuid string, owner activities.Owner) activities.ClaimResult {
	t.Helper()
	return w.BootFlavor(t, host, uuid, owner, Flavor())
}

// BootFlavor is Boot of flavor f.
func (w *World) BootFlavor(t testing.TB, host, uuid string, owner activities.Owner, f guest.Flavor) activities.ClaimResult {
	t.Helper()
	ctx := context.Background()
	if _, err := w.Acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: uuid, Name: "vm-" + uuid[:8], Flavor: f}); err != nil {
		t.Fatal(err)
	}
	c := w.ClaimFlavor(t, host, "boot-"+owner.FirstRunID, uuid, ledger.KindBoot, owner, f)
	if err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: uuid, Host: host, Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.Attach(ctx, activities.AttachInput{UUID: uuid, Host: host, ClaimID: c.ClaimID}); err != nil {
		t.Fatal(err)
	}
	return c
}

// ResizeTo runs a resize of uuid from host src to dst up to VERIFY_RESIZE,
// the way the Resize workflow does, and returns the destination claim.
func (w *World) ResizeTo(t testing.TB, uuid, src, srcClaim, dst string, f guest.Flavor) activities.ClaimResult {
	t.Helper()
	ctx := context.Background()
	step := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	step("BeginResize", w.Acts.BeginResize(ctx, activities.BeginResizeInput{UUID: uuid, NewFlavor: f}))
	c, err := w.Acts.Claim(ctx, activities.ClaimInput{Host: dst, ClaimID: "resize-dest-1", UUID: uuid, Kind: ledger.KindResizeDest,
		Owner: activities.Owner{WorkflowID: guest.InstanceWorkflowID(uuid), FirstRunID: "resize-1"}, Flavor: f})
	step("Claim", err)
	step("HoldClaim", w.Acts.HoldClaim(ctx, activities.ClaimRef{Host: src, ClaimID: srcClaim}))
	step("PowerOff", w.Acts.PowerOff(ctx, activities.DomainInput{UUID: uuid, Host: src}))
	step("MoveResized", w.Acts.MoveResized(ctx, activities.MoveResizedInput{UUID: uuid, Source: src, Dest: dst, ClaimID: c.ClaimID, Token: c.Token,
		Placement: c.Placement, Start: true}))
	step("FinishResize", w.Acts.FinishResize(ctx, activities.FinishResizeInput{UUID: uuid, Dest: dst, DestClaimID: c.ClaimID}))
	return c
}

// HasClaim says whether host holds claim id.
func (w *World) HasClaim(t testing.TB, host, id string) bool {
	t.Helper()
	_, err := w.Ledger.GetClaim(context.Background(), host, id)
	if errors.Is(err, ledger.ErrUnknownClaim) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// RunsPinned checks that uuid's domain on host runs pinned to the claim,
// with vcpus vCPUs.
func (w *World) RunsPinned(t testing.TB, uuid, host string, c activities.ClaimResult, vcpus int) {
	t.Helper()
	dom, err := w.Driver.Lookup(context.Background(), host, uuid)
	if err != nil || dom.State != hypervisor.StateRunning {
		t.Fatalf("domain of %s on %s = %+v, %v; want it running", uuid, host, dom, err)
	}
	pins, err := xmlpatch.Read(dom.XML)
	if err != nil {
		t.Fatal(err)
	}
	want, err := xmlpatch.PinsFor(&c.Placement)
	if err != nil {
		t.Fatal(err)
	}
	if got := pins.HostCPUs(); !got.Equal(want.HostCPUs()) || len(pins.VCPUPins) != vcpus {
		t.Errorf("domain of %s on %s pinned to %s with %d vCPUs, want %s with %d", uuid, host, got, len(pins.VCPUPins), want.HostCPUs(), vcpus)
	}
}

// WaitLeaseOut waits until Redis has let c's fence lease run out, and
// frees c doing so: the audit's compare-and-delete, which a running lease
// refuses, is the only look at the lease the ledger gives.
func (w *World) WaitLeaseOut(t testing.TB, c activities.ClaimResult) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		freed, err := w.Ledger.ReleaseIfUnchanged(context.Background(), c.Host, c.ClaimID, c.Token, ledger.StatePending)
		if err != nil {
			t.Fatal(err)
		}
		if freed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim %s still under its fence lease 30s after its renewal", c.ClaimID)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
