package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultMaxAttempts bounds how often Claim re-fits after losing a race.
const DefaultMaxAttempts = 8

// Options configure a Ledger.
type Options struct {
	// KeyPrefix starts every key; DefaultKeyPrefix when empty.
	KeyPrefix string
	// MaxAttempts bounds Claim's tries; DefaultMaxAttempts when zero.
	MaxAttempts int
	// Now is the clock for record timestamps; time.Now when nil.
	Now func() time.Time
	// Durability is what every change waits for before its call returns;
	// the zero value waits for nothing.
	Durability Durability
	// Namespace is the Temporal namespace of the workflows this process
	// claims for, which every claim records; Bind sets it too.
	Namespace string
}

// Ledger is the per-host CPU, memory and page ledger and the instance
// records, kept in Redis. It is safe for concurrent use, also by many
// processes sharing one Redis: every change is one atomic script.
type Ledger struct {
	rdb         redis.UniversalClient
	prefix      string
	maxAttempts int
	now         func() time.Time
	namespace   string

	// hosts caches each host's topology and state, so a claim fits without
	// reading the host first (see hostCache).
	hosts sync.Map // host name -> *hostCache
	keys  sync.Map // host name -> hostKeys
	// rules caches each instance's server group rule, fixed for the life
	// of its record, so that a claim reads it once per instance.
	rules ruleCache
	// apply runs claims and releases.
	apply *applier
	// acks sends changes followed by the waits for durability.
	acks *acker
	// hints tells other processes' placement indexes which hosts changed.
	hints *hinter
}

// New returns a ledger on rdb, a single-node or cluster client.
func New(rdb redis.UniversalClient, opts Options) (*Ledger, error) {
	if err := opts.Durability.check(); err != nil {
		return nil, err
	}
	acks := newAcker(rdb, opts.Durability)
	l := &Ledger{rdb: rdb, prefix: opts.KeyPrefix, maxAttempts: opts.MaxAttempts, now: opts.Now, acks: acks, namespace: opts.Namespace}
	if l.prefix == "" {
		l.prefix = DefaultKeyPrefix
	}
	if !validPrefix(l.prefix) {
		return nil, fmt.Errorf("ledger: key prefix %q: %w: prefixes are 1-64 characters of letters, digits, '.', '_', ':' and '-'", l.prefix, ErrInvalid)
	}
	l.hints = newHinter(rdb, l.changedKey())
	l.apply = &applier{rdb: rdb, acks: acks, hints: l.hints}
	if l.maxAttempts < 0 {
		return nil, fmt.Errorf("ledger: max attempts %d: %w: must be 0 (default %d) or more", l.maxAttempts, ErrInvalid, DefaultMaxAttempts)
	}
	if l.maxAttempts == 0 {
		l.maxAttempts = DefaultMaxAttempts
	}
	if l.now == nil {
		l.now = time.Now
	}
	return l, nil
}

// Open connects with cfg (see Config.NewClient) and returns a ledger using
// cfg's key prefix and durability, which it checks every master can give
// (CheckDurability), on masters that never evict its keys
// (CheckEviction). Close the client when done.
func Open(ctx context.Context, cfg Config) (*Ledger, redis.UniversalClient, error) {
	d := cfg.durability()
	if err := d.check(); err != nil {
		return nil, nil, err
	}
	rdb, err := cfg.NewClient(ctx)
	if err != nil {
		return nil, nil, err
	}
	l, err := New(rdb, Options{KeyPrefix: cfg.KeyPrefix, Durability: d})
	if err == nil {
		err = l.CheckEviction(ctx)
	}
	if err == nil {
		err = l.CheckDurability(ctx)
	}
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return l, rdb, nil
}

// timestamp is how record times are written: UTC, RFC 3339 with
// nanoseconds, the way encoding/json writes a time.Time.
func (l *Ledger) timestamp() string { return l.now().UTC().Format(time.RFC3339Nano) }

func isNil(err error) bool { return errors.Is(err, redis.Nil) }
