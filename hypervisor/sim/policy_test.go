package sim

import (
	"context"
	"errors"
	"fmt"
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

// TestMigratePolicyCountsFromTheCopysStart: a copy whose start is held at
// the copy gate and then starts past the completion timeout (30s late,
// within the start timeout), and itself lasts 8s, completes under a 10s
// completion timeout: the timeout counts the copy, not the wait before it.
func TestMigratePolicyCountsFromTheCopysStart(t *testing.T) {
	e, _ := policyEnv(t)
	if err := e.d.SetLatency(e.ctx, "h1", OpMigrate, 8*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := e.d.SetCopyStartDelay(e.ctx, "h1", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := e.d.HoldGate(e.ctx, GateCopy, uuidA); err != nil {
		t.Fatal(err)
	}
	p := hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: 10 * time.Second}
	var log progressLog
	done := make(chan error, 1)
	go func() { done <- e.d.Migrate(e.ctx, policyReq(p), log.add) }()
	if _, err := e.d.AwaitGate(e.ctx, GateCopy, uuidA, func(st GateState) bool { return st.Arrived == 1 }); err != nil {
		t.Fatal(err)
	}
	if got := log.all(); len(got) != 0 {
		t.Errorf("Migrate held before its copy reported %v, want nothing yet", got)
	}
	if err := e.d.ReleaseGate(e.ctx, GateCopy, uuidA); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Migrate whose copy started 30s late and lasted 8s, under a 10s completion timeout: %v, want nil", err)
	}
	e.movedToDest("after a copy that started late")
	setup, copying := 0, 0
	for _, pr := range log.all() {
		switch pr.Phase {
		case ProgressSetup:
			setup++
		case ProgressCopying:
			copying++
		}
	}
	if want := int(30 * time.Second / stepInterval); setup != want || copying != int(8*time.Second/stepInterval) {
		t.Errorf("Migrate whose copy started late: %d setup and %d copying reports, want %d and %d", setup, copying, want, int(8*time.Second/stepInterval))
	}
}

// TestMigratePolicyCopyNeverStarts: a copy that has not started within
// the start timeout (the completion timeout, at least MinStartTimeout)
// fails by it, with its own line,
// and the guest stays on the source, also under a post-copy policy: only
// a copy under way can switch.
func TestMigratePolicyCopyNeverStarts(t *testing.T) {
	for _, p := range []hypervisor.MigrationPolicy{
		{CompletionTimeoutPerGiB: 10 * time.Second},
		{CompletionTimeoutPerGiB: 10 * time.Second, AllowPostCopy: true, TimeoutAction: hypervisor.TimeoutPostCopy},
	} {
		e, src := policyEnv(t)
		if err := e.d.SetCopyStartDelay(e.ctx, "", time.Hour); err != nil {
			t.Fatal(err)
		}
		err := e.d.Migrate(e.ctx, policyReq(p), nil)
		what := fmt.Sprintf("Migrate under %+v of a copy that never starts", p)
		to := timeoutOf(t, what, err)
		if to.Timeout != hypervisor.TimeoutStart || to.Limit != hypervisor.MinStartTimeout {
			t.Errorf("%s: timeout %s after %s, want start after %s", what, to.Timeout, to.Limit, hypervisor.MinStartTimeout)
		}
		if want := "aborted: the copy had not started within 120s of the migration's start; the guest stays on the source"; !strings.HasSuffix(err.Error(), want) {
			t.Errorf("%s: %q, want it to end %q", what, err, want)
		}
		e.stayedOnSource(what, src)
	}
}

func TestSetCopyStartDelayRefusesNegative(t *testing.T) {
	e := newEnv(t, Options{Sleep: noWait})
	err := e.d.SetCopyStartDelay(e.ctx, "", -time.Second)
	if err == nil || !strings.Contains(err.Error(), "-1s: must be 0 or more") {
		t.Errorf("SetCopyStartDelay(-1s) = %v, want it refused naming -1s", err)
	}
}
