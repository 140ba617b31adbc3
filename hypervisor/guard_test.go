package hypervisor

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestExpired: a deadline past by the clock is expired before the
// context's timer fires, as after a frozen worker resumes; a context with
// time left, or none set, is not.
func TestExpired(t *testing.T) {
	if err := Expired(context.Background()); err != nil {
		t.Errorf("Expired(no deadline) = %v", err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(time.Hour))
	defer cancel()
	if err := Expired(ctx); err != nil {
		t.Errorf("Expired(an hour left) = %v", err)
	}
	past := deadlineOnly{Context: context.Background(), at: time.Now().Add(-time.Millisecond)}
	if err := Expired(past); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Expired(deadline passed, timer not fired) = %v, want DeadlineExceeded", err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if err := Expired(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Expired(cancelled) = %v, want Canceled", err)
	}
}

// deadlineOnly has a deadline whose timer never fires.
type deadlineOnly struct {
	context.Context
	at time.Time
}

func (d deadlineOnly) Deadline() (time.Time, bool) { return d.at, true }
