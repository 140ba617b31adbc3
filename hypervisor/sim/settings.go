package sim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// SetLatency sets how long op takes on host, or on every host when host is
// "". It overrides the configured defaults until ClearLatency; a per-host
// latency overrides the all-hosts one. For migrate it is the total
// duration of a migration, applied on the source host; for shutdown, how
// long the guest takes to power off after Shutdown has returned.
func (d *Driver) SetLatency(ctx context.Context, host string, op Op, l time.Duration) error {
	if err := op.check(); err != nil {
		return fmt.Errorf("sim: set latency: %w", err)
	}
	if l < 0 {
		return fmt.Errorf("sim: set latency of %s: %s: must be 0 or more", op, l)
	}
	return d.storeLatency(ctx, host, op, l.String())
}

// ClearLatency removes the latency SetLatency set for op on host (or on
// every host, for ""), so the next fallback applies again.
func (d *Driver) ClearLatency(ctx context.Context, host string, op Op) error {
	if err := op.check(); err != nil {
		return fmt.Errorf("sim: clear latency: %w", err)
	}
	return d.storeLatency(ctx, host, op, "")
}

func (d *Driver) storeLatency(ctx context.Context, host string, op Op, value string) error {
	if host == "" {
		var err error
		if value == "" {
			err = d.rdb.HDel(ctx, d.globalLatencyKey(), string(op)).Err()
		} else {
			err = d.rdb.HSet(ctx, d.globalLatencyKey(), string(op), value).Err()
		}
		if err != nil {
			return fmt.Errorf("sim: latency of %s: %w", op, err)
		}
		return nil
	}
	code, _, err := d.run(ctx, setHostFieldScript, []string{d.topoKey(host), d.latencyKey(host)}, string(op), value)
	if err != nil {
		return fmt.Errorf("sim: latency of %s on %s: %w", op, host, err)
	}
	if code == "NOHOST" {
		return fmt.Errorf("sim: latency of %s: %w", op, unknownHost(host))
	}
	return nil
}

// copyStart is the field of the latency settings that holds how long a
// migration's copy takes to start (SetCopyStartDelay); it is no Op, and
// no configured latency applies to it.
const copyStart = "copy-start"

// SetCopyStartDelay sets how long the copy of a migration from host (every
// host, for "") takes to start after the migration began, as QEMU on a busy
// host starts a copy late: 0, the default, starts it at once. The
// migration policy's start timeout counts it; its completion and progress
// timeouts count from the copy's start.
func (d *Driver) SetCopyStartDelay(ctx context.Context, host string, l time.Duration) error {
	if l < 0 {
		return fmt.Errorf("sim: set copy start delay: %s: must be 0 or more", l)
	}
	return d.storeLatency(ctx, host, copyStart, l.String())
}

// copyStartDelay is the copy start delay of a migration from host: the
// host's setting, else the all-hosts one, else 0.
func (d *Driver) copyStartDelay(ctx context.Context, host string) (time.Duration, error) {
	pipe := d.rdb.Pipeline()
	onHost := pipe.HGet(ctx, d.latencyKey(host), copyStart)
	global := pipe.HGet(ctx, d.globalLatencyKey(), copyStart)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, err
	}
	for _, c := range []*redis.StringCmd{onHost, global} {
		if c.Err() == nil {
			l, err := time.ParseDuration(c.Val())
			if err != nil {
				return 0, fmt.Errorf("stored copy start delay %q: %w", c.Val(), err)
			}
			return l, nil
		}
	}
	return 0, nil
}

// SetFault makes op fail on host: the next f.Times calls, then each call
// with probability f.Rate. It replaces the host's previous fault for op
// and overrides the configured rate; SetFault with the zero Fault stops
// failures, ClearFault returns to the configured rate. Migrate faults
// apply on the source host, prepare faults on the destination. A shutdown
// fault does not fail Shutdown: the guest ignores the request and keeps
// running, as a guest may ignore an ACPI power button.
func (d *Driver) SetFault(ctx context.Context, host string, op Op, f Fault) error {
	if err := op.check(); err != nil {
		return fmt.Errorf("sim: set fault: %w", err)
	}
	if err := f.check(); err != nil {
		return fmt.Errorf("sim: set fault of %s on %s: %w", op, host, err)
	}
	return d.storeFault(ctx, host, op, strconv.Itoa(f.Times), strconv.FormatFloat(f.Rate, 'g', -1, 64))
}

// ClearFault removes the fault SetFault set for op on host.
func (d *Driver) ClearFault(ctx context.Context, host string, op Op) error {
	if err := op.check(); err != nil {
		return fmt.Errorf("sim: clear fault: %w", err)
	}
	return d.storeFault(ctx, host, op, "", "")
}

func (d *Driver) storeFault(ctx context.Context, host string, op Op, times, rate string) error {
	code, _, err := d.run(ctx, setFaultScript, []string{d.topoKey(host), d.faultsKey(host)}, string(op), times, rate)
	if err != nil {
		return fmt.Errorf("sim: fault of %s on %s: %w", op, host, err)
	}
	if code == "NOHOST" {
		return fmt.Errorf("sim: fault of %s: %w", op, unknownHost(host))
	}
	return nil
}

// Settings are the latencies and faults in force, and which hosts are
// powered off.
type Settings struct {
	// Defaults are the configured latencies of every operation.
	Defaults map[Op]time.Duration
	// DefaultRates are the configured failure rates (non-zero ones only).
	DefaultRates map[Op]float64
	// Latency holds the run-time latencies for every host.
	Latency map[Op]time.Duration
	// Hosts holds each known host's run-time latencies and faults.
	Hosts map[string]HostSettings
}

// HostSettings are one host's run-time latencies and faults, and its power
// state.
type HostSettings struct {
	Latency map[Op]time.Duration
	Faults  map[Op]Fault
	// PoweredOff: the host is off (PowerOff) until PowerOn.
	PoweredOff bool
}

// Settings reads the latencies and faults in force, and the power
// state of every host.
func (d *Driver) Settings(ctx context.Context) (*Settings, error) {
	s := &Settings{Defaults: map[Op]time.Duration{}, DefaultRates: map[Op]float64{}, Hosts: map[string]HostSettings{}}
	for _, op := range Ops() {
		s.Defaults[op] = d.defaultLatency(op)
		if r := d.failRate[op]; r > 0 {
			s.DefaultRates[op] = r
		}
	}
	hosts, err := d.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	pipe := d.rdb.Pipeline()
	global := pipe.HGetAll(ctx, d.globalLatencyKey())
	lat := make([]*redis.MapStringStringCmd, len(hosts))
	faults := make([]*redis.MapStringStringCmd, len(hosts))
	off := make([]*redis.IntCmd, len(hosts))
	for i, h := range hosts {
		lat[i] = pipe.HGetAll(ctx, d.latencyKey(h))
		faults[i] = pipe.HGetAll(ctx, d.faultsKey(h))
		off[i] = pipe.Exists(ctx, d.powerKey(h))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("sim: settings: %w", err)
	}
	if s.Latency, err = parseLatencies(global.Val()); err != nil {
		return nil, fmt.Errorf("sim: settings: all hosts: %w", err)
	}
	for i, h := range hosts {
		hs := HostSettings{Faults: map[Op]Fault{}, PoweredOff: off[i].Val() == 1}
		if hs.Latency, err = parseLatencies(lat[i].Val()); err != nil {
			return nil, fmt.Errorf("sim: settings: host %s: %w", h, err)
		}
		for field, v := range faults[i].Val() {
			name, kind, _ := strings.Cut(field, ":")
			op := Op(name)
			f := hs.Faults[op]
			switch kind {
			case "times":
				f.Times, err = strconv.Atoi(v)
			case "rate":
				f.Rate, err = strconv.ParseFloat(v, 64)
			}
			if err != nil {
				return nil, fmt.Errorf("sim: settings: host %s: fault %s=%q: %w", h, field, v, err)
			}
			hs.Faults[op] = f
		}
		s.Hosts[h] = hs
	}
	return s, nil
}

func parseLatencies(m map[string]string) (map[Op]time.Duration, error) {
	out := map[Op]time.Duration{}
	for k, v := range m {
		l, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("latency %s=%q: %w", k, v, err)
		}
		out[Op(k)] = l
	}
	return out, nil
}

func (d *Driver) defaultLatency(op Op) time.Duration {
	if l, ok := d.opLatency[op]; ok {
		return l
	}
	return d.latency
}

// latencyOf is op's latency on host: the host's run-time setting, else the
// all-hosts one, else the configured default.
func (d *Driver) latencyOf(ctx context.Context, host string, op Op) (time.Duration, error) {
	pipe := d.rdb.Pipeline()
	onHost := pipe.HGet(ctx, d.latencyKey(host), string(op))
	global := pipe.HGet(ctx, d.globalLatencyKey(), string(op))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, err
	}
	for _, c := range []*redis.StringCmd{onHost, global} {
		if c.Err() == nil {
			l, err := time.ParseDuration(c.Val())
			if err != nil {
				return 0, fmt.Errorf("stored latency of %s %q: %w", op, c.Val(), err)
			}
			return l, nil
		}
	}
	return d.defaultLatency(op), nil
}

// pace holds op on uuid's domain at its gate while a test holds it, makes
// op on host take
// its latency, then injects its fault if one is due. It is the common
// start of every operation that has them.
func (d *Driver) pace(ctx context.Context, host, uuid string, op Op) error {
	if err := d.gate(ctx, Gate(op), uuid, false); err != nil {
		return err
	}
	l, err := d.latencyOf(ctx, host, op)
	if err != nil {
		return err
	}
	if err := d.sleep(ctx, l); err != nil {
		return err
	}
	return d.inject(ctx, host, op)
}

// inject returns an error wrapping ErrInjected when op on host is due to
// fail: a counted fault first (counted down atomically, so exactly N calls
// fail), else a draw against the host's rate or the configured one.
func (d *Driver) inject(ctx context.Context, host string, op Op) error {
	code, rest, err := d.run(ctx, faultScript, []string{d.faultsKey(host)}, string(op))
	if err != nil {
		return err
	}
	rate := d.failRate[op]
	switch code {
	case "FAIL":
		return fmt.Errorf("%w (one of the counted failures)", ErrInjected)
	case "RATE":
		if rate, err = strconv.ParseFloat(rest[0], 64); err != nil {
			return fmt.Errorf("stored fault rate of %s %q: %w", op, rest[0], err)
		}
	}
	if rate <= 0 {
		return nil
	}
	d.mu.Lock()
	draw := d.rng.Float64()
	d.mu.Unlock()
	if draw < rate {
		return fmt.Errorf("%w (failure rate %g)", ErrInjected, rate)
	}
	return nil
}
