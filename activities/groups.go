package activities

import (
	"context"
	"time"
)

// GroupSlotLease is how long a slot of a server group's disruption budget
// lasts unless renewed: an operation renews its slot well within it, and
// the slot of one that was terminated ends by itself after it.
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
	b, err := a.Ledger.TakeGroupSlot(ctx, in.UUID, GroupSlotLease, in.Force)
	if err != nil {
		return GroupSlot{}, classify(err)
	}
	return GroupSlot{Group: b.Group, Max: b.Max, Taken: b.Taken, Moving: b.Moving}, nil
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
