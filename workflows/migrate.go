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

// errFallBack says a live migration failed cleanly (the guest runs on its
// source as before) and asked to fall back to a cold migration. The
// reservation is a drain's that the live attempt did not take, for the
// cold one.
type errFallBack struct {
	cause       error
	reservation *api.Reservation
}

func (e errFallBack) Error() string { return e.cause.Error() }

// LiveMigration moves a running guest to another host: claim its CPUs on
// the destination (accepted), rewrite its domain XML for the destination
// pins (preparing), migrate (running), then commit: the destination claim
// becomes the guest's resident claim, its record moves, and the source
// claim is released. Any failure or cancellation before the commit rolls
// the hypervisor back and releases the destination claim, leaving the guest
// untouched on its source.
func LiveMigration(ctx workflow.Context, in api.LiveMigrationInput) (*api.LiveMigrationResult, error) {
	s, err := newSaga(ctx, api.OpLiveMigration, in.UUID, 6)
	if err != nil {
		return nil, err
	}
	give, err := s.holdBudget(ctx, in.UUID, false)
	if err != nil {
		return nil, s.fail(err)
	}
	defer give()
	res, err := s.liveMigrate(ctx, in)
	var fb errFallBack
	if !errors.As(err, &fb) {
		return res, err
	}
	s.status.Operation, s.status.Error, s.steps, s.done = api.OpColdMigration, "", 9, 0
	_ = workflow.UpsertTypedSearchAttributes(ctx, api.AttrOperation.ValueSet(string(api.OpColdMigration)))
	s.phase(api.PhaseScheduling, "the live migration failed ("+api.RootCause(fb.cause)+"); cold-migrating instead")
	// A reservation the live attempt adopted was released when it rolled
	// back: the cold migration claims its host anew.
	dest := in.Dest
	if in.Reservation != nil {
		dest = in.Reservation.Host
	}
	cold, err := s.resize(ctx, api.ResizeInput{UUID: in.UUID, Dest: dest, ConfirmWindow: in.ConfirmWindow, AutoConfirm: in.AutoConfirm,
		Reservation: fb.reservation})
	if err != nil {
		return nil, err
	}
	return &api.LiveMigrationResult{UUID: in.UUID, Source: cold.Source, Dest: cold.Dest, Placement: cold.Placement, Cold: cold}, nil
}

func (s *saga) liveMigrate(ctx workflow.Context, in api.LiveMigrationInput) (*api.LiveMigrationResult, error) {
	m := &migration{move: move{saga: s, uuid: in.UUID, reservation: in.Reservation, kind: ledger.KindMigrationDest}, in: in}
	if err := s.run(ctx, m.checkInstance, m.chooseDestination, m.taskState(guest.TaskMigrating), m.claimDestination, m.unplug); err != nil {
		var fb errFallBack
		if errors.As(err, &fb) {
			return nil, fb
		}
		return nil, s.fail(err)
	}
	s.onFailure("roll the hypervisor back", m.rollBack)
	// These steps compensate their own failures: a rollback that finds the
	// guest on the destination lets the migration commit instead.
	if err := s.run(ctx, m.prepareDestination, m.switchOver); err != nil {
		return nil, err
	}
	// The guest now runs on dst: from here the operation only goes forwards.
	ctx = s.commit(ctx)
	if err := s.run(ctx, m.commitDestination, m.plug); err != nil {
		return nil, s.fail(err)
	}
	s.phase(api.PhaseCompleted, "")
	return &api.LiveMigrationResult{UUID: in.UUID, Source: m.src, Dest: m.dst, Placement: &m.claimed.Placement}, nil
}

// migration is a live migration's state, shared by its steps.
type migration struct {
	move
	in api.LiveMigrationInput
	// onDest says a rollback found the guest on the destination: the
	// migration completed.
	onDest bool
}

// checkInstance loads the guest's record and refuses a guest that cannot
// be live-migrated; one whose devices cannot be unplugged falls back to a
// cold migration when asked to.
func (m *migration) checkInstance(ctx workflow.Context) (err error) {
	can := activities.InstanceInfo.CanLiveMigrate
	if m.in.ColdFallback {
		can = activities.InstanceInfo.Running
	}
	if m.inst, err = m.loadInstance(ctx, m.uuid, can); err != nil {
		return err
	}
	if err := m.inst.Unpluggable(); err != nil {
		return errFallBack{cause: err, reservation: m.reservation}
	}
	m.src, m.flavor = m.inst.Host, m.inst.Flavor
	if m.dst, err = reservedDest(m.in.Dest, m.reservation); err != nil {
		return err
	}
	m.setHosts(m.src, m.dst)
	m.step()
	return nil
}

// chooseDestination has pinflow choose the destination when the input
// names none, and refuses the guest's own host.
func (m *migration) chooseDestination(ctx workflow.Context) error {
	m.phase(api.PhaseScheduling, "choosing the destination")
	m.chosen = m.dst == ""
	m.choose = activities.ChooseHostInput{UUID: m.uuid, Flavor: m.flavor, Exclude: []string{m.src}}
	if m.chosen {
		if err := m.ledger(ctx, "choose a destination host", a.ChooseHost, m.choose).Get(ctx, &m.dst); err != nil {
			return err
		}
	}
	if m.dst == m.src {
		return activities.BadRequest(fmt.Sprintf("instance %s already runs on %s; choose another destination", m.uuid, m.dst))
	}
	m.setHosts(m.src, m.dst)
	return nil
}

// unplug unplugs the guest's passed-through devices on the source before
// anything moves; a rollback plugs them in again.
func (m *migration) unplug(ctx workflow.Context) error {
	if m.inst.Placement == nil || len(m.inst.Placement.Devices) == 0 {
		return nil
	}
	m.phase(api.PhaseUnplugging, "unplugging the guest's PCI devices on "+m.src)
	m.onFailure("plug the devices in again on "+m.src, func(ctx workflow.Context) error {
		in := activities.PlugDevicesInput{UUID: m.uuid, Host: m.src, ClaimID: m.inst.ClaimID, Token: m.inst.ClaimToken, Final: true}
		err := workflow.ExecuteActivity(m.hypervisorStep(ctx, "plug the devices in again on "+m.src), a.PlugDevices, in).Get(ctx, nil)
		if isType(err, api.ErrTypeHostDown) {
			return nil // the guest is the evacuation's, which plugs them where it rebuilds it
		}
		return err
	})
	return m.hypervisorTry(ctx, "unplug the devices on "+m.src, nil, a.UnplugDevices, activities.DomainInput{UUID: m.uuid, Host: m.src, ClaimID: m.inst.ClaimID, Token: m.inst.ClaimToken})
}

// plug plugs the destination's devices into the guest, which runs there:
// forwards only, retried until done; a refusal is reported, and the audit
// reports the devices unplugged until an operator acts.
func (m *migration) plug(ctx workflow.Context) error {
	if len(m.claimed.Placement.Devices) == 0 {
		return nil
	}
	m.phase(api.PhasePlugging, "plugging the guest's PCI devices in on "+m.dst)
	in := activities.PlugDevicesInput{UUID: m.uuid, Host: m.dst, ClaimID: m.destClaim, Token: m.claimed.Token, Final: true}
	return workflow.ExecuteActivity(m.hypervisorStep(ctx, "plug the devices in on "+m.dst), a.PlugDevices, in).Get(ctx, nil)
}

// prepareDestination rewrites the guest's domain XML for its pins on the
// destination.
func (m *migration) prepareDestination(ctx workflow.Context) error {
	m.phase(api.PhasePreparing, "rewriting the domain XML for the destination pins")
	prep := activities.PrepareMigrationInput{UUID: m.uuid, Source: m.src, Dest: m.dst, Placement: m.claimed.Placement, DestClaimID: m.destClaim}
	if err := m.hypervisorTry(ctx, "prepare the destination "+m.dst, nil, a.PrepareMigration, prep); err != nil {
		if err := m.failed(ctx, err); err != nil {
			return err
		}
	}
	m.step()
	return nil
}

// switchOver live-migrates the guest to the destination, unless a
// rollback found it there already.
func (m *migration) switchOver(ctx workflow.Context) error {
	if !m.onDest {
		m.phase(api.PhaseRunning, "migrating")
		// A successful migration is authoritative, even when a cancel
		// arrived while it ran: the guest runs on dst.
		err := m.migrate(ctx)
		pastPostCopy := false
		for isType(err, api.ErrTypePostCopyFailed) {
			// Past its switch to post-copy the migration cannot be undone,
			// only resumed: the guest's memory is on dst. No cancel stops
			// that; the claims stay as they are until it completes.
			ctx, pastPostCopy = m.commit(ctx), true
			m.phase(api.PhaseRunning, "resuming the migration, which failed after its switch to post-copy: "+appMessage(err))
			if err = workflow.Sleep(ctx, postCopyRetry); err == nil {
				err = m.migrate(ctx)
			}
		}
		if err != nil && pastPostCopy {
			// Nothing may be undone or retried cold: both claims stay for
			// the audit, which settles the guest where the hypervisor runs
			// it.
			return m.fail(err)
		}
		if err != nil {
			if err := m.failed(ctx, err); err != nil {
				return err
			}
		}
	}
	m.step()
	return nil
}

func (m *migration) migrate(ctx workflow.Context) error {
	m.current = fmt.Sprintf("live-migrate %s from %s to %s", m.uuid, m.src, m.dst)
	return m.try(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: migrateTimeout, HeartbeatTimeout: heartbeatTimeout,
		WaitForCancellation: true, Summary: m.current,
	}, nil, a.Migrate, m.migrateInput())
}

func (m *migration) migrateInput() activities.MigrateInput {
	return activities.MigrateInput{UUID: m.uuid, Source: m.src, Dest: m.dst, DestClaimID: m.destClaim, DestToken: m.claimed.Token}
}

// rollBack undoes the hypervisor's steps. It looks where the guest runs
// first: a migration that completed is finished forwards, never undone.
func (m *migration) rollBack(ctx workflow.Context) error {
	var rb activities.RollbackResult
	if err := workflow.ExecuteActivity(m.hypervisorStep(ctx, "roll back the migration"), a.RollbackMigration, m.migrateInput()).Get(ctx, &rb); err != nil {
		return err
	}
	if rb.OnDest {
		return errRolledForward
	}
	return nil
}

// failed compensates a failed hypervisor step. It returns nil when the
// rollback found the guest on the destination (onDest), which the
// operation then commits.
func (m *migration) failed(ctx workflow.Context, cause error) error {
	err, undone := m.abort(cause)
	if m.in.ColdFallback && undone && ctx.Err() == nil {
		// Every compensation ran and the guest runs on its source.
		return errFallBack{cause: err}
	}
	if errors.Is(err, errRolledForward) {
		m.onDest = true
		return nil
	}
	return err
}

// commitDestination makes the destination claim the guest's resident
// claim, moves its record and releases the source claim.
func (m *migration) commitDestination(ctx workflow.Context) error {
	m.phase(api.PhaseCommitting, "making the destination claim resident")
	commit := activities.CommitMigrationInput{UUID: m.uuid, Source: m.src, Dest: m.dst, SourceClaimID: m.inst.ClaimID,
		DestClaimID: m.destClaim}
	if err := m.ledger(ctx, "commit the migration", a.CommitMigration, commit).Get(ctx, nil); err != nil {
		return err
	}
	m.step()
	return nil
}
