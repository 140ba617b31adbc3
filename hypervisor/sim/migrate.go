package sim

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/pinflow/pinflow/hypervisor"
)

// Migration phases, as stored in a migration record.
const (
	phaseCopying    = "copying"
	phaseSwitchover = "switchover"
	phaseCompleted  = "completed"
	phaseRollback   = "rollback"
	// phaseAborting: the migration was declared dead and is being
	// aborted; see reap.
	phaseAborting = "aborting"
)

// Progress phases reported by Migrate.
const (
	// ProgressCopying is reported while memory is copied.
	ProgressCopying = "copying"
	// ProgressCompleted is reported once, when the guest runs on the
	// destination only.
	ProgressCompleted = "completed"
)

// stepInterval is how often a long migration reports progress; a short one
// reports minSteps times.
const (
	stepInterval = 250 * time.Millisecond
	minSteps     = 10
)

// cleanupTimeout bounds the steps that run after ctx is done: the abort
// of a cancelled migration and the end of one past its switchover.
const cleanupTimeout = 10 * time.Second

// migration is a migration record.
type migration struct {
	src, dst, destXML, srcXML, name, token, phase string
}

// inFlight reports whether the record belongs to a migration that is
// neither completed nor forgotten.
func (m *migration) inFlight() bool { return m != nil && m.phase != phaseCompleted }

// record reads the migration record of domain u, after ending the
// migration if its attempt is gone (see reap); nil when there is none.
func (d *Driver) record(ctx context.Context, u string) (*migration, error) {
	for reaped := false; ; reaped = true {
		f, err := d.rdb.HGetAll(ctx, d.migrationKey(u)).Result()
		if err != nil {
			return nil, err
		}
		if len(f) == 0 {
			return nil, nil
		}
		if p := f["phase"]; !reaped && p != phaseCompleted && p != phaseRollback {
			changed, err := d.reap(ctx, u, nil)
			if err != nil {
				return nil, err
			}
			if changed {
				continue
			}
		}
		return migrationOf(f), nil
	}
}

// migrationOf is the migration record stored in hash f; nil when f is
// empty.
func migrationOf(f map[string]string) *migration {
	if len(f) == 0 {
		return nil
	}
	return &migration{src: f["src"], dst: f["dst"], destXML: f["dest_xml"], srcXML: f["src_xml"],
		name: f["name"], token: f["token"], phase: f["phase"]}
}

// domState is a domain as stored, with its migration marks.
type domState struct {
	hypervisor.Domain
	incoming  bool
	migration string
	// shuttingDown: a shutdown is pending and not due yet.
	shuttingDown bool
}

// domain reads domain u of host, after aborting a dead migration that
// marks it; nil when the host has no such domain.
func (d *Driver) domain(ctx context.Context, host, u string) (*domState, error) {
	f, now, err := d.readDomain(ctx, host, u)
	if err != nil {
		return nil, err
	}
	if len(f) == 0 {
		return nil, nil
	}
	due, pending := shutdownDue(f)
	return &domState{Domain: *domainOf(f, now), incoming: f["incoming"] == "1", migration: f["migration"],
		shuttingDown: pending && now.Before(due)}, nil
}

// migrationDoc parses destXML and checks that it names domain uuid.
func migrationDoc(uuid, destXML string) (hypervisor.DomainIdentity, error) {
	doc, err := parseDomain(destXML)
	if err != nil {
		return hypervisor.DomainIdentity{}, fmt.Errorf("destination %w", err)
	}
	id, err := hypervisor.ParseUUID(uuid)
	if err != nil {
		return hypervisor.DomainIdentity{}, fmt.Errorf("%v: %w", err, hypervisor.ErrRejected)
	}
	if u := id.String(); doc.UUID != u {
		return hypervisor.DomainIdentity{}, fmt.Errorf("the destination xml names domain %s, not %s: %w", doc.UUID, u, hypervisor.ErrRejected)
	}
	return doc, nil
}

// checkDestination checks that the pins of destXML fit dst's topology.
func (d *Driver) checkDestination(ctx context.Context, dst, destXML string) error {
	topo, err := d.topology(ctx, dst)
	if err != nil {
		return err
	}
	if err := checkPins(topo, destXML); err != nil {
		return fmt.Errorf("destination xml: %w", err)
	}
	return nil
}

// PrepareMigration checks that dst can take domain uuid with destXML: the
// host exists, the XML names the domain and pins it to CPUs and nodes dst
// has, and dst does not hold the domain already (unless as the incoming
// side of this very migration, retried). The prepare latency and faults of
// dst apply.
func (d *Driver) PrepareMigration(ctx context.Context, dst, uuid, destXML string) error {
	fail := func(err error) error { return fmt.Errorf("sim: prepare migration of %s to %s: %w", uuid, dst, err) }
	doc, err := migrationDoc(uuid, destXML)
	if err != nil {
		return fail(err)
	}
	u := doc.UUID
	if err := d.checkDestination(ctx, dst, destXML); err != nil {
		return fail(err)
	}
	if err := d.pace(ctx, dst, u, OpPrepare); err != nil {
		return fail(err)
	}
	dom, err := d.domain(ctx, dst, u)
	if err != nil {
		return fail(err)
	}
	if dom == nil {
		return nil
	}
	rec, err := d.record(ctx, u)
	if err != nil {
		return fail(err)
	}
	if dom.incoming && rec.inFlight() && rec.dst == dst && rec.token == dom.migration {
		return nil
	}
	return fail(fmt.Errorf("the domain is already defined on %s (%s): %w", dst, dom.State, hypervisor.ErrRejected))
}

// Migrate moves the running domain req.UUID from req.Source to req.Dest,
// where req.DestXML becomes its definition, calling progress as it goes.
// Its copy lasts the migrate latency of the source, with a rising Percent
// over the guest's memory (its <memory>); the guest dirties nothing, so the
// bandwidth cap, downtime and auto-converge of req.Policy do not apply.
// The migrate fault of the source, when due, fails it half-way. Cancelling ctx, an injected fault,
// or a failing req.Fence aborts it: the domain keeps running on the
// source, the destination holds no trace of it, and the error wraps ctx's
// error, ErrInjected, or hypervisor.ErrFenced and the fence's error.
//
// The timeouts of req.Policy count the copy's own time (the steps of the
// latency, after the copy start delay that only the start timeout
// counts), not the wall clock, so that a test's Sleep that does not wait
// still times out as a real migration would: a latency longer than the
// completion timeout makes one. One that fires aborts the migration as a
// cancel does and returns a *hypervisor.MigrationTimeoutError, or, when
// the policy says post-copy, switches: the guest belongs to the
// destination from then on, and the rest of its memory is fetched over
// the rest of the latency (ProgressPostCopy reports) before the migration
// completes. A bad req.Policy is refused
// with hypervisor.ErrRejected.
//
// The steps, each atomic on one Redis slot and idempotent:
//
//  1. the migration record (phase copying, a fresh token, touched now),
//     home = src;
//  2. the source domain, which must run, is marked with the token;
//  3. the destination gets the domain, paused and marked as incoming;
//  4. the memory copy, after the copy gate and the source's copy start
//     delay (SetCopyStartDelay; ProgressSetup reports): latency and
//     progress, touching the record and checking ctx at every step;
//  5. switchover: phase switchover and home = dst, if the record still
//     carries this attempt's token; past this point ctx is ignored;
//  6. the destination domain runs with destXML;
//  7. the source domain, if still marked with the token, is removed;
//  8. phase completed; the record expires after Options.CompletedTTL, so
//     that a Rollback meanwhile can restore the source.
//
// req.Fence is called right before step 1, so a fenced attempt changes
// nothing, and right before step 5, the point of no return, so a fence
// that fails during the copy aborts it; a switch to post-copy is step 5
// too, and a fence that refuses it aborts the migration instead. Between
// that call and the switchover script there is no fence: the caller's
// lease covers that window, as it covers the same window of a real
// hypervisor.
//
// A retry after a crash finds: a record in phase copying (steps 1-4) and
// restarts the migration, replacing the marks of the lost attempt; a record
// in phase switchover (steps 5-7) and finishes 6-8 without calling Fence,
// since it is past the point of no return; or the domain running on dst
// with destXML and gone from src, and succeeds at once. Faults and latency
// apply only to an attempt that (re)starts copying.
//
// Without a retry, a migration whose attempt died during the copy is dead
// once its record has not been touched (step 1, and every step of 4) for
// Options.StaleMigration, by Redis's clock. The next call that reads the
// domain where the migration marks it (Lookup or Domains of either host,
// Migrate, Rollback, PrepareMigration, and Define, Start, Stop, Shutdown
// or Undefine where the mark would refuse them) aborts it first, as the
// attempt's own abort would: the domain runs on the source, unmarked, the
// destination holds no trace of it, and the record is gone, so another
// migration of the guest may start. Declaring it dead is one script on
// the record (phase aborting, decided by the first caller to find it
// stale); an attempt that was only slow and comes back after that fails
// at its next step or at its switchover, with an error, and changes
// nothing. A migration past its switchover is never aborted: a retry
// finishes it, and so does the first such read once its attempt has not
// shown itself for Options.StaleMigration (a worker killed there, its
// workflow ended), as libvirt completes a migration whose destination
// runs the guest whether or not its client is still there.
//
// A source or destination that powers off ends the migration at once (see
// PowerOff). During the copy it is aborted as a dead one, and Migrate
// fails with an error wrapping ErrHostOff; past the switchover it
// completes, and Migrate fails with ErrHostOff only if the destination is
// the host that went off, where the guest is then defined, shut off.
func (d *Driver) Migrate(ctx context.Context, req hypervisor.MigrateRequest, progress func(hypervisor.Progress)) error {
	if progress == nil {
		progress = func(hypervisor.Progress) {}
	}
	if err := d.migrate(ctx, req, progress); err != nil {
		return fmt.Errorf("sim: migrate %s from %s to %s: %w", req.UUID, req.Source, req.Dest, err)
	}
	return nil
}

// attempt is one call of Migrate: the migration it asks for, and what its
// steps share.
type attempt struct {
	req      hypervisor.MigrateRequest
	u        string // the domain's UUID, normalised
	name     string // the domain's name in the destination XML
	total    uint64 // the guest's memory in bytes, the data the copy moves
	progress func(hypervisor.Progress)

	// Set by begin.
	rec      *migration   // this attempt's record
	model    *latencyCopy // how the copy goes
	injected error        // a fault that strikes half-way through the copy

	// Set by copyMemory.
	last    hypervisor.Progress               // the last progress of the copy
	timeout *hypervisor.MigrationTimeoutError // the policy timeout that fired
}

// completed is the progress reported once the guest runs on the
// destination only.
func (a *attempt) completed() hypervisor.Progress {
	return hypervisor.Progress{Percent: 100, DataTotal: a.total, DataProcessed: a.total, Phase: ProgressCompleted}
}

// migrate is Migrate, with errors that do not yet say which migration
// failed. Its steps: locate the domain (or what a lost attempt left),
// begin a new attempt, copy the memory, switch over.
func (d *Driver) migrate(ctx context.Context, req hypervisor.MigrateRequest, progress func(hypervisor.Progress)) error {
	doc, err := migrationDoc(req.UUID, req.DestXML)
	if err != nil {
		return err
	}
	if req.Source == req.Dest {
		return fmt.Errorf("source and destination are the same host; a migration needs two: %w", hypervisor.ErrRejected)
	}
	if err := req.Policy.Validate(); err != nil {
		return fmt.Errorf("%w: %w", hypervisor.ErrRejected, err)
	}
	if err := d.checkHost(ctx, req.Source); err != nil {
		return err
	}
	if err := d.checkDestination(ctx, req.Dest, req.DestXML); err != nil {
		return err
	}
	a := &attempt{req: req, u: doc.UUID, name: doc.Name, total: doc.MemoryBytes, progress: progress}
	srcDom, done, err := d.locate(ctx, a)
	if err != nil {
		return err
	}
	if !done {
		if err := d.begin(ctx, a, srcDom); err != nil {
			return err
		}
		postCopy, err := d.copyMemory(ctx, a)
		if err != nil {
			return err
		}
		if err := d.switchOver(ctx, a, postCopy); err != nil {
			return err
		}
	}
	a.progress(a.completed())
	return nil
}

// locate finds where the domain is and what an earlier attempt left. It
// finishes an attempt lost past its switchover and recognises one that
// completed (done, in both cases); it refuses a domain that cannot migrate
// from here; otherwise it returns the running source domain a new attempt
// starts from.
func (d *Driver) locate(ctx context.Context, a *attempt) (srcDom *domState, done bool, err error) {
	src, dst := a.req.Source, a.req.Dest
	if srcDom, err = d.domain(ctx, src, a.u); err != nil {
		return nil, false, err
	}
	dstDom, err := d.domain(ctx, dst, a.u)
	if err != nil {
		return nil, false, err
	}
	rec, err := d.record(ctx, a.u)
	if err != nil {
		return nil, false, err
	}
	if rec.inFlight() {
		if rec.src != src || rec.dst != dst {
			return nil, false, fmt.Errorf("a migration from %s to %s is in flight (%s); roll it back first", rec.src, rec.dst, rec.phase)
		}
		switch rec.phase {
		case phaseSwitchover:
			// Past the point of no return: finish what the lost attempt
			// started (each step is a no-op if it was done).
			if err := d.finish(ctx, src, dst, a.u, rec); err != nil {
				return nil, false, err
			}
			return nil, true, nil
		case phaseRollback:
			return nil, false, fmt.Errorf("a rollback of this migration was interrupted; run Rollback again first")
		}
	}
	// A previous attempt completed and its answer was lost.
	if srcDom == nil && dstDom != nil && !dstDom.incoming && dstDom.migration == "" &&
		dstDom.State == hypervisor.StateRunning && dstDom.XML == a.req.DestXML {
		return nil, true, nil
	}
	switch {
	case srcDom == nil:
		return nil, false, fmt.Errorf("the domain is not on %s: %w", src, hypervisor.ErrNotFound)
	case srcDom.incoming || srcDom.State != hypervisor.StateRunning:
		return nil, false, fmt.Errorf("the domain is %s on %s, and only a running domain migrates: %w", srcDom.State, src, hypervisor.ErrRejected)
	case srcDom.shuttingDown:
		return nil, false, errShuttingDown
	case dstDom != nil && !dstDom.incoming:
		return nil, false, fmt.Errorf("the domain is already defined on %s (%s): %w", dst, dstDom.State, hypervisor.ErrRejected)
	}
	return srcDom, false, nil
}

// begin starts a new attempt from srcDom: it reads how the copy will go
// (the migrate latency of the source), calls the fence, draws the migrate
// fault, and runs steps 1-3. A failure after step 1 aborts the attempt.
func (d *Driver) begin(ctx context.Context, a *attempt, srcDom *domState) error {
	src, dst, u := a.req.Source, a.req.Dest, a.u
	if err := d.gate(ctx, GateMigrate, u, false); err != nil {
		return err
	}
	latency, err := d.latencyOf(ctx, src, OpMigrate)
	if err != nil {
		return err
	}
	// Before the fault is drawn, so that a fenced attempt uses up no
	// counted fault either.
	if err := a.req.CheckFence(ctx, "before the start"); err != nil {
		return err
	}
	// The fault is drawn now and strikes half-way, as a real migration
	// fails after moving some data.
	injected := d.inject(ctx, src, OpMigrate)
	if injected != nil && !errors.Is(injected, ErrInjected) {
		return injected
	}
	a.model, a.injected = newLatencyCopy(a.total, latency), injected
	a.rec = &migration{src: src, dst: dst, destXML: a.req.DestXML, srcXML: srcDom.XML, name: a.name, token: rand.Text(), phase: phaseCopying}

	started := time.Now().UTC().Format(time.RFC3339Nano)
	if _, _, err := d.run(ctx, beginScript, []string{d.homeKey(u), d.migrationKey(u)},
		src, dst, a.req.DestXML, a.rec.srcXML, a.rec.name, a.rec.token, started); err != nil {
		return err
	}
	if err := d.crashAt("begun"); err != nil {
		return err
	}
	code, rest, err := d.run(ctx, markSourceScript, d.domKeys(src, u), a.rec.token)
	if err != nil {
		return d.abort(ctx, a, err)
	}
	if err := d.codeErr(code, rest, src, u, func(e error) error { return e }); err != nil {
		return d.abort(ctx, a, err)
	}
	code, rest, err = d.run(ctx, incomingScript, d.domKeys(dst, u), u, a.name, a.req.DestXML, a.rec.token)
	if err != nil {
		return d.abort(ctx, a, err)
	}
	if err := d.codeErr(code, rest, dst, u, func(e error) error { return e }); err != nil {
		return d.abort(ctx, a, err)
	}
	return d.crashAt("incoming")
}

// copyMemory is step 4: the copy goes as a.model says, in steps that
// each touch the record (an attempt that stops touching it for
// Options.StaleMigration is dead, see reap), check ctx and report
// progress, until it converges. The injected fault strikes half-way. A
// timeout of the policy aborts the attempt, or, when the policy says
// post-copy, ends the copy with postCopy set. A failure aborts the
// attempt.
func (d *Driver) copyMemory(ctx context.Context, a *attempt) (postCopy bool, err error) {
	timer := a.req.Policy.Timer(a.total)
	// The model's clock starts with the attempt; the copy starts after
	// the copy gate and the source's copy start delay.
	if err := d.gate(ctx, GateCopy, a.u, false); err != nil {
		return false, d.abort(ctx, a, err)
	}
	startAt, err := d.awaitCopyStart(ctx, a, timer)
	if err != nil {
		return false, err
	}
	timer.CopyStarted(startAt)
	for {
		st := a.model.next()
		st.elapsed += startAt
		if err := d.sleep(ctx, st.wait); err != nil {
			return false, d.abort(ctx, a, err)
		}
		if err := d.touch(ctx, a); err != nil {
			return false, d.abort(ctx, a, err)
		}
		if a.injected != nil && st.halfway {
			return false, d.abort(ctx, a, a.injected)
		}
		a.last = st.progress
		a.progress(st.progress)
		if err := d.crashAt("copying"); err != nil {
			return false, err
		}
		if st.converged {
			return false, nil
		}
		if a.timeout = timer.Observe(st.elapsed, st.progress); a.timeout != nil {
			if a.req.Policy.PostCopyOnTimeout() && timer.Copying() {
				return true, nil
			}
			return false, d.abort(ctx, a, a.timeout)
		}
	}
}

// ProgressSetup is reported while a migration waits for its copy to
// start (SetCopyStartDelay).
const ProgressSetup = "setup"

// awaitCopyStart waits out the source's copy start delay, in steps that
// each touch the record and report no data sent, and returns it; the
// policy's start timeout, when it fires first, aborts the attempt.
func (d *Driver) awaitCopyStart(ctx context.Context, a *attempt, timer *hypervisor.MigrationTimer) (time.Duration, error) {
	delay, err := d.copyStartDelay(ctx, a.req.Source)
	if err != nil {
		return 0, d.abort(ctx, a, err)
	}
	var at time.Duration
	for at < delay {
		step := min(stepInterval, delay-at)
		if err := d.sleep(ctx, step); err != nil {
			return 0, d.abort(ctx, a, err)
		}
		at += step
		if err := d.touch(ctx, a); err != nil {
			return 0, d.abort(ctx, a, err)
		}
		a.progress(hypervisor.Progress{Phase: ProgressSetup})
		if a.timeout = timer.Observe(at, hypervisor.Progress{Phase: ProgressSetup}); a.timeout != nil {
			return 0, d.abort(ctx, a, a.timeout)
		}
	}
	return delay, nil
}

// touch marks the attempt's record as making progress; its error says why
// the attempt must stop.
func (d *Driver) touch(ctx context.Context, a *attempt) error {
	code, _, err := d.run(ctx, touchScript, []string{d.migrationKey(a.u)}, a.rec.token)
	if err != nil {
		return err
	}
	if err := d.ownerErr(code); err != nil {
		// PowerOff of either host ends the migration as dead; say so.
		if offErr := d.anyOff(ctx, a.req.Source, a.req.Dest); offErr != nil {
			return offErr
		}
		return err
	}
	return nil
}

// switchOver passes the point of no return, step 5, after a last look at
// ctx and the fence (a failure there aborts the attempt), and then
// finishes the migration, steps 6-8. With postCopy the switch is to
// post-copy: a fence that refuses it aborts the attempt with the timeout
// that asked for it, and after it the rest of the memory is pulled before
// the migration finishes.
func (d *Driver) switchOver(ctx context.Context, a *attempt, postCopy bool) error {
	if err := d.gate(ctx, GateSwitchover, a.u, false); err != nil {
		return d.abort(ctx, a, err)
	}
	if err := ctx.Err(); err != nil {
		return d.abort(ctx, a, err)
	}
	if !postCopy {
		if err := a.req.CheckFence(ctx, "before the switchover"); err != nil {
			return d.abort(ctx, a, err)
		}
	} else if err := a.req.CheckFence(ctx, "before the switch to post-copy"); err != nil {
		a.timeout.NoPostCopy = err
		return d.abort(ctx, a, a.timeout)
	}
	// A host that powered off during the copy has ended the migration
	// (see PowerOff); one that powers off from here on finds it past the
	// switchover, and finish copes.
	if err := d.anyOff(ctx, a.req.Source, a.req.Dest); err != nil {
		return d.abort(ctx, a, err)
	}
	code, _, err := d.run(ctx, switchoverScript, []string{d.homeKey(a.u), d.migrationKey(a.u)}, a.rec.token, a.req.Dest)
	if err != nil {
		return d.abort(ctx, a, err)
	}
	if err := d.ownerErr(code); err != nil {
		return d.abort(ctx, a, err)
	}
	if err := d.crashAt("switchover"); err != nil {
		return err
	}
	if err := d.gate(ctx, GateSwitched, a.u, true); err != nil {
		return err
	}
	if postCopy {
		d.pull(ctx, a)
	}
	return d.finish(ctx, a.req.Source, a.req.Dest, a.u, a.rec)
}

// ownerErr turns the answer of a script that an attempt runs on its own
// record (see ownedLua) into the reason the attempt must stop, or nil.
func (d *Driver) ownerErr(code string) error {
	switch code {
	case "OK":
		return nil
	case "SUPERSEDED":
		return errors.New("another attempt or a rollback took this migration over")
	case "DEAD":
		return fmt.Errorf("this attempt made no progress for over %s, so another caller took this migration over to abort it as dead", d.stale)
	case "GONE":
		return fmt.Errorf("a rollback, or the abort of this migration as dead (no progress for over %s), took this migration over", d.stale)
	}
	return fmt.Errorf("unexpected script answer %q", code)
}

// finish runs steps 6-8 of a migration past its switchover. It ignores
// ctx's cancellation: the guest already belongs to dst. A dst that is
// powered off keeps the guest defined, shut off (it died with the host),
// and finish then completes the migration and returns an error wrapping
// ErrHostOff; a src that is powered off loses its definition as usual.
func (d *Driver) finish(ctx context.Context, src, dst, u string, rec *migration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	code, _, err := d.run(ctx, promoteScript, []string{d.domKey(dst, u), d.powerKey(dst)}, rec.token, rec.destXML)
	if err != nil {
		return err
	}
	var result error
	switch code {
	case "OK":
	case "OFF":
		result = fmt.Errorf("%w after the switchover; the guest is defined there, shut off", hostOff(dst))
	default:
		return fmt.Errorf("the incoming domain on %s is gone (rolled back?); run Rollback", dst)
	}
	if err := d.crashAt("promoted"); err != nil {
		return err
	}
	code, _, err = d.run(ctx, removeSourceScript, []string{d.domainsKey(src), d.domKey(src, u)}, u, rec.token)
	if err != nil {
		return err
	}
	if code != "OK" {
		return fmt.Errorf("the domain on %s is no longer held by this migration (rolled back?); run Rollback", src)
	}
	code, _, err = d.run(ctx, completeScript, []string{d.migrationKey(u)}, rec.token, d.completedTTL.Milliseconds())
	if err != nil {
		return err
	}
	if code != "OK" {
		return fmt.Errorf("a rollback took this migration over; run Rollback again")
	}
	return result
}

// abort undoes an attempt's own steps 1-3, in reverse, and returns cause,
// with the cleanup's failure when there is one (Rollback repairs it).
func (d *Driver) abort(ctx context.Context, a *attempt, cause error) error {
	src, dst, u, token := a.req.Source, a.req.Dest, a.u, a.rec.token
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var errs []error
	if _, _, err := d.run(ctx, abortIncomingScript, []string{d.domainsKey(dst), d.domKey(dst, u)}, u, token); err != nil {
		errs = append(errs, err)
	}
	if _, _, err := d.run(ctx, unmarkSourceScript, []string{d.domKey(src, u)}, token); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		// The record goes last, so that a failed cleanup leaves it for
		// Rollback to find.
		if _, _, err := d.run(ctx, abortRecordScript, []string{d.migrationKey(u)}, token); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w (and aborting failed, run Rollback: %v)", cause, errors.Join(errs...))
	}
	return cause
}

// crashAt lets tests stop a migration dead at a named point.
func (d *Driver) crashAt(point string) error {
	if d.crash == nil {
		return nil
	}
	return d.crash(point)
}

// Rollback undoes a failed, aborted or completed-but-unwanted migration of
// uuid from src to dst: the domain runs on src (started if a partial state
// left it shut off, restored from the migration record if the switchover
// removed it), dst holds no trace of it, and the migration record is gone.
// It is idempotent. Without a record, a domain missing from src cannot be
// restored, and that is an error wrapping ErrNotFound.
//
// The steps: 1. the record, if it is this migration's, enters phase
// rollback (no attempt can switch over any more); 2. src runs the domain,
// and is its home; 3. dst's copy goes; 4. the record goes.
func (d *Driver) Rollback(ctx context.Context, src, dst, uuid string) error {
	fail := func(err error) error { return fmt.Errorf("sim: rollback %s from %s to %s: %w", uuid, src, dst, err) }
	u, err := domainUUID(uuid)
	if err != nil {
		return fail(err)
	}
	if src == dst {
		return fail(fmt.Errorf("source and destination are the same host; a migration has two: %w", hypervisor.ErrRejected))
	}
	for _, h := range []string{src, dst} {
		if err := d.checkHost(ctx, h); err != nil {
			return fail(err)
		}
	}
	rec, err := d.record(ctx, u)
	if err != nil {
		return fail(err)
	}
	if rec != nil && (rec.src != src || rec.dst != dst) {
		if rec.inFlight() {
			return fail(fmt.Errorf("the migration in flight is from %s to %s (%s); roll that one back", rec.src, rec.dst, rec.phase))
		}
		// A completed migration between other hosts says nothing here.
		rec = nil
	}
	if rec != nil {
		if _, _, err := d.run(ctx, rollbackBeginScript, []string{d.migrationKey(u)}, src, dst); err != nil {
			return fail(err)
		}
	}
	var name, srcXML string
	if rec != nil {
		name, srcXML = rec.name, rec.srcXML
	}
	code, rest, err := d.run(ctx, rollbackSourceScript, d.domKeys(src, u), u, name, srcXML)
	if err != nil {
		return fail(err)
	}
	if code == "NOTFOUND" {
		return fail(fmt.Errorf("the domain is not on %s and no migration record holds its definition to restore: %w", src, hypervisor.ErrNotFound))
	}
	if err := d.codeErr(code, rest, src, u, fail); err != nil {
		return err
	}
	if err := d.rdb.Set(ctx, d.homeKey(u), src, 0).Err(); err != nil {
		return fail(err)
	}
	code, rest, err = d.run(ctx, rollbackDestScript, d.domKeys(dst, u), u)
	if err != nil {
		return fail(err)
	}
	if err := d.codeErr(code, rest, dst, u, fail); err != nil {
		return err
	}
	if rec != nil {
		if _, _, err := d.run(ctx, rollbackEndScript, []string{d.migrationKey(u)}); err != nil {
			return fail(err)
		}
	}
	return nil
}
