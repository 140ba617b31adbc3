package ledger

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// applier runs claims and releases on a host, each as one apply script,
// followed by the wait for durability when one is configured.
//
// Concurrent operations used to go together, several to a script (group
// commit). That doubled the ledger's own rate at 64 clients, but moved no
// end-to-end figure: live migrations and a burst of 500 boots run at the
// rate Temporal gives them either way, a small fraction of what the
// ledger answers.
type applier struct {
	rdb   redis.UniversalClient
	acks  *acker  // the waits for durability after each script
	hints *hinter // the hosts a script changed, for placement indexes
}

// run applies one operation on the host of keys: args are "c" or "r",
// then the operation's arguments (see apply.lua). It returns the
// operation's reply. When the wait after the script failed, an operation
// whose reply acknowledges a change, or rests on one, returns that error
// instead; a claim's lost race keeps its reply, which Claim retries on.
func (a *applier) run(ctx context.Context, keys *hostKeys, args ...any) ([]any, error) {
	cmd := append([]any{"evalsha", applyScript.Hash(), 7, keys.topo, keys.pins, keys.claims, keys.usage, keys.undo, keys.lease, keys.state, 1},
		args...)
	var res any
	var err, notDurable error
	if a.acks.want.on() {
		w := &write{key: keys.topo, args: cmd, src: applySource}
		a.acks.do(ctx, []*write{w})
		res, err, notDurable = w.res, w.err, w.ack
	} else {
		res, err = a.rdb.Do(ctx, cmd...).Result()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			// A server that has not seen the script yet (a restart, a new
			// cluster node): EVAL loads it.
			res, err = a.rdb.Do(ctx, append([]any{"eval", applySource}, cmd[2:]...)...).Result()
		}
	}
	if err != nil {
		return nil, err
	}
	replies, _ := res.([]any)
	if len(replies) != 1 {
		return nil, fmt.Errorf("apply script replied %d results for one operation", len(replies))
	}
	reply, _ := replies[0].([]any)
	if len(reply) == 0 {
		return nil, fmt.Errorf("apply script replied %v for operation %v", replies[0], args[0])
	}
	if changedHost(reply) {
		// The change is made, durable or not.
		a.hints.add(keys.host)
	}
	if notDurable != nil && !lostRace(args, reply) {
		return nil, notDurable
	}
	return reply, nil
}

// changedHost says whether an operation's reply is a claim made or a
// claim released.
func changedHost(reply []any) bool {
	switch v := reply[0].(type) {
	case string:
		return v == "ok"
	case int64:
		return v == 1
	}
	return false
}

// lostRace says whether the reply is of a claim the script refused.
func lostRace(args, reply []any) bool {
	if args[0] != "c" {
		return false
	}
	status, _ := reply[0].(string)
	return status != "ok" && status != "exists"
}
