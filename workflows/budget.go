package workflows

import (
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
)

// Waits for a slot of a disruption budget start at budgetWaitMin and
// double up to budgetWaitMax.
const (
	budgetWaitMin = 2 * time.Second
	budgetWaitMax = 10 * time.Second
)

// holdBudget takes a slot of the disruption budget of the guest's server
// group before the operation moves it, waiting (and saying so in the
// operation's phase) while other members hold every slot, and keeps the
// slot renewed until the returned function gives it back; the caller
// defers that, so the slot goes back however the operation ends. force
// takes a slot past the budget: an evacuation is not held back, only
// counted. A cancel while it waits ends the operation before it changed
// anything.
func (s *saga) holdBudget(ctx workflow.Context, uuid string, force bool) (func(), error) {
	nothing := func() {}
	if workflow.GetVersion(ctx, changeDisruptionBudget, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		return nothing, nil
	}
	wait := budgetWaitMin
	for {
		var slot activities.GroupSlot
		if err := s.ledger(ctx, "take a slot of the group's disruption budget", a.TakeGroupSlot,
			activities.GroupSlotInput{UUID: uuid, Force: force}).Get(ctx, &slot); err != nil {
			return nothing, err
		}
		if slot.Taken && slot.Max == 0 {
			return nothing, nil
		}
		if slot.Taken {
			break
		}
		s.phase(api.PhaseScheduling, fmt.Sprintf("waiting for the disruption budget of group %s: %d of its members are moving (%s), and it allows %d",
			slot.Group, len(slot.Moving), strings.Join(slot.Moving, ", "), slot.Max))
		if err := workflow.Sleep(ctx, wait); err != nil {
			return nothing, err
		}
		wait = min(2*wait, budgetWaitMax)
	}
	// Renewed at a third of the lease, so two renewals may fail before it
	// ends.
	renewing, stop := workflow.WithCancel(ctx)
	workflow.Go(renewing, func(ctx workflow.Context) {
		for workflow.Sleep(ctx, activities.GroupSlotLease/3) == nil {
			_ = workflow.ExecuteLocalActivity(workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
				StartToCloseTimeout: ledgerTimeout, Summary: "renew the disruption budget slot",
			}), a.RenewGroupSlot, uuid).Get(ctx, nil)
		}
	})
	return func() {
		stop()
		dctx, _ := workflow.NewDisconnectedContext(ctx)
		_ = s.ledger(dctx, "give back the disruption budget slot", a.GiveGroupSlot, uuid).Get(dctx, nil)
	}, nil
}
