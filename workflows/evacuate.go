package workflows

import (
	"errors"
	"fmt"

	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
)

// Evacuate rebuilds the guest of a host an operator fenced (host down
// --fence) on another host: it claims there with the guest's own flavor
// and image properties, defines the guest from its record's domain XML
// pinned to the new claim, starts it and commits; the dead host's claim
// becomes a tombstone, cleared when the host comes back (HostUp). A
// destination whose claim fails is replaced by the next candidate. It
// refuses a guest whose host is not fenced.
func Evacuate(ctx workflow.Context, in api.EvacuateInput) (*api.EvacuateResult, error) {
	s, err := newSaga(ctx, api.OpEvacuation, in.UUID, 5)
	if err != nil {
		return nil, err
	}
	give, err := s.holdBudget(ctx, in.UUID, true)
	if err != nil {
		return nil, s.fail(err)
	}
	defer give()
	inst, err := s.loadInstance(ctx, in.UUID, activities.InstanceInfo.CanEvacuate)
	if err != nil {
		return nil, s.fail(err)
	}
	src := inst.Host
	s.setHosts(src, in.Dest)
	var st activities.HostStatus
	if err := s.ledger(ctx, "state of "+src, a.LoadHostStatus, src).Get(ctx, &st); err != nil {
		return nil, s.fail(err)
	}
	if st.State != ledger.HostDown {
		return nil, s.fail(activities.BadState(fmt.Sprintf("host %s of instance %s is %s; pinflow evacuates only from a host fenced with 'pinflow host down %s --fence'",
			src, in.UUID, st.State, src)))
	}
	if in.Dest == src {
		return nil, s.fail(activities.BadRequest(fmt.Sprintf("instance %s is on %s already; evacuate it to another host", in.UUID, src)))
	}
	s.step()

	if err := s.startTask(ctx, in.UUID, guest.TaskRebuilding); err != nil {
		return nil, s.fail(err)
	}
	dst, claim, err := claimElsewhere(ctx, s, inst, in.Dest)
	if err != nil {
		return nil, s.fail(err)
	}
	s.step()
	s.phase(api.PhaseAccepted, "CPUs claimed on "+dst+": "+claim.Placement.String())

	s.phase(api.PhaseRebuilding, "rebuilding on "+dst)
	dom := activities.DomainInput{UUID: in.UUID, Host: dst, ClaimID: claim.ClaimID, Token: claim.Token, Final: true}
	s.onFailure("destroy the domain", func(ctx workflow.Context) error {
		return workflow.ExecuteActivity(s.hypervisorStep(ctx, "destroy the domain on "+dst), a.DestroyDomain, dom).Get(ctx, nil)
	})
	spawn := activities.SpawnInput{UUID: in.UUID, Host: dst, Placement: claim.Placement, ClaimID: claim.ClaimID, Token: claim.Token}
	if err := s.hypervisorTry(ctx, "rebuild on "+dst, nil, a.Spawn, spawn); err != nil {
		if isType(err, api.ErrTypeRejected) {
			// The usual cause: the host was fenced while the guest still
			// runs there, and its disks cannot take a second copy.
			err = activities.BadState(fmt.Sprintf("instance %s may still run on %s, which is fenced as down: power it off there, then evacuate again (the hypervisor refused a second copy: %s)",
				in.UUID, src, appMessage(err)))
		}
		return nil, s.fail(err)
	}
	s.step()

	// The guest runs on its new host: finish forwards.
	ctx = s.commit(ctx)
	s.phase(api.PhaseCommitting, "making the claim resident")
	attach := activities.AttachInput{UUID: in.UUID, Host: dst, ClaimID: claim.ClaimID}
	if err := s.ledger(ctx, "commit the claim", a.Attach, attach).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	old := activities.ClaimRef{Host: src, ClaimID: inst.ClaimID}
	if err := s.ledger(ctx, "tombstone the claim on "+src, a.TombstoneClaim, old).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	s.phase(api.PhaseCompleted, "")
	return &api.EvacuateResult{UUID: in.UUID, Source: src, Host: dst, Placement: &claim.Placement}, nil
}

// claimElsewhere claims for the guest on dest or, when none is given, on
// the best host, trying the next candidate when a claim finds no room
// (another operation took it meanwhile) or its host went down. Each
// claim's release is registered before it is made.
func claimElsewhere(ctx workflow.Context, s *saga, inst activities.InstanceInfo, dest string) (string, activities.ClaimResult, error) {
	exclude := []string{inst.Host}
	var last error
	for try := 0; try < alternateHosts; try++ {
		host := dest
		if host == "" {
			s.phase(api.PhaseScheduling, "choosing a host")
			choose := activities.ChooseHostInput{UUID: inst.UUID, Flavor: inst.Flavor, Exclude: exclude}
			if err := s.ledger(ctx, "choose a host", a.ChooseHost, choose).Get(ctx, &host); err != nil {
				if last != nil {
					return "", activities.ClaimResult{}, errors.Join(last, err)
				}
				return "", activities.ClaimResult{}, err
			}
		}
		s.setHosts("", host)
		id := fmt.Sprintf("%s-%d", claimID(ctx, string(ledger.KindEvacuationDest)), try)
		s.onFailure("release the claim on "+host, func(ctx workflow.Context) error {
			return s.ledger(ctx, "release claim on "+host, a.ReleaseClaim,
				activities.ReleaseInput{Host: host, ClaimID: id, OnlyPending: true}).Get(ctx, nil)
		})
		claimIn := activities.ClaimInput{Host: host, ClaimID: id, UUID: inst.UUID, Kind: ledger.KindEvacuationDest, Owner: owner(ctx), Flavor: inst.Flavor}
		claim, err := s.claim(ctx, claimIn)
		if err == nil {
			return host, claim, nil
		}
		if dest != "" || !lostRoom(err) {
			return "", activities.ClaimResult{}, err
		}
		last, exclude = err, append(exclude, host)
	}
	return "", activities.ClaimResult{}, last
}

// lostRoom says whether a claim failed because its host had no room,
// went down, or took a member of the guest's server group since it was
// chosen: another host may still take the guest.
func lostRoom(err error) bool {
	return isType(err, api.ErrTypeNoFit, api.ErrTypeHostDown, api.ErrTypeGroupRule)
}

// HostUp brings a fenced host back: it marks the host returning (no
// claims, no new evacuations), refuses while an operation on any of its
// guests is open, destroys the leftover of every guest evacuated from it
// and clears its tombstone, and only then lets the host take claims
// again. A leftover it cannot destroy (the host's hypervisor still does
// not answer) marks the host down again, as it was.
func HostUp(ctx workflow.Context, in api.HostUpInput) (*api.HostUpResult, error) {
	s, err := newSaga(ctx, api.OpHostUp, "", 4)
	if err != nil {
		return nil, err
	}
	s.setHosts(in.Host, "")
	var st activities.HostStatus
	if err := s.ledger(ctx, "state of "+in.Host, a.LoadHostStatus, in.Host).Get(ctx, &st); err != nil {
		return nil, s.fail(err)
	}
	if err := s.ledger(ctx, "mark "+in.Host+" returning", a.MarkHostReturning, in.Host).Get(ctx, nil); err != nil {
		// Retried until it took effect, or refused (the host is up):
		// nothing to undo.
		return nil, s.fail(err)
	}
	s.onFailure("mark "+in.Host+" down again", func(ctx workflow.Context) error {
		down := activities.HostDownInput{Host: in.Host, Reason: st.Reason}
		return s.ledger(ctx, "mark "+in.Host+" down", a.MarkHostDown, down).Get(ctx, nil)
	})
	s.step()
	var left []api.Leftover
	if err := s.ledger(ctx, "list the tombstones on "+in.Host, a.HostLeftovers, in.Host).Get(ctx, &left); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	s.phase(api.PhaseDeleting, fmt.Sprintf("destroying %d leftover guests on %s", len(left), in.Host))
	for _, l := range left {
		if err := s.hypervisorTry(ctx, "destroy the leftover of "+l.UUID, nil, a.ClearTombstone, l); err != nil {
			return nil, s.fail(err)
		}
	}
	s.step()
	// Every tombstone is gone: the host may take claims again.
	ctx = s.commit(ctx)
	if err := s.ledger(ctx, "mark "+in.Host+" up", a.MarkHostUp, in.Host).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.phase(api.PhaseCompleted, "")
	return &api.HostUpResult{Host: in.Host, Leftovers: left}, nil
}
