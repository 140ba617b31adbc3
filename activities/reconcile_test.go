package activities

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// world is a real Redis with a ledger and a simulated hypervisor on it,
// and the activities over them. Its ledger's clock is the test's, so
// claims can be made in the past.
type world struct {
	acts *Activities
	led  *ledger.Ledger
	rdb  *redis.Client
	drv  *sim.Driver
	mu   sync.Mutex
	now  time.Time
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
	w := &world{now: time.Now().Add(-time.Hour)}
	led, err := ledger.New(rdb, ledger.Options{Now: w.clock, Namespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	w.led, w.rdb, w.drv = led, rdb, sim.New(simRDB, sim.Options{})
	w.acts = &Activities{Ledger: led, Driver: w.drv}
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

func uuidN(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }
