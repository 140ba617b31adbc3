package workflows

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	sdkpb "go.temporal.io/api/sdk/v1"
	"go.temporal.io/sdk/testsuite"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/drain"
)

// updated is how one Update sent to a test workflow ended.
type updated struct {
	rejected error
	// completed is the workflow time from the start at which the handler
	// returned; 0 while it has not.
	completed time.Duration
}

// update sends the Update name at workflow time at from the start and
// records how it ends.
func (h *harness) update(name string, at time.Duration, u *updated) {
	start := h.env.Now()
	h.env.RegisterDelayedCallback(func() {
		h.env.UpdateWorkflow(name, "", &testsuite.TestUpdateCallback{
			OnAccept:   func() {},
			OnReject:   func(err error) { u.rejected = err },
			OnComplete: func(any, error) { u.completed = h.env.Now().Sub(start) },
		})
	}, at)
}

// query asks the query q at workflow time at from the start, into v.
func (h *harness) query(t *testing.T, q string, at time.Duration, v any) {
	h.env.RegisterDelayedCallback(func() {
		r, err := h.env.QueryWorkflow(q)
		if err == nil {
			err = r.Get(v)
		}
		if err != nil {
			t.Errorf("query %s at %v: %v", q, at, err)
		}
	}, at)
}

// onDrain mocks a drain of src that plans uuids onto dst, each move
// taking moveTime; slots records the workflow time from the start at
// which each move took its slot, just before it started.
func (h *harness) onDrain(moveTime time.Duration, slots *[]time.Duration, uuids ...string) {
	start := h.env.Now()
	plan := drain.Plan{Source: "src"}
	for _, u := range uuids {
		plan.Moves = append(plan.Moves, drain.Move{UUID: u, Name: "vm", Target: "dst", Placement: &placement})
	}
	h.on("plan", a.PlanDrain, plan, nil)
	h.on("disable", a.DisableHost, nil)
	h.on("reserve", a.Reserve, api.Reservation{Host: "dst", ClaimID: "r", Owner: api.DrainWorkflowID("src"), Token: "t"}, nil)
	h.env.OnActivity(a.TakeMoveSlot, mock.Anything, mock.Anything).Return(activities.MoveSlotResult{Taken: true}, nil).Run(func(mock.Arguments) {
		*slots = append(*slots, h.env.Now().Sub(start))
	})
	h.on("renew", a.RenewMoveSlots, nil).Maybe()
	h.env.RegisterWorkflow(LiveMigration)
	h.env.OnWorkflow(LiveMigration, mock.Anything, mock.Anything).Return(&api.LiveMigrationResult{}, nil).After(moveTime)
}

// TestDrainPauseResume: a pause is taken at once, while a move runs; the
// drain then starts no move until a resume, and its status and phase
// detail say it is paused. A second pause and a resume of a drain not
// paused are refused by the validators and change nothing.
func TestDrainPauseResume(t *testing.T) {
	h := newHarness(t)
	var slots []time.Duration
	h.onDrain(time.Hour, &slots, uuid, "1c4d0e7f-2a3b-4c5d-9e8f-0a1b2c3d4e5f")
	h.on("give", a.GiveMoveSlots, nil)
	var early, pause, again, resume updated
	h.update(api.DrainResumeUpdate, 5*time.Minute, &early)
	h.update(api.DrainPauseUpdate, 10*time.Minute, &pause)
	h.update(api.DrainPauseUpdate, 20*time.Minute, &again)
	h.update(api.DrainResumeUpdate, 3*time.Hour, &resume)
	// The phase detail while the first move still runs; the drain's
	// status between that move's end and the resume.
	var status api.Status
	var st api.DrainStatus
	h.query(t, api.StatusQuery, 30*time.Minute, &status)
	h.query(t, api.DrainStatusQuery, 2*time.Hour, &st)
	h.env.ExecuteWorkflow(Drain, api.DrainInput{Host: "src", Parallel: 1})
	var res api.DrainResult
	if err := h.env.GetWorkflowResult(&res); err != nil || res.Moved != 2 {
		t.Fatalf("Drain = %+v, %v; want both guests moved", res, err)
	}
	for _, c := range []struct {
		name string
		u    updated
		want string // "" accepted
		at   time.Duration
	}{
		{"a resume before any pause", early, "is not paused; 'pinflow host drain pause src' pauses it", 0},
		{"a pause while a move runs", pause, "", 10 * time.Minute},
		{"a second pause", again, "is paused already; 'pinflow host drain resume src' resumes it", 0},
		{"the resume", resume, "", 3 * time.Hour},
	} {
		switch {
		case c.want == "" && c.u.rejected != nil:
			t.Errorf("%s: refused (%v), want it accepted", c.name, c.u.rejected)
		case c.want == "" && c.u.completed != c.at:
			t.Errorf("%s: sent at %v, completed at %v; want it completed at once", c.name, c.at, c.u.completed)
		case c.want != "" && (c.u.rejected == nil || !strings.Contains(c.u.rejected.Error(), c.want)):
			t.Errorf("%s: refusal %v, want one saying %q", c.name, c.u.rejected, c.want)
		case c.want != "" && c.u.completed != 0:
			t.Errorf("%s: refused, yet its handler ran", c.name)
		}
	}
	if len(slots) != 2 || slots[0] != 0 || slots[1] != 3*time.Hour {
		t.Errorf("moves started at %v, want at 0 and at the resume (3h): none while paused", slots)
	}
	moved := 0
	for _, g := range st.Guests {
		if g.State == api.GuestMoved {
			moved++
		}
	}
	if !st.Paused || st.Moving != 0 || moved != 1 {
		t.Errorf("status of the paused drain: paused %v, %d moving, %d moved; want paused, 0 moving, 1 moved", st.Paused, st.Moving, moved)
	}
	if status.Phase != api.PhaseRunning || !strings.Contains(status.Detail, "paused: no new move starts until 'pinflow host drain resume src'") {
		t.Errorf("phase of the drain paused while a move runs = %s %q, want running with a detail saying it is paused", status.Phase, status.Detail)
	}
}

// TestDrainEndingRefusesPauseAndResume: once every guest has moved and
// the drain only gives its last slot back, a pause and a resume are
// refused: no move is left to start.
func TestDrainEndingRefusesPauseAndResume(t *testing.T) {
	h := newHarness(t)
	var slots []time.Duration
	h.onDrain(time.Hour, &slots, uuid)
	// The slot goes back in 20 s after the move's end, within the
	// ledger steps' timeout.
	h.on("give", a.GiveMoveSlots, nil).After(20 * time.Second)
	var pause, resume updated
	h.update(api.DrainPauseUpdate, time.Hour+10*time.Second, &pause)
	h.update(api.DrainResumeUpdate, time.Hour+10*time.Second, &resume)
	h.env.ExecuteWorkflow(Drain, api.DrainInput{Host: "src"})
	var res api.DrainResult
	if err := h.env.GetWorkflowResult(&res); err != nil || res.Moved != 1 {
		t.Fatalf("Drain = %+v, %v; want the guest moved", res, err)
	}
	for name, u := range map[string]updated{"pause": pause, "resume": resume} {
		if want := "the drain of src is ending (every guest has moved or failed)"; u.rejected == nil || !strings.Contains(u.rejected.Error(), want) {
			t.Errorf("a %s while the last slot goes back: refusal %v, want one saying %q", name, u.rejected, want)
		}
	}
}

// TestDrainRecordsFailedMovesInOneLine: a move that fails records its
// root cause in one line, not the child and activity errors around it,
// and the drain's details in the UI show every guest's row and its
// limits, the settle readable.
func TestDrainRecordsFailedMovesInOneLine(t *testing.T) {
	h := newHarness(t)
	other := "1c4d0e7f-2a3b-4c5d-9e8f-0a1b2c3d4e5f"
	plan := drain.Plan{Source: "src"}
	for _, u := range []string{uuid, other} {
		plan.Moves = append(plan.Moves, drain.Move{UUID: u, Name: "vm", Target: "dst", Placement: &placement})
	}
	h.on("plan", a.PlanDrain, plan, nil)
	h.on("disable", a.DisableHost, nil)
	h.on("reserve", a.Reserve, api.Reservation{Host: "dst", ClaimID: "r", Owner: api.DrainWorkflowID("src"), Token: "t"}, nil)
	h.on("slot", a.TakeMoveSlot, activities.MoveSlotResult{Taken: true}, nil)
	h.on("give", a.GiveMoveSlots, nil)
	h.on("release", a.ReleaseReservation, nil)
	h.on("renew", a.RenewMoveSlots, nil).Maybe()
	h.env.RegisterWorkflow(LiveMigration)
	// The hypervisor's error as an activity wraps it: twice with %w.
	injected := fmt.Errorf("sim: prepare migration to dst: %w", fmt.Errorf("%w (one of the counted failures)", errors.New("injected fault")))
	h.env.OnWorkflow(LiveMigration, mock.Anything, mock.Anything).Return(nil, injected)
	h.env.ExecuteWorkflow(Drain, api.DrainInput{Host: "src", Attempts: 1, Settle: 90 * time.Second})
	var res api.DrainResult
	if err := h.env.GetWorkflowResult(&res); err != nil || res.Failed != 2 {
		t.Fatalf("Drain = %+v, %v; want both guests left", res, err)
	}
	want := "tried 1 targets (dst); last: its move to dst failed: sim: prepare migration to dst: injected fault (one of the counted failures)"
	for _, g := range res.Guests {
		if g.Error != want {
			t.Errorf("guest %s left with error %q, want %q", g.UUID, g.Error, want)
		}
	}
	v, err := h.env.QueryWorkflow("__temporal_workflow_metadata")
	if err != nil {
		t.Fatal(err)
	}
	var md sdkpb.WorkflowMetadata
	if err := v.Get(&md); err != nil {
		t.Fatal(err)
	}
	details := md.GetCurrentDetails()
	for _, w := range []string{
		"live moves, at most 2 at once and 2 onto one target, up to 1 targets a guest; operations in flight may hold the plan up for 1m30s",
		"| `" + uuid + "` | vm | failed |  | 1 | " + want + " |\n",
		"| `" + other + "` | vm | failed |  | 1 | " + want + " |\n",
	} {
		if !strings.Contains(details, w) {
			t.Errorf("the drain's details lack %q:\n%s", w, details)
		}
	}
}
