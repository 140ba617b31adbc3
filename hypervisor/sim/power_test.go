package sim

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/hypervisor"
)

// powerOff powers host off, failing the test on an error.
func (e *env) powerOff(host string) {
	e.t.Helper()
	if err := e.d.PowerOff(e.ctx, host); err != nil {
		e.t.Fatalf("PowerOff(%s): %v", host, err)
	}
}

// powerOn powers host on, failing the test on an error.
func (e *env) powerOn(host string) {
	e.t.Helper()
	if err := e.d.PowerOn(e.ctx, host); err != nil {
		e.t.Fatalf("PowerOn(%s): %v", host, err)
	}
}

// home returns the stored home of domain uuid, "" without one.
func (e *env) home(uuid string) string {
	e.t.Helper()
	h, err := e.rdb.Get(e.ctx, e.d.homeKey(uuid)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		e.t.Fatalf("GET home of %s: %v", uuid, err)
	}
	return h
}

// checkHostOff fails unless err is what a call named what gets from host
// while it is off: ErrHostOff naming the host, nothing a caller would take
// for a final answer.
func checkHostOff(t *testing.T, what, host string, err error) {
	t.Helper()
	if !errors.Is(err, ErrHostOff) {
		t.Errorf("%s with %s off: %v, want an error wrapping ErrHostOff", what, host, err)
		return
	}
	for _, not := range []error{hypervisor.ErrRejected, hypervisor.ErrNotFound, hypervisor.ErrUnknownHost} {
		if errors.Is(err, not) {
			t.Errorf("%s with %s off: %v wraps %v too, want ErrHostOff alone", what, host, err, not)
		}
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "sim: ") || !strings.Contains(msg, "host "+host+" is powered off") {
		t.Errorf("%s with %s off: error %q, want it to start with 'sim: ' and say 'host %s is powered off'", what, host, msg, host)
	}
}

func TestPowerOffStopsGuestsAndFailsCalls(t *testing.T) {
	e := newEnv(t, Options{})
	xa := e.running("h1", uuidA, "a", 2, 0)
	xb := e.running("h1", uuidB, "b", 3, 0)
	// b is shutting down, slowly: the power cut ends that too.
	if err := e.d.SetLatency(e.ctx, "h1", OpShutdown, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Shutdown(e.ctx, "h1", uuidB); err != nil {
		t.Fatal(err)
	}
	const uuidC = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	xc := e.running("h2", uuidC, "c", 2, 0)
	e.powerOff("h1")

	calls := map[string]func() error{
		"Capabilities":      func() error { _, err := e.d.Capabilities(e.ctx, "h1"); return err },
		"Define":            func() error { return e.d.Define(e.ctx, "h1", xa) },
		"Define new":        func() error { return e.d.Define(e.ctx, "h1", domainXML(uuidC, "c", 2, 0)) },
		"Start":             func() error { return e.d.Start(e.ctx, "h1", uuidA) },
		"Shutdown":          func() error { return e.d.Shutdown(e.ctx, "h1", uuidA) },
		"Stop":              func() error { return e.d.Stop(e.ctx, "h1", uuidA) },
		"Undefine":          func() error { return e.d.Undefine(e.ctx, "h1", uuidA) },
		"Undefine bad uuid": func() error { return e.d.Undefine(e.ctx, "h1", "not-a-uuid") },
		"Lookup":            func() error { _, err := e.d.Lookup(e.ctx, "h1", uuidA); return err },
		"Lookup bad uuid":   func() error { _, err := e.d.Lookup(e.ctx, "h1", "not-a-uuid"); return err },
		"Domains":           func() error { _, err := e.d.Domains(e.ctx, "h1"); return err },
		"PrepareMigration":  func() error { return e.d.PrepareMigration(e.ctx, "h1", uuidC, domainXML(uuidC, "c", 6, 1)) },
		"Migrate from it": func() error {
			return e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, domainXML(uuidA, "a", 6, 1)), nil)
		},
		"Migrate to it": func() error {
			return e.d.Migrate(e.ctx, migrateReq("h2", "h1", uuidC, domainXML(uuidC, "c", 6, 1)), nil)
		},
		"Rollback from it":   func() error { return e.d.Rollback(e.ctx, "h1", "h2", uuidA) },
		"Rollback to it":     func() error { return e.d.Rollback(e.ctx, "h2", "h1", uuidC) },
		"Capabilities again": func() error { _, err := e.d.Capabilities(e.ctx, "h1"); return err },
	}
	for name, call := range calls {
		checkHostOff(t, name, "h1", call())
	}

	// The other host is untouched, and the calls above changed nothing.
	if doms, err := e.d.Domains(e.ctx, "h2"); err != nil || len(doms) != 1 || doms[0].State != hypervisor.StateRunning {
		t.Errorf("Domains(h2) with h1 off = %+v, %v; want c running", doms, err)
	}
	s, err := e.d.Settings(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Hosts["h1"].PoweredOff || s.Hosts["h2"].PoweredOff {
		t.Errorf("Settings with h1 off: powered off h1=%v h2=%v, want true, false", s.Hosts["h1"].PoweredOff, s.Hosts["h2"].PoweredOff)
	}

	e.powerOn("h1")
	got, err := e.d.Domains(e.ctx, "h1")
	if err != nil {
		t.Fatalf("Domains(h1) after PowerOn: %v", err)
	}
	want := []hypervisor.Domain{
		{UUID: uuidA, Name: "a", State: hypervisor.StateShutoff, XML: xa},
		{UUID: uuidB, Name: "b", State: hypervisor.StateShutoff, XML: xb},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Domains(h1) after PowerOff and PowerOn mismatch (-want +got):\n%s", diff)
	}
	if m := e.raw("h1", uuidB); m["shutdown_due"] != "" {
		t.Errorf("b on h1 after the power cut: hash %v, want no pending shutdown", m)
	}
	if diff := cmp.Diff(map[string]where{"h2": {hypervisor.StateRunning, xc}}, e.placement(e.d, uuidC)); diff != "" {
		t.Errorf("c after h1's power cut: placement mismatch (-want +got):\n%s", diff)
	}
	// Back on, the host answers again, and its guests boot when asked.
	if err := e.d.Start(e.ctx, "h1", uuidA); err != nil {
		t.Errorf("Start(h1, a) after PowerOn: %v, want nil", err)
	}
	if s, err := e.d.Settings(e.ctx); err != nil || s.Hosts["h1"].PoweredOff {
		t.Errorf("Settings after PowerOn(h1): h1 powered off %v (err %v), want false", s.Hosts["h1"].PoweredOff, err)
	}
}

func TestPowerIdempotentAndUnknownHost(t *testing.T) {
	e := newEnv(t, Options{})
	x := e.running("h1", uuidA, "a", 2, 0)
	steps := []struct {
		name string
		run  func() error
		off  bool // h1 is off afterwards
	}{
		{"PowerOn of a host that is on", func() error { return e.d.PowerOn(e.ctx, "h1") }, false},
		{"PowerOff", func() error { return e.d.PowerOff(e.ctx, "h1") }, true},
		{"PowerOff again", func() error { return e.d.PowerOff(e.ctx, "h1") }, true},
		{"PowerOn", func() error { return e.d.PowerOn(e.ctx, "h1") }, false},
		{"PowerOn again", func() error { return e.d.PowerOn(e.ctx, "h1") }, false},
	}
	for _, s := range steps {
		if err := s.run(); err != nil {
			t.Fatalf("%s: %v, want nil", s.name, err)
		}
		st, err := e.d.Settings(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Hosts["h1"].PoweredOff; got != s.off {
			t.Errorf("after %s: h1 powered off %v, want %v", s.name, got, s.off)
		}
	}
	if diff := cmp.Diff(map[string]where{"h1": {hypervisor.StateShutoff, x}}, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after power off and on, placement mismatch (-want +got):\n%s", diff)
	}

	for name, call := range map[string]func() error{
		"PowerOff": func() error { return e.d.PowerOff(e.ctx, "nope") },
		"PowerOn":  func() error { return e.d.PowerOn(e.ctx, "nope") },
	} {
		err := call()
		if !errors.Is(err, hypervisor.ErrUnknownHost) || errors.Is(err, ErrHostOff) {
			t.Errorf("%s(nope): %v, want ErrUnknownHost (and not ErrHostOff)", name, err)
		} else if !strings.HasPrefix(err.Error(), "sim: ") || !strings.Contains(err.Error(), `"nope"`) {
			t.Errorf("%s(nope): error %q, want it to start with 'sim: ' and name the host", name, err)
		}
	}
	if n, err := e.rdb.Exists(e.ctx, e.d.powerKey("nope"), e.d.topoKey("nope")).Result(); err != nil || n != 0 {
		t.Errorf("keys of unknown host nope after PowerOff(nope): %d exist (err %v), want none", n, err)
	}
	// A removed host comes back on.
	e.powerOff("h2")
	if err := e.d.RemoveHost(e.ctx, "h2"); err != nil {
		t.Fatalf("RemoveHost(h2) while off: %v", err)
	}
	if err := e.d.AddHost(e.ctx, "h2", testTopo(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Capabilities(e.ctx, "h2"); err != nil {
		t.Errorf("Capabilities(h2) after it was removed while off and added again: %v, want nil", err)
	}
}

// TestEvacuateWhileHostOff walks the evacuation of a dead host: its guest
// is rebuilt elsewhere while it is off, and the leftover it still holds
// when it is back can neither start nor block, and goes away.
func TestEvacuateWhileHostOff(t *testing.T) {
	e := newEnv(t, Options{})
	if err := e.d.AddHost(e.ctx, "h3", testTopo(t)); err != nil {
		t.Fatal(err)
	}
	x1 := e.running("h1", uuidA, "a", 2, 0)
	x2 := domainXML(uuidA, "a", 6, 1)
	x3 := domainXML(uuidA, "a", 7, 1)
	leftover := "defined on h2 too; two copies would share its disks"
	steps := []struct {
		name     string
		run      func() error
		err      error  // want an error wrapping this (nil: success)
		errIn    string // and saying this
		home     string // the domain's home afterwards
		h1, h2   hypervisor.State
		skipLook map[string]bool // hosts that are off: not looked at
	}{
		{"define on h2 while h1 is on", func() error { return e.d.Define(e.ctx, "h2", x2) }, hypervisor.ErrRejected, "defined on h1", "h1", hypervisor.StateRunning, "", nil},
		{"power h1 off", func() error { return e.d.PowerOff(e.ctx, "h1") }, nil, "", "h1", "", "", map[string]bool{"h1": true}},
		{"define on h2 while h1 is off", func() error { return e.d.Define(e.ctx, "h2", x2) }, nil, "", "h2", "", hypervisor.StateShutoff, map[string]bool{"h1": true}},
		{"define on h2 again", func() error { return e.d.Define(e.ctx, "h2", x2) }, nil, "", "h2", "", hypervisor.StateShutoff, map[string]bool{"h1": true}},
		{"start on h2", func() error { return e.d.Start(e.ctx, "h2", uuidA) }, nil, "", "h2", "", hypervisor.StateRunning, map[string]bool{"h1": true}},
		{"power h1 on", func() error { return e.d.PowerOn(e.ctx, "h1") }, nil, "", "h2", hypervisor.StateShutoff, hypervisor.StateRunning, nil},
		{"start the leftover on h1", func() error { return e.d.Start(e.ctx, "h1", uuidA) }, hypervisor.ErrRejected, leftover, "h2", hypervisor.StateShutoff, hypervisor.StateRunning, nil},
		{"define the leftover on h1", func() error { return e.d.Define(e.ctx, "h1", x1) }, hypervisor.ErrRejected, "defined on h2", "h2", hypervisor.StateShutoff, hypervisor.StateRunning, nil},
		{"define on h3 while h2 is on", func() error { return e.d.Define(e.ctx, "h3", x3) }, hypervisor.ErrRejected, "defined on h2", "h2", hypervisor.StateShutoff, hypervisor.StateRunning, nil},
		{"migrate onto the leftover", func() error { return e.d.Migrate(e.ctx, migrateReq("h2", "h1", uuidA, x1), nil) }, hypervisor.ErrRejected, "already defined on h1", "h2", hypervisor.StateShutoff, hypervisor.StateRunning, nil},
		{"stop the leftover", func() error { return e.d.Stop(e.ctx, "h1", uuidA) }, nil, "", "h2", hypervisor.StateShutoff, hypervisor.StateRunning, nil},
		{"undefine the leftover", func() error { return e.d.Undefine(e.ctx, "h1", uuidA) }, nil, "", "h2", "", hypervisor.StateRunning, nil},
		{"undefine the leftover again", func() error { return e.d.Undefine(e.ctx, "h1", uuidA) }, nil, "", "h2", "", hypervisor.StateRunning, nil},
		{"migrate back to h1", func() error { return e.d.Migrate(e.ctx, migrateReq("h2", "h1", uuidA, x1), nil) }, nil, "", "h1", hypervisor.StateRunning, "", nil},
	}
	for _, s := range steps {
		err := s.run()
		if s.err == nil && err != nil {
			t.Fatalf("%s: %v, want nil", s.name, err)
		}
		if s.err != nil && (!errors.Is(err, s.err) || !strings.Contains(err.Error(), s.errIn)) {
			t.Fatalf("%s: %v, want an error wrapping %v saying %q", s.name, err, s.err, s.errIn)
		}
		if got := e.home(uuidA); got != s.home {
			t.Errorf("after %s: home %q, want %q", s.name, got, s.home)
		}
		for _, hs := range []struct {
			host string
			want hypervisor.State
		}{{"h1", s.h1}, {"h2", s.h2}} {
			if s.skipLook[hs.host] {
				continue
			}
			dom, err := e.d.Lookup(e.ctx, hs.host, uuidA)
			switch {
			case hs.want == "" && !errors.Is(err, hypervisor.ErrNotFound):
				t.Errorf("after %s: Lookup(%s) = %+v, %v; want ErrNotFound", s.name, hs.host, dom, err)
			case hs.want != "" && (err != nil || dom.State != hs.want):
				t.Errorf("after %s: Lookup(%s) = %+v, %v; want it %s", s.name, hs.host, dom, err, hs.want)
			}
		}
	}
}

// TestLeftoverStartsAlone: a leftover is refused while the copy that
// replaced it exists, even on a host that is off itself, and starts once
// it is the only copy.
func TestLeftoverStartsAlone(t *testing.T) {
	tests := []struct {
		name string
		// then acts on the copy on h2 once h1, holding the leftover, is
		// back.
		then      func(e *env) error
		wantStart error
		wantHome  string
	}{
		{"other copy undefined", func(e *env) error { return e.d.Undefine(e.ctx, "h2", uuidA) }, nil, "h1"},
		{"other copy stopped", func(e *env) error { return e.d.Stop(e.ctx, "h2", uuidA) }, hypervisor.ErrRejected, "h2"},
		{"other copy's host off", func(e *env) error { return e.d.PowerOff(e.ctx, "h2") }, hypervisor.ErrRejected, "h2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, Options{})
			x := e.running("h1", uuidA, "a", 2, 0)
			e.powerOff("h1")
			if err := e.d.Define(e.ctx, "h2", x); err != nil {
				t.Fatalf("Define(h2) with h1 off: %v", err)
			}
			e.powerOn("h1")
			if err := tt.then(e); err != nil {
				t.Fatal(err)
			}
			err := e.d.Start(e.ctx, "h1", uuidA)
			if !errors.Is(err, tt.wantStart) || (tt.wantStart == nil && err != nil) {
				t.Fatalf("Start(h1) of the leftover, %s: %v, want %v", tt.name, err, tt.wantStart)
			}
			if got := e.home(uuidA); got != tt.wantHome {
				t.Errorf("%s, after Start(h1): home %q, want %q", tt.name, got, tt.wantHome)
			}
			want := hypervisor.StateShutoff
			if tt.wantStart == nil {
				want = hypervisor.StateRunning
				// The leftover is the guest now: h2 cannot take it.
				if err := e.d.Define(e.ctx, "h2", x); !errors.Is(err, hypervisor.ErrRejected) {
					t.Errorf("%s: Define(h2) with the guest running on h1: %v, want ErrRejected", tt.name, err)
				}
			}
			if dom, err := e.d.Lookup(e.ctx, "h1", uuidA); err != nil || dom.State != want {
				t.Errorf("%s: Lookup(h1) = %+v, %v; want it %s", tt.name, dom, err, want)
			}
		})
	}
}

// TestPowerOffDuringCopy: a host powering off while a migration copies to
// or from it ends the migration as dead; the guest stays on the source,
// running unless the source is the host that went off.
func TestPowerOffDuringCopy(t *testing.T) {
	src := domainXML(uuidA, "a", 2, 0)
	dest := domainXML(uuidA, "a", 6, 1)
	tests := []struct {
		name   string
		off    string
		crash  bool // the worker driving the migration died first
		source hypervisor.State
	}{
		{"source off", "h1", false, hypervisor.StateShutoff},
		{"destination off", "h2", false, hypervisor.StateRunning},
		{"source off, worker dead", "h1", true, hypervisor.StateShutoff},
		{"destination off, worker dead", "h2", true, hypervisor.StateRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The default staleness bound is far away: only the power-off
			// ends the migration.
			e := newEnv(t, Options{})
			e.running("h1", uuidA, "a", 2, 0)
			var err error
			if tt.crash {
				crashOnce(e.d, "copying")
				if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); !errors.Is(err, errCrash) {
					t.Fatalf("Migrate crashing during the copy: %v, want the crash", err)
				}
				e.d.crash = nil
				e.powerOff(tt.off)
			} else {
				powered := false
				err = e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), func(p hypervisor.Progress) {
					if p.Percent >= 30 && !powered {
						powered = true
						e.powerOff(tt.off)
					}
				})
				if !powered {
					t.Fatalf("Migrate ended before 30%%: %v", err)
				}
				if !errors.Is(err, ErrHostOff) || !strings.Contains(err.Error(), "host "+tt.off+" is powered off") || !strings.HasPrefix(err.Error(), "sim: migrate ") {
					t.Errorf("Migrate while %s powered off: %v, want a 'sim: migrate' error wrapping ErrHostOff naming %s", tt.off, err, tt.off)
				}
			}
			// Ended at once, off host and all: no record, no marks, no
			// incoming domain.
			if rec := e.migrationRecord(uuidA); len(rec) != 0 {
				t.Errorf("after %s: migration record %v, want none", tt.name, rec)
			}
			if m := e.raw("h2", uuidA); len(m) != 0 {
				t.Errorf("after %s: h2 holds %v, want nothing", tt.name, m)
			}
			if m := e.raw("h1", uuidA); m["migration"] != "" || m["state"] != string(tt.source) {
				t.Errorf("after %s: h1 holds %v, want it %s and unmarked", tt.name, m, tt.source)
			}
			if got := e.home(uuidA); got != "h1" {
				t.Errorf("after %s: home %q, want h1", tt.name, got)
			}
			e.powerOn(tt.off)
			if diff := cmp.Diff(map[string]where{"h1": {tt.source, src}}, e.placement(e.d, uuidA)); diff != "" {
				t.Errorf("after %s and PowerOn: placement mismatch (-want +got):\n%s", tt.name, diff)
			}
			// Nothing blocks the guest: it boots and migrates.
			if err := e.d.Start(e.ctx, "h1", uuidA); err != nil {
				t.Fatalf("Start(h1) after %s: %v", tt.name, err)
			}
			if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); err != nil {
				t.Errorf("Migrate after %s: %v, want nil", tt.name, err)
			}
		})
	}
}

// TestPowerOffPastSwitchover: a migration past its point of no return is
// finished, not aborted: the guest belongs to the destination, shut off if
// that is the host that went off.
func TestPowerOffPastSwitchover(t *testing.T) {
	dest := domainXML(uuidA, "a", 6, 1)
	tests := []struct {
		name       string
		off        string
		crash      bool  // the worker driving the migration died at the switchover
		migrateErr error // what the live Migrate returns
		state      hypervisor.State
	}{
		{"source off", "h1", false, nil, hypervisor.StateRunning},
		{"destination off", "h2", false, ErrHostOff, hypervisor.StateShutoff},
		{"source off, worker dead", "h1", true, nil, hypervisor.StateRunning},
		{"destination off, worker dead", "h2", true, nil, hypervisor.StateShutoff},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, Options{})
			e.running("h1", uuidA, "a", 2, 0)
			if tt.crash {
				crashOnce(e.d, "switchover")
				if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); !errors.Is(err, errCrash) {
					t.Fatalf("Migrate crashing at the switchover: %v, want the crash", err)
				}
				e.d.crash = nil
				e.powerOff(tt.off)
			} else {
				e.d.crash = func(p string) error {
					if p == "switchover" {
						e.powerOff(tt.off)
					}
					return nil
				}
				err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil)
				e.d.crash = nil
				if tt.migrateErr == nil && err != nil {
					t.Errorf("Migrate with %s powering off past the switchover: %v, want nil", tt.off, err)
				}
				if tt.migrateErr != nil && (!errors.Is(err, tt.migrateErr) || !strings.Contains(err.Error(), "after the switchover")) {
					t.Errorf("Migrate with %s powering off past the switchover: %v, want an error wrapping %v saying 'after the switchover'", tt.off, err, tt.migrateErr)
				}
			}
			if rec := e.migrationRecord(uuidA); rec["phase"] != phaseCompleted {
				t.Errorf("after %s: record %v, want phase %s", tt.name, rec, phaseCompleted)
			}
			if got := e.home(uuidA); got != "h2" {
				t.Errorf("after %s: home %q, want h2", tt.name, got)
			}
			e.powerOn(tt.off)
			if diff := cmp.Diff(map[string]where{"h2": {tt.state, dest}}, e.placement(e.d, uuidA)); diff != "" {
				t.Errorf("after %s and PowerOn: placement mismatch (-want +got):\n%s", tt.name, diff)
			}
			if m := e.raw("h2", uuidA); m["incoming"] != "" || m["migration"] != "" {
				t.Errorf("after %s: h2 holds %v, want it unmarked", tt.name, m)
			}
		})
	}
}
