package workflows

import (
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// ShelveOffload powers the guest off and removes it from its host, then
// releases the host's claim at once (no audit is needed to free its pins),
// and only then clears the guest's host, node and NUMA data, leaving it
// shelved_offloaded with its domain XML kept for unshelving.
func ShelveOffload(ctx workflow.Context, in api.ShelveOffloadInput) (*api.ShelveOffloadResult, error) {
	s, err := newSaga(ctx, api.OpShelveOffload, in.UUID, 4)
	if err != nil {
		return nil, err
	}
	inst, err := s.loadInstance(ctx, in.UUID, activities.InstanceInfo.CanShelve)
	if err != nil {
		return nil, s.fail(err)
	}
	s.setHosts(inst.Host, "")
	s.step()

	if err := s.startTask(ctx, in.UUID, guest.TaskShelving); err != nil {
		return nil, s.fail(err)
	}

	s.phase(api.PhasePoweringOff, "powering off and removing the guest from "+inst.Host)
	dom := activities.DomainInput{UUID: in.UUID, Host: inst.Host, ClaimID: inst.ClaimID, Token: inst.ClaimToken}
	// An offload that did not finish leaves the guest running on its
	// resident claim, as before.
	s.onFailure("run the guest again", func(ctx workflow.Context) error {
		restore := dom
		restore.Final = true
		return restoreOrLeave(ctx, s, restore)
	})
	if err := s.hypervisorTry(ctx, "offload the guest from "+inst.Host, nil, a.Offload, dom); err != nil {
		return nil, s.fail(err)
	}
	s.step()

	// The guest is off its host: finish forwards.
	ctx = s.commit(ctx)
	s.phase(api.PhaseReleasing, "releasing the claim on "+inst.Host)
	if err := s.ledger(ctx, "release claim on "+inst.Host, a.ReleaseClaim,
		activities.ReleaseInput{Host: inst.Host, ClaimID: inst.ClaimID}).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	clear := activities.ClearHostInput{UUID: in.UUID, VMState: guest.VMShelvedOffloaded}
	if err := s.ledger(ctx, "clear host and NUMA data", a.ClearInstanceHost, clear).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	s.phase(api.PhaseCompleted, "")
	return &api.ShelveOffloadResult{UUID: in.UUID, Host: inst.Host}, nil
}

// Unshelve brings a shelved-offloaded guest back: it marks the guest
// unshelving (it is never treated as offloaded while that runs), claims
// CPUs on a host, spawns the guest with its domain XML patched for the new
// pins, and commits. A failure releases the claim and clears the guest's
// host and NUMA data, so it stays shelved_offloaded and a later delete
// succeeds.
func Unshelve(ctx workflow.Context, in api.UnshelveInput) (*api.UnshelveResult, error) {
	s, err := newSaga(ctx, api.OpUnshelve, in.UUID, 5)
	if err != nil {
		return nil, err
	}
	inst, err := s.loadInstance(ctx, in.UUID, activities.InstanceInfo.CanUnshelve)
	if err != nil {
		return nil, s.fail(err)
	}
	s.step()

	if err := s.startTask(ctx, in.UUID, guest.TaskUnshelving); err != nil {
		return nil, s.fail(err)
	}

	host, placement, err := placeAndSpawn(ctx, s, inst, in.Host, ledger.KindUnshelve)
	if err != nil {
		return nil, s.fail(err)
	}
	s.phase(api.PhaseCompleted, "")
	return &api.UnshelveResult{UUID: in.UUID, Host: host, Placement: placement}, nil
}

// placeAndSpawn is the tail that boot and unshelve share: choose a host
// unless one is given, claim on it, spawn the guest there and make the
// claim resident. It registers the compensations of each step: destroy the
// domain, release the claim and clear whatever host data the record holds.
func placeAndSpawn(ctx workflow.Context, s *saga, inst activities.InstanceInfo, host string, kind ledger.ClaimKind) (string, *numa.Placement, error) {
	s.phase(api.PhaseScheduling, "choosing a host")
	chosen := host == ""
	choose := activities.ChooseHostInput{UUID: inst.UUID, Flavor: inst.Flavor}
	if chosen {
		if err := s.ledger(ctx, "choose a host", a.ChooseHost, choose).Get(ctx, &host); err != nil {
			return "", nil, err
		}
	}
	s.setHosts("", host)

	id := claimID(ctx, string(kind))
	s.onFailure("release the claim and clear host data", func(ctx workflow.Context) error {
		if err := s.ledger(ctx, "release claim on "+host, a.ReleaseClaim,
			activities.ReleaseInput{Host: host, ClaimID: id, OnlyPending: true}).Get(ctx, nil); err != nil {
			return err
		}
		clear := activities.ClearHostInput{UUID: inst.UUID, VMState: inst.VMState, OnlyClaimID: id}
		return s.ledger(ctx, "clear host and NUMA data", a.ClearInstanceHost, clear).Get(ctx, nil)
	})
	claimIn := activities.ClaimInput{Host: host, ClaimID: id, UUID: inst.UUID, Kind: kind, Owner: owner(ctx), Flavor: inst.Flavor}
	claim, err := s.claim(ctx, claimIn)
	if err != nil && chosen {
		claim, err = s.retryElsewhere(ctx, err, &claimIn, choose, string(kind))
		host, id = claimIn.Host, claimIn.ClaimID
		s.setHosts("", host)
	}
	if err != nil {
		return "", nil, err
	}
	s.step()
	s.phase(api.PhaseAccepted, "CPUs claimed: "+claim.Placement.String())

	s.phase(api.PhaseSpawning, "spawning on "+host)
	dom := activities.DomainInput{UUID: inst.UUID, Host: host, ClaimID: id, Token: claim.Token, Final: true}
	s.onFailure("destroy the domain", func(ctx workflow.Context) error {
		return workflow.ExecuteActivity(s.hypervisorStep(ctx, "destroy the domain on "+host), a.DestroyDomain, dom).Get(ctx, nil)
	})
	spawn := activities.SpawnInput{UUID: inst.UUID, Host: host, Placement: claim.Placement, ClaimID: id, Token: claim.Token}
	if err := s.hypervisorTry(ctx, "spawn on "+host, nil, a.Spawn, spawn); err != nil {
		return "", nil, err
	}
	s.step()

	// A spawn that succeeded is authoritative, even when a cancel arrived
	// while it ran: the guest runs on the claim.
	ctx = s.commit(ctx)
	s.phase(api.PhaseCommitting, "making the claim resident")
	attach := activities.AttachInput{UUID: inst.UUID, Host: host, ClaimID: id}
	if err := s.ledger(ctx, "commit the claim", a.Attach, attach).Get(ctx, nil); err != nil {
		return "", nil, err
	}
	s.step()
	return host, &claim.Placement, nil
}
