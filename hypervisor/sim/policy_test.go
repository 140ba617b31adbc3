package sim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/hypervisor"
)

// These tests run the copy in its own time: Sleep returns at once, and the
// policy's timeouts count the copy's steps, so a migration that would take
// a minute ends in milliseconds.

// noWait is a Sleep that does not wait.
func noWait(ctx context.Context, _ time.Duration) error { return ctx.Err() }

// policyLatency is the migrate latency of policyEnv's h1, longer than the
// 10s completion timeout the tests give its 512 MiB guest.
const policyLatency = time.Minute

// policyEnv is an env whose migrations from h1 last policyLatency, with a
// running guest "a" (512 MiB) on h1. It returns the guest's XML there.
func policyEnv(t *testing.T) (*env, string) {
	t.Helper()
	e := newEnv(t, Options{Sleep: noWait})
	src := e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.SetLatency(e.ctx, "h1", OpMigrate, policyLatency); err != nil {
		t.Fatalf("SetLatency(h1, migrate, %s): %v", policyLatency, err)
	}
	return e, src
}

// policyReq is a migration of guest a from h1 to h2 under p.
func policyReq(p hypervisor.MigrationPolicy) hypervisor.MigrateRequest {
	req := migrateReq("h1", "h2", uuidA, domainXML(uuidA, "a", 6, 1))
	req.Policy = p
	return req
}

// stayedOnSource fails unless guest a runs on h1 alone, unchanged, with no
// migration record left.
func (e *env) stayedOnSource(what, src string) {
	e.t.Helper()
	want := map[string]where{"h1": {hypervisor.StateRunning, src}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		e.t.Errorf("%s: placement mismatch (-want +got):\n%s", what, diff)
	}
	if rec := e.migrationRecord(uuidA); len(rec) != 0 {
		e.t.Errorf("%s: migration record %v, want none", what, rec)
	}
}

// movedToDest fails unless guest a runs on h2 alone, with the destination
// XML of policyReq.
func (e *env) movedToDest(what string) {
	e.t.Helper()
	want := map[string]where{"h2": {hypervisor.StateRunning, domainXML(uuidA, "a", 6, 1)}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		e.t.Errorf("%s: placement mismatch (-want +got):\n%s", what, diff)
	}
}

// timeoutOf returns the timeout err carries, failing the test unless err is
// a 'sim: migrate' error matching ErrMigrationTimeout.
func timeoutOf(t *testing.T, what string, err error) *hypervisor.MigrationTimeoutError {
	t.Helper()
	var to *hypervisor.MigrationTimeoutError
	if !errors.Is(err, hypervisor.ErrMigrationTimeout) || !errors.As(err, &to) || !strings.HasPrefix(err.Error(), "sim: migrate ") {
		t.Fatalf("%s: %v; want a 'sim: migrate' error matching ErrMigrationTimeout", what, err)
	}
	return to
}

func TestMigratePolicyCompletionTimeoutAborts(t *testing.T) {
	// The copy would last a minute; the completion timeout of a guest
	// under 1 GiB is 10s.
	e, src := policyEnv(t)
	p := hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: 10 * time.Second}
	var log progressLog
	err := e.d.Migrate(e.ctx, policyReq(p), log.add)
	to := timeoutOf(t, "Migrate slower than its completion timeout", err)
	if to.Timeout != hypervisor.TimeoutCompletion || to.Limit != 10*time.Second || to.Memory != 512<<20 {
		t.Errorf("Migrate slower than its completion timeout: timeout %s after %s for %d bytes, want completion after 10s for %d", to.Timeout, to.Limit, to.Memory, 512<<20)
	}
	if !strings.Contains(err.Error(), "aborted: not completed within 10s") || !strings.Contains(err.Error(), "the guest stays on the source") {
		t.Errorf("Migrate slower than its completion timeout: %q; want it to say the migration was aborted after 10s and the guest stays on the source", err)
	}
	if n := len(log.all()); n != int(10*time.Second/stepInterval) {
		t.Errorf("Migrate slower than its completion timeout: %d progress reports, want one per %s step of the 10s", n, stepInterval)
	}
	e.stayedOnSource("after a completion timeout", src)

	// Nothing is left that would block the guest: with a short enough
	// latency it moves.
	if err := e.d.SetLatency(e.ctx, "h1", OpMigrate, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Migrate(e.ctx, policyReq(p), nil); err != nil {
		t.Fatalf("Migrate after a completion timeout: %v, want nil", err)
	}
	e.movedToDest("after a completion timeout and a new migration")
}

func TestMigratePolicyPostCopyCompletes(t *testing.T) {
	e, _ := policyEnv(t)
	p := hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: 10 * time.Second, AllowPostCopy: true, TimeoutAction: hypervisor.TimeoutPostCopy}
	req := policyReq(p)
	f := &fenceLog{}
	req.Fence = f.fence
	// Past the switch nothing can abort the migration, not even a cancel.
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	var log progressLog
	err := e.d.Migrate(ctx, req, func(pr hypervisor.Progress) {
		log.add(pr)
		if pr.Phase == ProgressPostCopy {
			cancel()
		}
	})
	if err != nil {
		t.Fatalf("Migrate that switches to post-copy: %v, want nil", err)
	}
	e.movedToDest("after a switch to post-copy")
	if n := f.count(); n != 2 {
		t.Errorf("Migrate that switches to post-copy called its fence %d times, want 2 (before the start, before the switch)", n)
	}
	seen := log.all()
	var phases []string
	for _, pr := range seen {
		if len(phases) == 0 || phases[len(phases)-1] != pr.Phase {
			phases = append(phases, pr.Phase)
		}
	}
	if diff := cmp.Diff([]string{ProgressCopying, ProgressPostCopy, ProgressCompleted}, phases); diff != "" {
		t.Errorf("Migrate that switches to post-copy: progress phases mismatch (-want +got):\n%s", diff)
	}
	// The pull fetches what remained at the switch, step by step.
	var pulled []hypervisor.Progress
	for _, pr := range seen {
		if pr.Phase == ProgressPostCopy {
			pulled = append(pulled, pr)
		}
	}
	for i := 1; i < len(pulled); i++ {
		if pulled[i].DataRemaining >= pulled[i-1].DataRemaining {
			t.Errorf("post-copy report %d %+v after %+v, want less remaining", i, pulled[i], pulled[i-1])
			break
		}
	}
	if last := pulled[len(pulled)-1]; last.DataRemaining != 0 {
		t.Errorf("last post-copy report %+v, want nothing remaining", last)
	}
}

func TestMigratePolicyPostCopyFenced(t *testing.T) {
	e, src := policyEnv(t)
	p := hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: 10 * time.Second, AllowPostCopy: true, TimeoutAction: hypervisor.TimeoutPostCopy}
	req := policyReq(p)
	f := &fenceLog{}
	req.Fence = f.fence
	var log progressLog
	err := e.d.Migrate(e.ctx, req, func(pr hypervisor.Progress) {
		log.add(pr)
		// The claim goes while the copy runs; only the switch sees it.
		f.fail()
	})
	checkFenced(t, "Migrate whose fence refuses the switch to post-copy", err)
	to := timeoutOf(t, "Migrate whose fence refuses the switch to post-copy", err)
	if to.Timeout != hypervisor.TimeoutCompletion || !errors.Is(to.NoPostCopy, hypervisor.ErrFenced) {
		t.Errorf("Migrate whose fence refuses the switch to post-copy: timeout %s, no post-copy because %v; want completion, and the fence", to.Timeout, to.NoPostCopy)
	}
	if !strings.Contains(err.Error(), "before the switch to post-copy") {
		t.Errorf("Migrate whose fence refuses the switch to post-copy: %q; want it to say where the fence refused", err)
	}
	if n := f.count(); n != 2 {
		t.Errorf("Migrate whose fence refuses the switch to post-copy called it %d times, want 2", n)
	}
	for _, pr := range log.all() {
		if pr.Phase != ProgressCopying {
			t.Errorf("Migrate whose fence refuses the switch to post-copy reported %+v; want only copying", pr)
			break
		}
	}
	e.stayedOnSource("after a refused switch to post-copy", src)
}

func TestMigratePolicyConvergence(t *testing.T) {
	// Each case starts from a guest that dirties memory faster than it is
	// sent, or sent faster than the cap allows, and says whether a knob
	// makes the migration converge before the 20s progress timeout.
	tests := []struct {
		name      string
		rates     Rates
		policy    hypervisor.MigrationPolicy
		converges bool
	}{
		{"dirtying faster than sending never converges", Rates{TransferMiBs: 100, DirtyMiBs: 150}, hypervisor.MigrationPolicy{}, false},
		{"auto-converge slows the guest until it does", Rates{TransferMiBs: 100, DirtyMiBs: 150}, hypervisor.MigrationPolicy{AllowAutoConverge: true}, true},
		{"a longer downtime lets it switch over with more to send", Rates{TransferMiBs: 100, DirtyMiBs: 150}, hypervisor.MigrationPolicy{MaxDowntime: 6 * time.Second}, true},
		{"a fast link outruns the guest", Rates{TransferMiBs: 1000, DirtyMiBs: 150}, hypervisor.MigrationPolicy{}, true},
		{"a bandwidth cap below the dirty rate keeps it from converging", Rates{TransferMiBs: 1000, DirtyMiBs: 150}, hypervisor.MigrationPolicy{BandwidthMiBs: 100}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, src := policyEnv(t)
			if err := e.d.SetRates(e.ctx, "h1", tt.rates); err != nil {
				t.Fatal(err)
			}
			p := tt.policy
			p.ProgressTimeout = 20 * time.Second
			var log progressLog
			err := e.d.Migrate(e.ctx, policyReq(p), log.add)
			if tt.converges {
				if err != nil {
					t.Fatalf("Migrate with %+v under %+v: %v, want nil", tt.rates, tt.policy, err)
				}
				e.movedToDest("after the migration")
				return
			}
			if to := timeoutOf(t, "Migrate", err); to.Timeout != hypervisor.TimeoutProgress {
				t.Errorf("Migrate with %+v under %+v: %v, want a progress timeout", tt.rates, tt.policy, err)
			}
			e.stayedOnSource("after the migration", src)
			// What a step sends is capped by the bandwidth.
			rate := tt.rates.TransferMiBs
			if tt.policy.BandwidthMiBs > 0 {
				rate = min(rate, float64(tt.policy.BandwidthMiBs))
			}
			limit := rate * mib * stepInterval.Seconds()
			var before uint64
			for _, pr := range log.all() {
				if sent := pr.DataProcessed - before; float64(sent) > limit {
					t.Errorf("a step sent %d bytes, more than the %g a step may at the rate and cap", sent, limit)
					break
				}
				before = pr.DataProcessed
			}
		})
	}
}

func TestMigratePolicyRejected(t *testing.T) {
	e, src := policyEnv(t)
	tests := []struct {
		name   string
		policy hypervisor.MigrationPolicy
		want   string
	}{
		{"post-copy action without post-copy", hypervisor.MigrationPolicy{TimeoutAction: hypervisor.TimeoutPostCopy}, "timeout action post-copy needs post-copy allowed"},
		{"unknown action", hypervisor.MigrationPolicy{TimeoutAction: "pause"}, `timeout action "pause": allowed are abort or post-copy`},
		{"negative timeout", hypervisor.MigrationPolicy{ProgressTimeout: -time.Second}, "progress timeout -1s"},
	}
	for _, tt := range tests {
		err := e.d.Migrate(e.ctx, policyReq(tt.policy), nil)
		if !errors.Is(err, hypervisor.ErrRejected) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Migrate with %s: %v; want ErrRejected containing %q", tt.name, err, tt.want)
		}
	}
	e.stayedOnSource("after the refused migrations", src)
}

func TestRatesSettings(t *testing.T) {
	e := newEnv(t, Options{})
	for _, err := range []error{
		e.d.SetRates(e.ctx, "", Rates{TransferMiBs: 1000}),
		e.d.SetRates(e.ctx, "h2", Rates{TransferMiBs: 100, DirtyMiBs: 12.5}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	s, err := e.d.Settings(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*Rates{"": s.Rates, "h1": s.Hosts["h1"].Rates, "h2": s.Hosts["h2"].Rates}
	want := map[string]*Rates{"": {TransferMiBs: 1000}, "h1": nil, "h2": {TransferMiBs: 100, DirtyMiBs: 12.5}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Settings rates mismatch (-want +got):\n%s", diff)
	}
	for host, want := range map[string]*Rates{"h1": {TransferMiBs: 1000}, "h2": {TransferMiBs: 100, DirtyMiBs: 12.5}} {
		if got, err := e.d.ratesOf(e.ctx, host); err != nil || !cmp.Equal(got, want) {
			t.Errorf("rates of migrations from %s = %+v, %v; want %+v (its own, else every host's)", host, got, err, want)
		}
	}
	if err := e.d.ClearRates(e.ctx, "h2"); err != nil {
		t.Fatal(err)
	}
	if err := e.d.ClearRates(e.ctx, ""); err != nil {
		t.Fatal(err)
	}
	if got, err := e.d.ratesOf(e.ctx, "h2"); err != nil || got != nil {
		t.Errorf("rates of h2 after ClearRates = %+v, %v; want none", got, err)
	}

	bad := []struct {
		host  string
		rates Rates
		want  string
	}{
		{"h1", Rates{}, "sim: set rates of h1: transfer 0 MiB/s, dirty 0 MiB/s: the transfer rate must be more than 0, the dirty rate 0 or more"},
		{"", Rates{TransferMiBs: 10, DirtyMiBs: -1}, "sim: set rates of every host: transfer 10 MiB/s, dirty -1 MiB/s: the transfer rate must be more than 0, the dirty rate 0 or more"},
		{"h9", Rates{TransferMiBs: 10}, "h9"},
	}
	for _, tt := range bad {
		if err := e.d.SetRates(e.ctx, tt.host, tt.rates); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("SetRates(%q, %+v) = %v, want an error containing %q", tt.host, tt.rates, err, tt.want)
		}
	}

	// A removed host takes its rates along.
	if err := e.d.SetRates(e.ctx, "h1", Rates{TransferMiBs: 5}); err != nil {
		t.Fatal(err)
	}
	if err := e.d.RemoveHost(e.ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	if n, err := e.rdb.Exists(e.ctx, e.d.ratesKey("h1")).Result(); err != nil || n != 0 {
		t.Errorf("rates key of a removed host: exists %d (%v), want gone", n, err)
	}
}
