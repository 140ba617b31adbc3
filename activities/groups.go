package activities

import (
	"context"
	"time"

	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
)

// GroupSlotLease is how long a slot of a server group's disruption budget
// lasts unless renewed: an operation renews its slot well within it. A
// slot whose lease ran out counts until a take that needs it has asked
// Temporal whether its operation ended (dropped) or is open (kept: its
// workers were away), so a budget holds through any outage.
const GroupSlotLease = 90 * time.Second

// GroupSlotInput asks for a slot of the disruption budget of the guest's
// server group; Force takes it past the budget (an evacuation: the guest
// is down already, and counts).
type GroupSlotInput struct {
	UUID  string `json:"uuid"`
	Force bool   `json:"force,omitempty"`
}

// GroupSlot says whether the guest holds a slot of its group's
// disruption budget, and when not, which members hold them.
type GroupSlot struct {
	Group string `json:"group,omitempty"`
	// Max is the group's budget; 0 when the guest needs no slot.
	Max    int      `json:"max,omitempty"`
	Taken  bool     `json:"taken"`
	Moving []string `json:"moving,omitempty"`
}

// TakeGroupSlot takes a slot of the disruption budget of the guest's
// server group, or renews the one it holds; a guest of no group, or of
// one without a budget, needs none and gets Taken.
func (a *Activities) TakeGroupSlot(ctx context.Context, in GroupSlotInput) (GroupSlot, error) {
	for {
		b, err := a.Ledger.TakeGroupSlot(ctx, in.UUID, GroupSlotLease, in.Force)
		if err != nil {
			return GroupSlot{}, classify(err)
		}
		if len(b.Expired) == 0 {
			return GroupSlot{Group: b.Group, Max: b.Max, Taken: b.Taken, Moving: b.Moving}, nil
		}
		// Every slot is held, some past their lease: each counts until its
		// operation is known to have ended.
		for _, m := range b.Expired {
			if err := a.judgeSlot(ctx, b.Group, m); err != nil {
				return GroupSlot{}, err
			}
		}
	}
}

// judgeSlot keeps the slot of member uuid of group whose lease ran out
// while an operation of the member is open, and drops it otherwise. With
// no way to ask Temporal (a.Audit unset) the lease's end is the answer.
func (a *Activities) judgeSlot(ctx context.Context, group, uuid string) error {
	open := false
	if a.Audit != nil && a.Audit.Owners != nil {
		st, err := a.Audit.Owners.OwnerStatus(ctx, guest.InstanceWorkflowID(uuid))
		if err != nil {
			return err
		}
		open = st.State == audit.OwnerRunning
	}
	if open {
		return classify(a.Ledger.KeepGroupSlot(ctx, group, uuid, GroupSlotLease))
	}
	return classify(a.Ledger.DropGroupSlot(ctx, group, uuid))
}

// RenewGroupSlot renews the guest's slot of its group's disruption
// budget.
func (a *Activities) RenewGroupSlot(ctx context.Context, uuid string) error {
	_, err := a.Ledger.RenewGroupSlot(ctx, uuid, GroupSlotLease)
	return classify(err)
}

// GiveGroupSlot gives back the guest's slot of its group's disruption
// budget; one not held is no error.
func (a *Activities) GiveGroupSlot(ctx context.Context, uuid string) error {
	return classify(a.Ledger.GiveGroupSlot(ctx, uuid))
}
