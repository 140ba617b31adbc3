package sim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/internal/testenv"
)

// migrationRecord returns the raw migration record of uuid.
func (e *env) migrationRecord(uuid string) map[string]string {
	e.t.Helper()
	m, err := e.rdb.HGetAll(e.ctx, e.d.migrationKey(uuid)).Result()
	if err != nil {
		e.t.Fatalf("HGETALL migration %s: %v", uuid, err)
	}
	return m
}

// progressLog collects progress reports; it is safe for concurrent use.
type progressLog struct {
	mu   sync.Mutex
	seen []hypervisor.Progress
}

func (p *progressLog) add(pr hypervisor.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, pr)
}

func (p *progressLog) all() []hypervisor.Progress {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]hypervisor.Progress(nil), p.seen...)
}

// checkRising fails unless the reports rise strictly and end at 100,
// completed.
func checkRising(t *testing.T, what string, seen []hypervisor.Progress, minReports int) {
	t.Helper()
	if len(seen) < minReports {
		t.Fatalf("%s: %d progress reports, want at least %d", what, len(seen), minReports)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i].Percent <= seen[i-1].Percent {
			t.Errorf("%s: progress %d then %d, want rising", what, seen[i-1].Percent, seen[i].Percent)
		}
		if seen[i].DataProcessed < seen[i-1].DataProcessed {
			t.Errorf("%s: data processed %d then %d, want not falling", what, seen[i-1].DataProcessed, seen[i].DataProcessed)
		}
	}
	last := seen[len(seen)-1]
	want := hypervisor.Progress{Percent: 100, DataTotal: 512 << 20, DataProcessed: 512 << 20, Phase: ProgressCompleted}
	if diff := cmp.Diff(want, last); diff != "" {
		t.Errorf("%s: last progress mismatch (-want +got):\n%s", what, diff)
	}
}

func TestMigrateMovesDomain(t *testing.T) {
	// steps records the migration's waits and progress reports in order.
	var mu sync.Mutex
	var steps []string
	step := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		steps = append(steps, s)
	}
	e := newEnv(t, Options{Sleep: func(ctx context.Context, d time.Duration) error {
		step("wait " + d.String())
		return sleepCtx(ctx, d)
	}})
	e.running("h1", uuidA, "a", 2, 0)
	dest := domainXML(uuidA, "a", 6, 1)
	if err := e.d.SetLatency(e.ctx, "h1", OpMigrate, 600*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := e.d.PrepareMigration(e.ctx, "h2", uuidA, dest); err != nil {
		t.Fatalf("PrepareMigration: %v", err)
	}
	var log progressLog
	mu.Lock()
	steps = nil
	mu.Unlock()
	report := func(p hypervisor.Progress) {
		log.add(p)
		step(fmt.Sprintf("progress %d%% %s", p.Percent, p.Phase))
	}
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), report); err != nil {
		t.Fatalf("Migrate(h1 -> h2): %v", err)
	}
	// The copy lasts the whole latency, in minSteps waits that each end
	// with a report, and the migration completes after the last of them.
	wantSteps := []string{
		"wait 60ms", "progress 10% copying", "wait 60ms", "progress 20% copying",
		"wait 60ms", "progress 30% copying", "wait 60ms", "progress 40% copying",
		"wait 60ms", "progress 50% copying", "wait 60ms", "progress 60% copying",
		"wait 60ms", "progress 70% copying", "wait 60ms", "progress 80% copying",
		"wait 60ms", "progress 90% copying", "wait 60ms", "progress 99% copying",
		"progress 100% completed",
	}
	mu.Lock()
	got := append([]string(nil), steps...)
	mu.Unlock()
	if diff := cmp.Diff(wantSteps, got); diff != "" {
		t.Errorf("Migrate with a 600ms latency: waits and reports mismatch (-want +got):\n%s", diff)
	}
	checkRising(t, "Migrate", log.all(), minSteps+1)
	want := map[string]where{"h2": {hypervisor.StateRunning, dest}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after Migrate, domain placement mismatch (-want +got):\n%s", diff)
	}
	if rec := e.migrationRecord(uuidA); rec["phase"] != phaseCompleted {
		t.Errorf("after Migrate, migration record phase %q, want %q", rec["phase"], phaseCompleted)
	}
	if ttl, err := e.rdb.PTTL(e.ctx, e.d.migrationKey(uuidA)).Result(); err != nil || ttl <= 0 || ttl > DefaultCompletedTTL {
		t.Errorf("after Migrate, record TTL %s (%v), want 0 < ttl <= %s", ttl, err, DefaultCompletedTTL)
	}
	// The domain lives on h2 now: h1 cannot define it any more, h2 may
	// migrate it back.
	if err := e.d.Define(e.ctx, "h1", domainXML(uuidA, "a", 2, 0)); !errors.Is(err, hypervisor.ErrRejected) {
		t.Errorf("Define(h1) of the migrated domain: %v, want ErrRejected", err)
	}
	back := domainXML(uuidA, "a", 3, 0)
	if err := e.d.Migrate(e.ctx, migrateReq("h2", "h1", uuidA, back), nil); err != nil {
		t.Fatalf("Migrate(h2 -> h1) back: %v", err)
	}
	want = map[string]where{"h1": {hypervisor.StateRunning, back}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after migrating back, placement mismatch (-want +got):\n%s", diff)
	}
}

func TestMigrateLongLatencyReportsEvery250ms(t *testing.T) {
	rec := newRecordingSleep()
	e := newEnv(t, Options{Sleep: func(ctx context.Context, d time.Duration) error { rec.waits <- d; return nil }})
	e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.SetLatency(e.ctx, "", OpMigrate, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	var log progressLog
	rec.drain()
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, domainXML(uuidA, "a", 6, 1)), log.add); err != nil {
		t.Fatal(err)
	}
	waits := rec.drain()
	var sum time.Duration
	for _, w := range waits {
		sum += w
	}
	if len(waits) != 40 || sum != 10*time.Second {
		t.Errorf("Migrate with 10s latency: %d waits totalling %s, want 40 totalling 10s", len(waits), sum)
	}
	checkRising(t, "Migrate 10s", log.all(), 41)
}

func TestMigrateCancelLeavesSource(t *testing.T) {
	e := newEnv(t, Options{})
	src := e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.SetLatency(e.ctx, "", OpMigrate, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	var log progressLog
	err := e.d.Migrate(ctx, migrateReq("h1", "h2", uuidA, domainXML(uuidA, "a", 6, 1)), func(p hypervisor.Progress) {
		log.add(p)
		if p.Percent >= 30 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "sim: migrate ") {
		t.Fatalf("Migrate cancelled at 30%%: %v, want a 'sim: migrate' error wrapping context.Canceled", err)
	}
	if last := log.all()[len(log.all())-1]; last.Percent >= 50 {
		t.Errorf("Migrate cancelled at 30%%: went on to %d%%", last.Percent)
	}
	want := map[string]where{"h1": {hypervisor.StateRunning, src}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after a cancelled Migrate, placement mismatch (-want +got):\n%s", diff)
	}
	if rec := e.migrationRecord(uuidA); len(rec) != 0 {
		t.Errorf("after a cancelled Migrate, migration record %v, want none", rec)
	}
	// Nothing is left that would block the domain: it stops, and a new
	// migration goes through.
	if err := e.d.SetLatency(e.ctx, "", OpMigrate, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, domainXML(uuidA, "a", 6, 1)), nil); err != nil {
		t.Errorf("Migrate after a cancelled one: %v, want nil", err)
	}
}

func TestMigrateInjectedFailureLeavesSource(t *testing.T) {
	e := newEnv(t, Options{})
	src := e.running("h1", uuidA, "a", 2, 0)
	dest := domainXML(uuidA, "a", 6, 1)
	if err := e.d.SetFault(e.ctx, "h1", OpMigrate, Fault{Times: 1}); err != nil {
		t.Fatal(err)
	}
	var log progressLog
	err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), log.add)
	if !errors.Is(err, ErrInjected) {
		t.Fatalf("Migrate with a migrate fault on h1: %v, want ErrInjected", err)
	}
	// It fails half-way, after some progress.
	if seen := log.all(); len(seen) == 0 || seen[len(seen)-1].Percent >= 100 {
		t.Errorf("Migrate with a fault: progress %v, want some, short of 100%%", seen)
	}
	want := map[string]where{"h1": {hypervisor.StateRunning, src}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after an injected failure, placement mismatch (-want +got):\n%s", diff)
	}
	// Rollback after a clean failure has nothing to do, and does it again.
	for i := range 2 {
		if err := e.d.Rollback(e.ctx, "h1", "h2", uuidA); err != nil {
			t.Fatalf("Rollback #%d: %v", i+1, err)
		}
	}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after Rollback, placement mismatch (-want +got):\n%s", diff)
	}
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); err != nil {
		t.Errorf("Migrate after the fault was spent: %v, want nil", err)
	}
}

func TestMigrateRejects(t *testing.T) {
	e := newEnv(t, Options{})
	e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.Define(e.ctx, "h1", domainXML(uuidB, "b", 3, 0)); err != nil {
		t.Fatal(err)
	}
	dest := domainXML(uuidA, "a", 6, 1)
	tests := []struct {
		name         string
		src, dst, id string
		xml          string
		want         error
		wantIn       string
	}{
		{"shut off domain", "h1", "h2", uuidB, domainXML(uuidB, "b", 6, 1), hypervisor.ErrRejected, "only a running domain migrates"},
		// With the XML it runs with on h1, it would look like a completed
		// migration whose answer was lost.
		{"missing domain", "h2", "h1", uuidA, domainXML(uuidA, "a", 3, 0), hypervisor.ErrNotFound, "not on h2"},
		{"uuid mismatch", "h1", "h2", uuidA, domainXML(uuidB, "a", 6, 1), hypervisor.ErrRejected, "names domain " + uuidB},
		{"pins outside destination", "h1", "h2", uuidA, domainXML(uuidA, "a", 9, 1), hypervisor.ErrRejected, "names cpus 9 the host does not have"},
		{"same host", "h1", "h1", uuidA, dest, hypervisor.ErrRejected, "same host"},
		{"bad xml", "h1", "h2", uuidA, "<domain>", hypervisor.ErrRejected, "destination domain xml"},
	}
	for _, tt := range tests {
		err := e.d.Migrate(e.ctx, migrateReq(tt.src, tt.dst, tt.id, tt.xml), nil)
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.wantIn) {
			t.Errorf("Migrate(%s): %v, want %v containing %q", tt.name, err, tt.want, tt.wantIn)
		}
	}
	want := map[string]where{"h1": {hypervisor.StateRunning, domainXML(uuidA, "a", 2, 0)}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after rejected migrations, placement mismatch (-want +got):\n%s", diff)
	}
	if rec := e.migrationRecord(uuidA); len(rec) != 0 {
		t.Errorf("after rejected migrations, migration record %v, want none", rec)
	}
}

func TestPrepareMigration(t *testing.T) {
	e := newEnv(t, Options{})
	e.running("h1", uuidA, "a", 2, 0)
	e.running("h2", uuidB, "b", 6, 1)
	tests := []struct {
		name, dst, id, xml string
		want               error
	}{
		{"fits", "h2", uuidA, domainXML(uuidA, "a", 7, 1), nil},
		{"unknown host", "h3", uuidA, domainXML(uuidA, "a", 7, 1), hypervisor.ErrUnknownHost},
		{"already on destination", "h2", uuidB, domainXML(uuidB, "b", 7, 1), hypervisor.ErrRejected},
		{"uuid mismatch", "h2", uuidA, domainXML(uuidB, "a", 7, 1), hypervisor.ErrRejected},
		{"pins outside", "h2", uuidA, domainXML(uuidA, "a", 70, 1), hypervisor.ErrRejected},
		{"bad uuid argument", "h2", "x", domainXML(uuidA, "a", 7, 1), hypervisor.ErrRejected},
	}
	for _, tt := range tests {
		err := e.d.PrepareMigration(e.ctx, tt.dst, tt.id, tt.xml)
		if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
			t.Errorf("PrepareMigration(%s): %v, want %v", tt.name, err, tt.want)
		}
	}
}

var errCrash = errors.New("worker died")

// crashOnce makes d's next migration stop dead at point.
func crashOnce(d *Driver, point string) {
	var once sync.Once
	d.crash = func(p string) error {
		var err error
		if p == point {
			once.Do(func() { err = errCrash })
		}
		return err
	}
}

func TestMigrateCrashThenRetryOrRollback(t *testing.T) {
	points := []string{"begun", "incoming", "copying", "switchover", "promoted"}
	src := domainXML(uuidA, "a", 2, 0)
	dest := domainXML(uuidA, "a", 6, 1)
	onSource := map[string]where{"h1": {hypervisor.StateRunning, src}}
	onDest := map[string]where{"h2": {hypervisor.StateRunning, dest}}
	for _, point := range points {
		for _, then := range []string{"retry", "rollback"} {
			t.Run(point+"/"+then, func(t *testing.T) {
				e := newEnv(t, Options{})
				e.running("h1", uuidA, "a", 2, 0)
				crashOnce(e.d, point)
				if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); !errors.Is(err, errCrash) {
					t.Fatalf("Migrate crashing at %s: %v, want the crash", point, err)
				}
				// A new worker picks the activity up.
				d := e.restart(Options{})
				if point == "incoming" || point == "copying" {
					// The same migration, retried, may prepare again.
					if err := d.PrepareMigration(e.ctx, "h2", uuidA, dest); err != nil {
						t.Errorf("PrepareMigration after a crash at %s: %v, want nil", point, err)
					}
				}
				var want map[string]where
				switch then {
				case "retry":
					var log progressLog
					if err := d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), log.add); err != nil {
						t.Fatalf("Migrate retried after a crash at %s: %v", point, err)
					}
					if seen := log.all(); len(seen) == 0 || seen[len(seen)-1].Percent != 100 {
						t.Errorf("Migrate retried after a crash at %s: progress %v, want it to end at 100", point, seen)
					}
					want = onDest
					if rec := e.migrationRecord(uuidA); rec["phase"] != phaseCompleted {
						t.Errorf("retry after a crash at %s: record phase %q, want %q", point, rec["phase"], phaseCompleted)
					}
				case "rollback":
					for i := range 2 {
						if err := d.Rollback(e.ctx, "h1", "h2", uuidA); err != nil {
							t.Fatalf("Rollback #%d after a crash at %s: %v", i+1, point, err)
						}
					}
					want = onSource
					if rec := e.migrationRecord(uuidA); len(rec) != 0 {
						t.Errorf("Rollback after a crash at %s: record %v, want none", point, rec)
					}
				}
				if diff := cmp.Diff(want, e.placement(d, uuidA)); diff != "" {
					t.Errorf("%s after a crash at %s: placement mismatch (-want +got):\n%s", then, point, diff)
				}
				// Whatever happened, the domain is usable again: stop works.
				for h := range want {
					if err := d.Stop(e.ctx, h, uuidA); err != nil {
						t.Errorf("Stop(%s) after %s: %v", h, then, err)
					}
				}
			})
		}
	}
}

func TestMigrateResultLost(t *testing.T) {
	e := newEnv(t, Options{})
	e.running("h1", uuidA, "a", 2, 0)
	dest := domainXML(uuidA, "a", 6, 1)
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); err != nil {
		t.Fatal(err)
	}
	// A fault now must not fail the retry of a migration that is done.
	if err := e.d.SetFault(e.ctx, "h1", OpMigrate, Fault{Times: 5}); err != nil {
		t.Fatal(err)
	}
	var log progressLog
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), log.add); err != nil {
		t.Errorf("Migrate retried after it completed: %v, want nil", err)
	}
	if seen := log.all(); len(seen) != 1 || seen[0].Percent != 100 {
		t.Errorf("Migrate retried after it completed: progress %v, want one report at 100", seen)
	}
	// Even once the record has expired.
	if err := e.rdb.Del(e.ctx, e.d.migrationKey(uuidA)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); err != nil {
		t.Errorf("Migrate retried after it completed and its record expired: %v, want nil", err)
	}
	// With another destination XML it is not the same migration.
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, domainXML(uuidA, "a", 7, 1)), nil); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Migrate with another XML after completion: %v, want ErrNotFound (not on h1)", err)
	}
	want := map[string]where{"h2": {hypervisor.StateRunning, dest}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("placement mismatch (-want +got):\n%s", diff)
	}
	// Without the record, Rollback cannot restore the source definition.
	if err := e.d.Rollback(e.ctx, "h1", "h2", uuidA); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Rollback of a completed migration whose record expired: %v, want ErrNotFound", err)
	}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after a failed Rollback, placement mismatch (-want +got):\n%s", diff)
	}
}

func TestRollbackAfterCompletedMigration(t *testing.T) {
	e := newEnv(t, Options{})
	src := e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, domainXML(uuidA, "a", 6, 1)), nil); err != nil {
		t.Fatal(err)
	}
	// The workflow failed after the migration, before its commit: the
	// ledger still places the guest on h1, so it goes back there.
	for i := range 2 {
		if err := e.d.Rollback(e.ctx, "h1", "h2", uuidA); err != nil {
			t.Fatalf("Rollback #%d of a completed migration: %v", i+1, err)
		}
	}
	want := map[string]where{"h1": {hypervisor.StateRunning, src}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after Rollback of a completed migration, placement mismatch (-want +got):\n%s", diff)
	}
	if err := e.d.Define(e.ctx, "h2", domainXML(uuidA, "a", 6, 1)); !errors.Is(err, hypervisor.ErrRejected) {
		t.Errorf("Define(h2) after the rollback home to h1: %v, want ErrRejected", err)
	}
}

func TestRollbackStartsShutOffSource(t *testing.T) {
	e := newEnv(t, Options{})
	x := domainXML(uuidA, "a", 2, 0)
	if err := e.d.Define(e.ctx, "h1", x); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Rollback(e.ctx, "h1", "h2", uuidA); err != nil {
		t.Fatalf("Rollback with the domain shut off on h1: %v", err)
	}
	want := map[string]where{"h1": {hypervisor.StateRunning, x}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after Rollback, placement mismatch (-want +got):\n%s", diff)
	}
	for _, tt := range []struct {
		name, src, dst, id string
		want               error
	}{
		{"unknown source", "h9", "h2", uuidA, hypervisor.ErrUnknownHost},
		{"same host", "h1", "h1", uuidA, hypervisor.ErrRejected},
		{"domain nowhere", "h1", "h2", uuidB, hypervisor.ErrNotFound},
	} {
		if err := e.d.Rollback(e.ctx, tt.src, tt.dst, tt.id); !errors.Is(err, tt.want) {
			t.Errorf("Rollback(%s): %v, want %v", tt.name, err, tt.want)
		}
	}
}

func TestRollbackWhileMigrating(t *testing.T) {
	e := newEnv(t, Options{})
	src := e.running("h1", uuidA, "a", 2, 0)
	// A worker that lost its activity keeps migrating while the workflow
	// compensates through another worker; the rollback wins. It runs
	// inside the first progress report, so it lands mid-copy every time.
	other := e.restart(Options{})
	var rollbackErr error
	rolledBack := false
	err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, domainXML(uuidA, "a", 6, 1)), func(hypervisor.Progress) {
		if !rolledBack {
			rolledBack = true
			rollbackErr = other.Rollback(e.ctx, "h1", "h2", uuidA)
		}
	})
	if rollbackErr != nil {
		t.Fatalf("Rollback during the migration: %v", rollbackErr)
	}
	if err == nil || !strings.Contains(err.Error(), "took this migration over") {
		t.Errorf("Migrate overtaken by a Rollback: %v, want a 'took this migration over' error", err)
	}
	want := map[string]where{"h1": {hypervisor.StateRunning, src}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after Rollback during a migration, placement mismatch (-want +got):\n%s", diff)
	}
	if rec := e.migrationRecord(uuidA); len(rec) != 0 {
		t.Errorf("after Rollback during a migration, record %v, want none", rec)
	}
	// The source is free again: it stops.
	if err := e.d.Stop(e.ctx, "h1", uuidA); err != nil {
		t.Errorf("Stop(h1) after the overtaken migration: %v", err)
	}
}

func TestMigrationInFlightBlocks(t *testing.T) {
	e := newEnv(t, Options{})
	e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.AddHost(e.ctx, "h3", testTopo(t)); err != nil {
		t.Fatal(err)
	}
	dest := domainXML(uuidA, "a", 6, 1)
	crashOnce(e.d, "incoming")
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); !errors.Is(err, errCrash) {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		call   func() error
		wantIn string
	}{
		{"stop source", func() error { return e.d.Stop(e.ctx, "h1", uuidA) }, "migrating away from h1"},
		{"shut source down", func() error { return e.d.Shutdown(e.ctx, "h1", uuidA) }, "migrating away from h1"},
		{"shut incoming down", func() error { return e.d.Shutdown(e.ctx, "h2", uuidA) }, "destination of an in-flight migration"},
		{"start incoming", func() error { return e.d.Start(e.ctx, "h2", uuidA) }, "destination of an in-flight migration"},
		{"undefine incoming", func() error { return e.d.Undefine(e.ctx, "h2", uuidA) }, "destination of an in-flight migration"},
		{"define on other host", func() error { return e.d.Define(e.ctx, "h3", dest) }, "migrating from h1 to h2"},
		{"migrate elsewhere", func() error { return e.d.Migrate(e.ctx, migrateReq("h1", "h3", uuidA, dest), nil) }, "in flight"},
		{"rollback elsewhere", func() error { return e.d.Rollback(e.ctx, "h1", "h3", uuidA) }, "in flight is from h1 to h2"},
	}
	for _, tt := range tests {
		if err := tt.call(); err == nil || !strings.Contains(err.Error(), tt.wantIn) {
			t.Errorf("%s during a migration: %v, want an error containing %q", tt.name, err, tt.wantIn)
		}
	}
	// The incoming domain shows on h2, paused, as libvirt lists it.
	doms, err := e.d.Domains(e.ctx, "h2")
	if err != nil || len(doms) != 1 || doms[0].State != hypervisor.StatePaused {
		t.Errorf("Domains(h2) during a migration = %+v, %v; want the paused incoming domain", doms, err)
	}
}

func TestConcurrentMigrations(t *testing.T) {
	e := newEnv(t, Options{})
	if err := e.d.SetLatency(e.ctx, "", OpMigrate, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	e.running("h1", uuidA, "a", 2, 0)
	e.running("h2", uuidB, "b", 6, 1)
	d2 := e.restart(Options{})
	moves := []struct {
		d        *Driver
		src, dst string
		uuid     string
		xml      string
	}{
		{e.d, "h1", "h2", uuidA, domainXML(uuidA, "a", 7, 1)},
		{d2, "h2", "h1", uuidB, domainXML(uuidB, "b", 3, 0)},
	}
	var wg sync.WaitGroup
	for _, m := range moves {
		wg.Go(func() {
			var log progressLog
			if err := m.d.Migrate(e.ctx, migrateReq(m.src, m.dst, m.uuid, m.xml), log.add); err != nil {
				t.Errorf("Migrate(%s, %s -> %s): %v", m.uuid, m.src, m.dst, err)
				return
			}
			checkRising(t, "Migrate "+m.uuid, log.all(), minSteps+1)
		})
	}
	wg.Wait()
	for _, m := range moves {
		want := map[string]where{m.dst: {hypervisor.StateRunning, m.xml}}
		if diff := cmp.Diff(want, e.placement(e.d, m.uuid)); diff != "" {
			t.Errorf("after concurrent migrations, %s placement mismatch (-want +got):\n%s", m.uuid, diff)
		}
	}
}

func TestStateSurvivesNewDriver(t *testing.T) {
	e := newEnv(t, Options{})
	x := e.running("h1", uuidA, "a", 2, 0)
	for _, err := range []error{
		e.d.SetLatency(e.ctx, "h2", OpStart, 10*time.Millisecond),
		e.d.SetFault(e.ctx, "h1", OpStop, Fault{Times: 2}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := e.d.Stop(e.ctx, "h1", uuidA); !errors.Is(err, ErrInjected) {
		t.Fatalf("Stop with 2 faults left: %v, want ErrInjected", err)
	}
	before, err := e.d.Settings(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A new worker: new client, new driver, same Redis.
	d := e.restart(Options{})
	hosts, err := d.Hosts(e.ctx)
	if err != nil || !cmp.Equal(hosts, []string{"h1", "h2"}) {
		t.Errorf("Hosts on a new driver = %v, %v; want [h1 h2]", hosts, err)
	}
	if diff := cmp.Diff(map[string]where{"h1": {hypervisor.StateRunning, x}}, e.placement(d, uuidA)); diff != "" {
		t.Errorf("placement on a new driver mismatch (-want +got):\n%s", diff)
	}
	after, err := d.Settings(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("Settings on a new driver mismatch (-before +after):\n%s", diff)
	}
	// The fault count carries on: one failure left, then success.
	if err := d.Stop(e.ctx, "h1", uuidA); !errors.Is(err, ErrInjected) {
		t.Errorf("Stop on a new driver with 1 fault left: %v, want ErrInjected", err)
	}
	if err := d.Stop(e.ctx, "h1", uuidA); err != nil {
		t.Errorf("Stop on a new driver with no fault left: %v, want nil", err)
	}
}

func TestRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	c := testenv.StartRedisCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	d := New(rdb, Options{})
	// Enough hosts and domains that keys spread over every node.
	hosts := []string{"h1", "h2", "h3", "h4"}
	for _, h := range hosts {
		if err := d.AddHost(ctx, h, testTopo(t)); err != nil {
			t.Fatalf("AddHost(%s) on a cluster: %v", h, err)
		}
	}
	if err := d.SetFault(ctx, "h3", OpMigrate, Fault{Times: 1}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetLatency(ctx, "", OpStart, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for i, u := range []string{uuidA, uuidB} {
		src, dst := hosts[2*i], hosts[2*i+1]
		if err := d.Define(ctx, src, domainXML(u, "g", 2, 0)); err != nil {
			t.Fatalf("Define(%s) on a cluster: %v", src, err)
		}
		if err := d.Start(ctx, src, u); err != nil {
			t.Fatalf("Start(%s) on a cluster: %v", src, err)
		}
		err := d.Migrate(ctx, migrateReq(src, dst, u, domainXML(u, "g", 6, 1)), nil)
		if src == "h3" {
			if !errors.Is(err, ErrInjected) {
				t.Fatalf("Migrate from h3 with a fault on a cluster: %v, want ErrInjected", err)
			}
			if err := d.Rollback(ctx, src, dst, u); err != nil {
				t.Fatalf("Rollback on a cluster: %v", err)
			}
			err = d.Migrate(ctx, migrateReq(src, dst, u, domainXML(u, "g", 6, 1)), nil)
		}
		if err != nil {
			t.Fatalf("Migrate(%s -> %s) on a cluster: %v", src, dst, err)
		}
		doms, err := d.Domains(ctx, dst)
		if err != nil || len(doms) != 1 || doms[0].State != hypervisor.StateRunning {
			t.Errorf("Domains(%s) on a cluster = %+v, %v; want the migrated domain running", dst, doms, err)
		}
	}
	// A shutdown with a latency reads Redis's clock in scripts and reads.
	if err := d.SetLatency(ctx, "", OpShutdown, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := d.Shutdown(ctx, "h2", uuidA); err != nil {
		t.Fatalf("Shutdown on a cluster: %v", err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		dom, err := d.Lookup(ctx, "h2", uuidA)
		if err == nil && dom.State == hypervisor.StateShutoff {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("Lookup(h2) on a cluster after Shutdown = %+v, %v; want it shut off soon", dom, err)
		}
	}
	if err := d.Undefine(ctx, "h2", uuidA); err != nil {
		t.Errorf("Undefine(h2) on a cluster after Shutdown: %v", err)
	}
	if _, err := d.Settings(ctx); err != nil {
		t.Errorf("Settings on a cluster: %v", err)
	}
	// Powering a host off runs one script over all its domains' keys.
	if err := d.Define(ctx, "h4", domainXML(uuidA, "g", 3, 0)); err != nil {
		t.Fatalf("Define(h4) on a cluster: %v", err)
	}
	if err := d.PowerOff(ctx, "h4"); err != nil {
		t.Fatalf("PowerOff(h4) on a cluster: %v", err)
	}
	if _, err := d.Domains(ctx, "h4"); !errors.Is(err, ErrHostOff) {
		t.Errorf("Domains(h4) on a cluster with h4 off: %v, want ErrHostOff", err)
	}
	if err := d.PowerOn(ctx, "h4"); err != nil {
		t.Fatalf("PowerOn(h4) on a cluster: %v", err)
	}
	doms, err := d.Domains(ctx, "h4")
	if err != nil || len(doms) != 2 || doms[0].State != hypervisor.StateShutoff || doms[1].State != hypervisor.StateShutoff {
		t.Errorf("Domains(h4) on a cluster after a power cycle = %+v, %v; want both shut off", doms, err)
	}
}

var errClaimGone = errors.New("claim gone")

// fenceLog is a Fence that fails once failing is set, counting its calls;
// it is safe for concurrent use.
type fenceLog struct {
	mu      sync.Mutex
	calls   int
	failing bool
}

func (f *fenceLog) fence(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.failing {
		return errClaimGone
	}
	return nil
}

func (f *fenceLog) fail() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing = true
}

func (f *fenceLog) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// checkFenced fails unless err is a migrate error wrapping ErrFenced and
// the fence's own error.
func checkFenced(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, hypervisor.ErrFenced) || !errors.Is(err, errClaimGone) || !strings.HasPrefix(err.Error(), "sim: migrate ") {
		t.Errorf("%s: %v, want a 'sim: migrate' error wrapping ErrFenced and the fence's error", what, err)
	}
}

func TestMigrateFencedBeforeStart(t *testing.T) {
	e := newEnv(t, Options{})
	src := e.running("h1", uuidA, "a", 2, 0)
	// A counted fault shows whether the fenced attempt drew one.
	if err := e.d.SetFault(e.ctx, "h1", OpMigrate, Fault{Times: 1}); err != nil {
		t.Fatal(err)
	}
	before, err := e.d.Settings(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := &fenceLog{failing: true}
	req := migrateReq("h1", "h2", uuidA, domainXML(uuidA, "a", 6, 1))
	req.Fence = f.fence
	var log progressLog
	err = e.d.Migrate(e.ctx, req, log.add)
	checkFenced(t, "Migrate with a failing fence", err)
	if n := f.count(); n != 1 {
		t.Errorf("Migrate with a failing fence called it %d times, want 1", n)
	}
	if seen := log.all(); len(seen) != 0 {
		t.Errorf("Migrate fenced before the start reported progress %v, want none", seen)
	}
	want := map[string]where{"h1": {hypervisor.StateRunning, src}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after a Migrate fenced before the start, placement mismatch (-want +got):\n%s", diff)
	}
	if rec := e.migrationRecord(uuidA); len(rec) != 0 {
		t.Errorf("after a Migrate fenced before the start, migration record %v, want none", rec)
	}
	after, err := e.d.Settings(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("a Migrate fenced before the start changed the settings (-before +after):\n%s", diff)
	}
	// The source is not marked: it stops.
	if err := e.d.Stop(e.ctx, "h1", uuidA); err != nil {
		t.Errorf("Stop(h1) after a fenced Migrate: %v, want nil", err)
	}
}

func TestMigrateFencedDuringCopy(t *testing.T) {
	// Instant sleeps: the copy runs all its steps at once.
	e := newEnv(t, Options{Sleep: func(ctx context.Context, _ time.Duration) error { return ctx.Err() }})
	src := e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.SetLatency(e.ctx, "", OpMigrate, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	f := &fenceLog{}
	req := migrateReq("h1", "h2", uuidA, domainXML(uuidA, "a", 6, 1))
	req.Fence = f.fence
	var log progressLog
	var during []hypervisor.Domain
	failed := false
	err := e.d.Migrate(e.ctx, req, func(p hypervisor.Progress) {
		log.add(p)
		if p.Percent >= 30 && !failed {
			// The claim goes while memory is copied; the copy goes on.
			failed = true
			f.fail()
			var err error
			if during, err = e.d.Domains(e.ctx, "h2"); err != nil {
				t.Errorf("Domains(h2) during the copy: %v", err)
			}
		}
	})
	checkFenced(t, "Migrate whose fence fails during the copy", err)
	if n := f.count(); n != 2 {
		t.Errorf("Migrate whose fence fails during the copy called it %d times, want 2 (before the start, before the switchover)", n)
	}
	if len(during) != 1 || during[0].State != hypervisor.StatePaused {
		t.Errorf("Domains(h2) during the copy = %+v, want the paused incoming domain", during)
	}
	seen := log.all()
	if last := seen[len(seen)-1]; last.Percent != 99 || last.Phase != ProgressCopying {
		t.Errorf("Migrate fenced at the switchover: last progress %+v, want the end of the copy (99%%, %s)", last, ProgressCopying)
	}
	want := map[string]where{"h1": {hypervisor.StateRunning, src}}
	if diff := cmp.Diff(want, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after a Migrate fenced at the switchover, placement mismatch (-want +got):\n%s", diff)
	}
	if doms, err := e.d.Domains(e.ctx, "h2"); err != nil || len(doms) != 0 {
		t.Errorf("Domains(h2) after a Migrate fenced at the switchover = %+v, %v; want none", doms, err)
	}
	if rec := e.migrationRecord(uuidA); len(rec) != 0 {
		t.Errorf("after a Migrate fenced at the switchover, migration record %v, want none", rec)
	}
	// The domain's home is still h1: h2 cannot define it.
	if err := e.d.Define(e.ctx, "h2", domainXML(uuidA, "a", 6, 1)); !errors.Is(err, hypervisor.ErrRejected) {
		t.Errorf("Define(h2) after a Migrate fenced at the switchover: %v, want ErrRejected (the domain lives on h1)", err)
	}
	// Nothing blocks a new, unfenced attempt.
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, domainXML(uuidA, "a", 6, 1)), nil); err != nil {
		t.Errorf("Migrate after a fenced one: %v, want nil", err)
	}
}

func TestMigrateRetryPastSwitchoverNotFenced(t *testing.T) {
	e := newEnv(t, Options{})
	e.running("h1", uuidA, "a", 2, 0)
	dest := domainXML(uuidA, "a", 6, 1)
	crashOnce(e.d, "switchover")
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); !errors.Is(err, errCrash) {
		t.Fatalf("Migrate crashing at the switchover: %v, want the crash", err)
	}
	// The claim is gone by the time the activity is retried, but the
	// migration is past its point of no return: it finishes.
	f := &fenceLog{failing: true}
	req := migrateReq("h1", "h2", uuidA, dest)
	req.Fence = f.fence
	d := e.restart(Options{})
	if err := d.Migrate(e.ctx, req, nil); err != nil {
		t.Fatalf("Migrate retried past the switchover with a failing fence: %v, want nil", err)
	}
	// So does a retry of the completed migration.
	if err := d.Migrate(e.ctx, req, nil); err != nil {
		t.Errorf("Migrate retried after completion with a failing fence: %v, want nil", err)
	}
	if n := f.count(); n != 0 {
		t.Errorf("Migrate retried past the switchover called the fence %d times, want 0", n)
	}
	want := map[string]where{"h2": {hypervisor.StateRunning, dest}}
	if diff := cmp.Diff(want, e.placement(d, uuidA)); diff != "" {
		t.Errorf("after the retry past the switchover, placement mismatch (-want +got):\n%s", diff)
	}
	if rec := e.migrationRecord(uuidA); rec["phase"] != phaseCompleted {
		t.Errorf("after the retry past the switchover, record phase %q, want %q", rec["phase"], phaseCompleted)
	}
}
