package ledger

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// MoveSlot names one move's slot: the move (a drain's migration of one
// guest) and the host it goes to.
type MoveSlot struct {
	Move   string
	Target string
}

func (s MoveSlot) member() string { return s.Target + "|" + s.Move }

// MoveLimits bound the moves running at once: in the whole cloud and onto
// one target.
type MoveLimits struct {
	Cloud  int
	Target int
}

// TakeMoveSlot takes a slot for the move, renewed for lease, if fewer
// than the limits' moves hold one in the cloud and on its target; taking
// a slot the move holds already renews it. It says which limit is full
// when it takes none. The slots live in one key (one Cluster slot): moves
// are few, and one script must see them all.
func (l *Ledger) TakeMoveSlot(ctx context.Context, s MoveSlot, lim MoveLimits, lease time.Duration) (bool, string, error) {
	wrap := func(err error) error {
		return fmt.Errorf("ledger: take a move slot for %s onto %s: %w", s.Move, s.Target, err)
	}
	if s.Move == "" || strings.Contains(s.Move, "|") || checkHostName(s.Target) != nil || lim.Cloud < 1 || lim.Target < 1 || lease < time.Millisecond {
		return false, "", wrap(fmt.Errorf("%w: move %q, target %q, limits %d/%d, lease %s: a move id without '|', a host, limits of at least 1 and a lease are needed",
			ErrInvalid, s.Move, s.Target, lim.Cloud, lim.Target, lease))
	}
	res, err := l.change(ctx, moveSlotScript, []string{l.movesKey()}, "take", s.Move, s.Target, lim.Cloud, lim.Target, lease.Milliseconds()).Slice()
	if err != nil {
		return false, "", wrap(err)
	}
	if res[0] == "ok" {
		return true, "", nil
	}
	return false, fmt.Sprintf("%d moves run %s", toInt(res[1]), map[any]string{"cloud": "in the cloud", "target": "onto " + s.Target}[res[0]]), nil
}

// RenewMoveSlots extends the slots' leases; a slot that ended is not
// taken again (its move takes a new one if it still needs it).
func (l *Ledger) RenewMoveSlots(ctx context.Context, slots []MoveSlot, lease time.Duration) error {
	if len(slots) == 0 {
		return nil
	}
	args := []any{"renew", lease.Milliseconds()}
	for _, s := range slots {
		args = append(args, s.member())
	}
	if err := l.change(ctx, moveSlotScript, []string{l.movesKey()}, args...).Err(); err != nil {
		return fmt.Errorf("ledger: renew move slots: %w", err)
	}
	return nil
}

// GiveMoveSlots gives the slots back; giving back one not held is no error.
func (l *Ledger) GiveMoveSlots(ctx context.Context, slots ...MoveSlot) error {
	if len(slots) == 0 {
		return nil
	}
	args := []any{"give"}
	for _, s := range slots {
		args = append(args, s.member())
	}
	if err := l.change(ctx, moveSlotScript, []string{l.movesKey()}, args...).Err(); err != nil {
		return fmt.Errorf("ledger: give back move slots: %w", err)
	}
	return nil
}
