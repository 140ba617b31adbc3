package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestMoveSlots: slots are taken up to the cloud's limit and the
// target's, taken again by their holder, given back, and end by
// themselves when their lease runs out.
func TestMoveSlots(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	lim := MoveLimits{Cloud: 3, Target: 2}
	take := func(move, target string, lease time.Duration) (bool, string) {
		t.Helper()
		ok, why, err := l.TakeMoveSlot(ctx, MoveSlot{Move: move, Target: target}, lim, lease)
		if err != nil {
			t.Fatal(err)
		}
		return ok, why
	}
	for _, m := range []struct{ move, target string }{{"m1", "a"}, {"m2", "a"}, {"m3", "b"}} {
		if ok, why := take(m.move, m.target, time.Minute); !ok {
			t.Fatalf("slot for %s onto %s refused: %s", m.move, m.target, why)
		}
	}
	if ok, _ := take("m1", "a", time.Minute); !ok {
		t.Errorf("the holder of a slot could not take it again")
	}
	if ok, why := take("m4", "c", time.Minute); ok || !strings.Contains(why, "3 moves run in the cloud") {
		t.Errorf("a fourth slot in a cloud of 3 = %v (%s), want refused by the cloud's limit", ok, why)
	}
	if err := l.GiveMoveSlots(ctx, MoveSlot{Move: "m3", Target: "b"}, MoveSlot{Move: "never", Target: "b"}); err != nil {
		t.Fatal(err)
	}
	if ok, why := take("m4", "a", time.Minute); ok || !strings.Contains(why, "2 moves run onto a") {
		t.Errorf("a third slot onto a = %v (%s), want refused by the target's limit", ok, why)
	}
	if ok, why := take("m4", "c", 50*time.Millisecond); !ok {
		t.Errorf("slot onto c after one was given back refused: %s", why)
	}
	// m4's lease ends unless renewed; m1's renewal keeps it.
	if err := l.RenewMoveSlots(ctx, []MoveSlot{{Move: "m1", Target: "a"}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if ok, why := take("m5", "c", time.Minute); !ok {
		t.Errorf("slot onto c after m4's lease ended refused: %s", why)
	}
	if _, _, err := l.TakeMoveSlot(ctx, MoveSlot{Move: "a|b", Target: "c"}, lim, time.Minute); !errors.Is(err, ErrInvalid) {
		t.Errorf("a move id with '|': %v, want ErrInvalid", err)
	}
	if _, _, err := l.TakeMoveSlot(ctx, MoveSlot{Move: "m", Target: "c"}, MoveLimits{}, time.Minute); !errors.Is(err, ErrInvalid) {
		t.Errorf("zero limits: %v, want ErrInvalid", err)
	}
}
