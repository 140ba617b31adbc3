package workflows

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
)

// TestReservedMoves: a drain's move, live or cold, goes to its
// reservation's host, adopts the reservation instead of claiming, and
// releases that claim on a failure only once it adopted it: a
// reservation it never adopted stays the drain's.
func TestReservedMoves(t *testing.T) {
	r := &api.Reservation{Host: "b", ClaimID: "reservation-b-1", Owner: "drain-a", Token: "t1"}
	adopted := activities.ClaimResult{Host: "b", ClaimID: r.ClaimID, Token: "t2", Placement: placement}
	tests := []struct {
		name     string
		wf       any
		in       any
		failAt   string
		steps    []string // the mocks to set up, beyond load and task
		want     string
		wantType string
	}{
		{"live: a destination other than the reservation's", LiveMigration, api.LiveMigrationInput{UUID: uuid, Dest: "c", Reservation: r},
			"", nil, "load", api.ErrTypeInvalidRequest},
		{"live: the adoption fails", LiveMigration, api.LiveMigrationInput{UUID: uuid, Reservation: r},
			"adopt", []string{"adopt"}, "load,task,adopt,task", api.ErrTypeConflict},
		{"live: prepare fails after the adoption", LiveMigration, api.LiveMigrationInput{UUID: uuid, Dest: "b", Reservation: r},
			"prepare", []string{"adopt", "prepare", "rollback", "release"}, "load,task,adopt,prepare,rollback,release,task", api.ErrTypeRejected},
		{"cold: a destination other than the reservation's", Resize, api.ResizeInput{UUID: uuid, Dest: "c", Reservation: r},
			"", nil, "load", api.ErrTypeInvalidRequest},
		{"cold: the adoption fails", Resize, api.ResizeInput{UUID: uuid, Reservation: r},
			"adopt", []string{"begin", "end", "adopt"}, "load,task,begin,adopt,end,task", api.ErrTypeConflict},
		{"cold: the source hold fails after the adoption", Resize, api.ResizeInput{UUID: uuid, Reservation: r},
			"hold", []string{"begin", "end", "adopt", "hold", "unhold", "release"}, "load,task,begin,adopt,hold,unhold,release,end,task", api.ErrTypeRejected},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			fail := func(step string, ok ...any) []any {
				if step == tt.failAt {
					return append(append([]any{}, ok[:len(ok)-1]...), failed("boom", tt.wantType))
				}
				return ok
			}
			var released []activities.ReleaseInput
			h.on("load", a.LoadInstance, active("a"), nil)
			h.on("task", a.SetTaskState, nil).Maybe()
			for _, step := range tt.steps {
				switch step {
				case "adopt":
					h.on("adopt", a.AdoptClaim, fail("adopt", adopted, nil)...)
				case "prepare":
					h.on("prepare", a.PrepareMigration, fail("prepare", nil)...)
				case "rollback":
					h.on("rollback", a.RollbackMigration, activities.RollbackResult{}, nil)
				case "begin":
					h.on("begin", a.BeginResize, nil)
				case "end":
					h.on("end", a.EndResize, nil)
				case "hold":
					h.on("hold", a.HoldClaim, fail("hold", nil)...)
				case "unhold":
					h.on("unhold", a.UnholdClaim, nil)
				case "release":
					// Run replaces the recording of on: record here.
					h.on("release", a.ReleaseClaim, nil).Run(func(args mock.Arguments) {
						h.record("release")
						released = append(released, args.Get(1).(activities.ReleaseInput))
					})
				}
			}
			h.env.ExecuteWorkflow(tt.wf, tt.in)
			var appErr *temporal.ApplicationError
			if err := h.env.GetWorkflowError(); !errors.As(err, &appErr) || appErr.Type() != tt.wantType {
				t.Fatalf("error = %v, want type %s", err, tt.wantType)
			}
			if got := h.sequence(); got != tt.want {
				t.Errorf("steps = %s, want %s", got, tt.want)
			}
			for _, rel := range released {
				if rel.Host != r.Host || rel.ClaimID != r.ClaimID || !rel.OnlyPending {
					t.Errorf("released %+v, want the adopted reservation %s on %s, only while pending", rel, r.ClaimID, r.Host)
				}
			}
		})
	}
}
