// Package sim is a simulated hypervisor whose whole state lives in Redis:
// hosts with their NUMA topology, domains with their XML and run state,
// in-flight migrations, injected faults and per-operation latencies. It
// survives worker restarts, and several worker processes can share it.
//
// # Redis keys
//
// With the default prefix P = "pinflow:sim", host h and domain UUID u:
//
//	P:hosts                 set    names of the known hosts
//	P:latency               hash   op -> latency for every host (run time)
//	P:host:{h}:topo         string the host's numa.Host as JSON, usage cleared
//	P:host:{h}:domains      set    UUIDs of the domains on h
//	P:host:{h}:dom:u        hash   uuid, name, state, xml; migration (token of
//	                               the migration holding it), incoming ("1"
//	                               on the destination of a migration) and
//	                               shutdown_due (when a pending guest
//	                               shutdown completes, in ms of Redis's
//	                               clock; see Shutdown)
//	P:host:{h}:latency      hash   op -> latency on h (run time)
//	P:host:{h}:faults       hash   "op:times" -> calls left to fail,
//	                               "op:rate" -> failure probability
//	P:host:{h}:power        string "off" while h is powered off (absent:
//	                               on); see PowerOff
//	P:dom:{u}:home          string the host the domain lives on
//	P:dom:{u}:migration     hash   src, dst, dest_xml, src_xml, name, token,
//	                               phase (copying, switchover, completed,
//	                               rollback, aborting), started, touched
//	                               (when the attempt last made progress,
//	                               in ms of Redis's clock)
//
// Every key of one host carries the hash tag {h}, and every key of one
// domain the tag {u}, so each Lua script touches one Redis Cluster slot. A
// migration touches three slots (source, destination, domain); Migrate
// orders its steps so that each is atomic and idempotent on its own, and so
// that a crash between any two of them leaves a state that a retried
// Migrate or a Rollback finishes (see Migrate).
//
// # Dead migrations
//
// A migration is driven by the call to Migrate, as a real one is by its
// client. When the worker running that call dies during the copy and no
// retry comes, the migration is dead once it has made no progress for
// Options.StaleMigration, and the sim aborts it by itself, as libvirt fails
// a migration whose client disconnected: the next call that reads the
// domain where a migration marks it (Lookup, Domains, Migrate, Rollback,
// PrepareMigration, and the lifecycle calls refused by the mark) first
// rolls it back, so that the guest runs on the source alone. A migration
// past its switchover is never aborted; a retried Migrate finishes it.
//
// # Powered-off hosts
//
// PowerOff models a host that crashed or lost power, PowerOn its return.
// While a host is off its guests are shut off and every driver call
// addressed to it fails with ErrHostOff; its definitions stay, so that
// once it is back they show as leftovers. A guest whose home host is off
// may be defined on another host (rebuilt there, as an evacuation does):
// that host becomes its home, and the copy on the off host stays behind,
// shut off. A leftover cannot start while another host holds the domain,
// so a guest never runs in two places; Stop and Undefine remove it.
package sim

import (
	"context"
	"errors"
	"math/rand/v2"
	"regexp"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultPrefix is the key prefix used when Options.Prefix is empty.
const DefaultPrefix = "pinflow:sim"

// DefaultCompletedTTL is how long a completed migration's record is kept
// when Options.CompletedTTL is zero.
const DefaultCompletedTTL = 24 * time.Hour

// DefaultStaleMigration is how long a copying migration may make no
// progress before it is dead, when Options.StaleMigration is zero. A live
// one makes progress every 250ms at most, unless Redis is slow to answer.
const DefaultStaleMigration = 10 * time.Second

// ErrInjected marks a failure injected with SetFault or a configured fault
// rate, so tests and demos can tell it from a real one.
var ErrInjected = errors.New("injected fault")

// Options configure a Driver. The zero value is usable: no latency, no
// faults, the default prefix.
type Options struct {
	// Prefix starts every key; DefaultPrefix when empty. It must not
	// contain braces, which would break the hash tags.
	Prefix string
	// Latency is the default duration of every operation.
	Latency time.Duration
	// OpLatency overrides Latency for single operations.
	OpLatency map[Op]time.Duration
	// FailRate is the default failure probability (0..1) of an operation
	// on every host; a rate set with SetFault on a host overrides it.
	FailRate map[Op]float64
	// Seed seeds the draws of rate faults; 0 picks a random seed.
	Seed uint64
	// Sleep waits d or until ctx is done, returning ctx's error then. Nil
	// means a timer; tests pass their own to observe or steer waits.
	Sleep func(ctx context.Context, d time.Duration) error
	// CompletedTTL is how long a completed migration's record is kept, so
	// that a Rollback after a successful Migrate (the workflow failed before
	// its commit) can restore the source definition. DefaultCompletedTTL
	// when zero.
	CompletedTTL time.Duration
	// StaleMigration is how long a migration may copy without making
	// progress before it is dead (its worker died) and the next read of
	// the domain aborts it; see Migrate. It must be well above the longest
	// gap between two progress steps, 250ms plus Redis's delays.
	// DefaultStaleMigration when zero.
	StaleMigration time.Duration
}

// Driver is the simulated hypervisor. It implements hypervisor.Driver and
// is safe for concurrent use.
type Driver struct {
	rdb          redis.UniversalClient
	prefix       string
	latency      time.Duration
	opLatency    map[Op]time.Duration
	failRate     map[Op]float64
	sleep        func(ctx context.Context, d time.Duration) error
	completedTTL time.Duration
	stale        time.Duration

	mu  sync.Mutex // guards rng
	rng *rand.Rand

	// crash, when set (by tests), is called at the named points of a
	// migration, or of the abort of a dead one; a non-nil result makes the
	// call return at once without cleaning up, as a worker that died there
	// would.
	crash func(point string) error
}

// New returns a driver keeping its state in rdb. It validates nothing in
// opts beyond what it needs; Config.Options validates user input.
func New(rdb redis.UniversalClient, opts Options) *Driver {
	d := &Driver{
		rdb:          rdb,
		prefix:       opts.Prefix,
		latency:      opts.Latency,
		opLatency:    map[Op]time.Duration{},
		failRate:     map[Op]float64{},
		sleep:        opts.Sleep,
		completedTTL: opts.CompletedTTL,
		stale:        opts.StaleMigration,
	}
	if d.prefix == "" {
		d.prefix = DefaultPrefix
	}
	for op, l := range opts.OpLatency {
		d.opLatency[op] = l
	}
	for op, r := range opts.FailRate {
		d.failRate[op] = r
	}
	if d.sleep == nil {
		d.sleep = sleepCtx
	}
	if d.completedTTL <= 0 {
		d.completedTTL = DefaultCompletedTTL
	}
	if d.stale <= 0 {
		d.stale = DefaultStaleMigration
	}
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	d.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return d
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Key layout; see the package documentation.

func (d *Driver) hostsKey() string         { return d.prefix + ":hosts" }
func (d *Driver) globalLatencyKey() string { return d.prefix + ":latency" }
func (d *Driver) hostKey(h, part string) string {
	return d.prefix + ":host:{" + h + "}:" + part
}
func (d *Driver) topoKey(h string) string      { return d.hostKey(h, "topo") }
func (d *Driver) domainsKey(h string) string   { return d.hostKey(h, "domains") }
func (d *Driver) domKey(h, uuid string) string { return d.hostKey(h, "dom:"+uuid) }
func (d *Driver) latencyKey(h string) string   { return d.hostKey(h, "latency") }
func (d *Driver) faultsKey(h string) string    { return d.hostKey(h, "faults") }
func (d *Driver) powerKey(h string) string     { return d.hostKey(h, "power") }
func (d *Driver) homeKey(uuid string) string   { return d.prefix + ":dom:{" + uuid + "}:home" }
func (d *Driver) migrationKey(u string) string { return d.prefix + ":dom:{" + u + "}:migration" }
func (d *Driver) domKeys(h, u string) []string {
	return []string{d.topoKey(h), d.domainsKey(h), d.domKey(h, u), d.powerKey(h)}
}

// hostNameRE is what a host name may look like: a DNS-like name, and
// nothing that could break a hash tag or a key.
var hostNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)
