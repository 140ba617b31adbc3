package workflows

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/numa"
)

const uuid = "0b3c9d6e-1f2a-4b5c-8d7e-9f0a1b2c3d4e"

var flavor = guest.Flavor{VCPUs: 2, MemoryMB: 1024, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}

func active(host string) activities.InstanceInfo {
	return activities.InstanceInfo{UUID: uuid, Name: "vm", Host: host, VMState: guest.VMActive, Flavor: flavor, ClaimID: "boot-1"}
}

var placement = numa.Placement{Cells: []numa.PlacedCell{{HostCell: 0, DedicatedVCPUs: numa.MustParse("0-1"), Pins: map[int]int{0: 2, 1: 3}, MemoryMB: 1024, CPUPolicy: numa.CPUPolicyDedicated}}}

// harness is a test workflow environment whose activity mocks record the
// order in which they ran. Activities run on goroutines of their own, at
// once where a workflow runs several, hence the lock.
type harness struct {
	env     *testsuite.TestWorkflowEnvironment
	metrics *capturedMetrics
	mu      sync.Mutex
	calls   []string
}

func newHarness(t *testing.T) *harness {
	h := newBareHarness(t)
	// No guest of these tests is in a group with a disruption budget.
	h.env.OnActivity(a.TakeGroupSlot, mock.Anything, mock.Anything).Return(activities.GroupSlot{Taken: true}, nil).Maybe()
	return h
}

// loadedMachine is the test environments' deadlock detection timeout: on
// a machine busy with other work a workflow goroutine can wait for a CPU
// longer than the SDK's default second without any deadlock.
const loadedMachine = time.Minute

// newBareHarness is newHarness with no activity mocked.
func newBareHarness(t *testing.T) *harness {
	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	metrics := &capturedMetrics{}
	s.SetMetricsHandler(metricsCapture{to: metrics})
	h := &harness{env: s.NewTestWorkflowEnvironment(), metrics: metrics}
	h.env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: loadedMachine})
	h.env.RegisterActivity(&activities.Activities{})
	t.Cleanup(func() { h.env.AssertExpectations(t) })
	return h
}

// on mocks activity fn (a method value of a nil *Activities) to return
// results, and records its name when it runs.
func (h *harness) on(name string, fn any, results ...any) *testsuite.MockCallWrapper {
	return h.env.OnActivity(fn, mock.Anything, mock.Anything).Return(results...).Run(func(mock.Arguments) {
		h.record(name)
	})
}

// record notes that the activity name ran.
func (h *harness) record(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, name)
}

func (h *harness) sequence() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.calls, ",")
}

func failed(msg, typ string) error { return temporal.NewNonRetryableApplicationError(msg, typ, nil) }

func TestLiveMigrationCommits(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, active("a"), nil)
	h.on("choose", a.ChooseHost, "b", nil)
	h.on("task", a.SetTaskState, nil)
	h.on("claim", a.Claim, activities.ClaimResult{Host: "b", ClaimID: "c", Placement: placement}, nil)
	h.on("prepare", a.PrepareMigration, nil)
	h.on("migrate", a.Migrate, nil)
	h.on("commit", a.CommitMigration, nil)
	h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("LiveMigration: %v", err)
	}
	var res api.LiveMigrationResult
	if err := h.env.GetWorkflowResult(&res); err != nil || res.Source != "a" || res.Dest != "b" {
		t.Errorf("LiveMigration result = %+v, %v; want a -> b", res, err)
	}
	if got, want := h.sequence(), "load,choose,task,claim,prepare,migrate,commit"; got != want {
		t.Errorf("LiveMigration steps = %s, want %s", got, want)
	}
}

// TestLiveMigrationCompensations fails each step of a live migration and
// checks the compensations that ran and the failure's one line: which
// step, after how many attempts, why, and where the guest stayed.
func TestLiveMigrationCompensations(t *testing.T) {
	boom := errors.New("connection reset")
	stays := "; instance " + uuid + " stays on a"
	tests := []struct {
		name     string
		failAt   string
		want     string
		wantType string
		line     string
	}{
		{"no fit on the destination", "claim", "load,task,claim,release,task", api.ErrTypeNoFit,
			"connection reset" + stays},
		{"prepare refused", "prepare", "load,task,claim,prepare,rollback,release,task", api.ErrTypeRejected,
			"prepare the destination b failed: connection reset" + stays},
		{"migrate fails", "migrate", "load,task,claim,prepare,migrate,rollback,release,task", api.ErrTypeRejected,
			"live-migrate " + uuid + " from a to b failed: connection reset" + stays},
		{"migrate fails every try", "migrate", "load,task,claim,prepare,migrate,migrate,migrate,rollback,release,task", "",
			"live-migrate " + uuid + " from a to b failed after 3 attempts: connection reset" + stays},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			fault := failed(boom.Error(), tt.wantType)
			if tt.wantType == "" {
				// A fault a retry may clear: tried driverAttempts times.
				tt.wantType = "Transient"
				fault = temporal.NewApplicationError(boom.Error(), tt.wantType)
			}
			fail := func(step string, ok ...any) []any {
				if step == tt.failAt {
					return append(append([]any{}, ok[:len(ok)-1]...), fault)
				}
				return ok
			}
			h.on("load", a.LoadInstance, active("a"), nil)
			h.on("task", a.SetTaskState, nil)
			h.on("claim", a.Claim, fail("claim", activities.ClaimResult{Placement: placement}, nil)...)
			h.on("release", a.ReleaseClaim, nil)
			if tt.failAt != "claim" {
				h.on("prepare", a.PrepareMigration, fail("prepare", nil)...)
				h.on("rollback", a.RollbackMigration, activities.RollbackResult{}, nil)
			}
			if tt.failAt == "migrate" {
				h.on("migrate", a.Migrate, fail("migrate", nil)...)
			}
			h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid, Dest: "b"})
			var appErr *temporal.ApplicationError
			err := h.env.GetWorkflowError()
			if !errors.As(err, &appErr) || appErr.Type() != tt.wantType {
				t.Fatalf("LiveMigration error = %v, want type %s", err, tt.wantType)
			}
			if got := api.RootCause(err); got != tt.line {
				t.Errorf("failure line = %q\nwant           %q", got, tt.line)
			}
			if got := h.sequence(); got != tt.want {
				t.Errorf("steps = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestLiveMigrationCancelledWhileMigratingCompensates(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, active("a"), nil)
	h.on("task", a.SetTaskState, nil)
	h.on("claim", a.Claim, activities.ClaimResult{Placement: placement}, nil)
	h.on("prepare", a.PrepareMigration, nil)
	h.on("migrate", a.Migrate, nil).After(time.Hour)
	h.on("rollback", a.RollbackMigration, activities.RollbackResult{}, nil)
	h.on("release", a.ReleaseClaim, nil)
	h.env.RegisterDelayedCallback(h.env.CancelWorkflow, time.Minute)
	h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid, Dest: "b"})
	if err := h.env.GetWorkflowError(); !temporal.IsCanceledError(err) {
		t.Fatalf("LiveMigration error = %v, want cancelled", err)
	}
	// The migrate mock never finishes: the cancellation reaches it first.
	if got, want := h.sequence(), "load,task,claim,prepare,rollback,release,task"; got != want {
		t.Errorf("steps = %s, want %s", got, want)
	}
}

func TestLiveMigrationRefusesBadInput(t *testing.T) {
	shelved := active("")
	shelved.VMState = guest.VMShelvedOffloaded
	tests := []struct {
		name string
		inst activities.InstanceInfo
		dest string
		want string
	}{
		{"shelved instance", shelved, "b", api.ErrTypeBadState},
		{"destination is the source", active("a"), "a", api.ErrTypeInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.on("load", a.LoadInstance, tt.inst, nil)
			h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid, Dest: tt.dest})
			var appErr *temporal.ApplicationError
			if err := h.env.GetWorkflowError(); !errors.As(err, &appErr) || appErr.Type() != tt.want {
				t.Fatalf("LiveMigration error = %v, want type %s", err, tt.want)
			}
			if got := h.sequence(); got != "load" {
				t.Errorf("steps = %s, want only load: nothing may change", got)
			}
		})
	}
}

func TestShelveOffloadReleasesBeforeClearing(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, active("a"), nil)
	h.on("task", a.SetTaskState, nil)
	h.on("offload", a.Offload, nil)
	h.on("release", a.ReleaseClaim, nil)
	h.on("clear", a.ClearInstanceHost, nil)
	h.env.ExecuteWorkflow(ShelveOffload, api.ShelveOffloadInput{UUID: uuid})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("ShelveOffload: %v", err)
	}
	if got, want := h.sequence(), "load,task,offload,release,clear"; got != want {
		t.Errorf("steps = %s, want %s", got, want)
	}
}

func TestShelveOffloadPowerOffFailureKeepsTheClaim(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, active("a"), nil)
	h.on("task", a.SetTaskState, nil)
	h.on("offload", a.Offload, failed("hypervisor refused", api.ErrTypeRejected))
	h.on("restore", a.RestoreDomain, nil)
	h.env.ExecuteWorkflow(ShelveOffload, api.ShelveOffloadInput{UUID: uuid})
	if err := h.env.GetWorkflowError(); err == nil {
		t.Fatal("ShelveOffload succeeded, want the offload error")
	}
	if got, want := h.sequence(), "load,task,offload,restore,task"; got != want {
		t.Errorf("steps = %s, want %s (no release: the guest still runs)", got, want)
	}
}

func shelved() activities.InstanceInfo {
	i := active("")
	i.VMState, i.ClaimID = guest.VMShelvedOffloaded, ""
	return i
}

func TestUnshelve(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, shelved(), nil)
	h.on("task", a.SetTaskState, nil)
	h.on("choose", a.ChooseHost, "b", nil)
	h.on("claim", a.Claim, activities.ClaimResult{Placement: placement}, nil)
	h.on("spawn", a.Spawn, nil)
	h.on("attach", a.Attach, nil)
	h.env.ExecuteWorkflow(Unshelve, api.UnshelveInput{UUID: uuid})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("Unshelve: %v", err)
	}
	if got, want := h.sequence(), "load,task,choose,claim,spawn,attach"; got != want {
		t.Errorf("steps = %s, want %s", got, want)
	}
}

func TestUnshelveSpawnFailureReleasesAndClears(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, shelved(), nil)
	h.on("task", a.SetTaskState, nil)
	h.on("claim", a.Claim, activities.ClaimResult{Placement: placement}, nil)
	h.on("spawn", a.Spawn, failed("injected spawn failure", api.ErrTypeRejected))
	h.on("destroy", a.DestroyDomain, nil)
	h.on("release", a.ReleaseClaim, nil)
	var cleared activities.ClearHostInput
	h.env.OnActivity(a.ClearInstanceHost, mock.Anything, mock.Anything).Return(nil).Run(func(args mock.Arguments) {
		cleared = args.Get(1).(activities.ClearHostInput)
		h.record("clear")
	})
	h.env.ExecuteWorkflow(Unshelve, api.UnshelveInput{UUID: uuid, Host: "b"})
	if err := h.env.GetWorkflowError(); err == nil {
		t.Fatal("Unshelve succeeded, want the spawn error")
	}
	if got, want := h.sequence(), "load,task,claim,spawn,destroy,release,clear,task"; got != want {
		t.Errorf("steps = %s, want %s", got, want)
	}
	if cleared.VMState != guest.VMShelvedOffloaded || cleared.OnlyClaimID == "" {
		t.Errorf("ClearInstanceHost(%+v): want vm_state shelved_offloaded and the unshelve claim", cleared)
	}
}

func TestUnshelveOfActiveInstanceChangesNothing(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, active("a"), nil)
	h.env.ExecuteWorkflow(Unshelve, api.UnshelveInput{UUID: uuid})
	var appErr *temporal.ApplicationError
	if err := h.env.GetWorkflowError(); !errors.As(err, &appErr) || appErr.Type() != api.ErrTypeBadState {
		t.Fatalf("Unshelve error = %v, want BadState", err)
	}
}

func TestBoot(t *testing.T) {
	h := newHarness(t)
	h.on("create", a.CreateInstance, activities.InstanceInfo{UUID: uuid, Name: "vm", Flavor: flavor, VMState: "building"}, nil)
	h.on("claim", a.Claim, activities.ClaimResult{Placement: placement}, nil)
	h.on("spawn", a.Spawn, nil)
	h.on("attach", a.Attach, nil)
	h.env.ExecuteWorkflow(Boot, api.BootInput{UUID: uuid, Name: "vm", Flavor: flavor, Host: "a"})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("Boot: %v", err)
	}
	if got, want := h.sequence(), "create,claim,spawn,attach"; got != want {
		t.Errorf("steps = %s, want %s", got, want)
	}
}

func TestBootNoFitMarksError(t *testing.T) {
	h := newHarness(t)
	h.on("create", a.CreateInstance, activities.InstanceInfo{UUID: uuid, Name: "vm", Flavor: flavor}, nil)
	h.on("choose", a.ChooseHost, "", failed("no host can take it", api.ErrTypeNoFit))
	h.on("task", a.SetTaskState, nil)
	h.env.ExecuteWorkflow(Boot, api.BootInput{UUID: uuid, Name: "vm", Flavor: flavor})
	if err := h.env.GetWorkflowError(); err == nil {
		t.Fatal("Boot succeeded, want no fit")
	}
	if got, want := h.sequence(), "create,choose,task"; got != want {
		t.Errorf("steps = %s, want %s", got, want)
	}
}

func TestDelete(t *testing.T) {
	tests := []struct {
		name string
		inst activities.InstanceInfo
		want string
	}{
		{"on a host", active("a"), "load,task,destroy,release,clear,delete"},
		{"shelved, nothing to free", shelved(), "load,task,delete"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.on("load", a.LoadInstance, tt.inst, nil)
			h.on("task", a.SetTaskState, nil)
			if tt.inst.Host != "" {
				h.on("destroy", a.DestroyDomain, nil)
				h.on("release", a.ReleaseClaim, nil)
				h.on("clear", a.ClearInstanceHost, nil)
			}
			h.on("delete", a.DeleteInstance, nil)
			h.env.ExecuteWorkflow(Delete, api.DeleteInput{UUID: uuid})
			if err := h.env.GetWorkflowError(); err != nil {
				t.Fatalf("Delete: %v", err)
			}
			if got := h.sequence(); got != tt.want {
				t.Errorf("steps = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestStatusQuery(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, active("a"), nil)
	h.on("task", a.SetTaskState, nil)
	h.on("claim", a.Claim, activities.ClaimResult{Placement: placement}, nil)
	h.on("prepare", a.PrepareMigration, nil)
	h.on("migrate", a.Migrate, nil).After(time.Hour)
	h.on("commit", a.CommitMigration, nil)
	var during api.Status
	h.env.RegisterDelayedCallback(func() {
		v, err := h.env.QueryWorkflow(api.StatusQuery)
		if err != nil {
			t.Errorf("QueryWorkflow(status): %v", err)
			return
		}
		if err := v.Get(&during); err != nil {
			t.Error(err)
		}
	}, time.Minute)
	h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid, Dest: "b"})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if during.Phase != api.PhaseRunning || during.Source != "a" || during.Dest != "b" || during.Progress == 0 {
		t.Errorf("status during the migration = %+v, want phase running from a to b with progress", during)
	}
}

// TestLiveMigrationRollbackFindsGuestMigrated: a Migrate whose attempts
// all failed although the guest switched over; the rollback looks, finds
// the guest on the destination, and the operation commits.
func TestLiveMigrationRollbackFindsGuestMigrated(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, active("a"), nil)
	h.on("task", a.SetTaskState, nil)
	h.on("claim", a.Claim, activities.ClaimResult{Placement: placement}, nil)
	h.on("prepare", a.PrepareMigration, nil)
	h.on("migrate", a.Migrate, failed("destination unreachable", api.ErrTypeRejected))
	h.on("rollback", a.RollbackMigration, activities.RollbackResult{OnDest: true}, nil)
	h.on("commit", a.CommitMigration, nil)
	h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid, Dest: "b"})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("LiveMigration error = %v, want success: the guest runs on b", err)
	}
	if got, want := h.sequence(), "load,task,claim,prepare,migrate,rollback,commit"; got != want {
		t.Errorf("steps = %s, want %s (the destination claim is never released)", got, want)
	}
}

// TestLiveMigrationFailedRollbackKeepsTheDestination: a rollback that
// fails leaves the destination claim and the task state for an operator:
// the guest may still run there.
func TestLiveMigrationFailedRollbackKeepsTheDestination(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, active("a"), nil)
	h.on("task", a.SetTaskState, nil)
	h.on("claim", a.Claim, activities.ClaimResult{Placement: placement}, nil)
	h.on("prepare", a.PrepareMigration, nil)
	h.on("migrate", a.Migrate, failed("connection reset", api.ErrTypeRejected))
	h.on("rollback", a.RollbackMigration, activities.RollbackResult{}, failed("domain not found anywhere", api.ErrTypeRejected))
	h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid, Dest: "b"})
	err := h.env.GetWorkflowError()
	if err == nil || !strings.Contains(err.Error(), "kept for an operator: release the destination claim, clear the task state") {
		t.Fatalf("LiveMigration error = %v, want the rollback's failure and what was kept", err)
	}
	if got, want := h.sequence(), "load,task,claim,prepare,migrate,rollback"; got != want {
		t.Errorf("steps = %s, want %s", got, want)
	}
}

// TestBootNamesItsCreator: the record is created for this run only, so a
// second boot of the same uuid is refused instead of spawning a copy.
func TestBootNamesItsCreator(t *testing.T) {
	h := newHarness(t)
	var creator string
	h.env.OnActivity(a.CreateInstance, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.CreateInstanceInput) (activities.InstanceInfo, error) {
			creator = in.Creator
			return activities.InstanceInfo{}, failed("instance exists already", api.ErrTypeBadState)
		})
	h.env.ExecuteWorkflow(Boot, api.BootInput{UUID: uuid, Name: "vm", Flavor: flavor})
	var appErr *temporal.ApplicationError
	if err := h.env.GetWorkflowError(); !errors.As(err, &appErr) || appErr.Type() != api.ErrTypeBadState {
		t.Fatalf("Boot error = %v, want BadState", err)
	}
	if creator == "" {
		t.Errorf("Boot created the record with no creator")
	}
}

// TestLiveMigrationTriesAnotherHost: the claim on the host pinflow chose
// lost its room to another operation; the migration chooses again without
// that host and completes on the next one. A named destination is not
// replaced.
func TestLiveMigrationTriesAnotherHost(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, active("a"), nil)
	var excluded [][]string
	h.env.OnActivity(a.ChooseHost, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.ChooseHostInput) (string, error) {
			excluded = append(excluded, in.Exclude)
			return map[int]string{1: "b", 2: "c"}[len(excluded)], nil
		})
	h.on("task", a.SetTaskState, nil)
	var claimed []activities.ClaimInput
	h.env.OnActivity(a.Claim, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.ClaimInput) (activities.ClaimResult, error) {
			claimed = append(claimed, in)
			if in.Host == "b" {
				return activities.ClaimResult{}, failed("no host cell has room", api.ErrTypeNoFit)
			}
			return activities.ClaimResult{Host: in.Host, ClaimID: in.ClaimID, Placement: placement}, nil
		})
	var prepared activities.PrepareMigrationInput
	h.env.OnActivity(a.PrepareMigration, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.PrepareMigrationInput) error {
			prepared = in
			return nil
		})
	h.on("migrate", a.Migrate, nil)
	var committed activities.CommitMigrationInput
	h.env.OnActivity(a.CommitMigration, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.CommitMigrationInput) error { committed = in; return nil })
	h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 2 || claimed[0].Host != "b" || claimed[1].Host != "c" || claimed[0].ClaimID == claimed[1].ClaimID {
		t.Fatalf("claims = %+v, want one on b, then one with another id on c", claimed)
	}
	if len(excluded) != 2 || !slices.Equal(excluded[1], []string{"a", "b"}) {
		t.Errorf("choices excluded %v, want the source, then the source and b", excluded)
	}
	if prepared.Dest != "c" || committed.Dest != "c" || committed.DestClaimID != claimed[1].ClaimID {
		t.Errorf("prepared on %q, committed %q/%q; want c and the claim made there", prepared.Dest, committed.Dest, committed.DestClaimID)
	}

	// Named: a claim with no room fails the migration.
	h = newHarness(t)
	h.on("load", a.LoadInstance, active("a"), nil)
	h.on("task", a.SetTaskState, nil)
	h.on("claim", a.Claim, activities.ClaimResult{}, failed("no room", api.ErrTypeNoFit))
	h.on("release", a.ReleaseClaim, nil)
	h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid, Dest: "b"})
	if got := h.sequence(); got != "load,task,claim,release,task" {
		t.Errorf("named destination without room: steps %s, want load,task,claim,release,task", got)
	}
}

// TestLiveMigrationPastPostCopyNeverFallsBack: a resumed post-copy
// migration that then fails otherwise leaves both claims to the audit:
// it neither rolls back nor falls back to a cold migration, which would
// power off a guest whose memory is on the destination.
func TestLiveMigrationPastPostCopyNeverFallsBack(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, active("a"), nil)
	h.on("choose", a.ChooseHost, "b", nil)
	h.on("task", a.SetTaskState, nil)
	h.on("claim", a.Claim, activities.ClaimResult{Host: "b", ClaimID: "c", Placement: placement}, nil)
	h.on("prepare", a.PrepareMigration, nil)
	tries := 0
	h.env.OnActivity(a.Migrate, mock.Anything, mock.Anything).Return(func(context.Context, activities.MigrateInput) error {
		h.record("migrate")
		if tries++; tries == 1 {
			return failed("the link between the hosts broke", api.ErrTypePostCopyFailed)
		}
		return failed("the destination refused the domain", api.ErrTypeRejected)
	})
	// Would show in the sequence.
	h.on("rollback", a.RollbackMigration, activities.RollbackResult{}, nil).Maybe()
	h.on("release", a.ReleaseClaim, nil).Maybe()
	h.on("poweroff", a.PowerOff, nil).Maybe()
	h.on("begin resize", a.BeginResize, nil).Maybe()
	h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid, ColdFallback: true})
	if err := h.env.GetWorkflowError(); err == nil || !strings.Contains(err.Error(), "refused the domain") {
		t.Errorf("LiveMigration failing after a resumed post-copy: %v, want the failure", err)
	}
	if got, want := h.sequence(), "load,choose,task,claim,prepare,migrate,migrate"; got != want {
		t.Errorf("LiveMigration failing after a resumed post-copy: steps %s, want %s", got, want)
	}
}

// TestLiveMigrationResumesABrokenPostCopy: a migration that fails past
// its switch to post-copy is resumed until it completes, even when the
// workflow is cancelled meanwhile; nothing rolls it back or releases a
// claim, and it commits.
func TestLiveMigrationResumesABrokenPostCopy(t *testing.T) {
	h := newHarness(t)
	h.on("load", a.LoadInstance, active("a"), nil)
	h.on("choose", a.ChooseHost, "b", nil)
	h.on("task", a.SetTaskState, nil)
	h.on("claim", a.Claim, activities.ClaimResult{Host: "b", ClaimID: "c", Placement: placement}, nil)
	h.on("prepare", a.PrepareMigration, nil)
	tries := 0
	h.env.OnActivity(a.Migrate, mock.Anything, mock.Anything).Return(func(context.Context, activities.MigrateInput) error {
		h.record("migrate")
		if tries++; tries < 3 {
			return failed("the link between the hosts broke", api.ErrTypePostCopyFailed)
		}
		return nil
	})
	// Would show in the sequence.
	h.on("rollback", a.RollbackMigration, activities.RollbackResult{}, nil).Maybe()
	h.on("release", a.ReleaseClaim, nil).Maybe()
	h.on("commit", a.CommitMigration, nil)
	h.env.RegisterDelayedCallback(func() { h.env.CancelWorkflow() }, postCopyRetry/2)
	h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("LiveMigration whose post-copy broke twice: %v, want it completed", err)
	}
	if got, want := h.sequence(), "load,choose,task,claim,prepare,migrate,migrate,migrate,commit"; got != want {
		t.Errorf("LiveMigration whose post-copy broke twice: steps %s, want %s", got, want)
	}
}

// TestMovesWaitForTheDisruptionBudget: a live migration of a member whose
// group's budget is spent waits, saying for whom, before it changes
// anything; takes its slot once one is free and gives it back when it
// ends; cancelled while it waits, it ends having changed nothing.
func TestMovesWaitForTheDisruptionBudget(t *testing.T) {
	for _, cancel := range []bool{false, true} {
		h := newBareHarness(t)
		tries := 0
		h.env.OnActivity(a.TakeGroupSlot, mock.Anything, mock.Anything).Return(
			func(_ context.Context, in activities.GroupSlotInput) (activities.GroupSlot, error) {
				tries++
				h.record("take")
				if tries < 3 {
					return activities.GroupSlot{Group: "db", Max: 1, Moving: []string{"other"}}, nil
				}
				return activities.GroupSlot{Group: "db", Max: 1, Taken: true}, nil
			})
		if !cancel {
			h.on("give", a.GiveGroupSlot, nil)
			h.on("load", a.LoadInstance, active("a"), nil)
			h.on("choose", a.ChooseHost, "b", nil)
			h.on("task", a.SetTaskState, nil)
			h.on("claim", a.Claim, activities.ClaimResult{Host: "b", ClaimID: "c", Placement: placement}, nil)
			h.on("prepare", a.PrepareMigration, nil)
			h.on("migrate", a.Migrate, nil)
			h.on("commit", a.CommitMigration, nil)
		}
		var waiting string
		h.env.SetOnTimerScheduledListener(func(string, time.Duration) {
			if waiting == "" {
				if st, err := h.env.QueryWorkflow(api.StatusQuery); err == nil {
					var s api.Status
					_ = st.Get(&s)
					waiting = s.Detail
				}
			}
		})
		want := "take,take,take,load,choose,task,claim,prepare,migrate,commit,give"
		if cancel {
			// Cancelled while it waits: it took no slot and changed nothing.
			h.env.RegisterDelayedCallback(h.env.CancelWorkflow, time.Second)
			want = "take"
		}
		h.env.ExecuteWorkflow(LiveMigration, api.LiveMigrationInput{UUID: uuid})
		if err := h.env.GetWorkflowError(); (err != nil) != cancel {
			t.Errorf("LiveMigration (cancelled %v) error = %v", cancel, err)
		}
		if got := h.sequence(); got != want {
			t.Errorf("LiveMigration (cancelled %v) steps = %s, want %s", cancel, got, want)
		}
		if !strings.Contains(waiting, "waiting for the disruption budget of group db: 1 of its members are moving (other)") {
			t.Errorf("LiveMigration's status while it waited = %q, want it to name the group and who moves", waiting)
		}
	}
}

// A step of driverAttempts tries counts only the attempts that reached a
// worker and failed there. An attempt Temporal lost on its way to one ends
// in a heartbeat timeout with no heartbeat (every such step heartbeats as
// it starts); a stopping worker hands its attempt over. Either is
// dispatched again at once, up to untriedAttempts times.
func TestTriesCountOnlyDeliveredAttempts(t *testing.T) {
	lost := temporal.NewHeartbeatTimeoutError()
	died := temporal.NewHeartbeatTimeoutError(activities.Running)
	fault := temporal.NewApplicationError("libvirt: connection reset", "Transient")
	stopping := temporal.NewApplicationError("the worker is stopping", api.ErrTypeWorkerStopping)
	repeat := func(err error, n int) []error { return slices.Repeat([]error{err}, n) }
	tests := []struct {
		name     string
		attempts []error // each attempt's end, nil for success
		line     string  // the failure, empty for success
	}{
		{"lost attempts are no tries", append(repeat(lost, untriedAttempts-1), nil), ""},
		{"a worker that died in the step is a try", repeat(died, driverAttempts),
			"spawn on b failed after 3 attempts: heartbeat timeout (type: Heartbeat)"},
		{"a stopping worker's hand-over is no try", append(repeat(stopping, driverAttempts), nil), ""},
		{"faults and losses mixed", []error{lost, fault, lost, fault, stopping, fault},
			"spawn on b failed after 6 attempts: libvirt: connection reset"},
		{"every attempt lost still ends", repeat(lost, untriedAttempts),
			"spawn on b failed after 10 attempts: heartbeat timeout (type: Heartbeat)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.on("load", a.LoadInstance, shelved(), nil)
			h.on("task", a.SetTaskState, nil)
			h.on("claim", a.Claim, activities.ClaimResult{Placement: placement}, nil)
			spawns := 0
			h.env.OnActivity(a.Spawn, mock.Anything, mock.Anything).Return(func(context.Context, activities.SpawnInput) error {
				spawns++
				return tt.attempts[min(spawns, len(tt.attempts))-1]
			})
			h.on("attach", a.Attach, nil).Maybe()
			h.on("destroy", a.DestroyDomain, nil).Maybe()
			h.on("release", a.ReleaseClaim, nil).Maybe()
			h.on("clear", a.ClearInstanceHost, nil).Maybe()
			h.env.ExecuteWorkflow(Unshelve, api.UnshelveInput{UUID: uuid, Host: "b"})
			err := h.env.GetWorkflowError()
			if spawns != len(tt.attempts) {
				t.Errorf("spawn ran %d times, want %d", spawns, len(tt.attempts))
			}
			// Every attempt after the first is counted, by why.
			want := map[string]float64{}
			for _, end := range tt.attempts[:len(tt.attempts)-1] {
				switch end {
				case lost:
					want["Spawn/lost"]++
				case stopping:
					want["Spawn/handed-over"]++
				default:
					want["Spawn/failed"]++
				}
			}
			got := map[string]float64{}
			for _, v := range h.metrics.of(MetricStepRedispatched) {
				got[v.tags["activity"]+"/"+v.tags["reason"]] += v.value
			}
			if !maps.Equal(got, want) {
				t.Errorf("%s = %v, want %v", MetricStepRedispatched, got, want)
			}
			if tt.line == "" {
				if err != nil {
					t.Fatalf("Unshelve: %v", err)
				}
				return
			}
			line := tt.line + "; instance " + uuid + " stays shelved_offloaded"
			if f, ok := api.FailureOf(err); !ok || f.Line() != line {
				t.Errorf("failure = %q\nwant      %q", f.Line(), line)
			}
		})
	}
}
