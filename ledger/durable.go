package ledger

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultWaitTimeout bounds each wait for durability when
// Durability.Timeout is zero.
const DefaultWaitTimeout = time.Second

// Durability is what every change of the ledger waits for before the call
// that made it returns: a claim, release, commit, fence, registration or
// instance record change. A change the server made but could not
// acknowledge in time fails its call with ErrNotDurable; the zero value
// waits for nothing, and a call returns once the master has made the
// change in memory.
//
// Each wait is sent on the connection of the change, right after it (a
// wait counts the writes of its own connection), to the master of the
// change's slot.
type Durability struct {
	// Replicas is how many replicas must have received the change (Redis
	// WAIT): a failover to one of them keeps it. Received is not written
	// to disk; see docs/redis-cluster.md.
	Replicas int
	// Local has the master write the change to its append-only file and
	// fsync it before the call returns (Redis WAITAOF 1 0), so that it
	// survives a crash of the master. It needs Redis 7.2 or later and
	// appendonly yes. appendfsync always gives the same guarantee on any
	// version, without waiting here.
	Local bool
	// Timeout bounds each wait; DefaultWaitTimeout when zero. The client
	// must read a reply for at least twice as long, plus the change's own
	// time (Config.NewClient sets its read timeout so).
	Timeout time.Duration
}

func (d Durability) on() bool { return d.Replicas > 0 || d.Local }

func (d Durability) check() error {
	if d.Replicas < 0 {
		return fmt.Errorf("ledger: wait replicas %d: %w: must be 0 (wait for none) or more (REDIS_WAIT_REPLICAS)", d.Replicas, ErrInvalid)
	}
	if d.Timeout < 0 || (d.Timeout > 0 && d.Timeout < time.Millisecond) {
		return fmt.Errorf("ledger: wait timeout %s: %w: must be 0 (default %s) or 1ms or more (REDIS_WAIT_TIMEOUT)", d.Timeout, ErrInvalid, DefaultWaitTimeout)
	}
	return nil
}

// acker sends changes with the waits for durability after them.
type acker struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // nil unless rdb is one
	want    Durability
}

func newAcker(rdb redis.UniversalClient, d Durability) *acker {
	if d.Timeout == 0 {
		d.Timeout = DefaultWaitTimeout
	}
	a := &acker{rdb: rdb, want: d}
	a.cluster, _ = rdb.(*redis.ClusterClient)
	return a
}

// write is one script call that changes keys of one slot, and what came
// of it.
type write struct {
	key  string // a key of the slot, to find its master on a cluster
	args []any  // evalsha, hash, numkeys, keys..., args...
	src  string // the script, for EVAL when the server lacks it
	eval bool   // send EVAL instead

	res any
	err error // the script's error, or the connection's
	ack error // nil, or why the change is not acknowledged durable
}

func newWrite(s *script, keys []string, args []any) *write {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", s.Hash(), len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	return &write{key: keys[0], args: a, src: s.src}
}

func (w *write) command() []any {
	if w.eval {
		return append([]any{"eval", w.src}, w.args[2:]...)
	}
	return w.args
}

// result is the write as a command's result: its reply, or its error, or
// else ErrNotDurable.
func (w *write) result(ctx context.Context) *redis.Cmd {
	cmd := redis.NewCmd(ctx, w.args...)
	switch {
	case w.err != nil:
		cmd.SetErr(w.err)
	case w.ack != nil:
		cmd.SetErr(w.ack)
	default:
		cmd.SetVal(w.res)
	}
	return cmd
}

// change runs a script that changes keys (all in one slot) and waits for
// the durability configured; without any, it is the script's Run.
func (l *Ledger) change(ctx context.Context, s *script, keys []string, args ...any) *redis.Cmd {
	if !l.acks.want.on() {
		return s.Run(ctx, l.rdb, keys, args...)
	}
	w := newWrite(s, keys, args)
	l.acks.do(ctx, w)
	return w.result(ctx)
}

// settled waits until every change the host's slot had so far is as
// durable as configured, for a reply read rather than written (a retried
// claim found made already): a write of the host's generation, unchanged,
// gives the wait after it a write to count from.
func (l *Ledger) settled(ctx context.Context, k *hostKeys) error {
	if !l.acks.want.on() {
		return nil
	}
	return l.change(ctx, touchScript, []string{k.topo}, "gen").Err()
}

// maxRedirects bounds how often a write follows its slot to another
// master (MOVED) before it fails.
const maxRedirects = 2

// do sends w to the master of its slot followed by the waits, in one
// pipeline on one connection, so that the waits count exactly the writes
// before them there. A write the server did not know the script of is
// sent again as EVAL; one whose slot moved follows it.
func (a *acker) do(ctx context.Context, w *write) {
	for redirects := 0; ; {
		c, err := a.master(ctx, w.key)
		if err != nil {
			w.err = err
			return
		}
		a.pipe(ctx, c, w)
		switch {
		case !w.eval && redis.HasErrorPrefix(w.err, "NOSCRIPT"):
			// A server that has not seen the script yet (a restart, a
			// new cluster node): EVAL loads it.
			w.eval = true
		case a.cluster != nil && redirects < maxRedirects && redis.HasErrorPrefix(w.err, "MOVED"):
			redirects++
			a.cluster.ReloadState(ctx)
		default:
			return
		}
	}
}

// master returns the master that serves key's slot.
func (a *acker) master(ctx context.Context, key string) (redis.Cmdable, error) {
	if a.cluster == nil {
		return a.rdb, nil
	}
	return a.cluster.MasterForKey(ctx, key)
}

// pipe sends w and then the waits to one server in one pipeline: one
// connection, in this order.
func (a *acker) pipe(ctx context.Context, c redis.Cmdable, w *write) {
	var cmd *redis.Cmd
	var aof *redis.IntSliceCmd
	var wait *redis.IntCmd
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		cmd = p.Do(ctx, w.command()...)
		aof, wait = a.queueWaits(ctx, p)
		return nil
	})
	w.res, w.err = cmd.Result()
	w.ack = a.acked(aof, wait)
}

// queueWaits adds the waits the durability asks for to p.
func (a *acker) queueWaits(ctx context.Context, p redis.Pipeliner) (aof *redis.IntSliceCmd, wait *redis.IntCmd) {
	ms := a.want.Timeout.Milliseconds()
	if a.want.Local {
		aof = redis.NewIntSliceCmd(ctx, "waitaof", 1, 0, ms)
		_ = p.Process(ctx, aof)
	}
	if a.want.Replicas > 0 {
		wait = redis.NewIntCmd(ctx, "wait", a.want.Replicas, ms)
		_ = p.Process(ctx, wait)
	}
	return aof, wait
}

// acked reads the waits' replies: nil when the changes before them are as
// durable as asked, else an error wrapping ErrNotDurable.
func (a *acker) acked(aof *redis.IntSliceCmd, wait *redis.IntCmd) error {
	if aof != nil {
		got, err := aof.Result()
		switch {
		case err != nil:
			return fmt.Errorf("%w: WAITAOF: %s", ErrNotDurable, waitAOFError(err))
		case len(got) == 0 || got[0] < 1:
			return fmt.Errorf("%w: the server did not fsync the change to its append-only file within %s", ErrNotDurable, a.want.Timeout)
		}
	}
	if wait != nil {
		got, err := wait.Result()
		switch {
		case err != nil:
			return fmt.Errorf("%w: WAIT: %v", ErrNotDurable, err)
		case got < int64(a.want.Replicas):
			return fmt.Errorf("%w: %d of the %d replicas asked for acknowledged the change within %s", ErrNotDurable, got, a.want.Replicas, a.want.Timeout)
		}
	}
	return nil
}

// waitAOFError explains a failed WAITAOF.
func waitAOFError(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(strings.ToLower(msg), "unknown command"):
		return "the server has no WAITAOF, which Redis 7.2 added: it cannot acknowledge a local fsync (" + msg + ")"
	case strings.Contains(msg, "appendonly"):
		return "the server runs without an append-only file (appendonly yes is needed): " + msg
	}
	return msg
}

// CheckDurability asks every master, once, whether it can give the
// durability the ledger waits for: WAITAOF and an append-only file for
// Durability.Local, enough replicas for Durability.Replicas. Its error
// is one line naming the server and what to change. Open calls it; a
// caller of New may.
func (l *Ledger) CheckDurability(ctx context.Context) error {
	if !l.acks.want.on() {
		return nil
	}
	return l.eachMaster(ctx, l.acks.probe)
}

// eachMaster calls check on every master, with the master's address for
// its error: each node of a cluster, or the one server.
func (l *Ledger) eachMaster(ctx context.Context, check func(ctx context.Context, c redis.UniversalClient, addr string) error) error {
	if l.acks.cluster != nil {
		return l.acks.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return check(ctx, c, c.Options().Addr)
		})
	}
	addr := "the server"
	if c, ok := l.rdb.(*redis.Client); ok {
		addr = c.Options().Addr
	}
	return check(ctx, l.rdb, addr)
}

// keepingPolicies are the maxmemory-policy values under which a server
// never evicts a ledger key. No ledger key carries a TTL, so the volatile
// policies, which evict only keys that do, leave them be: when memory
// runs out, a change fails instead, as under noeviction.
var keepingPolicies = []string{"noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"}

// CheckEviction asks every master, once, whether it may evict keys: a
// server that evicts a host's topology, pins or claims under memory
// pressure loses the ledger's record of who owns which pCPU, which no
// durability brings back. A policy that may evict is refused whatever
// maxmemory is now, since maxmemory can be set at run time. Its error is
// one line naming the server, its policy and the policies allowed. Open
// calls it; a caller of New may.
func (l *Ledger) CheckEviction(ctx context.Context) error {
	return l.eachMaster(ctx, func(ctx context.Context, c redis.UniversalClient, addr string) error {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return fmt.Errorf("ledger: redis %s: reading maxmemory-policy with INFO memory: %w", addr, err)
		}
		policy := infoField(info, "maxmemory_policy")
		if !slices.Contains(keepingPolicies, policy) {
			return fmt.Errorf("ledger: redis %s has maxmemory-policy %s, which may evict the ledger's keys and with them who owns which pCPU: allowed are %s (the ledger's keys have no TTL)",
				addr, policy, strings.Join(keepingPolicies, ", "))
		}
		return nil
	})
}

// probe checks one master. A wait on a connection that has written
// nothing returns at once when the server can satisfy it.
func (a *acker) probe(ctx context.Context, c redis.UniversalClient, addr string) error {
	want := a.want
	ms := want.Timeout.Milliseconds()
	if want.Local {
		if err := c.Do(ctx, "waitaof", 1, 0, ms).Err(); err != nil {
			version := "an unknown version"
			if info, ierr := c.Info(ctx, "server").Result(); ierr == nil {
				version = "Redis " + infoField(info, "redis_version")
			}
			if strings.Contains(strings.ToLower(err.Error()), "unknown command") {
				return fmt.Errorf("ledger: redis %s runs %s, which has no WAITAOF (Redis 7.2 and later): it cannot acknowledge a local fsync, which REDIS_WAIT_LOCAL=true asks for; run it with appendfsync always, which fsyncs every write before acknowledging it, and set REDIS_WAIT_LOCAL=false", addr, version)
			}
			if strings.Contains(err.Error(), "appendonly") {
				return fmt.Errorf("ledger: redis %s: REDIS_WAIT_LOCAL=true needs the server's append-only file: set appendonly yes (%v)", addr, err)
			}
			return fmt.Errorf("ledger: redis %s: checking REDIS_WAIT_LOCAL with WAITAOF: %v", addr, err)
		}
	}
	if want.Replicas > 0 {
		n, err := c.Do(ctx, "wait", want.Replicas, ms).Int64()
		if err != nil {
			return fmt.Errorf("ledger: redis %s: checking REDIS_WAIT_REPLICAS with WAIT: %v", addr, err)
		}
		if n < int64(want.Replicas) {
			return fmt.Errorf("ledger: redis %s: REDIS_WAIT_REPLICAS=%d, but only %d replicas acknowledged within %s: every change would fail; give the master %d replicas or lower REDIS_WAIT_REPLICAS", addr, want.Replicas, n, want.Timeout, want.Replicas)
		}
	}
	return nil
}

// infoField returns one field of an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return "?"
}
