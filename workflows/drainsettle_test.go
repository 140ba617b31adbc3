package workflows

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/drain"
)

// blocked is a plan of host src that an operation in flight keeps from
// completing.
var blocked = drain.Plan{Source: "src", Moves: []drain.Move{}, Blocked: []drain.Unplaceable{{UUID: uuid, Reason: "migration-dest claim of an open operation"}}}

// TestDrainWaitsForClaimsInFlight: a drain plans again every settleRetry
// while claims in flight block its host, and once they are gone it moves
// the guest, on the workflow's clock (time skipped), not the test's.
func TestDrainWaitsForClaimsInFlight(t *testing.T) {
	h := newHarness(t)
	h.env.RegisterWorkflow(LiveMigration)
	complete := drain.Plan{Source: "src", Moves: []drain.Move{{UUID: uuid, Name: "vm", Target: "dst", Placement: &placement}}}
	h.on("plan", (*activities.Activities).PlanDrain, blocked, nil).Twice()
	h.on("plan", (*activities.Activities).PlanDrain, complete, nil).Once()
	h.on("disable", (*activities.Activities).DisableHost, nil)
	h.on("reserve", (*activities.Activities).Reserve, api.Reservation{Host: "dst", ClaimID: "drain-1", Owner: api.DrainWorkflowID("src"), Token: "t"}, nil)
	h.on("slot", (*activities.Activities).TakeMoveSlot, activities.MoveSlotResult{Taken: true}, nil)
	h.on("give", (*activities.Activities).GiveMoveSlots, nil)
	h.env.OnWorkflow(LiveMigration, mock.Anything, mock.Anything).Return(&api.LiveMigrationResult{}, nil).Once()
	began := h.env.Now()
	h.env.ExecuteWorkflow(Drain, api.DrainInput{Host: "src", Settle: time.Minute})
	var res api.DrainResult
	if err := h.env.GetWorkflowResult(&res); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if res.Moved != 1 || res.Failed != 0 {
		t.Errorf("Drain moved %d and left %d, want 1 moved: %+v", res.Moved, res.Failed, res.Guests)
	}
	if got := h.sequence(); !strings.HasPrefix(got, "plan,plan,plan,disable,reserve,slot") {
		t.Errorf("Drain ran %s, want three plans before it disabled the host", got)
	}
	if waited := h.env.Now().Sub(began); waited < 2*settleRetry {
		t.Errorf("Drain planned three times within %v of workflow time, want at least %v between them", waited, 2*settleRetry)
	}
}

// TestDrainGivesUpAfterSettle: claims in flight that outlast the drain's
// settle fail it before it disables the host or reserves anything.
func TestDrainGivesUpAfterSettle(t *testing.T) {
	h := newHarness(t)
	h.on("plan", (*activities.Activities).PlanDrain, blocked, nil)
	h.env.ExecuteWorkflow(Drain, api.DrainInput{Host: "src", Settle: 10 * time.Second})
	err := h.env.GetWorkflowError()
	var app *temporal.ApplicationError
	if !errors.As(err, &app) || app.Type() != api.ErrTypeBadState || !strings.Contains(err.Error(), "cannot complete, so nothing moved") {
		t.Fatalf("Drain with claims in flight past its settle: %v, want a BadState saying it cannot complete", err)
	}
	// Plans at 0, 3, 6, 9 and 12 s: the last one is past the settle.
	if n := strings.Count(h.sequence(), "plan"); n != 5 {
		t.Errorf("Drain planned %d times in a settle of 10s, want 5 (every %v until past it)", n, settleRetry)
	}
	h.env.AssertActivityNotCalled(t, "DisableHost", mock.Anything, mock.Anything)
}
