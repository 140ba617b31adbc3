package workflows

import (
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/defrag"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/numa"
)

// onDefrag mocks a defrag of host a whose plan re-pins two guests, and
// the Repin each runs as a child, taking repinTime and failing with
// errs[i] for the i-th; it returns the inputs the children were started
// with and when, from the start.
func (h *harness) onDefrag(fits bool, repinTime time.Duration, errs ...error) (*[]api.RepinInput, *[]time.Duration) {
	start := h.env.Now()
	plan := defrag.Plan{Host: "a", For: "8 vCPUs", Fits: fits, Repins: []defrag.Repin{
		{UUID: "u1", From: numa.NewCPUSet(0), To: numa.NewCPUSet(1)},
		{UUID: "u2", From: numa.NewCPUSet(2), To: numa.NewCPUSet(3)},
	}}
	if !fits {
		plan.Reason = "a cell lacks memory"
	}
	h.on("plan", a.PlanDefrag, plan, nil)
	h.on("renew", a.RenewMoveSlots, nil).Maybe()
	var started []api.RepinInput
	var at []time.Duration
	h.env.RegisterWorkflow(Repin)
	h.env.OnWorkflow(Repin, mock.Anything, mock.Anything).After(repinTime).Return(func(_ workflow.Context, in api.RepinInput) (*api.RepinResult, error) {
		started, at = append(started, in), append(at, h.env.Now().Sub(start)-repinTime)
		if i := len(started) - 1; i < len(errs) {
			return nil, errs[i]
		}
		return &api.RepinResult{UUID: in.UUID}, nil
	}).Maybe()
	return &started, &at
}

// TestDefragSteps: the re-pins run one after another, each the guest's
// Repin to the planned pCPUs; after a failed one the rest are not tried;
// a flavor the plan makes no room for is refused before anything moves;
// a cancel while a re-pin runs cancels the defrag and starts no other.
func TestDefragSteps(t *testing.T) {
	flavor := &guest.Flavor{VCPUs: 8, MemoryMB: 1024, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
	t.Run("completes", func(t *testing.T) {
		h := newHarness(t)
		started, _ := h.onDefrag(true, time.Minute)
		h.env.ExecuteWorkflow(Defrag, api.DefragInput{Host: "a", Flavor: flavor})
		var res api.DefragResult
		if err := h.env.GetWorkflowResult(&res); err != nil {
			t.Fatal(err)
		}
		if res.Failed != 0 || res.Repins[0].State != api.RepinDone || res.Repins[1].State != api.RepinDone || !res.Done {
			t.Errorf("Defrag = %+v, want both re-pins done", res)
		}
		if len(*started) != 2 || (*started)[0].UUID != "u1" || (*started)[0].PCPUs.String() != "1" || (*started)[1].PCPUs.String() != "3" {
			t.Errorf("re-pins started: %+v, want u1 to 1 then u2 to 3", *started)
		}
	})
	t.Run("a failed re-pin leaves the rest untried", func(t *testing.T) {
		h := newHarness(t)
		started, _ := h.onDefrag(true, time.Minute, temporal.NewApplicationError("taken by claim x", api.ErrTypeConflict))
		h.env.ExecuteWorkflow(Defrag, api.DefragInput{Host: "a"})
		var res api.DefragResult
		if err := h.env.GetWorkflowResult(&res); err != nil {
			t.Fatal(err)
		}
		if res.Failed != 2 || res.Repins[0].State != api.RepinFailed || res.Repins[1].State != api.RepinNotTried || len(*started) != 1 {
			t.Errorf("Defrag = %+v with %d re-pins started, want the first failed and the second not tried", res, len(*started))
		}
	})
	t.Run("no room for the flavor", func(t *testing.T) {
		h := newHarness(t)
		started, _ := h.onDefrag(false, time.Minute)
		h.env.ExecuteWorkflow(Defrag, api.DefragInput{Host: "a", Flavor: flavor})
		if err := h.env.GetWorkflowError(); !isType(err, api.ErrTypeBadState) || len(*started) != 0 {
			t.Errorf("Defrag error = %v with %d re-pins started, want a refusal and none", err, len(*started))
		}
	})
	t.Run("paused and resumed", func(t *testing.T) {
		h := newHarness(t)
		_, at := h.onDefrag(true, time.Hour)
		var pause, resume, again updated
		h.update(api.DrainPauseUpdate, 10*time.Minute, &pause)
		h.update(api.DrainPauseUpdate, 20*time.Minute, &again)
		h.update(api.DrainResumeUpdate, 3*time.Hour, &resume)
		var st api.DefragStatus
		h.query(t, api.DefragStatusQuery, 2*time.Hour, &st)
		h.env.ExecuteWorkflow(Defrag, api.DefragInput{Host: "a"})
		if err := h.env.GetWorkflowError(); err != nil {
			t.Fatal(err)
		}
		if pause.rejected != nil || resume.rejected != nil || again.rejected == nil {
			t.Errorf("pause %v, second pause %v, resume %v; want the second pause alone refused", pause.rejected, again.rejected, resume.rejected)
		}
		if !st.Paused || st.Repins[0].State != api.RepinDone || st.Repins[1].State != api.RepinPlanned {
			t.Errorf("status while paused: %+v, want the first re-pin done and the second waiting", st)
		}
		if len(*at) != 2 || (*at)[1] < 3*time.Hour {
			t.Errorf("re-pins started at %v, want the second after the resume at 3h", *at)
		}
	})
	t.Run("cancelled while a re-pin runs", func(t *testing.T) {
		h := newHarness(t)
		started, _ := h.onDefrag(true, time.Hour)
		h.env.RegisterDelayedCallback(h.env.CancelWorkflow, 10*time.Minute)
		h.env.ExecuteWorkflow(Defrag, api.DefragInput{Host: "a"})
		if err := h.env.GetWorkflowError(); !temporal.IsCanceledError(err) || len(*started) != 1 {
			t.Errorf("Defrag error = %v with %d re-pins started, want cancelled after the first", err, len(*started))
		}
	})
}
