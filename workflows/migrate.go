package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// LiveMigrationInput names the guest to move and, optionally, where.
type LiveMigrationInput struct {
	UUID string `json:"uuid"`
	// Dest is the destination host; empty lets pinflow choose one.
	Dest string `json:"dest,omitempty"`
	// ColdFallback: when the live migration itself fails (the hypervisor
	// refuses to prepare or migrate, and the guest is back on its source),
	// cold-migrate instead, with ConfirmWindow as a Resize's.
	ColdFallback  bool          `json:"cold_fallback,omitempty"`
	ConfirmWindow time.Duration `json:"confirm_window,omitempty"`
	// AutoConfirm confirms the cold migration it falls back to as soon as
	// the guest runs on its destination.
	AutoConfirm bool `json:"auto_confirm,omitempty"`
	// Reservation is a drain's claim for the guest on its destination,
	// which the migration adopts instead of claiming; Dest is its host.
	Reservation *activities.Reservation `json:"reservation,omitempty"`
}

// LiveMigrationResult says where the guest went and how it is pinned there.
type LiveMigrationResult struct {
	UUID      string          `json:"uuid"`
	Source    string          `json:"source"`
	Dest      string          `json:"dest"`
	Placement *numa.Placement `json:"placement"`
	// Cold is the cold migration the live one fell back to, if it did.
	Cold *ResizeResult `json:"cold,omitempty"`
}

// errFallBack says a live migration failed cleanly (the guest runs on its
// source as before) and asked to fall back to a cold migration.
type errFallBack struct{ cause error }

func (e errFallBack) Error() string { return e.cause.Error() }

// LiveMigration moves a running guest to another host: claim its CPUs on
// the destination (accepted), rewrite its domain XML for the destination
// pins (preparing), migrate (running), then commit: the destination claim
// becomes the guest's resident claim, its record moves, and the source
// claim is released. Any failure or cancellation before the commit rolls
// the hypervisor back and releases the destination claim, leaving the guest
// untouched on its source.
func LiveMigration(ctx workflow.Context, in LiveMigrationInput) (*LiveMigrationResult, error) {
	s, err := newSaga(ctx, OpLiveMigration, in.UUID, 6)
	if err != nil {
		return nil, err
	}
	res, err := s.liveMigrate(ctx, in)
	var fb errFallBack
	if !errors.As(err, &fb) {
		return res, err
	}
	s.status.Operation, s.status.Error, s.steps, s.done = OpColdMigration, "", 9, 0
	_ = workflow.UpsertTypedSearchAttributes(ctx, AttrOperation.ValueSet(string(OpColdMigration)))
	s.phase(PhaseScheduling, "the live migration failed ("+fb.cause.Error()+"); cold-migrating instead")
	// A reservation the live attempt adopted was released when it rolled
	// back: the cold migration claims its host anew.
	dest := in.Dest
	if in.Reservation != nil {
		dest = in.Reservation.Host
	}
	cold, err := s.resize(ctx, ResizeInput{UUID: in.UUID, Dest: dest, ConfirmWindow: in.ConfirmWindow, AutoConfirm: in.AutoConfirm})
	if err != nil {
		return nil, err
	}
	return &LiveMigrationResult{UUID: in.UUID, Source: cold.Source, Dest: cold.Dest, Placement: cold.Placement, Cold: cold}, nil
}

func (s *saga) liveMigrate(ctx workflow.Context, in LiveMigrationInput) (*LiveMigrationResult, error) {
	inst, err := s.loadInstance(ctx, in.UUID, activities.InstanceInfo.CanLiveMigrate)
	if err != nil {
		return nil, s.fail(err)
	}
	src := inst.Host
	dst, err := reservedDest(in.Dest, in.Reservation)
	if err != nil {
		return nil, s.fail(err)
	}
	s.setHosts(src, dst)
	s.step()

	s.phase(PhaseScheduling, "choosing the destination")
	chosen := dst == ""
	choose := activities.ChooseHostInput{UUID: in.UUID, Flavor: inst.Flavor, Exclude: []string{src}}
	if chosen {
		if err := s.ledger(ctx, "choose a destination host", a.ChooseHost, choose).Get(ctx, &dst); err != nil {
			return nil, s.fail(err)
		}
	}
	if dst == src {
		return nil, s.fail(activities.BadRequest(fmt.Sprintf("instance %s already runs on %s; choose another destination", in.UUID, dst)))
	}
	s.setHosts(src, dst)

	if err := s.startTask(ctx, in.UUID, guest.TaskMigrating); err != nil {
		return nil, s.fail(err)
	}

	claimIn := activities.ClaimInput{Host: dst, UUID: in.UUID, Kind: ledger.KindMigrationDest, Owner: owner(ctx), Flavor: inst.Flavor}
	claim, err := s.claimMoveDest(ctx, src, &claimIn, in.Reservation, chosen, choose)
	if err != nil {
		return nil, s.fail(err)
	}
	dst, destClaim := claimIn.Host, claimIn.ClaimID
	s.step()
	s.phase(PhaseAccepted, "destination CPUs claimed: "+claim.Placement.String())

	s.phase(PhasePreparing, "rewriting the domain XML for the destination pins")
	move := activities.MigrateInput{UUID: in.UUID, Source: src, Dest: dst, DestClaimID: destClaim, DestToken: claim.Token}
	s.onFailure("roll the hypervisor back", func(ctx workflow.Context) error {
		// The rollback looks where the guest runs first: a migration that
		// completed is finished forwards, never undone.
		var rb activities.RollbackResult
		if err := workflow.ExecuteActivity(s.hypervisorStep(ctx, "roll back the migration"), a.RollbackMigration, move).Get(ctx, &rb); err != nil {
			return err
		}
		if rb.OnDest {
			return errRolledForward
		}
		return nil
	})
	// failed compensates, and says whether the guest turned out to run on
	// the destination already, so that the operation commits instead.
	failed := func(cause error) (bool, error) {
		err := s.fail(cause)
		if in.ColdFallback && err == cause && ctx.Err() == nil {
			// Every compensation ran and the guest runs on its source.
			return false, errFallBack{cause}
		}
		return errors.Is(err, errRolledForward), err
	}
	prep := activities.PrepareMigrationInput{UUID: in.UUID, Source: src, Dest: dst, Placement: claim.Placement, DestClaimID: destClaim}
	prepared := true
	if err := workflow.ExecuteActivity(s.hypervisorTry(ctx, "prepare "+dst), a.PrepareMigration, prep).Get(ctx, nil); err != nil {
		forward, err := failed(err)
		if !forward {
			return nil, err
		}
		prepared = false
	}
	s.step()

	if prepared {
		s.phase(PhaseRunning, "migrating")
		migrate := func(ctx workflow.Context) error {
			return workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
				StartToCloseTimeout: migrateTimeout, HeartbeatTimeout: heartbeatTimeout, RetryPolicy: tries,
				WaitForCancellation: true, Summary: fmt.Sprintf("live-migrate %s from %s to %s", in.UUID, src, dst),
			}), a.Migrate, move).Get(ctx, nil)
		}
		// A successful migration is authoritative, even when a cancel
		// arrived while it ran: the guest runs on dst.
		err := migrate(ctx)
		for isType(err, activities.ErrTypePostCopyFailed) {
			// Past its switch to post-copy the migration cannot be undone,
			// only resumed: the guest's memory is on dst. No cancel stops
			// that; the claims stay as they are until it completes.
			ctx = s.commit(ctx)
			s.phase(PhaseRunning, "resuming the migration, which failed after its switch to post-copy: "+appMessage(err))
			if err = workflow.Sleep(ctx, postCopyRetry); err == nil {
				err = migrate(ctx)
			}
		}
		if err != nil {
			if forward, err := failed(err); !forward {
				return nil, err
			}
		}
	}
	s.step()

	// The guest now runs on dst: from here the operation only goes forwards.
	ctx = s.commit(ctx)
	s.phase(PhaseCommitting, "making the destination claim resident")
	commit := activities.CommitMigrationInput{UUID: in.UUID, Source: src, Dest: dst, SourceClaimID: inst.ClaimID,
		DestClaimID: destClaim}
	if err := s.ledger(ctx, "commit the migration", a.CommitMigration, commit).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	s.phase(PhaseCompleted, "")
	return &LiveMigrationResult{UUID: in.UUID, Source: src, Dest: dst, Placement: &claim.Placement}, nil
}
