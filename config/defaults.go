package config

import (
	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guestxml"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/libvirt"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/placement"
)

// defaults is the configuration Load starts from, before the environment
// and the fields' default tags. A default that the code using the value
// also applies, to a field left zero, is that code's constant and is set
// here; a default only the configuration knows is its field's tag. Either
// way each default is written once, and Reference reads it from there.
func defaults() Config {
	return Config{
		RedisConfig: RedisConfig{
			KeyPrefix:   ledger.DefaultKeyPrefix,
			DialTimeout: ledger.DefaultDialTimeout,
			WaitTimeout: ledger.DefaultWaitTimeout,
		},
		SimConfig: SimConfig{KeyPrefix: sim.DefaultPrefix, StaleMigration: sim.DefaultStaleMigration},
		LibvirtConfig: LibvirtConfig{
			DialTimeout:          libvirt.DefaultDialTimeout,
			ProgressInterval:     libvirt.DefaultProgressInterval,
			AbortTimeout:         libvirt.DefaultAbortTimeout,
			PostCopyStallTimeout: libvirt.DefaultPostCopyStall,
		},
		DomainOptions: DomainOptions{Type: guestxml.DefaultType, Emulator: guestxml.DefaultEmulator, Machine: guestxml.DefaultMachine},
		Driver:        DriverSim,
		Reconcile:     Reconcile{Concurrency: api.DefaultReconcileConcurrency},
		Placement:     Placement{PollInterval: placement.DefaultPollInterval, SweepInterval: placement.DefaultSweepInterval},
		Steps:         Steps{FenceLease: activities.DefaultFenceLease, DrainMaxMoves: activities.DefaultDrainMaxMoves},
		Migration: Migration{
			CompletionTimeoutPerGiB: hypervisor.DefaultMigrationPolicy.CompletionTimeoutPerGiB,
			ProgressTimeout:         hypervisor.DefaultMigrationPolicy.ProgressTimeout,
			TimeoutAction:           string(hypervisor.DefaultMigrationPolicy.TimeoutAction),
		},
	}
}
