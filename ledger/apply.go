package ledger

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// applier runs claims and releases on a host, each as one script
// (claim.lua, release.lua), followed by the wait for durability when one
// is configured. Each operation is its own script: live migrations and
// bursts of boots run at the rate Temporal gives them, a small fraction of
// what the ledger answers, so batching them would move no end-to-end
// figure.
type applier struct {
	rdb   redis.UniversalClient
	acks  *acker  // the waits for durability after each script
	hints *hinter // the hosts a script changed, for placement indexes
}

// run runs s, claimScript or releaseScript, with args on the host of
// keys, and returns its reply. When the wait after the script failed, a
// reply that acknowledges a change, or rests on one, returns that error
// instead; a claim's lost race keeps its reply, which Claim retries on.
func (a *applier) run(ctx context.Context, keys *hostKeys, s *script, args ...any) ([]any, error) {
	var res any
	var err, notDurable error
	if a.acks.want.on() {
		w := newWrite(s, keys.all(), args)
		a.acks.do(ctx, w)
		res, err, notDurable = w.res, w.err, w.ack
	} else {
		res, err = s.Run(ctx, a.rdb, keys.all(), args...).Result()
	}
	if err != nil {
		return nil, err
	}
	reply, _ := res.([]any)
	if len(reply) == 0 {
		return nil, fmt.Errorf("%s script replied %v", s.name, res)
	}
	if changedHost(reply) {
		// The change is made, durable or not.
		a.hints.add(keys.host)
	}
	if notDurable != nil && !lostRace(s, reply) {
		return nil, notDurable
	}
	return reply, nil
}

// changedHost says whether a reply is of a claim made or a claim
// released.
func changedHost(reply []any) bool {
	status, _ := reply[0].(string)
	return status == "ok" || status == "released"
}

// lostRace says whether the reply is of a claim the script refused.
func lostRace(s *script, reply []any) bool {
	if s != claimScript {
		return false
	}
	status, _ := reply[0].(string)
	return status != "ok" && status != "exists"
}
