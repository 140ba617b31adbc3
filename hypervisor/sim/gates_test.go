package sim

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/hypervisor"
)

// await waits until g's state satisfies cond; a hang fails the test.
func (e *env) await(g Gate, what string, cond func(GateState) bool) GateState {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	st, err := e.d.AwaitGate(ctx, g, "", cond)
	if err != nil {
		e.t.Fatalf("waiting for %s at gate %s: %v", what, g, err)
	}
	return st
}

// TestGateHoldsUntilReleased: a call held at its gate has done nothing
// until the release, and then completes; the next call passes.
func TestGateHoldsUntilReleased(t *testing.T) {
	e := newEnv(t, Options{})
	if err := e.d.Define(e.ctx, "h1", domainXML(uuidA, "a", 2, 0)); err != nil {
		t.Fatal(err)
	}
	if err := e.d.HoldGate(e.ctx, GateStart, ""); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.d.Start(e.ctx, "h1", uuidA) }()
	e.await(GateStart, "the start", func(st GateState) bool { return st.Arrived == 1 })
	if dom, err := e.d.Lookup(e.ctx, "h1", uuidA); err != nil || dom.State != hypervisor.StateShutoff {
		t.Fatalf("domain while its start is held = %+v, %v; want it shut off", dom, err)
	}
	select {
	case err := <-done:
		t.Fatalf("Start returned %v while held", err)
	default:
	}
	if err := e.d.ReleaseGate(e.ctx, GateStart, ""); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Start after the release: %v", err)
	}
	if dom, err := e.d.Lookup(e.ctx, "h1", uuidA); err != nil || dom.State != hypervisor.StateRunning {
		t.Errorf("domain after the release = %+v, %v; want it running", dom, err)
	}
	if err := e.d.Stop(e.ctx, "h1", uuidA); err != nil {
		t.Errorf("Stop through a released gate of another operation: %v", err)
	}
	if _, err := ParseGate("nowhere"); err == nil {
		t.Error(`ParseGate("nowhere") = nil error`)
	}
}

// TestGateCancel: a held call whose context is cancelled returns that
// error and counts the cancel; a live migration held before its
// switchover is aborted by it, one held past its switchover notes it and
// completes once released.
func TestGateCancel(t *testing.T) {
	for _, tt := range []struct {
		gate   Gate
		onDest bool
	}{{GateMigrate, false}, {GateSwitchover, false}, {GateSwitched, true}} {
		t.Run(string(tt.gate), func(t *testing.T) {
			e := newEnv(t, Options{})
			src := e.running("h1", uuidA, "a", 2, 0)
			if err := e.d.HoldGate(e.ctx, tt.gate, ""); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(e.ctx)
			defer cancel()
			destXML := domainXML(uuidA, "a", 6, 1)
			done := make(chan error, 1)
			go func() { done <- e.d.Migrate(ctx, migrateReq("h1", "h2", uuidA, destXML), nil) }()
			e.await(tt.gate, "the migration", func(st GateState) bool { return st.Arrived == 1 })
			cancel()
			e.await(tt.gate, "the cancel", func(st GateState) bool { return st.Cancelled == 1 })
			if tt.onDest {
				select {
				case err := <-done:
					t.Fatalf("Migrate held past its switchover returned %v before the release", err)
				case <-time.After(5 * gatePoll):
				}
				if err := e.d.ReleaseGate(e.ctx, tt.gate, ""); err != nil {
					t.Fatal(err)
				}
			}
			err := <-done
			want := map[string]where{"h1": {hypervisor.StateRunning, src}}
			if tt.onDest {
				if err != nil {
					t.Fatalf("Migrate cancelled past its switchover: %v, want it completed", err)
				}
				want = map[string]where{"h2": {hypervisor.StateRunning, destXML}}
			} else if !errors.Is(err, context.Canceled) {
				t.Fatalf("Migrate cancelled at gate %s: %v, want context.Canceled", tt.gate, err)
			}
			if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
				t.Errorf("after a cancel at gate %s, placement mismatch (-want +got):\n%s", tt.gate, diff)
			}
		})
	}
}

// TestGateOfOneGuest: a gate held for one domain holds only its calls;
// the same operation on another domain passes.
func TestGateOfOneGuest(t *testing.T) {
	e := newEnv(t, Options{})
	for _, u := range []string{uuidA, uuidB} {
		if err := e.d.Define(e.ctx, "h1", domainXML(u, "g"+u[:4], 2, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.d.HoldGate(e.ctx, GateStart, uuidA); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.d.Start(e.ctx, "h1", uuidA) }()
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if _, err := e.d.AwaitGate(ctx, GateStart, uuidA, func(st GateState) bool { return st.Arrived == 1 }); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Stop(e.ctx, "h1", uuidB); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Start(e.ctx, "h1", uuidB); err != nil {
		t.Errorf("Start of another domain through a gate held for %s: %v", uuidA, err)
	}
	if st, err := e.d.GateState(e.ctx, GateStart, ""); err != nil || st.Arrived != 0 {
		t.Errorf("the every-domain gate = %+v, %v; want nothing arrived", st, err)
	}
	if err := e.d.ReleaseGate(e.ctx, GateStart, uuidA); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Start of %s after the release: %v", uuidA, err)
	}
}
