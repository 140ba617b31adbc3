package ledger

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ChangeRetention is how long a change hint is kept (see ChangedSince):
// a reader that has not looked for longer may have missed changes, and
// must read every host.
const ChangeRetention = 5 * time.Minute

const (
	// hintSpacing is the least time between two hint scripts of one
	// process: the changes in between go together, one entry per host,
	// so a busy ledger adds a script every few milliseconds, not one per
	// claim.
	hintSpacing = 10 * time.Millisecond
	// maxHintHosts bounds one hint script's arguments (Lua's unpack).
	maxHintHosts = 500
	hintTimeout  = 5 * time.Second
)

var hintScript = loadScript("hint")

// HostChange says that a host's usage or topology changed.
type HostChange struct {
	Host string
	// At orders the changes: the Redis server's clock in µs when the hint
	// was written, raised where needed so that every hint is later than
	// every one before it.
	At int64
}

// ChangedSince returns the hosts whose usage or topology changed after
// the change stamped after (0: all kept), oldest first, one entry per
// host, its latest. Every claim, release, registration and removal adds
// its host shortly after the change, in a command of its own (the hints
// live in one slot, a host's keys in another): a process that dies in
// between leaves the change without its hint, so a reader must also read
// every host now and then. A host's entry goes after ChangeRetention.
func (l *Ledger) ChangedSince(ctx context.Context, after int64) ([]HostChange, error) {
	zs, err := l.rdb.ZRangeByScoreWithScores(ctx, l.changedKey(),
		&redis.ZRangeBy{Min: "(" + strconv.FormatInt(after, 10), Max: "+inf"}).Result()
	if err != nil {
		return nil, fmt.Errorf("ledger: changed hosts: %w", err)
	}
	out := make([]HostChange, 0, len(zs))
	for _, z := range zs {
		name, _ := z.Member.(string)
		out = append(out, HostChange{Host: name, At: int64(z.Score)})
	}
	return out, nil
}

// LastChange returns the stamp of the latest change kept (see
// ChangedSince), 0 if there is none.
func (l *Ledger) LastChange(ctx context.Context) (int64, error) {
	zs, err := l.rdb.ZRangeWithScores(ctx, l.changedKey(), -1, -1).Result()
	if err != nil {
		return 0, fmt.Errorf("ledger: last change: %w", err)
	}
	if len(zs) == 0 {
		return 0, nil
	}
	return int64(zs[0].Score), nil
}

// hinter writes change hints for hosts in the background. The hint comes
// after its change's reply, never before, so a reader that sees it reads
// the change.
type hinter struct {
	rdb redis.UniversalClient
	key string

	mu      sync.Mutex
	pending map[string]struct{}
	running bool
}

func newHinter(rdb redis.UniversalClient, key string) *hinter {
	return &hinter{rdb: rdb, key: key, pending: map[string]struct{}{}}
}

// add queues a hint for host, and starts the sender if it is idle.
func (h *hinter) add(host string) {
	h.mu.Lock()
	h.pending[host] = struct{}{}
	start := !h.running
	h.running = true
	h.mu.Unlock()
	if start {
		go h.run()
	}
}

// now writes a host's hint before returning, for the rare changes
// (registration, removal) whose callers may look at the keys right after.
func (h *hinter) now(ctx context.Context, host string) {
	// The change is made: its hint goes even if the caller gave up.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), hintTimeout)
	defer cancel()
	h.write(ctx, []string{host})
}

// run sends what is queued until nothing is.
func (h *hinter) run() {
	for {
		h.mu.Lock()
		if len(h.pending) == 0 {
			h.running = false
			h.mu.Unlock()
			return
		}
		hosts := make([]string, 0, len(h.pending))
		for host := range h.pending {
			hosts = append(hosts, host)
		}
		clear(h.pending)
		h.mu.Unlock()
		h.send(hosts)
		time.Sleep(hintSpacing)
	}
}

func (h *hinter) send(hosts []string) {
	ctx, cancel := context.WithTimeout(context.Background(), hintTimeout)
	defer cancel()
	h.write(ctx, hosts)
}

func (h *hinter) write(ctx context.Context, hosts []string) {
	for len(hosts) > 0 {
		n := min(len(hosts), maxHintHosts)
		args := make([]any, 0, n+1)
		args = append(args, ChangeRetention.Microseconds())
		for _, host := range hosts[:n] {
			args = append(args, host)
		}
		// A hint that does not land delays its change in the readers'
		// views until their next full read; nothing relies on it.
		_ = hintScript.Run(ctx, h.rdb, []string{h.key}, args...).Err()
		hosts = hosts[n:]
	}
}
