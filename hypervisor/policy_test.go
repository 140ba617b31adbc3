package hypervisor

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestMigrationPolicyValidate(t *testing.T) {
	tests := []struct {
		name    string
		policy  MigrationPolicy
		wantErr string // empty: valid
	}{
		{"zero", MigrationPolicy{}, ""},
		{"default", DefaultMigrationPolicy, ""},
		{"post-copy allowed and asked for", MigrationPolicy{AllowPostCopy: true, TimeoutAction: TimeoutPostCopy}, ""},
		{"post-copy asked for, not allowed", MigrationPolicy{TimeoutAction: TimeoutPostCopy}, "timeout action post-copy needs post-copy allowed"},
		{"unknown action", MigrationPolicy{TimeoutAction: "pause"}, `timeout action "pause": allowed are abort or post-copy`},
		{"negative downtime", MigrationPolicy{MaxDowntime: -time.Millisecond}, "max downtime -1ms: must be 0 or more"},
	}
	for _, tt := range tests {
		err := tt.policy.Validate()
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("Validate(%s) = %v, want %q", tt.name, err, tt.wantErr)
		}
	}
}

func TestCompletionTimeout(t *testing.T) {
	p := MigrationPolicy{CompletionTimeoutPerGiB: 150 * time.Second}
	tests := []struct {
		memory uint64
		want   time.Duration
	}{
		{0, 150 * time.Second},
		{128 << 20, 150 * time.Second},
		{1 << 30, 150 * time.Second},
		{3 << 29, 225 * time.Second},
		{64 << 30, 64 * 150 * time.Second},
	}
	for _, tt := range tests {
		if got := p.CompletionTimeout(tt.memory); got != tt.want {
			t.Errorf("CompletionTimeout(%s) = %s, want %s", formatBytes(tt.memory), got, tt.want)
		}
	}
}

// TestMigrationTimer feeds a timer the reports of a migration and checks
// which timeout fires when.
func TestMigrationTimer(t *testing.T) {
	const gib = 1 << 30
	report := func(remaining uint64) Progress {
		return Progress{DataTotal: gib, DataProcessed: gib - remaining, DataRemaining: remaining, Phase: "migrating"}
	}
	tests := []struct {
		name    string
		policy  MigrationPolicy
		reports []Progress // one a second, from 1s on
		fires   int        // the report that fires, from 1; 0: none
		want    MigrationTimeoutError
	}{
		{
			name:    "falling data remaining is progress",
			policy:  MigrationPolicy{ProgressTimeout: 2 * time.Second},
			reports: []Progress{report(900), report(800), report(700), report(600), report(500)},
		},
		{
			name:    "a new low resets the progress clock",
			policy:  MigrationPolicy{ProgressTimeout: 3 * time.Second},
			reports: []Progress{report(900), report(950), report(990), report(890), report(990), report(990), report(990)},
			fires:   7,
			want:    MigrationTimeoutError{Timeout: TimeoutProgress, Limit: 3 * time.Second, Memory: gib, DataRemaining: 990, LowestRemaining: 890},
		},
		{
			name:    "nothing remaining between two passes is no low",
			policy:  MigrationPolicy{ProgressTimeout: 3 * time.Second},
			reports: []Progress{report(900), report(0), report(850), report(800), report(800), report(800)},
			fires:   0,
		},
		{
			name:    "nothing remaining does not hide a stall",
			policy:  MigrationPolicy{ProgressTimeout: 2 * time.Second},
			reports: []Progress{report(900), report(0), report(950)},
			fires:   3,
			want:    MigrationTimeoutError{Timeout: TimeoutProgress, Limit: 2 * time.Second, Memory: gib, DataRemaining: 950, LowestRemaining: 900},
		},
		{
			name:    "a copy not started yet is timed by neither timeout",
			policy:  MigrationPolicy{CompletionTimeoutPerGiB: time.Second, ProgressTimeout: time.Second},
			reports: []Progress{{Phase: "setup"}, {Phase: "setup"}, {DataTotal: gib, Phase: "setup"}, {Phase: "setup"}},
		},
		{
			name:   "the timeouts count from the copy's start, however late",
			policy: MigrationPolicy{CompletionTimeoutPerGiB: 4 * time.Second, ProgressTimeout: 2 * time.Second},
			// Data is first sent at 4 s: the completion timeout fires 4 s
			// later, not at 4 s.
			reports: []Progress{{Phase: "setup"}, {Phase: "setup"}, {DataTotal: gib, Phase: "setup"}, report(900), report(800), report(700), report(600), report(500)},
			fires:   8,
			want:    MigrationTimeoutError{Timeout: TimeoutCompletion, Limit: 4 * time.Second, Memory: gib, DataRemaining: 500, LowestRemaining: 500},
		},

		{
			name:    "completion fires first when both are due",
			policy:  MigrationPolicy{CompletionTimeoutPerGiB: 3 * time.Second, ProgressTimeout: 3 * time.Second},
			reports: []Progress{report(500), report(500), report(500), report(500)},
			fires:   4,
			want:    MigrationTimeoutError{Timeout: TimeoutCompletion, Limit: 3 * time.Second, Memory: gib, DataRemaining: 500, LowestRemaining: 500},
		},
		{
			name:    "zero timeouts never fire",
			policy:  MigrationPolicy{},
			reports: []Progress{report(500), report(500), report(500), report(500)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			timer := tt.policy.Timer(gib)
			for i, p := range tt.reports {
				got := timer.Observe(time.Duration(i+1)*time.Second, p)
				switch {
				case got == nil && i+1 == tt.fires:
					t.Fatalf("report %d (%+v): no timeout, want %+v", i+1, p, tt.want)
				case got != nil && i+1 != tt.fires:
					t.Fatalf("report %d (%+v): timeout %+v, want none yet", i+1, p, got)
				case got != nil && *got != tt.want:
					t.Fatalf("report %d: timeout %+v, want %+v", i+1, *got, tt.want)
				}
			}
		})
	}
}

// TestMigrationStartTimeout: a copy that never starts fails after the
// longest of the policy's timeouts and MinStartTimeout, and a policy
// without timeouts waits for it forever.
func TestMigrationStartTimeout(t *testing.T) {
	const gib = 1 << 30
	setup := Progress{DataTotal: gib, Phase: "setup"}
	for _, tt := range []struct {
		name   string
		policy MigrationPolicy
		limit  time.Duration
	}{
		{"small timeouts", MigrationPolicy{CompletionTimeoutPerGiB: 4 * time.Second, ProgressTimeout: 8 * time.Second}, MinStartTimeout},
		{"a long completion timeout", MigrationPolicy{CompletionTimeoutPerGiB: 10 * time.Minute}, 10 * time.Minute},
		{"a long progress timeout", MigrationPolicy{ProgressTimeout: 5 * time.Minute}, 5 * time.Minute},
		{"no timeouts", MigrationPolicy{}, 0},
	} {
		timer := tt.policy.Timer(gib)
		if tt.limit == 0 {
			if got := timer.Observe(24*time.Hour, setup); got != nil {
				t.Errorf("%s: a day without a copy: %v, want no timeout", tt.name, got)
			}
			continue
		}
		if got := timer.Observe(tt.limit-time.Second, setup); got != nil {
			t.Errorf("%s: %s without a copy: %v, want no timeout yet", tt.name, tt.limit-time.Second, got)
		}
		want := MigrationTimeoutError{Timeout: TimeoutStart, Limit: tt.limit, Memory: gib}
		if got := timer.Observe(tt.limit, setup); got == nil || *got != want {
			t.Errorf("%s: %s without a copy: %+v, want %+v", tt.name, tt.limit, got, want)
		}
		if timer.Copying() {
			t.Errorf("%s: Copying() before any data was sent", tt.name)
		}
	}
}

func TestMigrationTimeoutError(t *testing.T) {
	fenced := errors.New("fenced")
	tests := []struct {
		err  *MigrationTimeoutError
		want string
	}{
		{&MigrationTimeoutError{Timeout: TimeoutProgress, Limit: 150 * time.Second, DataRemaining: 1288490189, LowestRemaining: 1288490189},
			"aborted: no progress for 150s (data remaining 1.2 GiB); the guest stays on the source"},
		{&MigrationTimeoutError{Timeout: TimeoutProgress, Limit: 150 * time.Second, DataRemaining: 15 << 20, LowestRemaining: 1700 << 10},
			"aborted: no progress for 150s (data remaining 15 MiB, lowest 1.7 MiB); the guest stays on the source"},
		{&MigrationTimeoutError{Timeout: TimeoutCompletion, Limit: 1500 * time.Millisecond, Memory: 10 << 30, DataRemaining: 512 << 20, LowestRemaining: 512 << 20, NoPostCopy: fenced},
			"aborted: not completed within 1.5s, the completion timeout of a guest with 10 GiB of memory (data remaining 512 MiB), and the switch to post-copy failed: fenced; the guest stays on the source"},
		{&MigrationTimeoutError{Timeout: TimeoutProgress, Limit: time.Minute},
			"aborted: no progress for 60s (no data reported yet); the guest stays on the source"},
		{&MigrationTimeoutError{Timeout: TimeoutStart, Limit: 150 * time.Second, Memory: 1 << 30},
			"aborted: the copy had not started within 150s of the migration's start; the guest stays on the source"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("%+v.Error() =\n  %q, want\n  %q", *tt.err, got, tt.want)
		}
		if !errors.Is(tt.err, ErrMigrationTimeout) {
			t.Errorf("%+v does not match ErrMigrationTimeout", *tt.err)
		}
		if got := errors.Is(tt.err, fenced); got != (tt.err.NoPostCopy != nil) {
			t.Errorf("errors.Is(%+v, its NoPostCopy) = %v", *tt.err, got)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 1536: "1.5 KiB", 128 << 20: "128 MiB", 1288490189: "1.2 GiB", 3 << 40: "3 TiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
