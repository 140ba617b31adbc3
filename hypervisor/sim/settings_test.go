package sim

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kelseyhightower/envconfig"

	"github.com/pinflow/pinflow/hypervisor"
)

func TestParseOp(t *testing.T) {
	tests := []struct {
		in   string
		want Op
		err  bool
	}{
		{"define", OpDefine, false},
		{"Start", OpStart, false},
		{"spawn", OpStart, false},
		{" migrate ", OpMigrate, false},
		{"prepare", OpPrepare, false},
		{"reboot", "", true},
		{"", "", true},
	}
	for _, tt := range tests {
		got, err := ParseOp(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("ParseOp(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.err)
		}
		if err != nil && !strings.Contains(err.Error(), "must be one of define, start, shutdown, stop, undefine, prepare, migrate") {
			t.Errorf("ParseOp(%q) error %q, want it to list the allowed operations", tt.in, err)
		}
	}
}

// opCall runs one operation on h1 whose fault is under test, from a state
// where it would succeed, and checks that a failed call changed nothing.
type opCall struct {
	op    Op
	setup func(e *env)
	call  func(e *env) error
	// after returns what Lookup(h1), Lookup(h2) must show after a failed
	// call.
	unchanged map[string]where
}

func opCalls() []opCall {
	xa := domainXML(uuidA, "a", 2, 0)
	xa2 := domainXML(uuidA, "a", 6, 1)
	running := map[string]where{"h1": {hypervisor.StateRunning, xa}}
	shutoff := map[string]where{"h1": {hypervisor.StateShutoff, xa}}
	define := func(e *env) {
		if err := e.d.Define(e.ctx, "h1", xa); err != nil {
			e.t.Fatal(err)
		}
	}
	start := func(e *env) { e.running("h1", uuidA, "a", 2, 0) }
	return []opCall{
		{OpDefine, func(*env) {}, func(e *env) error { return e.d.Define(e.ctx, "h1", xa) }, map[string]where{}},
		{OpStart, define, func(e *env) error { return e.d.Start(e.ctx, "h1", uuidA) }, shutoff},
		{OpStop, start, func(e *env) error { return e.d.Stop(e.ctx, "h1", uuidA) }, running},
		{OpUndefine, define, func(e *env) error { return e.d.Undefine(e.ctx, "h1", uuidA) }, shutoff},
		{OpMigrate, start, func(e *env) error { return e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, xa2), nil) }, running},
	}
}

func TestCountedFaultFailsExactlyN(t *testing.T) {
	for _, oc := range opCalls() {
		t.Run(string(oc.op), func(t *testing.T) {
			e := newEnv(t, Options{})
			oc.setup(e)
			if err := e.d.SetFault(e.ctx, "h1", oc.op, Fault{Times: 2}); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				err := oc.call(e)
				if !errors.Is(err, ErrInjected) {
					t.Fatalf("%s call %d with Fault{Times: 2}: %v, want ErrInjected", oc.op, i+1, err)
				}
				if diff := cmp.Diff(oc.unchanged, e.placement(e.d, uuidA)); diff != "" {
					t.Fatalf("%s call %d failed but changed the domain (-want +got):\n%s", oc.op, i+1, diff)
				}
			}
			if err := oc.call(e); err != nil {
				t.Fatalf("%s call 3 with Fault{Times: 2}: %v, want nil", oc.op, err)
			}
		})
	}
}

func TestPrepareFault(t *testing.T) {
	e := newEnv(t, Options{})
	x := domainXML(uuidA, "a", 6, 1)
	if err := e.d.SetFault(e.ctx, "h2", OpPrepare, Fault{Times: 1}); err != nil {
		t.Fatal(err)
	}
	if err := e.d.PrepareMigration(e.ctx, "h2", uuidA, x); !errors.Is(err, ErrInjected) {
		t.Errorf("PrepareMigration(h2) with a prepare fault: %v, want ErrInjected", err)
	}
	if err := e.d.PrepareMigration(e.ctx, "h2", uuidA, x); err != nil {
		t.Errorf("PrepareMigration(h2) after the fault: %v, want nil", err)
	}
}

func TestCountedFaultConcurrentCallers(t *testing.T) {
	e := newEnv(t, Options{})
	e.running("h1", uuidA, "a", 2, 0)
	const times, callers = 7, 40
	if err := e.d.SetFault(e.ctx, "h1", OpStart, Fault{Times: times}); err != nil {
		t.Fatal(err)
	}
	// Several workers share the counter: half the calls go through a
	// second driver on its own connection.
	d2 := e.restart(Options{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	for i := range callers {
		d := e.d
		if i%2 == 1 {
			d = d2
		}
		wg.Go(func() {
			err := d.Start(e.ctx, "h1", uuidA)
			if err != nil && !errors.Is(err, ErrInjected) {
				t.Errorf("Start: %v, want nil or ErrInjected", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
			}
		})
	}
	wg.Wait()
	if failed != times {
		t.Errorf("%d concurrent Starts with Fault{Times: %d}: %d failed, want exactly %d", callers, times, failed, times)
	}
}

func TestRateFault(t *testing.T) {
	// failures counts the failed calls among n Stops of a running domain
	// and returns the pattern of failures.
	failures := func(e *env, d *Driver, n int) []bool {
		out := make([]bool, n)
		for i := range out {
			err := d.Stop(e.ctx, "h1", uuidA)
			if err != nil && !errors.Is(err, ErrInjected) {
				e.t.Fatalf("Stop: %v", err)
			}
			out[i] = err != nil
		}
		return out
	}
	count := func(p []bool) int {
		n := 0
		for _, f := range p {
			if f {
				n++
			}
		}
		return n
	}
	tests := []struct {
		name     string
		opts     Options
		fault    *Fault
		min, max int // out of 200
	}{
		{"rate 0", Options{Seed: 1}, &Fault{Rate: 0}, 0, 0},
		{"rate 1", Options{Seed: 1}, &Fault{Rate: 1}, 200, 200},
		{"rate 0.3", Options{Seed: 1}, &Fault{Rate: 0.3}, 30, 90},
		{"configured rate 0.5", Options{Seed: 2, FailRate: map[Op]float64{OpStop: 0.5}}, nil, 60, 140},
		{"host rate overrides configured", Options{Seed: 2, FailRate: map[Op]float64{OpStop: 1}}, &Fault{Rate: 0}, 0, 0},
		{"counted first, then rate", Options{Seed: 3}, &Fault{Times: 200, Rate: 0}, 200, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.opts)
			e.running("h1", uuidA, "a", 2, 0)
			if tt.fault != nil {
				if err := e.d.SetFault(e.ctx, "h1", OpStop, *tt.fault); err != nil {
					t.Fatal(err)
				}
			}
			got := count(failures(e, e.d, 200))
			if got < tt.min || got > tt.max {
				t.Errorf("200 Stops with %s: %d failed, want %d-%d", tt.name, got, tt.min, tt.max)
			}
		})
	}

	// The same seed gives the same failures.
	e := newEnv(t, Options{})
	e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.SetFault(e.ctx, "h1", OpStop, Fault{Rate: 0.5}); err != nil {
		t.Fatal(err)
	}
	first := failures(e, e.restart(Options{Seed: 42}), 100)
	second := failures(e, e.restart(Options{Seed: 42}), 100)
	if diff := cmp.Diff(first, second); diff != "" {
		t.Errorf("Stops with Fault{Rate: 0.5} and seed 42, twice: patterns differ (-first +second):\n%s", diff)
	}
	if n := count(first); n == 0 || n == 100 {
		t.Errorf("100 Stops with Fault{Rate: 0.5}: %d failed, want some but not all", n)
	}
}

func TestSetFaultRejects(t *testing.T) {
	e := newEnv(t, Options{})
	tests := []struct {
		name   string
		op     Op
		f      Fault
		wantIn string
	}{
		{"negative times", OpStart, Fault{Times: -1}, "times -1: must be 0 or more"},
		{"rate above 1", OpMigrate, Fault{Rate: 1.5}, "rate 1.5: must be between 0 and 1"},
		{"negative rate", OpMigrate, Fault{Rate: -0.1}, "rate -0.1: must be between 0 and 1"},
		{"unknown op", Op("reboot"), Fault{Times: 1}, `operation "reboot": must be one of`},
		{"alias not resolved", Op("spawn"), Fault{Times: 1}, `operation "spawn": must be one of`},
	}
	for _, tt := range tests {
		err := e.d.SetFault(e.ctx, "h1", tt.op, tt.f)
		if err == nil || !strings.Contains(err.Error(), tt.wantIn) || !strings.HasPrefix(err.Error(), "sim: ") {
			t.Errorf("SetFault(h1, %s, %+v) (%s): %v, want an error containing %q", tt.op, tt.f, tt.name, err, tt.wantIn)
		}
	}
	if err := e.d.SetLatency(e.ctx, "", OpStart, -time.Second); err == nil || !strings.Contains(err.Error(), "-1s: must be 0 or more") {
		t.Errorf("SetLatency(-1s): %v, want an error naming -1s", err)
	}
	s, err := e.d.Settings(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Latency) != 0 || len(s.Hosts["h1"].Faults) != 0 {
		t.Errorf("Settings after rejected changes = %+v, want no latency or fault", s)
	}
}

func TestLatencyResolution(t *testing.T) {
	tests := []struct {
		name   string
		opts   Options
		global time.Duration // -1: unset
		host   time.Duration // -1: unset
		want   time.Duration
	}{
		{"nothing set", Options{}, -1, -1, 0},
		{"configured", Options{Latency: 30 * time.Millisecond}, -1, -1, 30 * time.Millisecond},
		{"configured for op", Options{Latency: 30 * time.Millisecond, OpLatency: map[Op]time.Duration{OpStart: 50 * time.Millisecond}}, -1, -1, 50 * time.Millisecond},
		{"all hosts overrides configured", Options{Latency: 30 * time.Millisecond}, 70 * time.Millisecond, -1, 70 * time.Millisecond},
		{"host overrides all hosts", Options{}, 70 * time.Millisecond, 90 * time.Millisecond, 90 * time.Millisecond},
		{"host zero overrides all hosts", Options{}, 70 * time.Millisecond, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := newRecordingSleep()
			tt.opts.Sleep = rec.sleep
			e := newEnv(t, tt.opts)
			if err := e.d.Define(e.ctx, "h1", domainXML(uuidA, "a", 2, 0)); err != nil {
				t.Fatal(err)
			}
			if tt.global >= 0 {
				if err := e.d.SetLatency(e.ctx, "", OpStart, tt.global); err != nil {
					t.Fatal(err)
				}
			}
			if tt.host >= 0 {
				if err := e.d.SetLatency(e.ctx, "h1", OpStart, tt.host); err != nil {
					t.Fatal(err)
				}
			}
			rec.drain()
			if err := e.d.Start(e.ctx, "h1", uuidA); err != nil {
				t.Fatal(err)
			}
			// Start waits the resolved latency once, through Options.Sleep.
			if diff := cmp.Diff([]time.Duration{tt.want}, rec.drain()); diff != "" {
				t.Errorf("Start with %s: waits mismatch (-want +got):\n%s", tt.name, diff)
			}
		})
	}
}

func TestClearLatencyAndFault(t *testing.T) {
	rec := newRecordingSleep()
	e := newEnv(t, Options{Sleep: rec.sleep, Latency: 5 * time.Millisecond, FailRate: map[Op]float64{OpDefine: 1}})
	x := domainXML(uuidA, "a", 2, 0)
	steps := []struct {
		name  string
		set   func() error
		wait  time.Duration
		fails bool
	}{
		{"configured", func() error { return nil }, 5 * time.Millisecond, true},
		{"set", func() error {
			return errors.Join(e.d.SetLatency(e.ctx, "h1", OpDefine, 20*time.Millisecond), e.d.SetFault(e.ctx, "h1", OpDefine, Fault{}))
		}, 20 * time.Millisecond, false},
		{"cleared", func() error {
			return errors.Join(e.d.ClearLatency(e.ctx, "h1", OpDefine), e.d.ClearFault(e.ctx, "h1", OpDefine))
		}, 5 * time.Millisecond, true},
	}
	for _, s := range steps {
		if err := s.set(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		rec.drain()
		err := e.d.Define(e.ctx, "h1", x)
		if got := errors.Is(err, ErrInjected); got != s.fails {
			t.Errorf("%s: Define: %v, want injected failure %v", s.name, err, s.fails)
		}
		if diff := cmp.Diff([]time.Duration{s.wait}, rec.drain()); diff != "" {
			t.Errorf("%s: Define waits mismatch (-want +got):\n%s", s.name, diff)
		}
	}
}

func TestLatencyHonoursCancel(t *testing.T) {
	e := newEnv(t, Options{})
	if err := e.d.SetLatency(e.ctx, "", OpDefine, time.Hour); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 50*time.Millisecond)
	defer cancel()
	err := e.d.Define(ctx, "h1", domainXML(uuidA, "a", 2, 0))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Define with a 1h latency and a 50ms deadline: %v, want DeadlineExceeded", err)
	}
	if got := e.placement(e.d, uuidA); len(got) != 0 {
		t.Errorf("domain after a cancelled Define = %v, want nowhere", got)
	}
}

func TestSettings(t *testing.T) {
	e := newEnv(t, Options{Latency: time.Second, OpLatency: map[Op]time.Duration{OpMigrate: 10 * time.Second}, FailRate: map[Op]float64{OpMigrate: 0.1}})
	for _, err := range []error{
		e.d.SetLatency(e.ctx, "", OpStart, 2*time.Second),
		e.d.SetLatency(e.ctx, "h2", OpMigrate, 1500*time.Millisecond),
		e.d.SetFault(e.ctx, "h1", OpMigrate, Fault{Times: 3, Rate: 0.25}),
		e.d.SetFault(e.ctx, "h2", OpStart, Fault{Rate: 0.5}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, err := e.d.Settings(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := &Settings{
		Defaults: map[Op]time.Duration{
			OpDefine: time.Second, OpStart: time.Second, OpShutdown: time.Second, OpStop: time.Second, OpUndefine: time.Second,
			OpPrepare: time.Second, OpMigrate: 10 * time.Second, OpDetach: time.Second, OpAttach: time.Second, OpRepin: time.Second,
		},
		DefaultRates: map[Op]float64{OpMigrate: 0.1},
		Latency:      map[Op]time.Duration{OpStart: 2 * time.Second},
		Hosts: map[string]HostSettings{
			"h1": {Latency: map[Op]time.Duration{}, Faults: map[Op]Fault{OpMigrate: {Times: 3, Rate: 0.25}}},
			"h2": {Latency: map[Op]time.Duration{OpMigrate: 1500 * time.Millisecond}, Faults: map[Op]Fault{OpStart: {Rate: 0.5}}},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Settings mismatch (-want +got):\n%s", diff)
	}
}

func TestConfigOptions(t *testing.T) {
	tests := []struct {
		name   string
		env    map[string]string
		want   Options
		wantIn string
	}{
		{"defaults", nil, Options{OpLatency: map[Op]time.Duration{}, FailRate: map[Op]float64{}}, ""},
		{"all set", map[string]string{
			"PINFLOW_SIM_KEY_PREFIX":      "demo:sim",
			"PINFLOW_SIM_LATENCY":         "200ms",
			"PINFLOW_SIM_LATENCIES":       "spawn:2s,stop:1s",
			"PINFLOW_SIM_MIGRATE_SECONDS": "7.5",
			"PINFLOW_SIM_FAIL_RATES":      "migrate:0.1",
			"PINFLOW_SIM_SEED":            "9",
			"PINFLOW_SIM_STALE_MIGRATION": "1m",
		}, Options{
			Prefix: "demo:sim", Latency: 200 * time.Millisecond,
			OpLatency: map[Op]time.Duration{OpStart: 2 * time.Second, OpStop: time.Second, OpMigrate: 7500 * time.Millisecond},
			FailRate:  map[Op]float64{OpMigrate: 0.1}, Seed: 9, StaleMigration: time.Minute,
		}, ""},
		{"stale migration 0 is the default", map[string]string{"PINFLOW_SIM_STALE_MIGRATION": "0"},
			Options{OpLatency: map[Op]time.Duration{}, FailRate: map[Op]float64{}}, ""},
		{"negative latency", map[string]string{"PINFLOW_SIM_LATENCY": "-1s"}, Options{}, "PINFLOW_SIM_LATENCY -1s: must be 0 or more"},
		{"unknown op", map[string]string{"PINFLOW_SIM_LATENCIES": "reboot:1s"}, Options{}, `PINFLOW_SIM_LATENCIES: operation "reboot": must be one of`},
		{"bad duration", map[string]string{"PINFLOW_SIM_LATENCIES": "start:soon"}, Options{}, `start:"soon": must be a duration`},
		{"rate above 1", map[string]string{"PINFLOW_SIM_FAIL_RATES": "migrate:2"}, Options{}, `migrate:"2": must be a number between 0 and 1`},
		{"negative migrate seconds", map[string]string{"PINFLOW_SIM_MIGRATE_SECONDS": "-3"}, Options{}, "PINFLOW_SIM_MIGRATE_SECONDS -3: must be 0 or more"},
		{"braces in prefix", map[string]string{"PINFLOW_SIM_KEY_PREFIX": "a{b}"}, Options{}, "must not contain braces"},
		{"stale migration too short", map[string]string{"PINFLOW_SIM_STALE_MIGRATION": "300ms"}, Options{}, "PINFLOW_SIM_STALE_MIGRATION 300ms: must be at least 1s"},
		{"negative stale migration", map[string]string{"PINFLOW_SIM_STALE_MIGRATION": "-5s"}, Options{}, "PINFLOW_SIM_STALE_MIGRATION -5s: must be at least 1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var c Config
			if err := envconfig.Process("PINFLOW", &c); err != nil {
				t.Fatalf("envconfig.Process: %v", err)
			}
			got, err := c.Options()
			if tt.wantIn != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantIn) {
					t.Errorf("Config.Options() with %v: %v, want an error containing %q", tt.env, err, tt.wantIn)
				}
				return
			}
			if err != nil {
				t.Fatalf("Config.Options() with %v: %v", tt.env, err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b func(context.Context, time.Duration) error) bool { return a == nil && b == nil })); diff != "" {
				t.Errorf("Config.Options() with %v mismatch (-want +got):\n%s", tt.env, diff)
			}
		})
	}
}
