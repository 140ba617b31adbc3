package workflows

import (
	"fmt"

	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
)

// Boot creates a guest's record, claims CPUs on a host, spawns the guest
// there and commits. A failure releases the claim and leaves the record in
// vm_state error with no host, for a delete to remove.
func Boot(ctx workflow.Context, in api.BootInput) (*api.BootResult, error) {
	s, err := newSaga(ctx, api.OpBoot, in.UUID, 4)
	if err != nil {
		return nil, err
	}
	var inst activities.InstanceInfo
	// Booting an existing uuid again is refused, not a second copy.
	create := activities.CreateInstanceInput{UUID: in.UUID, Name: in.Name, Flavor: in.Flavor, Creator: firstRunID(ctx), Group: in.Group}
	if err := s.ledger(ctx, "create instance "+in.Name, a.CreateInstance, create).Get(ctx, &inst); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	s.onFailure("mark the instance as failed", func(ctx workflow.Context) error {
		return s.endTask(ctx, in.UUID, guest.VMError)
	})
	s.stays = fmt.Sprintf("instance %s runs nowhere: its record is in error until 'pinflow delete %s'", in.UUID, in.UUID)
	host, placement, err := placeAndSpawn(ctx, s, inst, in.Host, ledger.KindBoot)
	if err != nil {
		return nil, s.fail(err)
	}
	s.phase(api.PhaseCompleted, "")
	return &api.BootResult{UUID: in.UUID, Host: host, Placement: placement}, nil
}

// Delete destroys the guest on its host, releases its claim (a claim that
// an earlier failure already released is no error), then clears its host
// data and removes its record. It only goes forwards: every step is idempotent
// and retried until it succeeds.
func Delete(ctx workflow.Context, in api.DeleteInput) (*api.DeleteResult, error) {
	s, err := newSaga(ctx, api.OpDelete, in.UUID, 4)
	if err != nil {
		return nil, err
	}
	inst, err := s.loadInstance(ctx, in.UUID, nil)
	if err != nil {
		return nil, s.fail(err)
	}
	s.setHosts(inst.Host, "")
	s.step()
	// A delete only goes forwards: a cancel must not leave a guest half
	// destroyed.
	ctx = s.commit(ctx)
	s.phase(api.PhaseDeleting, "")
	if err := s.setTask(ctx, in.UUID, guest.TaskDeleting); err != nil {
		return nil, s.fail(err)
	}
	if inst.Host != "" {
		dom := activities.DomainInput{UUID: in.UUID, Host: inst.Host, ClaimID: inst.ClaimID, Token: inst.ClaimToken}
		if err := workflow.ExecuteActivity(s.hypervisorStep(ctx, "destroy the domain on "+inst.Host), a.DestroyDomain, dom).Get(ctx, nil); err != nil {
			return nil, s.fail(err)
		}
		s.step()
		if inst.ClaimID != "" {
			if err := s.ledger(ctx, "release claim on "+inst.Host, a.ReleaseClaim,
				activities.ReleaseInput{Host: inst.Host, ClaimID: inst.ClaimID}).Get(ctx, nil); err != nil {
				return nil, s.fail(err)
			}
		}
		if src := inst.ResizeSource; src != nil {
			// A resize's source hold: its guest left the source when it moved.
			if err := s.ledger(ctx, "release the source hold on "+src.Host, a.ReleaseClaim,
				activities.ReleaseInput{Host: src.Host, ClaimID: src.ClaimID}).Get(ctx, nil); err != nil {
				return nil, s.fail(err)
			}
		}
		s.step()
		clear := activities.ClearHostInput{UUID: in.UUID, VMState: guest.VMDeleted}
		if err := s.ledger(ctx, "clear host and NUMA data", a.ClearInstanceHost, clear).Get(ctx, nil); err != nil {
			return nil, s.fail(err)
		}
	}
	if err := s.ledger(ctx, "delete the record", a.DeleteInstance, in.UUID).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.phase(api.PhaseCompleted, "")
	return &api.DeleteResult{UUID: in.UUID, Host: inst.Host}, nil
}
