package ledger

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinflow/pinflow/internal/testenv"
)

// redisAnswer is an error as Redis sends it.
type redisAnswer string

func (e redisAnswer) Error() string { return string(e) }
func (redisAnswer) RedisError()     {}

// TestOutageHookWaitsOutARestart: a command that meets a Redis restarting
// (refused connections, a server loading its data, the transaction it
// refused for that) runs again until Redis answers; an answer is returned
// at once; a Redis that stays away fails the command after the wait with
// one line that says since when and why, never Redis' raw words.
func TestOutageHookWaitsOutARestart(t *testing.T) {
	ctx := context.Background()
	h := outageHook{wait: time.Hour, where: "127.0.0.1:6379"}
	outage := []error{syscall.ECONNREFUSED, redisAnswer("LOADING Redis is loading the dataset in memory"),
		redisAnswer("EXECABORT Transaction discarded because of previous errors.")}
	calls := 0
	err := h.retry(ctx, func() error {
		calls++
		if calls <= len(outage) {
			return outage[calls-1]
		}
		return nil
	})
	if err != nil || calls != len(outage)+1 {
		t.Errorf("retry over a restart = %v after %d calls, want nil after %d", err, calls, len(outage)+1)
	}

	calls = 0
	answer := redisAnswer("WRONGTYPE Operation against a key holding the wrong kind of value")
	if err := h.retry(ctx, func() error { calls++; return answer }); !errors.Is(err, answer) || calls != 1 {
		t.Errorf("retry of an answer = %v after %d calls, want the answer after 1", err, calls)
	}

	short := outageHook{wait: 50 * time.Millisecond, where: "127.0.0.1:6379"}
	err = short.retry(ctx, func() error { return outage[2] })
	var oe *OutageError
	if !errors.As(err, &oe) || !Unavailable(err) {
		t.Fatalf("retry past the wait = %v, want an *OutageError that is Unavailable", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "the ledger's Redis at 127.0.0.1:6379 has been unavailable since") ||
		!strings.Contains(msg, "it is loading its data after a restart") || strings.Contains(msg, "EXECABORT") || strings.Contains(msg, "\n") {
		t.Errorf("OutageError = %q, want one line that says since when and why, without Redis' raw words", msg)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := h.retry(cancelled, func() error { return outage[0] }); !errors.Is(err, context.Canceled) {
		t.Errorf("retry with its context cancelled = %v, want context.Canceled", err)
	}
}

// TestOutageWaitOnARealRedis: with OutageWait set, a command to a Redis
// that stopped after the client connected fails after the wait with an
// OutageError, and one to a Redis that came back answers.
func TestOutageWaitOnARealRedis(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	rdb, err := Config{URL: srv.URL(), OutageWait: 200 * time.Millisecond}.NewClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	srv.Stop(t)
	err = rdb.Set(ctx, "k", "v", 0).Err()
	var oe *OutageError
	if !errors.As(err, &oe) || !strings.Contains(err.Error(), "it refuses connections") {
		t.Fatalf("Set on a stopped Redis = %v, want an OutageError saying it refuses connections", err)
	}
	srv.Start(t)
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Errorf("Set on the Redis started again: %v", err)
	}
}
