package sim

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Op names a simulated operation whose latency and faults can be set.
type Op string

// The operations with a latency and faults. Lookup, Domains, Capabilities
// and Rollback have neither: reads are instant, and a rollback is what
// repairs an injected failure. Shutdown is the odd one: its latency is how
// long the guest takes to power off after Shutdown has returned, and its
// fault is a guest that ignores the request, as a guest may ignore an ACPI
// power button.
const (
	OpDefine   Op = "define"
	OpStart    Op = "start"
	OpShutdown Op = "shutdown"
	OpStop     Op = "stop"
	OpUndefine Op = "undefine"
	OpPrepare  Op = "prepare"
	OpMigrate  Op = "migrate"
	// OpDetach and OpAttach unplug and plug a running guest's PCI
	// devices, around a live migration.
	OpDetach Op = "detach"
	OpAttach Op = "attach"
	// OpRepin changes a guest's pins in place.
	OpRepin Op = "repin"
)

// Ops lists every Op in the order operators read them.
func Ops() []Op {
	return []Op{OpDefine, OpStart, OpShutdown, OpStop, OpUndefine, OpPrepare, OpMigrate, OpDetach, OpAttach, OpRepin}
}

// opAliases are other names operators type for an Op.
var opAliases = map[string]Op{"spawn": OpStart}

// ParseOp reads an operation name, case-insensitively; "spawn" is an alias
// for start.
func ParseOp(s string) (Op, error) {
	name := strings.ToLower(strings.TrimSpace(s))
	if op, ok := opAliases[name]; ok {
		return op, nil
	}
	for _, op := range Ops() {
		if string(op) == name {
			return op, nil
		}
	}
	return "", fmt.Errorf("sim: operation %q: must be one of %s (or spawn, an alias for start)", s, opList())
}

func opList() string {
	names := make([]string, 0, len(Ops()))
	for _, op := range Ops() {
		names = append(names, string(op))
	}
	return strings.Join(names, ", ")
}

// check reports an Op that is not one of Ops, for callers that skipped
// ParseOp.
func (op Op) check() error {
	for _, o := range Ops() {
		if o == op {
			return nil
		}
	}
	return fmt.Errorf("operation %q: must be one of %s", string(op), opList())
}

// Fault is an injected failure of one operation on one host: the next Times
// calls fail, and after them each call fails with probability Rate.
type Fault struct {
	Times int     `json:"times"`
	Rate  float64 `json:"rate"`
}

// check validates f.
func (f Fault) check() error {
	if f.Times < 0 {
		return fmt.Errorf("times %d: must be 0 or more", f.Times)
	}
	if !(f.Rate >= 0 && f.Rate <= 1) {
		return fmt.Errorf("rate %s: must be between 0 and 1", strconv.FormatFloat(f.Rate, 'g', -1, 64))
	}
	return nil
}

// Config is the simulator's environment configuration, read with
// envconfig under the PINFLOW_ prefix (PINFLOW_SIM_LATENCY, ...). Run-time
// settings stored in Redis (SetLatency, SetFault) override it.
type Config struct {
	// KeyPrefix starts every Redis key of the simulator.
	KeyPrefix string `envconfig:"SIM_KEY_PREFIX"`
	// RedisURL is a redis:// URL of a server that keeps the simulated
	// hypervisors apart from the ledger's Redis, as real hypervisors are,
	// so that a failover of the ledger's Redis cannot lose a simulated
	// guest; empty keeps them in the ledger's Redis.
	RedisURL string `envconfig:"SIM_REDIS_URL"`
	// Latency is the duration of every operation, e.g. "500ms".
	Latency time.Duration `envconfig:"SIM_LATENCY" default:"0s"`
	// Latencies overrides Latency per operation: "start:2s,migrate:30s".
	Latencies map[string]string `envconfig:"SIM_LATENCIES"`
	// MigrateSeconds, when set, is the total duration of a migration; it
	// overrides Latency and Latencies for migrate.
	MigrateSeconds float64 `envconfig:"SIM_MIGRATE_SECONDS"`
	// FailRates are default failure probabilities per operation on every
	// host: "migrate:0.1". Counted faults ("the next N") exist only at run
	// time, since every worker reading the environment would count its own.
	FailRates map[string]string `envconfig:"SIM_FAIL_RATES"`
	// Seed seeds the draws of rate faults; 0 picks a random seed.
	Seed uint64 `envconfig:"SIM_SEED"`
	// StaleMigration is how long a migration may copy without progress
	// before it counts as dead (the worker driving it died) and the next
	// call that reads the guest rolls it back, leaving the guest on its
	// source. At least 1s, since a live migration makes progress every
	// 250ms and a slow Redis delays that; 0 means the default.
	StaleMigration time.Duration `envconfig:"SIM_STALE_MIGRATION"`
}

// minStaleMigration is the least Config.StaleMigration, well above the
// 250ms between two progress steps of a live migration.
const minStaleMigration = time.Second

// Options validates the configuration and turns it into driver options.
// Its errors name the variable, the bad value and what is allowed.
func (c Config) Options() (Options, error) {
	o := Options{
		Prefix:         c.KeyPrefix,
		Latency:        c.Latency,
		OpLatency:      map[Op]time.Duration{},
		FailRate:       map[Op]float64{},
		Seed:           c.Seed,
		StaleMigration: c.StaleMigration,
	}
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		return Options{}, fmt.Errorf("sim: PINFLOW_SIM_KEY_PREFIX %q: must not contain braces, which Redis reads as hash tags", c.KeyPrefix)
	}
	if c.Latency < 0 {
		return Options{}, fmt.Errorf("sim: PINFLOW_SIM_LATENCY %s: must be 0 or more", c.Latency)
	}
	for _, name := range sortedKeys(c.Latencies) {
		op, err := ParseOp(name)
		if err != nil {
			return Options{}, fmt.Errorf("sim: PINFLOW_SIM_LATENCIES: %w", unprefixed(err))
		}
		l, err := time.ParseDuration(strings.TrimSpace(c.Latencies[name]))
		if err != nil || l < 0 {
			return Options{}, fmt.Errorf("sim: PINFLOW_SIM_LATENCIES: %s:%q: must be a duration of 0 or more, like 500ms or 2s", name, c.Latencies[name])
		}
		o.OpLatency[op] = l
	}
	if c.StaleMigration != 0 && c.StaleMigration < minStaleMigration {
		return Options{}, fmt.Errorf("sim: PINFLOW_SIM_STALE_MIGRATION %s: must be at least %s, well above the %s between a migration's progress steps (or 0 for the default, %s)",
			c.StaleMigration, minStaleMigration, stepInterval, DefaultStaleMigration)
	}
	if c.MigrateSeconds < 0 {
		return Options{}, fmt.Errorf("sim: PINFLOW_SIM_MIGRATE_SECONDS %g: must be 0 or more", c.MigrateSeconds)
	}
	if c.MigrateSeconds > 0 {
		o.OpLatency[OpMigrate] = time.Duration(c.MigrateSeconds * float64(time.Second))
	}
	for _, name := range sortedKeys(c.FailRates) {
		op, err := ParseOp(name)
		if err != nil {
			return Options{}, fmt.Errorf("sim: PINFLOW_SIM_FAIL_RATES: %w", unprefixed(err))
		}
		r, err := strconv.ParseFloat(strings.TrimSpace(c.FailRates[name]), 64)
		if err != nil || !(r >= 0 && r <= 1) {
			return Options{}, fmt.Errorf("sim: PINFLOW_SIM_FAIL_RATES: %s:%q: must be a number between 0 and 1", name, c.FailRates[name])
		}
		o.FailRate[op] = r
	}
	return o, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// unprefixed strips the "sim: " of an error about to be wrapped by another
// "sim: " message.
func unprefixed(err error) error {
	return fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "sim: "))
}
