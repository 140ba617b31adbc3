package hypervisor

import (
	"errors"
	"fmt"
	"time"
)

// MigrationPolicy bounds how long a live migration may run and says what
// may help it converge, as Nova's live_migration_* options and KubeVirt's
// migration configuration do. Its zero value sets no timeout and no
// bandwidth cap and leaves the hypervisor's defaults; DefaultMigrationPolicy
// is what an operator gets without configuring anything.
//
// A migration converges when the memory its guest dirties while it is
// copied can be sent within the allowed downtime. One whose guest dirties
// memory faster than it can be sent never does; the timeouts end it, by an
// abort that leaves the guest running on its source, or, when allowed, by
// a switch to post-copy that completes it on the destination.
type MigrationPolicy struct {
	// CompletionTimeoutPerGiB bounds the copy, from when the hypervisor
	// first reports data sent: it may run this long per GiB of guest
	// memory, a guest under 1 GiB counting as 1 GiB. 0: no bound. A loaded
	// host starts a copy late, and that is no sign the copy will not
	// converge; a copy that has not started by the longest of the two
	// timeouts and MinStartTimeout after the call fails (TimeoutStart).
	CompletionTimeoutPerGiB time.Duration
	// ProgressTimeout bounds how long the data remaining may go without
	// falling below its lowest figure so far, from the copy's start; a
	// migration whose guest dirties memory as fast as it is sent stops
	// making progress. 0: no bound.
	ProgressTimeout time.Duration
	// TimeoutAction is what a timeout does: TimeoutAbort (also when empty)
	// or TimeoutPostCopy, which needs AllowPostCopy.
	TimeoutAction TimeoutAction
	// AllowPostCopy starts the migration able to switch to post-copy
	// (libvirt's VIR_MIGRATE_POSTCOPY). It does not switch by itself:
	// TimeoutAction post-copy does.
	AllowPostCopy bool
	// AllowAutoConverge lets the hypervisor slow the guest's vCPUs down
	// when the migration does not converge (VIR_MIGRATE_AUTO_CONVERGE),
	// so that it dirties memory more slowly.
	AllowAutoConverge bool
	// MaxDowntime is the longest the guest may be paused for the final
	// switchover of a pre-copy migration; a longer one lets a busier
	// guest converge. 0: the hypervisor's default, 300ms for QEMU.
	MaxDowntime time.Duration
	// BandwidthMiBs caps the migration's transfer rate, in MiB/s, before
	// and after a switch to post-copy. 0: no cap.
	BandwidthMiBs uint64
}

// TimeoutAction is what a MigrationPolicy timeout does to the migration.
type TimeoutAction string

// The timeout actions.
const (
	// TimeoutAbort aborts the migration: the guest stays on its source.
	TimeoutAbort TimeoutAction = "abort"
	// TimeoutPostCopy switches the migration to post-copy: the guest runs
	// on the destination at once and fetches the memory still on the
	// source as it touches it, so the migration completes. Past the
	// switch it cannot be aborted, and a failure of either host or of the
	// network between them loses the guest. A copy that never started
	// cannot switch: the start timeout aborts it.
	TimeoutPostCopy TimeoutAction = "post-copy"
)

// Defaults of DefaultMigrationPolicy, those of KubeVirt.
const (
	DefaultCompletionTimeoutPerGiB = 150 * time.Second
	DefaultProgressTimeout         = 150 * time.Second
)

// MinStartTimeout is the least time a policy with a timeout gives a copy
// to start: QEMU sets a migration up (capabilities, the destination's
// QEMU, the connection) before it sends anything, slowly on a loaded host,
// and a small guest's completion timeout is no bound for that.
const MinStartTimeout = 2 * time.Minute

// DefaultMigrationPolicy aborts a migration that runs longer than 150s per
// GiB of guest memory or makes no progress for 150s, and uses neither
// post-copy nor auto-converge, since both change how the guest runs.
var DefaultMigrationPolicy = MigrationPolicy{
	CompletionTimeoutPerGiB: DefaultCompletionTimeoutPerGiB,
	ProgressTimeout:         DefaultProgressTimeout,
	TimeoutAction:           TimeoutAbort,
}

// ParseTimeoutAction reads a timeout action, "abort" or "post-copy".
func ParseTimeoutAction(s string) (TimeoutAction, error) {
	switch a := TimeoutAction(s); a {
	case TimeoutAbort, TimeoutPostCopy:
		return a, nil
	}
	return "", fmt.Errorf("timeout action %q: allowed are %s or %s", s, TimeoutAbort, TimeoutPostCopy)
}

// Validate says what is wrong with the policy, naming the bad value.
func (p MigrationPolicy) Validate() error {
	if p.CompletionTimeoutPerGiB < 0 || p.ProgressTimeout < 0 || p.MaxDowntime < 0 {
		return fmt.Errorf("migration policy: completion timeout per GiB %s, progress timeout %s, max downtime %s: must be 0 or more",
			p.CompletionTimeoutPerGiB, p.ProgressTimeout, p.MaxDowntime)
	}
	if p.TimeoutAction == "" {
		return nil
	}
	if _, err := ParseTimeoutAction(string(p.TimeoutAction)); err != nil {
		return fmt.Errorf("migration policy: %w", err)
	}
	if p.TimeoutAction == TimeoutPostCopy && !p.AllowPostCopy {
		return fmt.Errorf("migration policy: timeout action %s needs post-copy allowed", TimeoutPostCopy)
	}
	return nil
}

// PostCopyOnTimeout says whether a timeout switches to post-copy rather
// than aborting.
func (p MigrationPolicy) PostCopyOnTimeout() bool {
	return p.TimeoutAction == TimeoutPostCopy && p.AllowPostCopy
}

// CompletionTimeout is how long a migration of a guest with memory bytes
// may run; 0 means no bound.
func (p MigrationPolicy) CompletionTimeout(memory uint64) time.Duration {
	gib := max(float64(memory)/(1<<30), 1)
	return time.Duration(float64(p.CompletionTimeoutPerGiB) * gib)
}

// ErrMigrationTimeout: a live migration ran past a timeout of its
// MigrationPolicy and was aborted; the guest runs on its source. The same
// migration under the same policy would time out again, so it is not
// worth retrying. A *MigrationTimeoutError says which timeout it was.
var ErrMigrationTimeout = errors.New("migration timed out")

// The timeouts of a MigrationPolicy, as MigrationTimeoutError names them.
const (
	TimeoutCompletion = "completion"
	TimeoutProgress   = "progress"
	// TimeoutStart: the copy did not start (no data sent) within the
	// start timeout of the migration's call (MigrationTimer).
	TimeoutStart = "start"
)

// MigrationTimeoutError is the error of a migration a timeout of its
// policy aborted. It matches ErrMigrationTimeout, and unwraps to NoPostCopy.
type MigrationTimeoutError struct {
	// Timeout is TimeoutCompletion, TimeoutProgress or TimeoutStart.
	Timeout string
	// Limit is the timeout that was reached: the completion timeout for
	// the guest's memory, or the progress timeout.
	Limit time.Duration
	// Memory is the guest's memory in bytes.
	Memory uint64
	// DataRemaining is the data left to send at the last report, and
	// LowestRemaining the least it had been (the progress timeout's
	// mark); both 0 when the hypervisor reported none.
	DataRemaining, LowestRemaining uint64
	// NoPostCopy, when set, is why the migration was aborted instead of
	// switched to post-copy as the policy asked: a fence that refused the
	// switch, or the hypervisor refusing it.
	NoPostCopy error
}

// Error says which timeout fired, with the figures an operator needs to
// choose another policy.
func (e *MigrationTimeoutError) Error() string {
	figures := "no data reported yet"
	switch {
	case e.DataRemaining == 0 && e.LowestRemaining == 0:
	case e.DataRemaining > e.LowestRemaining:
		figures = fmt.Sprintf("data remaining %s, lowest %s", formatBytes(e.DataRemaining), formatBytes(e.LowestRemaining))
	default:
		figures = "data remaining " + formatBytes(e.DataRemaining)
	}
	what := fmt.Sprintf("not completed within %s, the completion timeout of a guest with %s of memory (%s)", seconds(e.Limit), formatBytes(e.Memory), figures)
	switch e.Timeout {
	case TimeoutProgress:
		what = fmt.Sprintf("no progress for %s (%s)", seconds(e.Limit), figures)
	case TimeoutStart:
		what = fmt.Sprintf("the copy had not started within %s of the migration's start", seconds(e.Limit))
	}
	if e.NoPostCopy != nil {
		return fmt.Sprintf("aborted: %s, and the switch to post-copy failed: %v; the guest stays on the source", what, e.NoPostCopy)
	}
	return fmt.Sprintf("aborted: %s; the guest stays on the source", what)
}

// Is makes the error match ErrMigrationTimeout.
func (e *MigrationTimeoutError) Is(target error) bool { return target == ErrMigrationTimeout }

// Unwrap returns why post-copy was not used, or nil.
func (e *MigrationTimeoutError) Unwrap() error { return e.NoPostCopy }

// MigrationTimer watches one migration for the timeouts of its policy.
// Drivers feed it every progress report with the time since the start.
type MigrationTimer struct {
	policy     MigrationPolicy
	memory     uint64
	completion time.Duration
	remaining  uint64
	lowest     uint64
	// copying is set from the first report of data sent, at copyAt.
	copying bool
	copyAt  time.Duration
	// lowAt is when the data remaining last fell below its lowest
	// figure, or the copy's start.
	lowAt  time.Duration
	hasLow bool
}

// Timer starts watching a migration of a guest with memory bytes.
func (p MigrationPolicy) Timer(memory uint64) *MigrationTimer {
	return &MigrationTimer{policy: p, memory: memory, completion: p.CompletionTimeout(memory)}
}

// Observe takes the progress at elapsed since the migration's call and
// returns the timeout it brought about, or nil. The completion and
// progress timeouts count from the first report of data sent (the copy's
// start, however late a loaded host starts it); before it only the start
// timeout counts. A figure of nothing remaining is no low: QEMU reports
// it between two passes over memory, and taking it for the lowest would
// leave no later figure lower.
func (t *MigrationTimer) Observe(elapsed time.Duration, p Progress) *MigrationTimeoutError {
	fired := func(which string, limit time.Duration) *MigrationTimeoutError {
		return &MigrationTimeoutError{Timeout: which, Limit: limit, Memory: t.memory, DataRemaining: t.remaining, LowestRemaining: t.lowest}
	}
	if p.DataProcessed > 0 {
		t.CopyStarted(elapsed)
	}
	if !t.copying {
		if limit := t.startLimit(); limit > 0 && elapsed >= limit {
			return fired(TimeoutStart, limit)
		}
		return nil
	}
	if p.DataTotal > 0 && p.DataRemaining > 0 {
		t.remaining = p.DataRemaining
		if !t.hasLow || p.DataRemaining < t.lowest {
			t.lowest, t.lowAt, t.hasLow = p.DataRemaining, elapsed, true
		}
	}
	if t.policy.CompletionTimeoutPerGiB > 0 && elapsed-t.copyAt >= t.completion {
		return fired(TimeoutCompletion, t.completion)
	}
	if t.policy.ProgressTimeout > 0 && elapsed-t.lowAt >= t.policy.ProgressTimeout {
		return fired(TimeoutProgress, t.policy.ProgressTimeout)
	}
	return nil
}

// CopyStarted marks the copy's start at elapsed since the call, for a
// driver that starts it itself; others leave it to Observe. A later mark
// changes nothing.
func (t *MigrationTimer) CopyStarted(elapsed time.Duration) {
	if !t.copying {
		t.copying, t.copyAt, t.lowAt = true, elapsed, elapsed
	}
}

// Copying says whether the copy has started: only then can a migration
// switch to post-copy.
func (t *MigrationTimer) Copying() bool { return t.copying }

// startLimit is how long the copy may take to start: the longest of the
// completion timeout, the progress timeout and MinStartTimeout, for a
// policy with either timeout; 0: no bound.
func (t *MigrationTimer) startLimit() time.Duration {
	var limit time.Duration
	if t.policy.CompletionTimeoutPerGiB > 0 {
		limit = t.completion
	}
	limit = max(limit, t.policy.ProgressTimeout)
	if limit == 0 {
		return 0
	}
	return max(limit, MinStartTimeout)
}

// formatBytes formats a byte count for people: "512 MiB", "1.2 GiB".
func formatBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	s := fmt.Sprintf("%.1f", v)
	if v >= 100 || s[len(s)-2:] == ".0" {
		s = fmt.Sprintf("%.0f", v)
	}
	return s + " " + []string{"KiB", "MiB", "GiB", "TiB", "PiB"}[i]
}

// seconds formats a duration of whole seconds as "150s", as operators
// configure timeouts, and any other as time.Duration does.
func seconds(d time.Duration) string {
	if d >= time.Second && d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}
