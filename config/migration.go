package config

import (
	"fmt"
	"time"

	"github.com/pinflow/pinflow/hypervisor"
)

// Migration is the policy every live migration runs under, as Nova's
// live_migration_* options and KubeVirt's migration configuration set it.
// Its defaults are hypervisor.DefaultMigrationPolicy, KubeVirt's.
type Migration struct {
	// CompletionTimeoutPerGiB bounds a live migration: it is aborted (or
	// switched to post-copy, see PINFLOW_MIGRATION_TIMEOUT_ACTION) once it
	// has run this long per GiB of guest memory, a guest under 1 GiB
	// counting as 1 GiB; 0 sets no bound.
	CompletionTimeoutPerGiB time.Duration `envconfig:"MIGRATION_COMPLETION_TIMEOUT_PER_GIB"`
	// ProgressTimeout aborts (or switches to post-copy) a live migration
	// whose data remaining has not fallen below its lowest figure for this
	// long, as one whose guest dirties memory faster than it is sent; 0
	// sets no bound.
	ProgressTimeout time.Duration `envconfig:"MIGRATION_PROGRESS_TIMEOUT"`
	// TimeoutAction is what a timeout does: abort (the guest stays on its
	// source and the operation rolls back) or post-copy (the guest
	// switches to the destination and the migration completes; needs
	// PINFLOW_MIGRATION_ALLOW_POST_COPY).
	TimeoutAction string `envconfig:"MIGRATION_TIMEOUT_ACTION"`
	// AllowPostCopy starts every live migration able to switch to
	// post-copy. After a switch a failure of either host loses the guest;
	// one of the network between them pauses it on both until pinflow
	// resumes the migration.
	AllowPostCopy bool `envconfig:"MIGRATION_ALLOW_POST_COPY" default:"false"`
	// AllowAutoConverge lets the hypervisor slow a guest's vCPUs down
	// while its migration does not converge.
	AllowAutoConverge bool `envconfig:"MIGRATION_ALLOW_AUTO_CONVERGE" default:"false"`
	// MaxDowntime is the longest a guest may be paused at the end of its
	// live migration; 0 keeps the hypervisor's default (300ms for QEMU).
	MaxDowntime time.Duration `envconfig:"MIGRATION_MAX_DOWNTIME" default:"0s"`
	// BandwidthMiBs caps each live migration's transfer rate, in MiB/s; 0
	// sets no cap.
	BandwidthMiBs int64 `envconfig:"MIGRATION_BANDWIDTH_MIBS" default:"0"`
}

// Policy checks the settings and returns the policy they make. Its error
// is one line naming the variable, the bad value and what is allowed.
func (m Migration) Policy() (hypervisor.MigrationPolicy, error) {
	for _, d := range []struct {
		name  string
		value time.Duration
		zero  string
	}{
		{"MIGRATION_COMPLETION_TIMEOUT_PER_GIB", m.CompletionTimeoutPerGiB, "no limit"},
		{"MIGRATION_PROGRESS_TIMEOUT", m.ProgressTimeout, "no limit"},
		{"MIGRATION_MAX_DOWNTIME", m.MaxDowntime, "the hypervisor's default"},
	} {
		if d.value < 0 {
			return hypervisor.MigrationPolicy{}, fmt.Errorf("config: %s_%s %s: must be 0 or more (0: %s)", Prefix, d.name, d.value, d.zero)
		}
	}
	if m.BandwidthMiBs < 0 {
		return hypervisor.MigrationPolicy{}, fmt.Errorf("config: %s_MIGRATION_BANDWIDTH_MIBS %d: must be 0 or more MiB/s (0: no cap)", Prefix, m.BandwidthMiBs)
	}
	action, err := hypervisor.ParseTimeoutAction(m.TimeoutAction)
	if err != nil {
		return hypervisor.MigrationPolicy{}, fmt.Errorf("config: %s_MIGRATION_TIMEOUT_ACTION %q: allowed are %s or %s", Prefix, m.TimeoutAction, hypervisor.TimeoutAbort, hypervisor.TimeoutPostCopy)
	}
	if action == hypervisor.TimeoutPostCopy && !m.AllowPostCopy {
		return hypervisor.MigrationPolicy{}, fmt.Errorf("config: %s_MIGRATION_TIMEOUT_ACTION %s needs %s_MIGRATION_ALLOW_POST_COPY=true; set it, or use %s",
			Prefix, action, Prefix, hypervisor.TimeoutAbort)
	}
	p := hypervisor.MigrationPolicy{
		CompletionTimeoutPerGiB: m.CompletionTimeoutPerGiB,
		ProgressTimeout:         m.ProgressTimeout,
		TimeoutAction:           action,
		AllowPostCopy:           m.AllowPostCopy,
		AllowAutoConverge:       m.AllowAutoConverge,
		MaxDowntime:             m.MaxDowntime,
		BandwidthMiBs:           uint64(m.BandwidthMiBs),
	}
	// The checks above name the variables; this one guards against their
	// drifting from the driver's.
	if err := p.Validate(); err != nil {
		return hypervisor.MigrationPolicy{}, fmt.Errorf("config: %w", err)
	}
	return p, nil
}
