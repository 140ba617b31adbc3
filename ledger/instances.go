package ledger

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// listFields are the record fields Instances reads: all but the domain
// XML, kilobytes per guest that a listing does not show.
var listFields = []string{"uuid", "name", "host", "node", "vm_state", "task_state", "request", "placement", "claim_id", "group", "resize", "updated_at"}

// listBatch is how many keys a SCAN step asks for and how many records one
// pipeline reads.
const listBatch = 1000

// Instances returns every instance record, ordered by uuid, without its
// domain XML (Instance reads that).
//
// There is no index of the records to read: a set of uuids would live in
// a slot of its own, written in a command of its own beside each record,
// and go stale whenever one of the two writes is lost. Instances finds the
// records by SCAN over their key pattern instead, on every master of a
// cluster. That walks every key of the database, listBatch keys a round
// trip (host keys, simulator state and all), and then reads each record
// with one HMGET, pipelined: for an operator's listing, not for a path
// that runs per operation. A record created or deleted during the walk
// may be listed or not; one that exists throughout is listed once.
func (l *Ledger) Instances(ctx context.Context) ([]*Instance, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: list instances: %w", err) }
	uuids := map[string]bool{}
	start, end := l.prefix+":inst:{", "}"
	err := l.scanKeys(ctx, start+"*"+end, func(key string) {
		u := strings.TrimSuffix(strings.TrimPrefix(key, start), end)
		if validKeyName(u) && l.instKey(u) == key { // else not a record key, though the pattern matched
			uuids[u] = true
		}
	})
	if err != nil {
		return nil, wrap(err)
	}
	sorted := make([]string, 0, len(uuids))
	for u := range uuids {
		sorted = append(sorted, u)
	}
	sort.Strings(sorted)
	out := make([]*Instance, 0, len(sorted))
	for len(sorted) > 0 {
		batch := sorted[:min(len(sorted), listBatch)]
		sorted = sorted[len(batch):]
		cmds := make([]*redis.SliceCmd, len(batch))
		if _, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, u := range batch {
				cmds[i] = p.HMGet(ctx, l.instKey(u), listFields...)
			}
			return nil
		}); err != nil {
			return nil, wrap(err)
		}
		for i, cmd := range cmds {
			f := make(map[string]string, len(listFields))
			for j, v := range cmd.Val() {
				if s, ok := v.(string); ok {
					f[listFields[j]] = s
				}
			}
			if f["uuid"] == "" {
				continue // deleted since the walk saw it
			}
			in, err := parseInstance(f)
			if err != nil {
				return nil, wrap(fmt.Errorf("instance %s: %w", batch[i], err))
			}
			out = append(out, in)
		}
	}
	return out, nil
}

// scanKeys calls each with every key that matches the pattern, walking
// every master of a cluster at once; calls to each never overlap. A key
// seen on two masters during a resharding is given twice.
func (l *Ledger) scanKeys(ctx context.Context, match string, each func(key string)) error {
	var mu sync.Mutex
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		it := c.Scan(ctx, 0, match, listBatch).Iterator()
		for it.Next(ctx) {
			mu.Lock()
			each(it.Val())
			mu.Unlock()
		}
		return it.Err()
	}
	if l.acks.cluster != nil {
		return l.acks.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	}
	return scan(ctx, l.rdb)
}
