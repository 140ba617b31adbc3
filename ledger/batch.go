package ledger

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// maxFlushers bounds the pipelines in flight at once: a few keep the
// server busy while the replies of earlier ones are being read; more only
// make smaller batches.
const maxFlushers = 4

// batcher sends the claim and release scripts of concurrent callers
// together, one pipeline per round trip, instead of one round trip each.
// Each script still runs atomically on its own; the pipeline only shares
// the write and read system calls, which cost the client and the server
// more than a claim's script does.
type batcher struct {
	rdb      redis.UniversalClient
	mu       sync.Mutex
	queue    []*scriptCall
	flushers int
}

type scriptCall struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
	done   chan struct{}
}

// run runs script as one command of the next pipeline and returns its
// reply. A caller whose context ends stops waiting, as with any command,
// but the script may still run: the scripts are idempotent.
func (b *batcher) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	c := &scriptCall{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	start := b.flushers < maxFlushers
	if start {
		b.flushers++
	}
	b.mu.Unlock()
	if start {
		go b.flush()
	}
	select {
	case <-c.done:
		return c.cmd
	case <-ctx.Done():
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(ctx.Err())
		return cmd
	}
}

// flush sends what is queued, one pipeline at a time, until the queue is
// empty.
func (b *batcher) flush() {
	for {
		b.mu.Lock()
		batch := b.queue
		b.queue = nil
		if len(batch) == 0 {
			b.flushers--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.send(batch)
	}
}

func (b *batcher) send(batch []*scriptCall) {
	// One caller giving up must not fail the others' commands; the first
	// caller's context still carries its values (tracing) along.
	ctx := context.WithoutCancel(batch[0].ctx)
	if len(batch) == 1 {
		c := batch[0]
		c.cmd = c.script.Run(ctx, b.rdb, c.keys, c.args...)
		close(c.done)
		return
	}
	cmds := make([]*redis.Cmd, len(batch))
	_, _ = b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range batch {
			cmds[i] = c.script.EvalSha(ctx, p, c.keys, c.args...)
		}
		return nil
	})
	for i, c := range batch {
		c.cmd = cmds[i]
		if err := c.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			// A server that has not seen the script yet (a restart, a new
			// cluster node): Run loads it.
			c.cmd = c.script.Run(ctx, b.rdb, c.keys, c.args...)
		}
		close(c.done)
	}
}
