package ledger

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/numa"
)

func TestUnavailable(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("ledger: fence c on a: %w", ErrUnknownClaim), false},
		{fmt.Errorf("ledger: claim: %w", ErrConflict), false},
		{fmt.Errorf("ledger: claim: %w", &numa.NoFitError{}), false},
		{fmt.Errorf("ledger: instance: %w", ErrUnknownInstance), false},
		{fmt.Errorf("ledger: %w", context.Canceled), false},
		{fmt.Errorf("ledger: fence c on a: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}), true},
		{fmt.Errorf("ledger: claim: %w", redis.ErrClosed), true},
		{fmt.Errorf("ledger: claim: %w", ErrNotDurable), true},
	} {
		if got := Unavailable(tt.err); got != tt.want {
			t.Errorf("Unavailable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
