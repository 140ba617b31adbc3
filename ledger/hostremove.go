package ledger

import (
	"context"
	"fmt"
)

var (
	hostRemoveScript = loadScript("host_remove")
	hostUnlistScript = loadScript("host_unlist")
)

// RemoveHost removes a host that holds nothing but the tombstones of
// guests evacuated from it, with them: a host that will never come back
// (a returning host destroys its leftovers and keeps its keys). It
// refuses a host with any live claim (ErrConflict, naming one), and one
// with tombstones that is not down. It returns how many tombstones went.
// Removing an unknown host is ErrUnknownHost; the name leaves the host
// list last, so a crash in between is finished by removing again.
func (l *Ledger) RemoveHost(ctx context.Context, host string) (int, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: remove host %s: %w", host, err) }
	if err := checkHostName(host); err != nil {
		return 0, wrap(err)
	}
	listed, err := l.rdb.SIsMember(ctx, l.hostsKey(), host).Result()
	if err != nil {
		return 0, wrap(err)
	}
	k := l.hostKeys(host)
	raw, err := l.change(ctx, hostRemoveScript, k.all()).Slice()
	if err != nil {
		return 0, wrap(err)
	}
	res, err := decodeHostRemove(replyStrings(raw))
	if err != nil {
		return 0, wrap(err)
	}
	switch res.status {
	case "gone":
		if !listed {
			return 0, wrap(fmt.Errorf("%w: %q", ErrUnknownHost, host))
		}
	case "live":
		return 0, wrap(fmt.Errorf("%w: its claim %s is %s; evacuate, migrate or delete its guests first", ErrConflict, res.claim, res.claimState))
	case "notdown":
		return 0, wrap(fmt.Errorf("%w: it holds %d tombstones and is %s; a host that returns clears them with host up", ErrConflict, res.tombstones, res.hostState))
	}
	n := res.tombstones
	l.dropCache(host, nil)
	l.hints.now(ctx, host)
	if err := l.change(ctx, hostUnlistScript, []string{l.hostsKey()}, host).Err(); err != nil {
		return 0, wrap(err)
	}
	return n, nil
}
