package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/defrag"
	"github.com/pinflow/pinflow/drain"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/placement"
)

// PlanDrainInput names the host to empty and how its guests move.
type PlanDrainInput struct {
	Host string `json:"host"`
	// Policy is the drain's policy (api.DrainPolicy): under "live"
	// a guest whose devices cannot be unplugged is planned as NotLive.
	Policy string `json:"policy,omitempty"`
}

// PlanDrain plans where every guest at rest on the host goes (drain.Make),
// from the ledger as it is now: the host's resident claims and their
// instance records, and every other host that takes new guests (up;
// disabled, down and returning hosts are no targets). Claims that are no
// guest at rest are reported as blocking. It changes nothing.
func (a *Activities) PlanDrain(ctx context.Context, in PlanDrainInput) (drain.Plan, error) {
	plan, err := drain.PlanHost(ctx, a.Ledger, in.Host, in.Policy == string(api.DrainLive))
	return plan, classify(err)
}

// ReserveInput asks for a drain's reservation of an exact placement.
type ReserveInput struct {
	Host      string         `json:"host"`
	ClaimID   string         `json:"claim_id"`
	UUID      string         `json:"uuid"`
	Owner     Owner          `json:"owner"`
	Placement numa.Placement `json:"placement"`
}

// Reserve claims exactly the planned placement for a guest the drain will
// move, owned by the drain. pCPUs taken since the plan: ErrConflict, a
// non-retryable Conflict the drain answers by planning the guest again.
func (a *Activities) Reserve(ctx context.Context, in ReserveInput) (api.Reservation, error) {
	p := in.Placement
	c, err := a.Ledger.Claim(ctx, ledger.ClaimSpec{ID: in.ClaimID, Host: in.Host, InstanceUUID: in.UUID, Kind: ledger.KindReservation,
		OwnerWorkflowID: in.Owner.WorkflowID, OwnerRunID: in.Owner.FirstRunID, Placement: &p})
	if err != nil {
		return api.Reservation{}, conflict(err)
	}
	return api.Reservation{Host: c.Host, ClaimID: c.ID, Owner: c.OwnerWorkflowID, Token: c.Token}, nil
}

// ReleaseReservation frees a reservation the drain still owns; one a move
// adopted (its token changed) or that is gone is left alone.
func (a *Activities) ReleaseReservation(ctx context.Context, r api.Reservation) error {
	_, err := a.Ledger.ReleaseIfUnchanged(ctx, r.Host, r.ClaimID, r.Token, ledger.StatePending)
	if errors.Is(err, ledger.ErrUnknownClaim) {
		return nil
	}
	return classify(err)
}

// AdoptInput asks for a drain's reservation as an operation's own claim.
type AdoptInput struct {
	Reservation api.Reservation  `json:"reservation"`
	UUID        string           `json:"uuid"`
	Kind        ledger.ClaimKind `json:"kind"`
	Owner       Owner            `json:"owner"`
}

// AdoptClaim makes the reservation the calling operation's pending claim,
// with a token of its own (ledger.Adopt); adopting it again is a retry.
func (a *Activities) AdoptClaim(ctx context.Context, in AdoptInput) (ClaimResult, error) {
	r := in.Reservation
	c, err := a.Ledger.Adopt(ctx, ledger.Adoption{Host: r.Host, ClaimID: r.ClaimID, InstanceUUID: in.UUID, FromWorkflowID: r.Owner,
		Kind: in.Kind, OwnerWorkflowID: in.Owner.WorkflowID, OwnerRunID: in.Owner.FirstRunID})
	if err != nil {
		return ClaimResult{}, conflict(err)
	}
	return ClaimResult{Host: c.Host, ClaimID: c.ID, Token: c.Token, State: c.State, Placement: *c.Placement}, nil
}

// DisableHostInput asks to keep new guests off a host.
type DisableHostInput struct {
	Host   string `json:"host"`
	Reason string `json:"reason"`
}

// DisableHost disables an up or disabled host (a drain's first step); a
// host that is down or returning is a BadState: evacuate it instead.
func (a *Activities) DisableHost(ctx context.Context, in DisableHostInput) error {
	st, err := a.Ledger.HostStatus(ctx, in.Host)
	if err != nil {
		return classify(err)
	}
	if st.State != ledger.HostUp && st.State != ledger.HostDisabled {
		return BadState(fmt.Sprintf("host %s is %s: a drain moves guests off a running host; evacuate a fenced one", in.Host, st.State))
	}
	_, err = a.Ledger.SetHostDisabled(ctx, in.Host, in.Reason)
	return classify(err)
}

// PlanGuestInput asks where one guest of a drained host goes now.
type PlanGuestInput struct {
	Host    string   `json:"host"`
	UUID    string   `json:"uuid"`
	Exclude []string `json:"exclude,omitempty"`
}

// PlanGuest plans one guest of the host again, on the ledger as it is
// now, leaving out the targets it already failed on: a reservation that
// lost its race, or a move that failed.
func (a *Activities) PlanGuest(ctx context.Context, in PlanGuestInput) (drain.Plan, error) {
	inst, err := a.Ledger.Instance(ctx, in.UUID)
	if err != nil {
		return drain.Plan{}, classify(err)
	}
	req, err := inst.Request.Request()
	if err != nil {
		return drain.Plan{}, classify(err)
	}
	targets, err := drain.Targets(ctx, a.Ledger, in.Host)
	if err != nil {
		return drain.Plan{}, classify(err)
	}
	for _, h := range in.Exclude {
		delete(targets, h)
	}
	g, err := placement.MemberGroup(ctx, a.Ledger, inst.UUID)
	if err != nil {
		return drain.Plan{}, classify(err)
	}
	return drain.Make(in.Host, []drain.Guest{{UUID: inst.UUID, Name: inst.Name, Request: req, Group: g}}, targets), nil
}

// DefaultDrainMaxMoves is the cloud's limit on drain moves running at
// once when Activities.DrainMaxMoves is 0.
const DefaultDrainMaxMoves = 5

// MoveSlotLease is how long a move's slot lasts unless renewed: a drain
// renews its slots well within it, and the slots of a drain that was
// terminated end by themselves after it. Short, since those slots hold
// every other drain in the cloud back until then; a slot that lapses
// while all workers are down only lets a few more moves start.
const MoveSlotLease = 90 * time.Second

// MoveSlotInput asks for a slot for one drain move onto Target, at most
// PerTarget moves running onto it in the whole cloud.
type MoveSlotInput struct {
	Move      string `json:"move"`
	Target    string `json:"target"`
	PerTarget int    `json:"per_target"`
}

// MoveSlotResult says whether the slot was taken, and if not which limit
// is full.
type MoveSlotResult struct {
	Taken bool   `json:"taken"`
	Full  string `json:"full,omitempty"`
}

// TakeMoveSlot takes a slot for the move if the cloud's and its target's
// limits allow (ledger.TakeMoveSlot).
func (a *Activities) TakeMoveSlot(ctx context.Context, in MoveSlotInput) (MoveSlotResult, error) {
	limit := a.DrainMaxMoves
	if limit <= 0 {
		limit = DefaultDrainMaxMoves
	}
	ok, full, err := a.Ledger.TakeMoveSlot(ctx, ledger.MoveSlot{Move: in.Move, Target: in.Target},
		ledger.MoveLimits{Cloud: limit, Target: in.PerTarget}, MoveSlotLease)
	return MoveSlotResult{Taken: ok, Full: full}, classify(err)
}

// RenewMoveSlots extends the leases of a drain's slots.
func (a *Activities) RenewMoveSlots(ctx context.Context, slots []MoveSlotInput) error {
	return classify(a.Ledger.RenewMoveSlots(ctx, moveSlots(slots), MoveSlotLease))
}

// GiveMoveSlots gives a drain's slots back.
func (a *Activities) GiveMoveSlots(ctx context.Context, slots []MoveSlotInput) error {
	return classify(a.Ledger.GiveMoveSlots(ctx, moveSlots(slots)...))
}

func moveSlots(in []MoveSlotInput) []ledger.MoveSlot {
	out := make([]ledger.MoveSlot, len(in))
	for i, s := range in {
		out[i] = ledger.MoveSlot{Move: s.Move, Target: s.Target}
	}
	return out
}

// PlanDefragInput names the host to defragment and the flavor to make
// room for, nil for none.
type PlanDefragInput struct {
	Host   string        `json:"host"`
	Flavor *guest.Flavor `json:"flavor,omitempty"`
}

// PlanDefrag plans the defragmentation of the host (defrag.PlanHost) from
// the ledger as it is now. It changes nothing.
func (a *Activities) PlanDefrag(ctx context.Context, in PlanDefragInput) (defrag.Plan, error) {
	var req *numa.Request
	name := ""
	if in.Flavor != nil {
		r, err := in.Flavor.Request()
		if err != nil {
			return defrag.Plan{}, BadRequest(fmt.Sprintf("defrag of %s: %v", in.Host, err))
		}
		req, name = r, in.Flavor.Summary()
	}
	plan, err := defrag.PlanHost(ctx, a.Ledger, in.Host, req, name)
	return plan, classify(err)
}
