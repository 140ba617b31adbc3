package workflows

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
)

var bigger = guest.Flavor{VCPUs: 4, MemoryMB: 2048, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}

// onResize mocks every step a resize may take.
func (h *harness) onResize() {
	h.on("load", a.LoadInstance, active("a"), nil)
	h.on("choose", a.ChooseHost, "b", nil)
	h.on("task", a.SetTaskState, nil)
	h.on("begin", a.BeginResize, nil)
	h.on("claim", a.Claim, activities.ClaimResult{Host: "b", ClaimID: "d", Placement: placement}, nil)
	h.on("hold", a.HoldClaim, nil)
	// Powering off takes a minute, so a decision can come before VERIFY_RESIZE.
	h.on("poweroff", a.PowerOff, nil).After(time.Minute)
	h.on("move", a.MoveResized, nil)
	h.on("finish", a.FinishResize, nil)
}

// decide sends a confirm or revert after delay and records how the
// Update ended.
func (h *harness) decide(t *testing.T, delay time.Duration, decision string, rejected *error) {
	h.env.RegisterDelayedCallback(func() {
		h.env.UpdateWorkflow(api.ResizeDecisionUpdate, "", &testsuite.TestUpdateCallback{
			OnAccept:   func() {},
			OnReject:   func(err error) { *rejected = err },
			OnComplete: func(any, error) {},
		}, decision)
	}, delay)
}

func TestResizeEnds(t *testing.T) {
	const prefix = "load,choose,task,begin,claim,hold,task,poweroff,move,task,finish"
	tests := []struct {
		name    string
		window  time.Duration
		decide  string        // "" sends none
		cancel  time.Duration // > 0 cancels then
		outcome string
		steps   string
	}{
		{"confirm", 0, api.DecisionConfirm, 0, "confirmed", prefix + ",task,confirm"},
		{"revert", 0, api.DecisionRevert, 0, "reverted", prefix + ",task,revert,destroy,restore,release,end,task"},
		{"confirm window passes", 30 * time.Minute, "", 0, "auto-confirmed", prefix + ",task,confirm"},
		{"cancel in VERIFY_RESIZE reverts", -1, "", 2 * time.Hour, "reverted", prefix + ",task,revert,destroy,restore,release,end,task"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.onResize()
			h.on("confirm", a.ConfirmResize, nil).Maybe()
			h.on("destroy", a.DestroyDomain, nil).Maybe()
			h.on("revert", a.RevertRecord, nil).Maybe()
			h.on("restore", a.RestoreDomain, nil).Maybe()
			h.on("release", a.ReleaseClaim, nil).Maybe()
			h.on("end", a.EndResize, nil).Maybe()
			var rejected error
			if tt.decide != "" {
				// Well inside VERIFY_RESIZE, before the default window.
				h.decide(t, 10*time.Minute, tt.decide, &rejected)
			}
			if tt.cancel > 0 {
				h.env.RegisterDelayedCallback(h.env.CancelWorkflow, tt.cancel)
			}
			f := bigger
			h.env.ExecuteWorkflow(Resize, api.ResizeInput{UUID: uuid, Flavor: &f, ConfirmWindow: tt.window})
			if err := h.env.GetWorkflowError(); err != nil {
				t.Fatalf("Resize: %v", err)
			}
			if rejected != nil {
				t.Fatalf("Update %s rejected: %v", tt.decide, rejected)
			}
			var res api.ResizeResult
			if err := h.env.GetWorkflowResult(&res); err != nil || res.Outcome != tt.outcome {
				t.Errorf("Resize result = %+v, %v; want outcome %s", res, err, tt.outcome)
			}
			if got := h.sequence(); got != tt.steps {
				t.Errorf("Resize steps =\n  %s\nwant\n  %s", got, tt.steps)
			}
		})
	}
}

// A revert that cannot make its source hold resident (the hold gone, or
// its host down) destroys nothing: the guest keeps running on its
// destination, the resize ends, and a hold on a down host is tombstoned.
func TestResizeRevertKeepsTheDestination(t *testing.T) {
	const prefix = "load,choose,task,begin,claim,hold,task,poweroff,move,task,finish,task,revert"
	tests := []struct {
		name  string
		typ   string
		steps string
		want  string
	}{
		{"the source host is down", api.ErrTypeHostDown, prefix + ",tombstone,end,task", "tombstone that 'pinflow host up a' clears"},
		{"the hold is gone", api.ErrTypeBadState, prefix + ",end,task", "keeps running on b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.onResize()
			h.on("revert", a.RevertRecord, failed("the hold cannot be resident", tt.typ))
			h.on("tombstone", a.TombstoneClaim, nil).Maybe()
			h.on("end", a.EndResize, nil)
			h.on("destroy", a.DestroyDomain, nil).Maybe()
			h.on("restore", a.RestoreDomain, nil).Maybe()
			h.on("release", a.ReleaseClaim, nil).Maybe()
			h.on("end", a.EndResize, nil).Maybe()
			var rejected error
			h.decide(t, 10*time.Minute, api.DecisionRevert, &rejected)
			f := bigger
			h.env.ExecuteWorkflow(Resize, api.ResizeInput{UUID: uuid, Flavor: &f})
			if err := h.env.GetWorkflowError(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Resize error = %v, want one saying %q", err, tt.want)
			}
			if got := h.sequence(); got != tt.steps {
				t.Errorf("Resize steps =\n  %s\nwant\n  %s", got, tt.steps)
			}
		})
	}
}

// TestResizeUndoKeepsTheDestination undoes a move that failed when its
// source hold cannot be resident: the guest's copy on the destination is
// never destroyed, and is kept when the move left one there.
func TestResizeUndoKeepsTheDestination(t *testing.T) {
	const prefix = "load,choose,task,begin,claim,hold,task,poweroff,move,revert,keep"
	tests := []struct {
		name  string
		typ   string
		keep  error
		steps string
		want  string
	}{
		{"the source host is down", api.ErrTypeHostDown, nil, prefix + ",tombstone,end,task", "tombstone that 'pinflow host up a' clears"},
		{"the hold is gone", api.ErrTypeBadState, nil, prefix + ",end,task", "keeps running on b"},
		{"nothing was moved", api.ErrTypeBadState, failed("no domain on b", api.ErrTypeBadState), prefix, "runs on neither host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.on("load", a.LoadInstance, active("a"), nil)
			h.on("choose", a.ChooseHost, "b", nil)
			h.on("task", a.SetTaskState, nil)
			h.on("begin", a.BeginResize, nil)
			h.on("claim", a.Claim, activities.ClaimResult{Host: "b", ClaimID: "d", Placement: placement}, nil)
			h.on("hold", a.HoldClaim, nil)
			h.on("poweroff", a.PowerOff, nil)
			h.on("move", a.MoveResized, failed("boom", api.ErrTypeFenced))
			h.on("revert", a.RevertRecord, failed("the hold cannot be resident", tt.typ))
			h.on("keep", a.KeepMoved, tt.keep)
			h.on("tombstone", a.TombstoneClaim, nil).Maybe()
			h.on("end", a.EndResize, nil).Maybe()
			h.on("destroy", a.DestroyDomain, nil).Maybe()
			h.on("restore", a.RestoreDomain, nil).Maybe()
			h.on("unhold", a.UnholdClaim, nil).Maybe()
			h.on("release", a.ReleaseClaim, nil).Maybe()
			f := bigger
			h.env.ExecuteWorkflow(Resize, api.ResizeInput{UUID: uuid, Flavor: &f})
			if err := h.env.GetWorkflowError(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Resize error = %v, want one saying %q", err, tt.want)
			} else if kept := tt.keep == nil; kept && strings.Contains(err.Error(), "kept for an operator") {
				t.Errorf("Resize error = %v, want no compensation left for an operator: the guest is kept", err)
			}
			if got := h.sequence(); got != tt.steps {
				t.Errorf("Resize steps =\n  %s\nwant\n  %s", got, tt.steps)
			}
		})
	}
}

func TestResizeCompensations(t *testing.T) {
	tests := []struct {
		failAt string
		typ    string
		want   string
	}{
		// A claim with no room tries two more hosts pinflow chooses.
		{"claim", api.ErrTypeNoFit, "load,choose,task,begin,claim,choose,claim,choose,claim,release,end,task"},
		{"hold", api.ErrTypeBadState, "load,choose,task,begin,claim,hold,unhold,release,end,task"},
		{"poweroff", api.ErrTypeRejected, "load,choose,task,begin,claim,hold,task,poweroff,restore,unhold,release,end,task"},
		{"move", api.ErrTypeFenced, "load,choose,task,begin,claim,hold,task,poweroff,move,revert,destroy,restore,release,end,task"},
	}
	for _, tt := range tests {
		t.Run(tt.failAt, func(t *testing.T) {
			h := newHarness(t)
			fail := func(step string, ok ...any) []any {
				if step == tt.failAt {
					return append(append([]any{}, ok[:len(ok)-1]...), failed("boom", tt.typ))
				}
				return ok
			}
			h.on("load", a.LoadInstance, active("a"), nil)
			h.on("choose", a.ChooseHost, "b", nil)
			h.on("task", a.SetTaskState, nil)
			h.on("begin", a.BeginResize, nil)
			h.on("end", a.EndResize, nil)
			h.on("claim", a.Claim, fail("claim", activities.ClaimResult{Host: "b", ClaimID: "d", Placement: placement}, nil)...)
			h.on("release", a.ReleaseClaim, nil)
			h.on("hold", a.HoldClaim, fail("hold", nil)...).Maybe()
			h.on("unhold", a.UnholdClaim, nil).Maybe()
			h.on("poweroff", a.PowerOff, fail("poweroff", nil)...).Maybe()
			h.on("restore", a.RestoreDomain, nil).Maybe()
			h.on("move", a.MoveResized, fail("move", nil)...).Maybe()
			h.on("destroy", a.DestroyDomain, nil).Maybe()
			h.on("revert", a.RevertRecord, nil).Maybe()
			f := bigger
			h.env.ExecuteWorkflow(Resize, api.ResizeInput{UUID: uuid, Flavor: &f})
			var appErr *temporal.ApplicationError
			if err := h.env.GetWorkflowError(); !errors.As(err, &appErr) || appErr.Type() != tt.typ {
				t.Fatalf("Resize error = %v, want type %s", err, tt.typ)
			}
			if got := h.sequence(); got != tt.want {
				t.Errorf("steps =\n  %s\nwant\n  %s", got, tt.want)
			}
		})
	}
}

func TestResizeRefuses(t *testing.T) {
	same := flavor
	tests := []struct {
		name string
		in   api.ResizeInput
		inst activities.InstanceInfo
		want string
	}{
		{"the current flavor", api.ResizeInput{UUID: uuid, Flavor: &same}, active("a"), "has that flavor already"},
		{"a cold migration onto its own host", api.ResizeInput{UUID: uuid, Dest: "a"}, active("a"), "needs another host"},
		{"a shelved guest", api.ResizeInput{UUID: uuid}, activities.InstanceInfo{UUID: uuid, VMState: guest.VMShelvedOffloaded, Flavor: flavor}, "only an active or stopped instance"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.on("load", a.LoadInstance, tt.inst, nil)
			h.env.ExecuteWorkflow(Resize, tt.in)
			if err := h.env.GetWorkflowError(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Resize(%s) error = %v, want one saying %q", tt.name, err, tt.want)
			}
			if got := h.sequence(); got != "load" {
				t.Errorf("Resize(%s) steps = %s, want only load", tt.name, got)
			}
		})
	}
}

// A decision is taken only in VERIFY_RESIZE, and only once.
func TestResizeDecisionValidated(t *testing.T) {
	h := newHarness(t)
	h.onResize()
	h.on("confirm", a.ConfirmResize, nil)
	var early, unknown, first, second error
	h.decide(t, 10*time.Second, api.DecisionConfirm, &early) // while powering off
	h.decide(t, 10*time.Minute, "keep", &unknown)
	h.decide(t, 11*time.Minute, api.DecisionConfirm, &first)
	h.decide(t, 11*time.Minute, api.DecisionRevert, &second)
	f := bigger
	h.env.ExecuteWorkflow(Resize, api.ResizeInput{UUID: uuid, Flavor: &f})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"confirm while powering off", early, "not awaiting confirmation"},
		{"an unknown decision", unknown, "allowed are confirm or revert"},
		{"the first confirm", first, ""},
		{"a revert after the confirm", second, "being confirmed already"},
	} {
		if c.want == "" && c.err != nil || c.want != "" && (c.err == nil || !strings.Contains(c.err.Error(), c.want)) {
			t.Errorf("%s: Update error = %v, want %q", c.name, c.err, c.want)
		}
	}
	var res api.ResizeResult
	if err := h.env.GetWorkflowResult(&res); err != nil || res.Outcome != "confirmed" {
		t.Errorf("Resize result = %+v, %v; want confirmed (the later revert must not win)", res, err)
	}
}

func TestEvacuate(t *testing.T) {
	down := activities.HostStatus{Host: "a", State: ledger.HostDown, Token: "t"}
	t.Run("rebuilds and tombstones", func(t *testing.T) {
		h := newHarness(t)
		h.on("load", a.LoadInstance, active("a"), nil)
		h.on("state", a.LoadHostStatus, down, nil)
		h.on("task", a.SetTaskState, nil)
		h.on("choose", a.ChooseHost, "b", nil)
		h.on("claim", a.Claim, activities.ClaimResult{Host: "b", ClaimID: "e", Token: "k", Placement: placement}, nil)
		h.on("spawn", a.Spawn, nil)
		h.on("attach", a.Attach, nil)
		h.on("tombstone", a.TombstoneClaim, nil)
		h.env.ExecuteWorkflow(Evacuate, api.EvacuateInput{UUID: uuid})
		if err := h.env.GetWorkflowError(); err != nil {
			t.Fatalf("Evacuate: %v", err)
		}
		if got, want := h.sequence(), "load,state,task,choose,claim,spawn,attach,tombstone"; got != want {
			t.Errorf("Evacuate steps = %s, want %s", got, want)
		}
	})
	t.Run("a lost claim tries the next host", func(t *testing.T) {
		h := newHarness(t)
		h.on("load", a.LoadInstance, active("a"), nil)
		h.on("state", a.LoadHostStatus, down, nil)
		h.on("task", a.SetTaskState, nil)
		h.on("choose", a.ChooseHost, "b", nil).Once()
		h.on("choose", a.ChooseHost, "c", nil).Once()
		h.on("claim", a.Claim, activities.ClaimResult{}, failed("no room left", api.ErrTypeNoFit)).Once()
		h.on("claim", a.Claim, activities.ClaimResult{Host: "c", ClaimID: "e", Placement: placement}, nil).Once()
		h.on("spawn", a.Spawn, failed("refused", api.ErrTypeRejected))
		h.on("destroy", a.DestroyDomain, nil)
		h.on("release", a.ReleaseClaim, nil)
		h.env.ExecuteWorkflow(Evacuate, api.EvacuateInput{UUID: uuid})
		if err := h.env.GetWorkflowError(); err == nil {
			t.Fatal("Evacuate succeeded with a refused spawn")
		}
		// Both claims are released (the first never existed), the task
		// state cleared; the dead host's claim is never tombstoned.
		if got, want := h.sequence(), "load,state,task,choose,claim,choose,claim,spawn,destroy,release,release,task"; got != want {
			t.Errorf("Evacuate steps = %s, want %s", got, want)
		}
	})
	t.Run("refuses a host that is up", func(t *testing.T) {
		h := newHarness(t)
		h.on("load", a.LoadInstance, active("a"), nil)
		h.on("state", a.LoadHostStatus, activities.HostStatus{Host: "a", State: ledger.HostUp}, nil)
		h.env.ExecuteWorkflow(Evacuate, api.EvacuateInput{UUID: uuid})
		if err := h.env.GetWorkflowError(); err == nil || !strings.Contains(err.Error(), "only from a host fenced") {
			t.Fatalf("Evacuate error = %v, want a refusal naming fencing", err)
		}
		if got := h.sequence(); got != "load,state" {
			t.Errorf("Evacuate steps = %s, want load,state", got)
		}
	})
}

func TestHostUp(t *testing.T) {
	h := newHarness(t)
	left := []api.Leftover{{Host: "a", UUID: uuid, ClaimID: "boot-1"}, {Host: "a", UUID: "u2", ClaimID: "boot-2"}}
	h.on("state", a.LoadHostStatus, activities.HostStatus{Host: "a", State: ledger.HostDown, Reason: "psu"}, nil)
	h.on("returning", a.MarkHostReturning, nil)
	h.on("leftovers", a.HostLeftovers, left, nil)
	h.on("clear", a.ClearTombstone, nil)
	h.on("up", a.MarkHostUp, nil)
	h.env.ExecuteWorkflow(HostUp, api.HostUpInput{Host: "a"})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("HostUp: %v", err)
	}
	if got, want := h.sequence(), "state,returning,leftovers,clear,clear,up"; got != want {
		t.Errorf("HostUp steps = %s, want %s", got, want)
	}
}

// A leftover that cannot be destroyed puts the host back down.
func TestHostUpFails(t *testing.T) {
	h := newHarness(t)
	h.on("state", a.LoadHostStatus, activities.HostStatus{Host: "a", State: ledger.HostDown, Reason: "psu"}, nil)
	h.on("returning", a.MarkHostReturning, nil)
	h.on("leftovers", a.HostLeftovers, []api.Leftover{{Host: "a", UUID: uuid, ClaimID: "boot-1"}}, nil)
	h.on("clear", a.ClearTombstone, failed("libvirtd does not answer", api.ErrTypeRejected))
	h.on("down", a.MarkHostDown, nil)
	h.env.ExecuteWorkflow(HostUp, api.HostUpInput{Host: "a"})
	if err := h.env.GetWorkflowError(); err == nil {
		t.Fatal("HostUp succeeded with a leftover left")
	}
	if got, want := h.sequence(), "state,returning,leftovers,clear,down"; got != want {
		t.Errorf("HostUp steps = %s, want %s", got, want)
	}
}

// A live migration asked to fall back cold does so only after its own
// failure was compensated, and then ends as a cold migration.
func TestLiveMigrationFallsBackCold(t *testing.T) {
	h := newHarness(t)
	h.onResize()
	h.on("prepare", a.PrepareMigration, failed("cannot live-migrate a guest with a passthrough device", api.ErrTypeRejected))
	h.on("rollback", a.RollbackMigration, activities.RollbackResult{}, nil)
	h.on("release", a.ReleaseClaim, nil)
	h.on("confirm", a.ConfirmResize, nil)
	h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid, ColdFallback: true, ConfirmWindow: time.Minute})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("LiveMigration: %v", err)
	}
	var res api.LiveMigrationResult
	if err := h.env.GetWorkflowResult(&res); err != nil || res.Cold == nil || res.Cold.Outcome != "auto-confirmed" {
		t.Errorf("LiveMigration result = %+v, %v; want a cold migration, auto-confirmed", res, err)
	}
	want := "load,choose,task,claim,prepare,rollback,release,task," + "load,choose,task,begin,claim,hold,task,poweroff,move,task,finish,task,confirm"
	if got := h.sequence(); got != want {
		t.Errorf("steps =\n  %s\nwant\n  %s", got, want)
	}
}
