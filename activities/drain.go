package activities

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pinflow/pinflow/drain"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/placement"
)

// PlanDrainInput names the host to empty and how its guests move.
type PlanDrainInput struct {
	Host string `json:"host"`
	// Policy is the drain's policy (workflows.DrainPolicy): under "live"
	// a guest whose devices cannot be unplugged is planned as NotLive.
	Policy string `json:"policy,omitempty"`
}

// drainLive is workflows.DrainLive, which this package cannot import.
const drainLive = "live"

// PlanDrain plans where every guest at rest on the host goes (drain.Make),
// from the ledger as it is now: the host's resident claims and their
// instance records, and every other host that takes new guests (up;
// disabled, down and returning hosts are no targets). Claims that are no
// guest at rest are reported as blocking. It changes nothing.
func (a *Activities) PlanDrain(ctx context.Context, in PlanDrainInput) (drain.Plan, error) {
	snap, err := a.Ledger.Snapshot(ctx, in.Host)
	if err != nil {
		return drain.Plan{}, classify(err)
	}
	var guests []drain.Guest
	var blocked, notLive []drain.Unplaceable
	groups := map[string]*placement.ServerGroup{}
	for _, c := range snap.Claims {
		inst, err := a.Ledger.Instance(ctx, c.InstanceUUID)
		if err != nil && !errors.Is(err, ledger.ErrUnknownInstance) {
			return drain.Plan{}, classify(err)
		}
		if c.State == ledger.StateCommitted && inst != nil && inst.Host == in.Host && inst.ClaimID == c.ID {
			req, err := inst.Request.Request()
			if err != nil {
				blocked = append(blocked, drain.Unplaceable{UUID: inst.UUID, Name: inst.Name, Reason: fmt.Sprintf("its flavor makes no request: %v", err)})
				continue
			}
			g, err := a.sharedGroup(ctx, groups, inst)
			if err != nil {
				return drain.Plan{}, classify(err)
			}
			if fixed := InfoOf(inst).Facts().FixedDevices(); in.Policy == drainLive && len(fixed) > 0 {
				notLive = append(notLive, drain.Unplaceable{UUID: inst.UUID, Name: inst.Name,
					Reason: fmt.Sprintf("it passes through %s, which cannot be unplugged; --policy live-then-cold moves it cold", strings.Join(fixed, " and "))})
				continue
			}
			guests = append(guests, drain.Guest{UUID: inst.UUID, Name: inst.Name, Request: req, Group: g})
			continue
		}
		b := drain.Unplaceable{UUID: c.InstanceUUID, Reason: blockReason(&c)}
		if inst != nil {
			b.Name = inst.Name
		}
		blocked = append(blocked, b)
	}
	targets, err := a.drainTargets(ctx, in.Host)
	if err != nil {
		return drain.Plan{}, err
	}
	plan := drain.Make(in.Host, guests, targets)
	plan.Blocked, plan.NotLive = blocked, notLive
	return plan, nil
}

// blockReason says why a claim on a host to drain is no guest at rest.
func blockReason(c *ledger.Claim) string {
	switch {
	case c.Kind == ledger.KindQuarantine:
		return fmt.Sprintf("quarantine %s holds pCPUs until an operator releases it", c.ID)
	case c.State == ledger.StatePending:
		return fmt.Sprintf("claim %s (%s) is pending: operation %s is in flight", c.ID, c.Kind, c.OwnerWorkflowID)
	case c.State == ledger.StateHeld:
		return fmt.Sprintf("claim %s is a resize's source hold: confirm or revert the resize", c.ID)
	case c.State == ledger.StateTombstone:
		return fmt.Sprintf("claim %s is a tombstone of an evacuated guest", c.ID)
	default:
		return fmt.Sprintf("claim %s (%s, %s) is not its instance's resident claim on this host", c.ID, c.Kind, c.State)
	}
}

// drainTargets reads every host but source that takes new guests, in
// pipelines: one read per host in turn made a plan over 100,000 hosts
// wait on 100,000 round trips.
func (a *Activities) drainTargets(ctx context.Context, source string) (map[string]*numa.Host, error) {
	names, err := a.Ledger.Hosts(ctx)
	if err != nil {
		return nil, classify(err)
	}
	states, err := a.Ledger.HostStatuses(ctx, names)
	if err != nil {
		return nil, classify(err)
	}
	var usable []string
	for _, n := range names {
		if n != source && placement.Usable(states[n]) {
			usable = append(usable, n)
		}
	}
	views, err := a.Ledger.ReadHosts(ctx, usable, nil)
	if err != nil {
		return nil, classify(err)
	}
	// The views of one topology share its parts; drain.Make clones each
	// host before it places a guest on it.
	targets := make(map[string]*numa.Host, len(views))
	for _, v := range views {
		if v.Host != nil { // removed meanwhile
			targets[v.Name] = v.Host
		}
	}
	return targets, nil
}

// Reservation is capacity a drain holds for one guest on its target: the
// guest's move adopts it (AdoptClaim) instead of claiming anew.
type Reservation struct {
	Host    string `json:"host"`
	ClaimID string `json:"claim_id"`
	// Owner is the drain's workflow id, the owner the claim must have.
	Owner string `json:"owner"`
	// Token is the drain's token: its conditional release frees the claim
	// only while no move has adopted it.
	Token string `json:"token"`
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
func (a *Activities) Reserve(ctx context.Context, in ReserveInput) (Reservation, error) {
	p := in.Placement
	c, err := a.Ledger.Claim(ctx, ledger.ClaimSpec{ID: in.ClaimID, Host: in.Host, InstanceUUID: in.UUID, Kind: ledger.KindReservation,
		OwnerWorkflowID: in.Owner.WorkflowID, OwnerRunID: in.Owner.FirstRunID, Placement: &p})
	if err != nil {
		return Reservation{}, conflict(err)
	}
	return Reservation{Host: c.Host, ClaimID: c.ID, Owner: c.OwnerWorkflowID, Token: c.Token}, nil
}

// ReleaseReservation frees a reservation the drain still owns; one a move
// adopted (its token changed) or that is gone is left alone.
func (a *Activities) ReleaseReservation(ctx context.Context, r Reservation) error {
	_, err := a.Ledger.ReleaseIfUnchanged(ctx, r.Host, r.ClaimID, r.Token, ledger.StatePending)
	if errors.Is(err, ledger.ErrUnknownClaim) {
		return nil
	}
	return classify(err)
}

// AdoptInput asks for a drain's reservation as an operation's own claim.
type AdoptInput struct {
	Reservation Reservation      `json:"reservation"`
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
	targets, err := a.drainTargets(ctx, in.Host)
	if err != nil {
		return drain.Plan{}, err
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

// sharedGroup is serverGroup of inst, read once per group for a plan of
// many guests: the plan counts its moves in it.
func (a *Activities) sharedGroup(ctx context.Context, groups map[string]*placement.ServerGroup, inst *ledger.Instance) (*placement.ServerGroup, error) {
	if inst.Group == "" {
		return nil, nil
	}
	if g, ok := groups[inst.Group]; ok {
		return g, nil
	}
	g, err := placement.MemberGroup(ctx, a.Ledger, inst.UUID)
	if err != nil {
		return nil, err
	}
	groups[inst.Group] = g
	return g, nil
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
