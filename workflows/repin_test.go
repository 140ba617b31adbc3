package workflows

import (
	"slices"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
)

// TestRepinSteps: a re-pin claims, pins and commits; a cancel while it
// claims releases the re-pin claim and touches no domain; a failure
// past the first live pin call compensates nothing.
func TestRepinSteps(t *testing.T) {
	for _, tt := range []struct {
		name   string
		cancel bool
		failAt string
		steps  string
	}{
		{"completes", false, "", "load,claim,repin,commit"},
		{"cancelled while it claims", true, "", ""},
		{"the live pins fail", false, "repin", "load,claim,repin"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.on("load", a.LoadInstance, active("a"), nil)
			claim := h.on("claim", a.ClaimRepin, activities.ClaimResult{Host: "a", ClaimID: "rp", Placement: placement}, nil)
			if tt.cancel {
				claim.After(time.Hour)
				h.env.RegisterDelayedCallback(h.env.CancelWorkflow, time.Minute)
			}
			h.on("release", a.ReleaseClaim, nil).Maybe()
			var repinErr error
			if tt.failAt == "repin" {
				repinErr = failed("the hypervisor refused", api.ErrTypeRejected)
			}
			h.on("repin", a.RepinDomain, repinErr).Maybe()
			h.on("commit", a.CommitRepin, nil).Maybe()
			h.env.ExecuteWorkflow(Repin, api.RepinInput{UUID: uuid})
			err := h.env.GetWorkflowError()
			switch {
			case tt.cancel && !temporal.IsCanceledError(err):
				t.Errorf("Repin error = %v, want cancelled", err)
			case tt.failAt != "" && err == nil:
				t.Errorf("Repin error = nil, want the failure of %s", tt.failAt)
			case !tt.cancel && tt.failAt == "" && err != nil:
				t.Errorf("Repin: %v", err)
			}
			got := h.sequence()
			if tt.cancel {
				// The held claim's mock is recorded when it returns, which
				// the test clock may put after the compensation or never:
				// what counts is the release and no domain touched.
				steps := strings.Split(got, ",")
				if !slices.Contains(steps, "release") || slices.Contains(steps, "repin") || slices.Contains(steps, "commit") {
					t.Errorf("cancelled Repin steps = %s, want the release and neither repin nor commit", got)
				}
				return
			}
			if got != tt.steps {
				t.Errorf("Repin steps = %s, want %s", got, tt.steps)
			}
		})
	}
}
