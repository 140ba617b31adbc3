package ledger

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

const (
	// maxFlushers bounds the batches in flight at once: the server runs one
	// while the client reads the replies of another and fills the next.
	// With minBatch it was chosen by measuring (make bench-ledger): 3 and
	// 16 kept a 2-core machine busiest at 64 clients.
	maxFlushers = 3
	// maxOpsPerScript bounds one apply script: the server runs nothing
	// else while a script runs, so a batch stays a few hundred µs long.
	maxOpsPerScript = 64
	// minBatch is the fewest operations a batch goes out with while others
	// are on the wire (fewer when fewer are on the wire: as many as they
	// carry): those come back soon, and a handful of operations costs the
	// server and the client nearly as much as a full batch. With nothing
	// on the wire a batch goes at once, so a lone caller never waits.
	minBatch = 16
)

// batcher applies the claims and releases of concurrent callers together
// (group commit): the operations on one host that queue up while earlier
// ones are on the wire go to the server as one apply script, and the
// scripts of different hosts as one pipeline. Each operation is still
// whole or not at all, and sees every change made before it; batching only
// shares the script's reads and writes and the round trip, which cost more
// than an operation itself.
type batcher struct {
	rdb   redis.UniversalClient
	acks  *acker  // the waits for durability after each pipeline
	hints *hinter // the hosts a script changed, for placement indexes

	mu        sync.Mutex
	more      sync.Cond // signalled when a batch is due or one returns
	queue     []*hostOp
	flushers  int // goroutines sending batches
	onWire    int // batches sent and not yet replied
	opsOnWire int // the operations in them
}

func newBatcher(rdb redis.UniversalClient, acks *acker, hints *hinter) *batcher {
	b := &batcher{rdb: rdb, acks: acks, hints: hints}
	b.more.L = &b.mu
	return b
}

// hostOp is one claim or release on one host.
type hostOp struct {
	keys  *hostKeys
	args  []any // "c" or "r", then the operation's arguments (see apply.lua)
	reply []any
	err   error
	done  chan struct{} // receives once the reply or error is set
}

// hostOps are reused: a busy ledger runs tens of thousands a second.
var hostOps = sync.Pool{New: func() any { return &hostOp{done: make(chan struct{}, 1)} }}

// argLists are the apply commands' argument lists, reused once replied.
var argLists = sync.Pool{New: func() any { return new([]any) }}

// run applies one operation in the next batch and returns its reply. A
// caller whose context ends stops waiting, as with any command, but the
// operation may still be applied: every operation is idempotent.
func (b *batcher) run(ctx context.Context, keys *hostKeys, args ...any) ([]any, error) {
	o := hostOps.Get().(*hostOp)
	o.keys, o.args = keys, args
	b.mu.Lock()
	b.queue = append(b.queue, o)
	start := b.flushers < maxFlushers
	if start {
		b.flushers++
	} else if len(b.queue) == min(minBatch, b.opsOnWire) {
		b.more.Signal()
	}
	b.mu.Unlock()
	if start {
		go b.flush(context.WithoutCancel(ctx))
	}
	select {
	case <-o.done:
		reply, err := o.reply, o.err
		*o = hostOp{done: o.done}
		hostOps.Put(o)
		return reply, err
	case <-ctx.Done():
		// The batcher still holds o: it is not reused.
		return nil, ctx.Err()
	}
}

// flush sends what is queued, one batch at a time, until the queue is
// empty; while other batches are on the wire it waits for minBatch
// operations (or as many as those carry, if fewer) or for a reply. One caller giving up must not fail the
// others' operations, so ctx has no deadline; it still carries the first
// caller's values (tracing).
func (b *batcher) flush(ctx context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		for len(b.queue) > 0 && b.onWire > 0 && len(b.queue) < min(minBatch, b.opsOnWire) {
			b.more.Wait()
		}
		batch := b.queue
		b.queue = nil
		if len(batch) == 0 {
			b.flushers--
			return
		}
		b.onWire++
		b.opsOnWire += len(batch)
		b.mu.Unlock()
		b.send(ctx, batch)
		b.mu.Lock()
		b.onWire--
		b.opsOnWire -= len(batch)
		b.more.Broadcast()
	}
}

// send groups the batch by host, in arrival order, into apply scripts of
// at most maxOpsPerScript operations, and sends them as one pipeline
// (with durability waits, one per server: see sendDurable).
func (b *batcher) send(ctx context.Context, batch []*hostOp) {
	var scripts [][]*hostOp
	open := map[string]int{} // host's topo key -> its last script's index
	for _, o := range batch {
		i, ok := open[o.keys.topo]
		if !ok || len(scripts[i]) == maxOpsPerScript {
			i = len(scripts)
			open[o.keys.topo] = i
			scripts = append(scripts, nil)
		}
		scripts[i] = append(scripts[i], o)
	}
	if b.acks.want.on() {
		b.sendDurable(ctx, scripts)
		return
	}
	if len(scripts) == 1 {
		args := applyArgs(scripts[0])
		res, err := b.rdb.Do(ctx, *args...).Result()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			res, err = b.rdb.Do(ctx, evalInstead(*args)...).Result()
		}
		b.deliver(scripts[0], res, err, nil)
		putArgs(args)
		return
	}
	cmds := make([]*redis.Cmd, len(scripts))
	args := make([]*[]any, len(scripts))
	_, _ = b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, ops := range scripts {
			args[i] = applyArgs(ops)
			cmds[i] = p.Do(ctx, *args[i]...)
		}
		return nil
	})
	for i, ops := range scripts {
		res, err := cmds[i].Result()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			// A server that has not seen the script yet (a restart, a new
			// cluster node): EVAL loads it.
			res, err = b.rdb.Do(ctx, evalInstead(*args[i])...).Result()
		}
		b.deliver(ops, res, err, nil)
		putArgs(args[i])
	}
}

// sendDurable sends the scripts with the waits for durability after
// them: the scripts of each server in one pipeline, which go-redis writes
// on one connection, ending in the waits, so that they count exactly
// those scripts' writes (on a cluster, go-redis would send a keyless
// WAIT to any node; each server's pipeline goes to its master directly).
func (b *batcher) sendDurable(ctx context.Context, scripts [][]*hostOp) {
	ws := make([]*write, len(scripts))
	args := make([]*[]any, len(scripts))
	for i, ops := range scripts {
		args[i] = applyArgs(ops)
		ws[i] = &write{key: ops[0].keys.topo, args: *args[i], src: applySource}
	}
	b.acks.do(ctx, ws)
	for i, ops := range scripts {
		b.deliver(ops, ws[i].res, ws[i].err, ws[i].ack)
		putArgs(args[i])
	}
}

func putArgs(args *[]any) {
	clear(*args)
	*args = (*args)[:0]
	argLists.Put(args)
}

// applyArgs lays out one apply script command for ops on one host:
// EVALSHA, the script's hash, the host's keys, then the operations.
func applyArgs(ops []*hostOp) *[]any {
	k := ops[0].keys
	p := argLists.Get().(*[]any)
	// The keys in the order of all().
	args := append(*p, "evalsha", applyScript.Hash(), 7, k.topo, k.pins, k.claims, k.usage, k.undo, k.lease, k.state, len(ops))
	for _, o := range ops {
		args = append(args, o.args...)
	}
	*p = args
	return p
}

// evalInstead turns an EVALSHA command into the EVAL of the same script.
func evalInstead(args []any) []any {
	out := append([]any{"eval", applySource}, args[2:]...)
	return out
}

// deliver hands each operation its reply, or the script's error to all.
// When the waits after the script failed (notDurable), every operation
// whose reply acknowledges a change, or rests on one, gets that error
// instead; a claim's lost race keeps its reply, which Claim retries on.
// A script that changed its host queues the host's change hint: the
// change is made, durable or not.
func (b *batcher) deliver(ops []*hostOp, res any, err, notDurable error) {
	replies, _ := res.([]any)
	if err == nil && len(replies) != len(ops) {
		err = fmt.Errorf("apply script replied %d results for %d operations", len(replies), len(ops))
	}
	// Read before the first operation goes back to its caller, who reuses it.
	host, changed := ops[0].keys.host, false
	for i, o := range ops {
		if err == nil {
			o.reply, _ = replies[i].([]any)
			changed = changed || changedHost(o.reply)
		}
		switch {
		case err != nil:
			o.err = err
		case len(o.reply) == 0:
			o.err = fmt.Errorf("apply script replied %v for operation %v", replies[i], o.args[0])
		case notDurable != nil && !lostRaceReply(o):
			o.reply, o.err = nil, notDurable
		}
		o.done <- struct{}{}
	}
	if changed {
		b.hints.add(host)
	}
}

// changedHost says whether an operation's reply is a claim made or a
// claim released.
func changedHost(reply []any) bool {
	if len(reply) == 0 {
		return false
	}
	switch v := reply[0].(type) {
	case string:
		return v == "ok"
	case int64:
		return v == 1
	}
	return false
}

// lostRaceReply says whether o is a claim the script refused.
func lostRaceReply(o *hostOp) bool {
	if o.args[0] != "c" {
		return false
	}
	status, _ := o.reply[0].(string)
	return status != "ok" && status != "exists"
}
