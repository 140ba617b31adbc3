package sim

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/hypervisor"
)

// testStale is the staleness bound of these tests: short, and still well
// above the gaps between the progress steps of their migrations.
const testStale = 300 * time.Millisecond

// waitStale waits until a migration last touched now is stale.
func waitStale() { time.Sleep(2 * testStale) }

// staleEnv is an env whose drivers use testStale, with a third host h3.
func staleEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, Options{StaleMigration: testStale})
	if err := e.d.AddHost(e.ctx, "h3", testTopo(t)); err != nil {
		t.Fatal(err)
	}
	return e
}

// raw returns the stored hash of domain uuid on host.
func (e *env) raw(host, uuid string) map[string]string {
	e.t.Helper()
	m, err := e.rdb.HGetAll(e.ctx, e.d.domKey(host, uuid)).Result()
	if err != nil {
		e.t.Fatalf("HGETALL %s on %s: %v", uuid, host, err)
	}
	return m
}

// deadMigration starts a migration of uuidA, running on h1 with src, to
// h2 whose driver dies during the copy, and returns the destination XML.
func (e *env) deadMigration() string {
	e.t.Helper()
	dest := domainXML(uuidA, "a", 6, 1)
	crashOnce(e.d, "copying")
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); !errors.Is(err, errCrash) {
		e.t.Fatalf("Migrate crashing during the copy: %v, want the crash", err)
	}
	e.d.crash = nil
	return dest
}

// checkAborted fails unless no migration of uuidA is in flight and none of
// its traces is left: no incoming domain on h2, no mark on h1.
func (e *env) checkAborted(what string) {
	e.t.Helper()
	if rec := e.migrationRecord(uuidA); len(rec) != 0 && rec["phase"] != phaseCompleted {
		e.t.Errorf("%s: migration record %v, want none in flight", what, rec)
	}
	if m := e.raw("h2", uuidA); m["incoming"] == "1" {
		e.t.Errorf("%s: h2 holds the incoming domain %v, want it gone", what, m)
	}
	if m := e.raw("h1", uuidA); m["migration"] != "" || m["incoming"] != "" {
		e.t.Errorf("%s: h1 holds the domain marked %v, want it unmarked", what, m)
	}
}

// checkOnSource fails unless uuidA runs on h1 with src, unmarked, and no
// other host has it.
func (e *env) checkOnSource(what, src string) {
	e.t.Helper()
	e.checkAborted(what)
	if diff := cmp.Diff(map[string]where{"h1": {hypervisor.StateRunning, src}}, e.placement(e.d, uuidA)); diff != "" {
		e.t.Errorf("%s: placement mismatch (-want +got):\n%s", what, diff)
	}
	if doms, err := e.d.Domains(e.ctx, "h2"); err != nil || len(doms) != 0 {
		e.t.Errorf("%s: Domains(h2) = %+v, %v; want none", what, doms, err)
	}
}

func TestStaleMigrationAborted(t *testing.T) {
	e := staleEnv(t)
	src := e.running("h1", uuidA, "a", 2, 0)
	begin := time.Now()
	e.deadMigration()
	to3 := domainXML(uuidA, "a", 7, 1)

	// Right after the crash the migration may still be alive: the
	// incoming domain shows and another migration is refused. That holds
	// only while less than the bound has passed since the last touch, which
	// came after begin; a machine too slow for that skips the check.
	dom, lookupErr := e.d.Lookup(e.ctx, "h2", uuidA)
	migrateErr := e.d.Migrate(e.ctx, migrateReq("h1", "h3", uuidA, to3), nil)
	if took := time.Since(begin); took < testStale {
		if lookupErr != nil || dom.State != hypervisor.StatePaused {
			t.Errorf("Lookup(h2) right after the crash = %+v, %v; want the paused incoming domain", dom, lookupErr)
		}
		if migrateErr == nil || !strings.Contains(migrateErr.Error(), "in flight") {
			t.Errorf("Migrate(h1 -> h3) right after the crash: %v, want an 'in flight' error", migrateErr)
		}
	} else {
		t.Logf("the checks right after the crash took %s, more than the bound %s; skipped", took, testStale)
	}

	// Once the bound has passed, the first Lookup aborts the migration.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		dom, err := e.d.Lookup(e.ctx, "h2", uuidA)
		if errors.Is(err, hypervisor.ErrNotFound) {
			break
		}
		if err != nil || dom.State != hypervisor.StatePaused {
			t.Fatalf("Lookup(h2) while the dead migration ages = %+v, %v; want the paused incoming domain, then ErrNotFound", dom, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("Lookup(h2) still finds the incoming domain long after the bound %s", testStale)
		}
	}
	e.checkOnSource("after the dead migration was aborted", src)
	// Nothing is left to roll back.
	for i := range 2 {
		if err := e.d.Rollback(e.ctx, "h1", "h2", uuidA); err != nil {
			t.Errorf("Rollback #%d to the old destination: %v, want nil", i+1, err)
		}
	}
	e.checkOnSource("after Rollback to the old destination", src)
	// And the guest migrates elsewhere.
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h3", uuidA, to3), nil); err != nil {
		t.Fatalf("Migrate(h1 -> h3) after the dead migration was aborted: %v", err)
	}
	if dom, err := e.d.Lookup(e.ctx, "h3", uuidA); err != nil || dom.State != hypervisor.StateRunning || dom.XML != to3 {
		t.Errorf("Lookup(h3) after the migration there = %+v, %v; want it running with its new XML", dom, err)
	}
	if diff := cmp.Diff(map[string]where{}, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after the migration to h3, placement on h1 and h2 mismatch (-want +got):\n%s", diff)
	}
}

// TestStaleMigrationEveryReader: whichever call reads the domain first
// after the bound aborts the dead migration, and then does its own job.
func TestStaleMigrationEveryReader(t *testing.T) {
	dest := domainXML(uuidA, "a", 6, 1)
	to3 := domainXML(uuidA, "a", 7, 1)
	noDomains := func(doms []hypervisor.Domain, err error) error {
		if err == nil && len(doms) != 0 {
			return errors.New("domains listed, want none")
		}
		return err
	}
	oneRunning := func(doms []hypervisor.Domain, err error) error {
		if err == nil && (len(doms) != 1 || doms[0].State != hypervisor.StateRunning) {
			return errors.New("domains listed are not the one running guest")
		}
		return err
	}
	tests := []struct {
		name string
		call func(e *env) error
		want error // nil, or what the error wraps
	}{
		{"Lookup destination", func(e *env) error { _, err := e.d.Lookup(e.ctx, "h2", uuidA); return err }, hypervisor.ErrNotFound},
		{"Lookup source", func(e *env) error { _, err := e.d.Lookup(e.ctx, "h1", uuidA); return err }, nil},
		{"Domains destination", func(e *env) error { return noDomains(e.d.Domains(e.ctx, "h2")) }, nil},
		{"Domains source", func(e *env) error { return oneRunning(e.d.Domains(e.ctx, "h1")) }, nil},
		{"Migrate again", func(e *env) error { return e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil) }, nil},
		{"Migrate elsewhere", func(e *env) error { return e.d.Migrate(e.ctx, migrateReq("h1", "h3", uuidA, to3), nil) }, nil},
		{"Rollback", func(e *env) error { return e.d.Rollback(e.ctx, "h1", "h2", uuidA) }, nil},
		{"Rollback elsewhere", func(e *env) error { return e.d.Rollback(e.ctx, "h1", "h3", uuidA) }, nil},
		{"PrepareMigration", func(e *env) error { return e.d.PrepareMigration(e.ctx, "h2", uuidA, dest) }, nil},
		{"Define on destination", func(e *env) error { return e.d.Define(e.ctx, "h2", dest) }, hypervisor.ErrRejected},
		{"Define elsewhere", func(e *env) error { return e.d.Define(e.ctx, "h3", to3) }, hypervisor.ErrRejected},
		{"Start destination", func(e *env) error { return e.d.Start(e.ctx, "h2", uuidA) }, hypervisor.ErrNotFound},
		{"Stop source", func(e *env) error { return e.d.Stop(e.ctx, "h1", uuidA) }, nil},
		{"Stop destination", func(e *env) error { return e.d.Stop(e.ctx, "h2", uuidA) }, hypervisor.ErrNotFound},
		{"Shutdown source", func(e *env) error { return e.d.Shutdown(e.ctx, "h1", uuidA) }, nil},
		{"Shutdown destination", func(e *env) error { return e.d.Shutdown(e.ctx, "h2", uuidA) }, hypervisor.ErrNotFound},
		{"Undefine destination", func(e *env) error { return e.d.Undefine(e.ctx, "h2", uuidA) }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := staleEnv(t)
			e.running("h1", uuidA, "a", 2, 0)
			e.deadMigration()
			waitStale()
			err := tt.call(e)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("%s after the bound: %v, want %v", tt.name, err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "migrat") {
				t.Errorf("%s after the bound: %v, want no error about the dead migration", tt.name, err)
			}
			e.checkAborted(tt.name + " after the bound")
		})
	}
}

func TestSlowMigrationNotStale(t *testing.T) {
	e := staleEnv(t)
	e.running("h1", uuidA, "a", 2, 0)
	dest := domainXML(uuidA, "a", 6, 1)
	// Longer than the bound, in steps shorter than it.
	if err := e.d.SetLatency(e.ctx, "h1", OpMigrate, 1200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Another worker reads the domain on both hosts all along, which
	// would abort the migration if it took it for dead.
	reader := e.restart(Options{StaleMigration: testStale})
	done := make(chan struct{})
	var paused int
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if dom, err := reader.Lookup(e.ctx, "h2", uuidA); err == nil && dom.State == hypervisor.StatePaused {
				paused++
			}
			for _, h := range []string{"h1", "h2"} {
				if _, err := reader.Domains(e.ctx, h); err != nil {
					t.Errorf("Domains(%s) during a slow migration: %v", h, err)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	var log progressLog
	err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), log.add)
	close(done)
	wg.Wait()
	if err != nil {
		t.Fatalf("Migrate slower than the bound, read all along: %v, want nil", err)
	}
	if paused == 0 {
		t.Fatalf("the reader never saw the incoming domain: the test read nothing during the copy")
	}
	checkRising(t, "slow Migrate", log.all(), minSteps+1)
	if diff := cmp.Diff(map[string]where{"h2": {hypervisor.StateRunning, dest}}, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after a slow migration, placement mismatch (-want +got):\n%s", diff)
	}
	if rec := e.migrationRecord(uuidA); rec["phase"] != phaseCompleted {
		t.Errorf("after a slow migration, record phase %q, want %q", rec["phase"], phaseCompleted)
	}
}

// TestLateAttemptFails: an attempt that stalls past the bound, and is
// aborted as dead meanwhile, fails when it comes back and changes nothing.
func TestLateAttemptFails(t *testing.T) {
	src := domainXML(uuidA, "a", 2, 0)
	dest := domainXML(uuidA, "a", 6, 1)
	to3 := domainXML(uuidA, "a", 7, 1)
	tests := []struct {
		name string
		// atFence stalls the attempt at its fence before the switchover
		// rather than in the copy.
		atFence bool
		// meanwhile runs, on another worker, while the attempt stalls
		// past the bound.
		meanwhile func(e *env, d *Driver) error
		wantIn    string
		// check checks what meanwhile left, once the attempt is back.
		check func(e *env)
	}{
		{
			name:      "stalled in the copy",
			meanwhile: func(e *env, d *Driver) error { return lookupGone(e, d) },
			wantIn:    "took this migration over",
			check:     func(e *env) { e.checkOnSource("after the late attempt", src) },
		},
		{
			name:    "stalled before the switchover",
			atFence: true,
			meanwhile: func(e *env, d *Driver) error {
				return lookupGone(e, d)
			},
			wantIn: "took this migration over",
			check:  func(e *env) { e.checkOnSource("after the late attempt", src) },
		},
		{
			name: "stalled while the guest migrated elsewhere",
			meanwhile: func(e *env, d *Driver) error {
				return d.Migrate(e.ctx, migrateReq("h1", "h3", uuidA, to3), nil)
			},
			wantIn: "took this migration over",
			check: func(e *env) {
				e.checkAborted("after the late attempt")
				if diff := cmp.Diff(map[string]where{}, e.placement(e.d, uuidA)); diff != "" {
					e.t.Errorf("after the late attempt, placement on h1 and h2 mismatch (-want +got):\n%s", diff)
				}
				if dom, err := e.d.Lookup(e.ctx, "h3", uuidA); err != nil || dom.State != hypervisor.StateRunning || dom.XML != to3 {
					e.t.Errorf("after the late attempt, Lookup(h3) = %+v, %v; want the guest running there", dom, err)
				}
				if rec := e.migrationRecord(uuidA); rec["phase"] != phaseCompleted || rec["dst"] != "h3" {
					e.t.Errorf("after the late attempt, record %v, want the completed migration to h3", rec)
				}
			},
		},
		{
			// The worker that declared the migration dead died before
			// aborting it; the attempt, back, aborts itself.
			name: "stalled while its abort was half done",
			meanwhile: func(e *env, d *Driver) error {
				crashOnce(d, "reaping")
				if _, err := d.Lookup(e.ctx, "h2", uuidA); !errors.Is(err, errCrash) {
					return errors.Join(errors.New("Lookup(h2) by a worker dying as it aborts: want the crash"), err)
				}
				if rec := e.migrationRecord(uuidA); rec["phase"] != phaseAborting {
					return errors.New("the record is in phase " + rec["phase"] + ", want " + phaseAborting)
				}
				return nil
			},
			wantIn: "made no progress",
			check:  func(e *env) { e.checkOnSource("after the late attempt", src) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := staleEnv(t)
			e.running("h1", uuidA, "a", 2, 0)
			stalled, resume := make(chan struct{}), make(chan struct{})
			stall := func() {
				close(stalled)
				<-resume
			}
			req := migrateReq("h1", "h2", uuidA, dest)
			var progress func(hypervisor.Progress)
			if tt.atFence {
				fences := 0
				req.Fence = func(context.Context) error {
					if fences++; fences == 2 {
						stall()
					}
					return nil
				}
			} else {
				reports := 0
				progress = func(hypervisor.Progress) {
					if reports++; reports == 1 {
						stall()
					}
				}
			}
			errc := make(chan error, 1)
			go func() { errc <- e.d.Migrate(e.ctx, req, progress) }()
			<-stalled
			waitStale()
			err := tt.meanwhile(e, e.restart(Options{StaleMigration: testStale}))
			close(resume)
			lateErr := <-errc
			if err != nil {
				t.Fatalf("while the attempt stalled: %v", err)
			}
			if lateErr == nil || !strings.Contains(lateErr.Error(), tt.wantIn) {
				t.Errorf("Migrate back after being declared dead: %v, want an error containing %q", lateErr, tt.wantIn)
			}
			tt.check(e)
		})
	}
}

// lookupGone looks the incoming domain up on h2 with d, and expects it
// gone.
func lookupGone(e *env, d *Driver) error {
	if _, err := d.Lookup(e.ctx, "h2", uuidA); !errors.Is(err, hypervisor.ErrNotFound) {
		return errors.Join(errors.New("Lookup(h2) after the bound: want ErrNotFound"), err)
	}
	return nil
}

func TestStaleMigrationConcurrentReaders(t *testing.T) {
	e := staleEnv(t)
	src := e.running("h1", uuidA, "a", 2, 0)
	dest := e.deadMigration()
	waitStale()
	reads := map[string]func(d *Driver) error{
		"Lookup(h2)": func(d *Driver) error {
			if _, err := d.Lookup(e.ctx, "h2", uuidA); !errors.Is(err, hypervisor.ErrNotFound) {
				return errors.Join(errors.New("want ErrNotFound"), err)
			}
			return nil
		},
		"Lookup(h1)": func(d *Driver) error {
			dom, err := d.Lookup(e.ctx, "h1", uuidA)
			if err == nil && dom.State != hypervisor.StateRunning {
				return errors.New("the guest is " + string(dom.State) + ", want running")
			}
			return err
		},
		"Domains(h2)": func(d *Driver) error {
			doms, err := d.Domains(e.ctx, "h2")
			if err == nil && len(doms) != 0 {
				return errors.New("domains listed, want none")
			}
			return err
		},
		"Domains(h1)": func(d *Driver) error {
			doms, err := d.Domains(e.ctx, "h1")
			if err == nil && (len(doms) != 1 || doms[0].State != hypervisor.StateRunning) {
				return errors.New("domains listed are not the one running guest")
			}
			return err
		},
		"Rollback(h1, h2)":   func(d *Driver) error { return d.Rollback(e.ctx, "h1", "h2", uuidA) },
		"PrepareMigration":   func(d *Driver) error { return d.PrepareMigration(e.ctx, "h2", uuidA, dest) },
		"Stop(h2)":           func(d *Driver) error { return ignore(d.Stop(e.ctx, "h2", uuidA), hypervisor.ErrNotFound) },
		"Undefine(h2)":       func(d *Driver) error { return d.Undefine(e.ctx, "h2", uuidA) },
		"Rollback(h1, h3)":   func(d *Driver) error { return d.Rollback(e.ctx, "h1", "h3", uuidA) },
		"Define(h2) refused": func(d *Driver) error { return ignore(d.Define(e.ctx, "h2", dest), hypervisor.ErrRejected) },
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for name, read := range reads {
		for range 3 {
			d := e.restart(Options{StaleMigration: testStale})
			wg.Go(func() {
				<-start
				if err := read(d); err != nil {
					t.Errorf("%s, concurrent with other readers after the bound: %v", name, err)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	e.checkOnSource("after concurrent readers", src)
}

// ignore returns nil for an error wrapping want, and other errors as they
// are.
func ignore(err, want error) error {
	if errors.Is(err, want) {
		return nil
	}
	if err == nil {
		return errors.New("succeeded, want an error wrapping " + want.Error())
	}
	return err
}

// TestStaleMigrationLeftoverMarks: a retry that dies right after its
// step 1 leaves the marks of the attempt it replaced; aborting it as dead
// clears those too.
func TestStaleMigrationLeftoverMarks(t *testing.T) {
	e := staleEnv(t)
	src := e.running("h1", uuidA, "a", 2, 0)
	dest := domainXML(uuidA, "a", 6, 1)
	crashOnce(e.d, "incoming")
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); !errors.Is(err, errCrash) {
		t.Fatalf("Migrate crashing after its step 3: %v, want the crash", err)
	}
	retry := e.restart(Options{StaleMigration: testStale})
	crashOnce(retry, "begun")
	if err := retry.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); !errors.Is(err, errCrash) {
		t.Fatalf("Migrate retried, crashing after its step 1: %v, want the crash", err)
	}
	if got, first := e.migrationRecord(uuidA)["token"], e.raw("h2", uuidA)["migration"]; got == first || first == "" {
		t.Fatalf("the retry's record has token %q and h2's mark %q; want the first attempt's mark left over", got, first)
	}
	waitStale()
	if _, err := e.d.Lookup(e.ctx, "h2", uuidA); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Lookup(h2) after the bound: %v, want ErrNotFound", err)
	}
	e.checkOnSource("after the dead retry was aborted", src)
	if err := e.d.Stop(e.ctx, "h1", uuidA); err != nil {
		t.Errorf("Stop(h1) after the dead retry was aborted: %v, want nil", err)
	}
}

// TestStaleMigrationPastSwitchover: a migration past its point of no
// return is never aborted: once its attempt has stopped for the
// staleness bound (its process died), the first read finishes it, and a
// retry then finds it done.
func TestStaleMigrationPastSwitchover(t *testing.T) {
	e := staleEnv(t)
	e.running("h1", uuidA, "a", 2, 0)
	dest := domainXML(uuidA, "a", 6, 1)
	crashOnce(e.d, "switchover")
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); !errors.Is(err, errCrash) {
		t.Fatalf("Migrate crashing at the switchover: %v, want the crash", err)
	}
	waitStale()
	if dom, err := e.d.Lookup(e.ctx, "h1", uuidA); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Lookup(h1) long after a crash at the switchover = %+v, %v; want ErrNotFound (the read finished the migration)", dom, err)
	}
	if diff := cmp.Diff(map[string]where{"h2": {hypervisor.StateRunning, dest}}, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after the read, placement mismatch (-want +got):\n%s", diff)
	}
	if rec := e.migrationRecord(uuidA); rec["phase"] != phaseCompleted {
		t.Errorf("after the read, record phase %q, want %q", rec["phase"], phaseCompleted)
	}
	if err := e.d.Rollback(e.ctx, "h1", "h3", uuidA); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Rollback(h1, h3) of a guest that left h1 for h2: %v, want ErrNotFound", err)
	}
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); err != nil {
		t.Fatalf("Migrate retried after the read finished it: %v", err)
	}
	if diff := cmp.Diff(map[string]where{"h2": {hypervisor.StateRunning, dest}}, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after the retry, placement mismatch (-want +got):\n%s", diff)
	}
}

// TestStaleRollbackFinishesOrphan: the rollback of another migration of
// the guest, the next operation's, does not wait forever on one past its
// switchover whose attempt died: once that one is stale, the rollback's
// read finishes it, and there is nothing of the other migration to undo.
func TestStaleRollbackFinishesOrphan(t *testing.T) {
	e := staleEnv(t)
	e.running("h1", uuidA, "a", 2, 0)
	dest := domainXML(uuidA, "a", 6, 1)
	crashOnce(e.d, "switchover")
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil); !errors.Is(err, errCrash) {
		t.Fatalf("Migrate crashing at the switchover: %v, want the crash", err)
	}
	waitStale()
	err := e.d.Rollback(e.ctx, "h1", "h3", uuidA)
	if !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Rollback(h1, h3) long after the crash: %v, want ErrNotFound (the guest left h1)", err)
	}
	if diff := cmp.Diff(map[string]where{"h2": {hypervisor.StateRunning, dest}}, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after the rollback, placement mismatch (-want +got):\n%s", diff)
	}
}

// TestStaleHeldPastSwitchover: an attempt held past its switchover longer
// than the staleness bound is finished by the next read, and then, once
// released, finds its own steps done and succeeds.
func TestStaleHeldPastSwitchover(t *testing.T) {
	e := staleEnv(t)
	e.running("h1", uuidA, "a", 2, 0)
	dest := domainXML(uuidA, "a", 6, 1)
	if err := e.d.HoldGate(e.ctx, GateSwitched, ""); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, dest), nil) }()
	e.await(GateSwitched, "the migration past its switchover", func(st GateState) bool { return st.Arrived == 1 })
	waitStale()
	if _, err := e.d.Domains(e.ctx, "h1"); err != nil {
		t.Fatalf("Domains(h1) with the attempt held past the bound: %v", err)
	}
	if diff := cmp.Diff(map[string]where{"h2": {hypervisor.StateRunning, dest}}, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after the read, placement mismatch (-want +got):\n%s", diff)
	}
	if err := e.d.ReleaseGate(e.ctx, GateSwitched, ""); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Migrate released after a read finished it: %v, want nil", err)
	}
	if diff := cmp.Diff(map[string]where{"h2": {hypervisor.StateRunning, dest}}, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after the release, placement mismatch (-want +got):\n%s", diff)
	}
}
