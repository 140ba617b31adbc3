package config

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/hypervisor"
)

// TestMigrationPolicyDefaults: without any variable set, migrations run
// under hypervisor.DefaultMigrationPolicy.
func TestMigrationPolicyDefaults(t *testing.T) {
	c, err := Load()
	if err != nil {
		t.Fatalf("Load(): %v", err)
	}
	p, err := c.Migration.Policy()
	if err != nil {
		t.Fatalf("Migration.Policy() of the defaults: %v", err)
	}
	if diff := cmp.Diff(hypervisor.DefaultMigrationPolicy, p); diff != "" {
		t.Errorf("default migration policy mismatch (-want +got):\n%s", diff)
	}
}

// TestMigrationPolicyFromEnvironment: every variable reaches the policy.
func TestMigrationPolicyFromEnvironment(t *testing.T) {
	for k, v := range map[string]string{
		"MIGRATION_COMPLETION_TIMEOUT_PER_GIB": "800s",
		"MIGRATION_PROGRESS_TIMEOUT":           "0",
		"MIGRATION_TIMEOUT_ACTION":             "post-copy",
		"MIGRATION_ALLOW_POST_COPY":            "true",
		"MIGRATION_ALLOW_AUTO_CONVERGE":        "true",
		"MIGRATION_MAX_DOWNTIME":               "500ms",
		"MIGRATION_BANDWIDTH_MIBS":             "1024",
	} {
		t.Setenv(Prefix+"_"+k, v)
	}
	c, err := Load()
	if err != nil {
		t.Fatalf("Load(): %v", err)
	}
	p, err := c.Migration.Policy()
	if err != nil {
		t.Fatalf("Migration.Policy(): %v", err)
	}
	want := hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: 800 * time.Second, TimeoutAction: hypervisor.TimeoutPostCopy,
		AllowPostCopy: true, AllowAutoConverge: true, MaxDowntime: 500 * time.Millisecond, BandwidthMiBs: 1024}
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("migration policy mismatch (-want +got):\n%s", diff)
	}
}

// TestMigrationPolicyRejects: Load refuses a bad value with one line that
// names the variable, the value and what is allowed.
func TestMigrationPolicyRejects(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"unknown action", map[string]string{"MIGRATION_TIMEOUT_ACTION": "pause"},
			`config: PINFLOW_MIGRATION_TIMEOUT_ACTION "pause": allowed are abort or post-copy`},
		{"post-copy action without post-copy", map[string]string{"MIGRATION_TIMEOUT_ACTION": "post-copy"},
			"config: PINFLOW_MIGRATION_TIMEOUT_ACTION post-copy needs PINFLOW_MIGRATION_ALLOW_POST_COPY=true; set it, or use abort"},
		{"negative completion timeout", map[string]string{"MIGRATION_COMPLETION_TIMEOUT_PER_GIB": "-1s"},
			"config: PINFLOW_MIGRATION_COMPLETION_TIMEOUT_PER_GIB -1s: must be 0 or more (0: no limit)"},
		{"negative progress timeout", map[string]string{"MIGRATION_PROGRESS_TIMEOUT": "-150s"},
			"config: PINFLOW_MIGRATION_PROGRESS_TIMEOUT -2m30s: must be 0 or more (0: no limit)"},
		{"negative downtime", map[string]string{"MIGRATION_MAX_DOWNTIME": "-5ms"},
			"config: PINFLOW_MIGRATION_MAX_DOWNTIME -5ms: must be 0 or more (0: the hypervisor's default)"},
		{"negative bandwidth", map[string]string{"MIGRATION_BANDWIDTH_MIBS": "-1"},
			"config: PINFLOW_MIGRATION_BANDWIDTH_MIBS -1: must be 0 or more MiB/s (0: no cap)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(Prefix+"_"+k, v)
			}
			_, err := Load()
			if err == nil || err.Error() != tt.want {
				t.Errorf("Load() with %v = %v, want %q", tt.env, err, tt.want)
			}
		})
	}
}
