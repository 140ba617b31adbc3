package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/numa"
)

// simTestEnv starts a Redis for the sim commands, with host h1 known to
// the simulator, and returns a driver on it to check what they stored.
func simTestEnv(t *testing.T) *sim.Driver {
	t.Helper()
	r := testenv.StartRedis(t)
	t.Setenv("PINFLOW_REDIS_URL", r.URL())
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { rdb.Close() })
	spec := numa.HostSpec{Cells: []numa.CellSpec{{ID: 0, CPUs: []int{0, 1, 2, 3}, MemoryMB: 4096}}}
	topo, err := spec.Host(nil)
	if err != nil {
		t.Fatal(err)
	}
	d := sim.New(rdb, sim.Options{})
	if err := d.AddHost(context.Background(), "h1", topo); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSimCommands(t *testing.T) {
	d := simTestEnv(t)
	tests := []struct {
		args []string
		want string // the output, or the error's text
		err  bool
	}{
		{[]string{"sim", "latency", "--op", "spawn", "--seconds", "2.5"}, "start latency on every host set to 2.5s\n", false},
		{[]string{"sim", "latency", "--op", "migrate", "--seconds", "30", "--host", "h1"}, "migrate latency on h1 set to 30s\n", false},
		{[]string{"sim", "latency", "--op", "stop", "--seconds", "1"}, "stop latency on every host set to 1s\n", false},
		{[]string{"sim", "latency", "--op", "stop", "--clear"}, "stop latency on every host cleared; the configured one applies\n", false},
		{[]string{"sim", "fault", "--host", "h1", "--op", "migrate", "--times", "2", "--rate", "0.1"}, "migrate on h1: the next 2 calls fail, then each call fails with probability 0.1\n", false},
		{[]string{"sim", "fault", "--host", "h1", "--op", "define", "--rate", "1"}, "define on h1: each call fails with probability 1\n", false},
		{[]string{"sim", "fault", "--host", "h1", "--op", "stop", "--times", "0"}, "stop on h1 will not fail\n", false},
		{[]string{"sim", "fault", "--host", "h1", "--op", "stop", "--clear"}, "stop fault on h1 cleared; the configured rate applies\n", false},
		{[]string{"sim", "power", "--host", "h1", "--on"}, "h1 is powered on; its guests stay shut off\n", false},
		{[]string{"sim", "power", "--host", "h1", "--off"}, "h1 is powered off; its guests are shut off, and calls to it fail until sim power --host h1 --on\n", false},
		{[]string{"sim", "power", "--off", "--host", "h1"}, "h1 is powered off; its guests are shut off, and calls to it fail until sim power --host h1 --on\n", false},

		{[]string{"sim", "latency", "--op", "reboot", "--seconds", "1"}, `sim latency: --op operation "reboot": must be one of define, start, shutdown, stop, undefine, prepare, migrate, detach, attach, repin (or spawn, an alias for start): usage`, true},
		{[]string{"sim", "latency", "--seconds", "1"}, "sim latency: --op is required; allowed: define, start (or spawn), shutdown, stop, undefine, prepare, migrate, detach, attach, repin: usage", true},
		{[]string{"sim", "latency", "--op", "start"}, "sim latency: --seconds is required (or --clear): usage", true},
		{[]string{"sim", "latency", "--op", "start", "--seconds", "-1"}, "sim latency: --seconds -1: must be between 0 and 86400: usage", true},
		{[]string{"sim", "latency", "--op", "start", "--seconds", "NaN"}, "sim latency: --seconds NaN: must be between 0 and 86400: usage", true},
		{[]string{"sim", "latency", "--op", "start", "--seconds", "1", "--clear"}, "sim latency: give --seconds S or --clear, not both: usage", true},
		{[]string{"sim", "latency", "--op", "start", "--seconds", "1", "--host", "h9"}, `sim: latency of start: host "h9": unknown host; add it first`, true},
		{[]string{"sim", "fault", "--host", "h1", "--op", "start", "--times", "-1"}, "sim fault: --times -1: must be 0 or more: usage", true},
		{[]string{"sim", "fault", "--host", "h1", "--op", "start", "--rate", "1.5"}, "sim fault: --rate 1.5: must be between 0 and 1: usage", true},
		{[]string{"sim", "fault", "--host", "h1", "--op", "start"}, "sim fault: --times N (and/or --rate R) is required (or --clear): usage", true},
		{[]string{"sim", "fault", "--op", "start", "--times", "1"}, "sim fault: --host is required: usage", true},
		{[]string{"sim", "fault", "--host", "h9", "--op", "start", "--times", "1"}, `sim: fault of start: host "h9": unknown host; add it first`, true},
		{[]string{"sim", "fault", "--host", "h1", "--op", "start", "--times", "x"}, `sim fault: --times "x": allowed are whole numbers: usage`, true},
		{[]string{"sim", "show", "extra"}, `sim show takes no positional arguments, got 1: "extra": usage`, true},
		{[]string{"sim", "power", "--host", "h1"}, "sim power: give exactly one of --off or --on: usage", true},
		{[]string{"sim", "power", "--host", "h1", "--off", "--on"}, "sim power: give exactly one of --off or --on: usage", true},
		{[]string{"sim", "power", "--on"}, "sim power: --host is required: usage", true},
		{[]string{"sim", "power", "--host", "h1", "--on", "now"}, `sim power takes no positional arguments, got 1: "now": usage`, true},
		{[]string{"sim", "power", "--host", "h1", "--on=maybe"}, `sim power: --on "maybe": allowed are true and false: usage`, true},
		{[]string{"sim", "power", "--host", "h9", "--on"}, `sim: power on h9: host "h9": unknown host; add it first`, true},
		{[]string{"sim", "power", "--host", "h9", "--off"}, `sim: power off h9: host "h9": unknown host; add it first`, true},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		err := dispatch(tt.args, &out)
		got := out.String()
		if err != nil {
			got = err.Error()
		}
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("pinflow %s = %q (error %v), want %q (error %v)", strings.Join(tt.args, " "), got, err != nil, tt.want, tt.err)
		}
		if tt.err && strings.HasSuffix(tt.want, ": usage") && !errors.Is(err, errUsage) {
			t.Errorf("pinflow %s: error %v does not wrap errUsage (exit 2)", strings.Join(tt.args, " "), err)
		}
	}

	// Only the good commands changed anything.
	got, err := d.Settings(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := &sim.Settings{
		Defaults: map[sim.Op]time.Duration{
			sim.OpDefine: 0, sim.OpStart: 0, sim.OpShutdown: 0, sim.OpStop: 0, sim.OpUndefine: 0, sim.OpPrepare: 0, sim.OpMigrate: 0,
			sim.OpDetach: 0, sim.OpAttach: 0, sim.OpRepin: 0,
		},
		DefaultRates: map[sim.Op]float64{},
		Latency:      map[sim.Op]time.Duration{sim.OpStart: 2500 * time.Millisecond},
		Hosts: map[string]sim.HostSettings{"h1": {
			Latency:    map[sim.Op]time.Duration{sim.OpMigrate: 30 * time.Second},
			Faults:     map[sim.Op]sim.Fault{sim.OpMigrate: {Times: 2, Rate: 0.1}, sim.OpDefine: {Rate: 1}},
			PoweredOff: true,
		}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("simulator settings after the commands mismatch (-want +got):\n%s", diff)
	}
}

func TestSimShow(t *testing.T) {
	simTestEnv(t)
	t.Setenv("PINFLOW_SIM_LATENCY", "100ms")
	t.Setenv("PINFLOW_SIM_FAIL_RATES", "migrate:0.05")
	for _, args := range [][]string{
		{"sim", "latency", "--op", "migrate", "--seconds", "12", "--host", "h1"},
		{"sim", "latency", "--op", "start", "--seconds", "2"},
		{"sim", "fault", "--host", "h1", "--op", "migrate", "--times", "3"},
	} {
		if err := dispatch(args, &bytes.Buffer{}); err != nil {
			t.Fatalf("pinflow %s: %v", strings.Join(args, " "), err)
		}
	}
	var out bytes.Buffer
	if err := dispatch([]string{"sim", "show"}, &out); err != nil {
		t.Fatalf("pinflow sim show: %v", err)
	}
	want := `LATENCY     define  start  shutdown  stop   undefine  prepare  migrate  detach  attach  repin
configured  100ms   100ms  100ms     100ms  100ms     100ms    100ms    100ms   100ms   100ms
every host  -       2s     -         -      -         -        -        -       -       -
h1          -       -      -         -      -         -        12s      -       -       -
FAULTS
  every host (configured) migrate: each call fails with probability 0.05
  h1 migrate: the next 3 calls fail
POWERED OFF none
`
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("pinflow sim show mismatch (-want +got):\n%s", diff)
	}

	out.Reset()
	if err := dispatch([]string{"sim", "show", "--json"}, &out); err != nil {
		t.Fatalf("pinflow sim show --json: %v", err)
	}
	var got simSettingsView
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("pinflow sim show --json: %v in %s", err, out.String())
	}
	wantJSON := simSettingsView{
		Defaults: map[sim.Op]float64{"define": 0.1, "start": 0.1, "shutdown": 0.1, "stop": 0.1, "undefine": 0.1, "prepare": 0.1, "migrate": 0.1,
			"detach": 0.1, "attach": 0.1, "repin": 0.1},
		DefaultRates: map[sim.Op]float64{"migrate": 0.05},
		Latency:      map[sim.Op]float64{"start": 2},
		Hosts: map[string]simHostSettings{"h1": {
			Latency: map[sim.Op]float64{"migrate": 12},
			Faults:  map[sim.Op]sim.Fault{"migrate": {Times: 3}},
		}},
		PoweredOff: []string{},
	}
	if diff := cmp.Diff(wantJSON, got); diff != "" {
		t.Errorf("pinflow sim show --json mismatch (-want +got):\n%s", diff)
	}

	out.Reset()
	if err := dispatch([]string{"sim", "fault", "--host", "h1", "--op", "prepare", "--times", "1", "--json"}, &out); err != nil {
		t.Fatal(err)
	}
	if want := "{\n  \"host\": \"h1\",\n  \"op\": \"prepare\",\n  \"fault\": {\n    \"times\": 1,\n    \"rate\": 0\n  }\n}\n"; out.String() != want {
		t.Errorf("pinflow sim fault --json = %q, want %q", out.String(), want)
	}
}

func TestSimCommandsRedisDown(t *testing.T) {
	t.Setenv("PINFLOW_REDIS_URL", "redis://127.0.0.1:1/0")
	err := dispatch([]string{"sim", "show"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "redis://127.0.0.1:1/0: cannot connect") {
		t.Errorf("pinflow sim show with Redis down: %v, want a 'cannot connect' error naming the address", err)
	}
	t.Setenv("PINFLOW_REDIS_URL", "http://example")
	err = dispatch([]string{"sim", "show"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "REDIS_URL is not a redis://") {
		t.Errorf("pinflow sim show with a bad URL: %v, want an error naming the variable and value", err)
	}
}

func TestSimPower(t *testing.T) {
	d := simTestEnv(t)
	ctx := context.Background()
	const uuid = "0f8fad5b-d9cb-469f-a165-70867728950e"
	x := `<domain><name>a</name><uuid>` + uuid + `</uuid><memory unit='MiB'>512</memory><vcpu>1</vcpu></domain>`
	if err := d.Define(ctx, "h1", x); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx, "h1", uuid); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := dispatch([]string{"sim", "power", "--host", "h1", "--off", "--json"}, &out); err != nil {
		t.Fatalf("pinflow sim power --host h1 --off --json: %v", err)
	}
	if want := "{\n  \"host\": \"h1\",\n  \"powered_off\": true\n}\n"; out.String() != want {
		t.Errorf("pinflow sim power --host h1 --off --json = %q, want %q", out.String(), want)
	}
	if _, err := d.Lookup(ctx, "h1", uuid); !errors.Is(err, sim.ErrHostOff) {
		t.Errorf("Lookup(h1) after pinflow sim power --off: %v, want ErrHostOff", err)
	}

	out.Reset()
	if err := dispatch([]string{"sim", "show"}, &out); err != nil {
		t.Fatalf("pinflow sim show: %v", err)
	}
	if !strings.HasSuffix(out.String(), "FAULTS none\nPOWERED OFF h1\n") {
		t.Errorf("pinflow sim show with h1 off = %q, want it to end with FAULTS none and POWERED OFF h1", out.String())
	}
	out.Reset()
	if err := dispatch([]string{"sim", "show", "--json"}, &out); err != nil {
		t.Fatalf("pinflow sim show --json: %v", err)
	}
	var view simSettingsView
	if err := json.Unmarshal(out.Bytes(), &view); err != nil {
		t.Fatalf("pinflow sim show --json: %v in %s", err, out.String())
	}
	if diff := cmp.Diff([]string{"h1"}, view.PoweredOff); diff != "" {
		t.Errorf("pinflow sim show --json powered_off mismatch (-want +got):\n%s", diff)
	}

	out.Reset()
	if err := dispatch([]string{"sim", "power", "--host", "h1", "--on", "--json"}, &out); err != nil {
		t.Fatalf("pinflow sim power --host h1 --on --json: %v", err)
	}
	if want := "{\n  \"host\": \"h1\",\n  \"powered_off\": false\n}\n"; out.String() != want {
		t.Errorf("pinflow sim power --host h1 --on --json = %q, want %q", out.String(), want)
	}
	if dom, err := d.Lookup(ctx, "h1", uuid); err != nil || dom.State != "shutoff" {
		t.Errorf("Lookup(h1) after a power cycle = %+v, %v; want the guest shut off", dom, err)
	}
	out.Reset()
	if err := dispatch([]string{"sim", "show", "--json"}, &out); err != nil {
		t.Fatalf("pinflow sim show --json: %v", err)
	}
	if !strings.Contains(out.String(), `"powered_off": []`) {
		t.Errorf("pinflow sim show --json with every host on = %s, want \"powered_off\": []", out.String())
	}
}
