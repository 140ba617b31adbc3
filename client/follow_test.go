package client_test

import (
	"errors"
	"fmt"
	"testing"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/client"
)

// TestRootMessage: the message of the error a step raised, as it comes
// back from Temporal, whatever wraps it and whatever it wraps.
func TestRootMessage(t *testing.T) {
	unknown := errors.New("unknown host")
	full := `sim: capabilities of nowhere: host "nowhere": unknown host; add it first`
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"a typed error with the Go errors it came from",
			temporal.NewNonRetryableApplicationError(full, "UnknownHost", fmt.Errorf("sim: capabilities of nowhere: %w", fmt.Errorf("host %q: %w; add it first", "nowhere", unknown))),
			full},
		{"a typed error without a cause", temporal.NewNonRetryableApplicationError("host a is down", "BadState", nil), "host a is down"},
		{"a Go error", fmt.Errorf("libvirt: host a: %w", errors.New("connection refused")), "libvirt: host a: connection refused"},
	} {
		// Temporal carries the error and its causes as failures.
		conv := temporal.GetDefaultFailureConverter()
		got := client.RootMessage(conv.FailureToError(conv.ErrorToFailure(tt.err)))
		if got != tt.want {
			t.Errorf("RootMessage(%s) = %q, want %q", tt.name, got, tt.want)
		}
	}
}
