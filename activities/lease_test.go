package activities_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
)

// outageWorld is a world whose ledger has a Redis of its own, which keeps
// what it acknowledged across a stop, and whose simulated hypervisors do
// not stop with it.
func outageWorld(t *testing.T) (*simcloud.World, *testenv.Redis) {
	t.Helper()
	led := testenv.StartRedis(t, testenv.AppendOnly())
	w := simcloud.NewOn(t, led, testenv.StartRedis(t))
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	return w, led
}

// result runs f in the background; its error arrives on the channel.
func result(f func() error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	return done
}

func waitResult(t *testing.T, what string, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("%s has not returned a minute after the ledger came back", what)
		return nil
	}
}

// TestSpawnWaitsOutALedgerOutage: a spawn whose fence finds the ledger
// down waits for it, starting nothing meanwhile, and then starts the
// guest: a Redis failover costs the step time, not one of its attempts.
func TestSpawnWaitsOutALedgerOutage(t *testing.T) {
	ctx := context.Background()
	w, led := outageWorld(t)
	u := simcloud.UUID(60)
	if _, err := w.Acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: u, Name: "vm", Flavor: simcloud.Flavor()}); err != nil {
		t.Fatal(err)
	}
	c := w.Claim(t, "a", "boot-run-1", u, ledger.KindBoot, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-1"})
	failed := &failedCalls{}
	w.RDB.AddHook(failed)
	led.Stop(t)
	done := result(func() error {
		return w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token})
	})
	// The fence found the ledger down and tried again: it waits.
	for deadline := time.Now().Add(time.Minute); failed.n.Load() < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the spawn's fence did not call the ledger within a minute")
		}
	}
	select {
	case err := <-done:
		t.Fatalf("Spawn with the ledger down returned %v, want it to wait", err)
	default:
	}
	if _, err := w.Driver.Lookup(ctx, "a", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Spawn defined the guest before its fence passed (lookup error %v)", err)
	}
	led.Start(t)
	if err := waitResult(t, "Spawn", done); err != nil {
		t.Fatalf("Spawn once the ledger is back = %v, want nil", err)
	}
	if dom, err := w.Driver.Lookup(ctx, "a", u); err != nil || dom.State != hypervisor.StateRunning {
		t.Errorf("guest after the spawn = %+v, %v; want running", dom, err)
	}
}

// atSwitchover starts in's migration and returns once its copy is done
// and it is held before its switchover, whose fence comes right after
// ReleaseGate(GateSwitchover): a test stops the ledger there to reach
// that fence with the ledger down.
func atSwitchover(t *testing.T, w *simcloud.World, in activities.MigrateInput) <-chan error {
	t.Helper()
	ctx := context.Background()
	if err := w.Driver.HoldGate(ctx, sim.GateSwitchover, in.UUID); err != nil {
		t.Fatal(err)
	}
	done := result(func() error { return w.Acts.Migrate(ctx, in) })
	if _, err := w.Driver.AwaitGate(ctx, sim.GateSwitchover, in.UUID, func(st sim.GateState) bool { return st.Arrived == 1 }); err != nil {
		t.Fatal(err)
	}
	return done
}

// failedCalls counts the calls of a Redis client that failed, so that a
// test sees a step reach a ledger that is down.
type failedCalls struct{ n atomic.Int64 }

func (f *failedCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *failedCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && !errors.Is(err, redis.Nil) {
			f.n.Add(1)
		}
		return err
	}
}

func (f *failedCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestMigrateRidesOutALedgerOutage: the ledger is down when the migration
// fences before its switchover; the lease its start took still holds the
// claim, so the fence waits for the ledger instead of aborting, and the
// migration completes.
func TestMigrateRidesOutALedgerOutage(t *testing.T) {
	ctx := context.Background()
	w, led := outageWorld(t)
	in, _, _ := preparedMigration(t, w, 61)
	done := atSwitchover(t, w, in)
	failed := &failedCalls{}
	w.RDB.AddHook(failed)
	led.Stop(t)
	if err := w.Driver.ReleaseGate(ctx, sim.GateSwitchover, in.UUID); err != nil {
		t.Fatal(err)
	}
	// The fence found the ledger down and tried again: it waits.
	for deadline := time.Now().Add(time.Minute); failed.n.Load() < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the switchover fence did not call the ledger within a minute of the release")
		}
	}
	select {
	case err := <-done:
		t.Fatalf("Migrate with the ledger down at its switchover fence returned %v, want it to wait", err)
	default:
	}
	led.Start(t)
	if err := waitResult(t, "Migrate", done); err != nil {
		t.Fatalf("Migrate across a ledger outage = %v, want nil", err)
	}
	if dom, err := w.Driver.Lookup(ctx, "b", in.UUID); err != nil || dom.State != hypervisor.StateRunning {
		t.Errorf("guest on the destination = %+v, %v; want running", dom, err)
	}
	if _, err := w.Driver.Lookup(ctx, "a", in.UUID); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("guest still on the source after the migration (lookup error %v)", err)
	}
}

// TestMigrateAbortsWhenItsLeaseRunsOut: with the ledger down for longer
// than the lease, the fence before the switchover cannot prove the claim
// still the migration's, so it aborts: the guest stays on its source, and
// the error is retryable, since a retry may move it once the ledger is
// back.
func TestMigrateAbortsWhenItsLeaseRunsOut(t *testing.T) {
	ctx := context.Background()
	w, led := outageWorld(t)
	w.Acts.FenceLease = 4 * time.Second
	in, _, _ := preparedMigration(t, w, 62)
	done := atSwitchover(t, w, in)
	// The switchover fence retries until the lease runs out.
	led.Stop(t)
	if err := w.Driver.ReleaseGate(ctx, sim.GateSwitchover, in.UUID); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Migrate has not returned 30s into an outage longer than its lease")
	}
	led.Start(t)
	var app *temporal.ApplicationError
	if err == nil || (errors.As(err, &app) && app.NonRetryable()) {
		t.Fatalf("Migrate whose lease ran out = %v, want a retryable error", err)
	}
	if !strings.Contains(err.Error(), "fence lease") || !strings.Contains(err.Error(), "ran out") {
		t.Errorf("Migrate whose lease ran out = %q, want it to say the fence lease ran out", err)
	}
	if dom, lerr := w.Driver.Lookup(ctx, "a", in.UUID); lerr != nil || dom.State != hypervisor.StateRunning {
		t.Errorf("guest on its source after the abort = %+v, %v; want running (Migrate: %v)", dom, lerr, err)
	}
	if _, lerr := w.Driver.Lookup(ctx, "b", in.UUID); !errors.Is(lerr, hypervisor.ErrNotFound) {
		t.Errorf("guest on the destination after the abort (lookup error %v)", lerr)
	}
	// The retry, with the ledger back, moves it.
	if err := w.Acts.Migrate(ctx, in); err != nil {
		t.Fatalf("Migrate again with the ledger back = %v, want nil", err)
	}
}

// TestLeaseHoldsUnderClockSkew: a worker whose wall clock is an hour off
// Redis', either way, believes a lease it just renewed and never one
// that Redis has let run out (the audit may then free the claim).
func TestLeaseHoldsUnderClockSkew(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	u := simcloud.UUID(63)
	for i, skew := range []time.Duration{-time.Hour, time.Hour} {
		c := w.Claim(t, "a", fmt.Sprintf("boot-run-%d", i), u, ledger.KindBoot, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-1"})
		now := func() time.Time { return time.Now().Add(skew) }
		l := activities.NewLease(w.Acts, "a", c.ClaimID, c.Token, 200*time.Millisecond, now)
		until, err := l.Renew(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !now().Before(until) {
			t.Errorf("skew %s: the lease just renewed ends at %s by the worker's clock, before its now %s", skew, until, now())
		}
		w.WaitLeaseOut(t, c)
		if held := l.Held(); now().Before(held) {
			t.Errorf("skew %s: Redis let the lease run out, but the worker believes it until %s, %s from now", skew, held, held.Sub(now()))
		}
	}
}
