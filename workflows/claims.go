package workflows

import (
	"errors"
	"fmt"

	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
)

// claim claims pinned CPUs on in.Host and remembers the claim, so that a
// recovery after Redis lost it can make it again as this run knows it.
func (s *saga) claim(ctx workflow.Context, in activities.ClaimInput) (activities.ClaimResult, error) {
	var c activities.ClaimResult
	if err := s.ledger(ctx, "claim pinned CPUs on "+in.Host, a.Claim, in).Get(ctx, &c); err != nil {
		return c, err
	}
	s.held = append(s.held, audit.HeldClaim{Host: c.Host, ClaimID: c.ClaimID, Kind: in.Kind, Token: c.Token,
		OwnerRunID: in.Owner.FirstRunID, Placement: c.Placement})
	return c, nil
}

// alternateHosts bounds the hosts an operation tries when pinflow chose
// its destination and a claim there finds no room (another operation took
// it between the choice and the claim), like Nova's alternates: a claim
// is a compare-and-set, so trying the next host is safe.
const alternateHosts = 3

// retryElsewhere follows a claim on a host pinflow chose that found no
// room: it chooses again without the hosts tried and claims there, up to
// alternateHosts hosts in all. in ends naming the host and claim id of the
// last try; the first try's compensation, which reads the caller's host
// and claim id variables, must see them updated from in.
func (s *saga) retryElsewhere(ctx workflow.Context, first error, in *activities.ClaimInput, choose activities.ChooseHostInput, kind string) (activities.ClaimResult, error) {
	err := first
	var c activities.ClaimResult
	for try := 1; err != nil && lostRoom(err) && try < alternateHosts; try++ {
		choose.Exclude = append(choose.Exclude, in.Host)
		var next string
		if cerr := s.ledger(ctx, "choose another host", a.ChooseHost, choose).Get(ctx, &next); cerr != nil {
			return c, errors.Join(err, cerr)
		}
		s.phase(api.PhaseScheduling, fmt.Sprintf("%s had no room left (%v); trying %s", in.Host, err, next))
		in.Host, in.ClaimID = next, fmt.Sprintf("%s-%d", claimID(ctx, kind), try)
		c, err = s.claim(ctx, *in)
	}
	return c, err
}

// claimDest claims the destination with in, or, when the operation moves
// a guest for a drain, adopts the drain's reservation there instead: the
// pCPUs the drain held for the guest become the operation's own pending
// claim without ever being free.
func (s *saga) claimDest(ctx workflow.Context, in activities.ClaimInput, r *api.Reservation) (activities.ClaimResult, error) {
	if r == nil {
		return s.claim(ctx, in)
	}
	var c activities.ClaimResult
	adopt := activities.AdoptInput{Reservation: *r, UUID: in.UUID, Kind: in.Kind, Owner: in.Owner}
	if err := s.ledger(ctx, "adopt the drain's reservation on "+r.Host, a.AdoptClaim, adopt).Get(ctx, &c); err != nil {
		return c, err
	}
	s.held = append(s.held, audit.HeldClaim{Host: c.Host, ClaimID: c.ClaimID, Kind: in.Kind, Token: c.Token,
		OwnerRunID: in.Owner.FirstRunID, Placement: c.Placement})
	return c, nil
}

// move is what the steps of a live or cold migration share: the guest,
// where it goes and its claim there.
type move struct {
	*saga
	uuid        string
	inst        activities.InstanceInfo
	reservation *api.Reservation
	src, dst    string
	// chosen says pinflow chose dst, with choose.
	chosen bool
	choose activities.ChooseHostInput
	// kind and flavor are those of the claim on dst.
	kind      ledger.ClaimKind
	flavor    guest.Flavor
	claimed   activities.ClaimResult
	destClaim string
}

// taskState is the step that sets the guest's task state, cleared again
// if the operation fails.
func (m *move) taskState(task guest.TaskState) func(workflow.Context) error {
	return func(ctx workflow.Context) error { return m.startTask(ctx, m.uuid, task) }
}

// claimDestination claims the guest's CPUs on dst, or adopts the drain's
// reservation there. When pinflow chose the host and the claim finds no
// room there, it tries other hosts as retryElsewhere does; dst ends
// naming the host of the claim. The claim is released if the operation
// fails: a claim of its own from before it is made, since an unknown
// outcome may leave one, a reservation only once adopted.
func (m *move) claimDestination(ctx workflow.Context) error {
	in := activities.ClaimInput{Host: m.dst, ClaimID: claimID(ctx, string(m.kind)), UUID: m.uuid, Kind: m.kind, Owner: owner(ctx), Flavor: m.flavor}
	if m.reservation != nil {
		in.ClaimID = m.reservation.ClaimID
	}
	// The release reads dst and destClaim when it runs: after a retry
	// they name the last try.
	m.destClaim = in.ClaimID
	release := func(ctx workflow.Context) error {
		return m.ledger(ctx, "release claim on "+m.dst, a.ReleaseClaim,
			activities.ReleaseInput{Host: m.dst, ClaimID: m.destClaim, OnlyPending: true}).Get(ctx, nil)
	}
	if m.reservation == nil {
		m.onFailure("release the destination claim", release)
	}
	claim, err := m.claimDest(ctx, in, m.reservation)
	if err != nil && m.chosen {
		claim, err = m.retryElsewhere(ctx, err, &in, m.choose, string(m.kind))
		m.dst, m.destClaim = in.Host, in.ClaimID
		m.setHosts(m.src, m.dst)
	}
	if err != nil {
		return err
	}
	if m.reservation != nil {
		m.onFailure("release the destination claim", release)
	}
	m.claimed = claim
	m.step()
	m.phase(api.PhaseAccepted, "destination CPUs claimed: "+claim.Placement.String())
	return nil
}

// reservedDest is where a move goes: dest, or the host of the drain's
// reservation r when there is one; a dest naming another host is refused.
func reservedDest(dest string, r *api.Reservation) (string, error) {
	if r == nil {
		return dest, nil
	}
	if dest != "" && dest != r.Host {
		return "", activities.BadRequest(fmt.Sprintf("destination %s and a reservation on %s: a reserved move goes to its reservation's host", dest, r.Host))
	}
	return r.Host, nil
}

// claimID is the id of a claim this run makes; it stays the same when the
// claiming activity is retried and differs between runs.
func claimID(ctx workflow.Context, kind string) string {
	return kind + "-" + firstRunID(ctx)
}

// firstRunID is the run's chain's first run id: the same across retries
// and continue-as-new. (The test environment leaves it empty.)
func firstRunID(ctx workflow.Context) string {
	info := workflow.GetInfo(ctx)
	if info.FirstRunID != "" {
		return info.FirstRunID
	}
	return info.WorkflowExecution.RunID
}

// owner names this run as a claim's owner.
func owner(ctx workflow.Context) activities.Owner {
	info := workflow.GetInfo(ctx)
	return activities.Owner{WorkflowID: info.WorkflowExecution.ID, FirstRunID: firstRunID(ctx)}
}
