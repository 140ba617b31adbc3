package libvirt

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// Progress phases reported by Migrate.
const (
	PhaseWaiting   = "waiting"   // an earlier attempt's migration is still running
	PhaseSetup     = "setup"     // libvirt has not reported any data yet
	PhaseMigrating = "migrating" // memory is being copied
	PhasePostCopy  = "post-copy" // switched to post-copy: the guest runs on the destination
	PhasePausing   = "pausing"   // pausing a post-copy migration that sent no data, to resume it
	PhaseResuming  = "resuming"  // resuming a post-copy migration that failed
	PhaseAborting  = "aborting"  // cancelled; libvirt is aborting the job
	PhaseCompleted = "completed" // the guest runs on the destination only
)

// migrateFlags make a live, peer-to-peer migration that leaves a persistent
// definition on the destination and none on the source, and gives up on an
// I/O error rather than pausing the guest.
const migrateFlags = golibvirt.MigrateLive | golibvirt.MigratePeer2peer | golibvirt.MigratePersistDest |
	golibvirt.MigrateUndefineSource | golibvirt.MigrateAbortOnError

// defaultMaxDowntime is QEMU's own downtime limit. Migrate sets it when
// the policy leaves MaxDowntime zero, since the limit stays on the guest
// after a failed migration and would otherwise carry over to the next.
const defaultMaxDowntime = 300 * time.Millisecond

// policyFlags are the migration flags for policy p: auto-converge and
// post-copy are asked for at the start, or not at all.
func policyFlags(p hypervisor.MigrationPolicy) golibvirt.DomainMigrateFlags {
	f := migrateFlags
	if p.AllowAutoConverge {
		f |= golibvirt.MigrateAutoConverge
	}
	if p.AllowPostCopy {
		f |= golibvirt.MigratePostcopy
	}
	return f
}

// policyParams are the migration parameters for policy p: its bandwidth
// cap, for the post-copy phase too when post-copy is allowed.
func policyParams(p hypervisor.MigrationPolicy) []golibvirt.TypedParam {
	if p.BandwidthMiBs == 0 {
		return nil
	}
	params := []golibvirt.TypedParam{{Field: golibvirt.MigrateParamBandwidth, Value: *golibvirt.NewTypedParamValueUllong(p.BandwidthMiBs)}}
	if p.AllowPostCopy {
		params = append(params, golibvirt.TypedParam{Field: golibvirt.MigrateParamBandwidthPostcopy, Value: *golibvirt.NewTypedParamValueUllong(p.BandwidthMiBs)})
	}
	return params
}

// checkDestIdentity checks that destXML is a domain XML for uuid, and
// returns what it says of the domain.
func checkDestIdentity(uuid, destXML string) (hypervisor.DomainIdentity, error) {
	id, err := hypervisor.ReadDomainIdentity(destXML)
	if err != nil {
		return hypervisor.DomainIdentity{}, fmt.Errorf("destination XML: %w", err)
	}
	want, err := hypervisor.ParseUUID(uuid)
	if err != nil {
		return hypervisor.DomainIdentity{}, err
	}
	if id.UUID != want.String() {
		return hypervisor.DomainIdentity{}, fmt.Errorf("destination XML has uuid %s, want %s: %w", id.UUID, uuid, hypervisor.ErrRejected)
	}
	return id, nil
}

// checkDestXML is checkDestIdentity that also reads the pins of destXML,
// for hypervisor.PinsFit.
func checkDestXML(uuid, destXML string) (hypervisor.DomainIdentity, *xmlpatch.Pins, error) {
	id, err := checkDestIdentity(uuid, destXML)
	if err != nil {
		return hypervisor.DomainIdentity{}, nil, err
	}
	pins, err := xmlpatch.Read(destXML)
	if err != nil {
		return hypervisor.DomainIdentity{}, nil, fmt.Errorf("destination XML: %w: %w", hypervisor.ErrRejected, err)
	}
	return id, pins, nil
}

// PrepareMigration checks, before any data moves, that dst answers, that
// destXML is a domain XML for uuid, that its CPU pins and NUMA node sets
// name CPUs and nodes dst has, and that dst does not hold the domain
// already. A domain already running on dst is accepted: it is the outcome
// of an earlier attempt of the same migration, which Migrate confirms.
func (d *Driver) PrepareMigration(ctx context.Context, dst, uuid, destXML string) error {
	_, pins, err := checkDestXML(uuid, destXML)
	if err != nil {
		return fmt.Errorf("libvirt: prepare migration of %s to host %s: %w", uuid, dst, err)
	}
	c, err := d.connect(ctx, dst)
	if err != nil {
		return err
	}
	if existing, err := c.lookup(ctx, uuid); err == nil {
		st, err := c.state(ctx, existing)
		if err != nil {
			return err
		}
		if st == hypervisor.StateRunning {
			return nil
		}
		return fmt.Errorf("libvirt: prepare migration of %s to %s: the domain is already defined there (%s); roll back or undefine it first", uuid, c.where(), st)
	} else if !errors.Is(err, hypervisor.ErrNotFound) {
		return err
	}
	spec, err := d.HostSpec(ctx, dst)
	if err != nil {
		return err
	}
	// libvirt itself finds a CPU or node the host lacks only when QEMU
	// starts on the destination, after the memory copy.
	var cpus, nodes numa.CPUSet
	for _, cell := range spec.Cells {
		cpus = cpus.Union(numa.NewCPUSet(cell.CPUs...))
		nodes = nodes.With(cell.ID)
	}
	if err := hypervisor.PinsFit(pins, cpus, nodes); err != nil {
		return fmt.Errorf("libvirt: prepare migration of %s to %s: %w", uuid, c.where(), err)
	}
	return nil
}

// Migrate live-migrates the running domain req.UUID from req.Source to
// req.Dest, peer to peer: the source libvirtd connects to the
// destination's URI itself and QEMU sends memory to the destination's
// migrate URI. req.DestXML becomes the domain's live and persistent
// definition on the destination, and the source keeps no definition.
// progress, when not nil, is called from this goroutine with the source's
// job statistics every ProgressInterval and once at the end.
//
// Migrate may be called again after an unknown outcome: a domain that runs
// on dst and is gone from src has been migrated, and a migration still
// running from an earlier call is taken over as if this call had started
// it. Cancelling ctx aborts the
// migration and returns once libvirt has ended it, with the guest running
// on src; if the migration had already passed the point of no return, it
// completes and Migrate returns nil. A failing req.Fence does the same,
// and the error wraps hypervisor.ErrFenced; see the package documentation
// for when it is called. A destination that refuses destXML (a CPU or NUMA
// node it does not have, changed guest NUMA cells) gives an error wrapping
// hypervisor.ErrRejected, and the guest stays on src.
//
// req.Policy applies as the package documentation says (see Migration
// policy). A timeout that aborts returns a *hypervisor.MigrationTimeoutError
// once libvirt has ended the job, with the guest running on src.
func (d *Driver) Migrate(ctx context.Context, req hypervisor.MigrateRequest, progress func(hypervisor.Progress)) error {
	src, dst, uuid, destXML := req.Source, req.Dest, req.UUID, req.DestXML
	if progress == nil {
		progress = func(hypervisor.Progress) {}
	}
	from, to := "host "+src, "host "+dst
	fail := func(err error) error {
		return fmt.Errorf("libvirt: migrate %s from %s to %s: %w", uuid, from, to, err)
	}
	if src == dst {
		return fail(fmt.Errorf("source and destination are the same host; pick another destination"))
	}
	id, err := checkDestIdentity(uuid, destXML)
	if err != nil {
		return fail(err)
	}
	if err := req.Policy.Validate(); err != nil {
		return fail(fmt.Errorf("%w: %w", hypervisor.ErrRejected, err))
	}
	sc, err := d.connect(ctx, src)
	if err != nil {
		return err
	}
	dc, err := d.connect(ctx, dst)
	if err != nil {
		return err
	}
	from, to = sc.where(), dc.where()
	dom, before, running, done, err := d.settle(ctx, sc, dc, uuid)
	if err != nil || done {
		if done {
			progress(hypervisor.Progress{Percent: 100, Phase: PhaseCompleted})
		}
		return err
	}
	stop := make(chan struct{})
	defer close(stop)
	var result <-chan error
	postCopy := false
	if running {
		// An earlier attempt's migration still runs and its caller is
		// gone: this call takes it over, fence, timeouts, cancel and all.
		stage, err := sc.postCopyStage(ctx, dom)
		if err != nil {
			return fail(err)
		}
		if stage == postCopyFailed {
			return d.resumePostCopy(ctx, sc, dc, dom, req, id.MemoryBytes, hypervisor.Progress{Phase: PhasePostCopy}, errPostCopyBroke, progress)
		}
		postCopy = stage == postCopyRunning
		progress(hypervisor.Progress{Phase: PhaseWaiting})
		result = d.watch(context.WithoutCancel(ctx), sc, dom, stop)
	} else if result, err = d.start(ctx, sc, dc, dom, before, req); err != nil || result == nil {
		if result == nil && err == nil {
			progress(hypervisor.Progress{Percent: 100, Phase: PhaseCompleted})
		}
		return err
	}

	o, err := d.follow(ctx, sc, dom, req, id.MemoryBytes, postCopy, result, progress)
	if err != nil && o.postCopy {
		return fail(fmt.Errorf("%w: %w", hypervisor.ErrPostCopyFailed, err))
	}
	if err != nil {
		return fail(err)
	}
	last, migErr, stopped := o.last, o.migErr, o.stopped
	if migErr != nil && (o.postCopy || errors.Is(migErr, errPostCopyBroke)) {
		// The guest ran on dst from the switch on; resuming it on src
		// would run it twice, with memory dst has changed since. The
		// migration can only go on.
		return d.resumePostCopy(ctx, sc, dc, dom, req, id.MemoryBytes, last, migErr, progress)
	}
	if migErr != nil && !isLibvirtError(migErr) && !errors.Is(migErr, errEarlierFailed) {
		// The connection to the source broke: its libvirtd may still be
		// migrating, so the outcome is unknown until it is asked again.
		sc.drop()
		return fail(fmt.Errorf("lost the source connection; the migration may still run there, call Migrate again to follow it or Rollback to undo it: %w", oneLine{migErr}))
	}
	if migErr != nil {
		// libvirt resumes the source when a live migration fails; make
		// sure of it, since the guest must keep running there.
		if before == hypervisor.StateRunning {
			if err := sc.resumeIfPaused(context.WithoutCancel(ctx), uuid); err != nil {
				return fail(fmt.Errorf("%w; and afterwards: %w", oneLine{migErr}, err))
			}
		}
		if stopped != nil {
			return fail(stopped)
		}
		if sentinel := rejectedMigration(migErr); sentinel != nil {
			return fail(fmt.Errorf("%w: %w", sentinel, oneLine{migErr}))
		}
		return fail(oneLine{migErr})
	}
	return d.completed(ctx, sc, dc, uuid, last, progress)
}

// completed confirms a migration call that succeeded and reports it done.
// The context outlives a cancellation that came too late to stop it.
func (d *Driver) completed(ctx context.Context, sc, dc *conn, uuid string, last hypervisor.Progress, progress func(hypervisor.Progress)) error {
	if err := d.confirm(context.WithoutCancel(ctx), sc, dc, uuid); err != nil {
		return fmt.Errorf("libvirt: migrate %s from %s to %s: %w", uuid, sc.where(), dc.where(), err)
	}
	last.Phase, last.Percent, last.DataRemaining = PhaseCompleted, 100, 0
	if last.DataTotal > 0 {
		last.DataProcessed = max(last.DataProcessed, last.DataTotal)
	}
	progress(last)
	return nil
}

// postCopyResumes bounds the resumes of a failed post-copy migration one
// Migrate call makes before it gives up; the caller calls again.
const postCopyResumes = 3

// postCopyNotPaused bounds how long a resume waits for QEMU on both hosts
// to see the break (postcopy-paused): until then a resume is refused as a
// migration still running, which says nothing of whether it could
// succeed. A loaded host takes seconds; only a hang reaches this.
const postCopyNotPaused = 2 * time.Minute

// notPausedYet says whether a resume was refused because QEMU still
// reports the broken migration as running.
func notPausedYet(err error) bool {
	return libvirtCode(err) == golibvirt.ErrOperationInvalid && strings.Contains(err.Error(), "still running")
}

// resumePostCopy resumes a migration that failed after its switch to
// post-copy (libvirt's VIR_MIGRATE_POSTCOPY_RESUME), with the flags and
// parameters it started with, until it completes or postCopyResumes
// resumes have failed (a resume refused before the source's QEMU and
// libvirt report the break does not count, see postCopyNotPaused).
// Nothing aborts it: past the switch there is no way back, so neither a
// cancel nor a fence stops it. Its error wraps hypervisor.ErrPostCopyFailed.
func (d *Driver) resumePostCopy(ctx context.Context, sc, dc *conn, dom golibvirt.Domain, req hypervisor.MigrateRequest, memory uint64,
	last hypervisor.Progress, cause error, progress func(hypervisor.Progress)) error {
	fail := func(err error) error {
		return fmt.Errorf("libvirt: migrate %s from %s to %s: %w", req.UUID, sc.where(), dc.where(), err)
	}
	bg := context.WithoutCancel(ctx)
	params := migrateParams(dc, req)
	flags := policyFlags(req.Policy) | golibvirt.MigratePostcopy | golibvirt.MigratePostcopyResume
	waitPaused := time.Now().Add(postCopyNotPaused)
	for failed := 0; ; {
		last.Phase = PhaseResuming
		progress(last)
		result := make(chan error, 1)
		go func() {
			_, err := sc.l.DomainMigratePerform3Params(dom, golibvirt.OptString{dc.hc.URI}, params, nil, flags)
			result <- err
		}()
		o, err := d.follow(bg, sc, dom, req, memory, true, result, progress)
		if err != nil {
			return fail(fmt.Errorf("%w: resuming it: %w", hypervisor.ErrPostCopyFailed, err))
		}
		if o.migErr == nil {
			return d.completed(ctx, sc, dc, req.UUID, o.last, progress)
		}
		if !isLibvirtError(o.migErr) {
			sc.drop()
			return fail(fmt.Errorf("%w: lost the source connection resuming it (%w); call Migrate again", hypervisor.ErrPostCopyFailed, oneLine{o.migErr}))
		}
		// The source must see the break before a resume can work; under
		// load it takes a while, and until then a resume is refused.
		stage, _ := sc.postCopyStage(bg, dom)
		if !notPausedYet(o.migErr) && stage == postCopyFailed || time.Now().After(waitPaused) {
			if failed++; failed == postCopyResumes {
				return fail(fmt.Errorf("%w: it failed (%w) and %d resumes failed too, the last: %w; the guest is paused on both hosts until Migrate resumes it",
					hypervisor.ErrPostCopyFailed, oneLine{cause}, failed, oneLine{o.migErr}))
			}
		}
		last = o.last
		select {
		case <-time.After(d.cfg.ProgressInterval):
		case <-bg.Done():
		}
	}
}

// migrateParams are the migration's typed parameters: the destination
// XML (live and persistent), where to send the data, and the policy's.
func migrateParams(dc *conn, req hypervisor.MigrateRequest) []golibvirt.TypedParam {
	params := []golibvirt.TypedParam{
		{Field: golibvirt.MigrateParamDestXML, Value: *golibvirt.NewTypedParamValueString(req.DestXML)},
		{Field: golibvirt.MigrateParamPersistXML, Value: *golibvirt.NewTypedParamValueString(req.DestXML)},
	}
	if m := dc.hc.MigrateURI; m != "" {
		params = append(params, golibvirt.TypedParam{Field: golibvirt.MigrateParamURI, Value: *golibvirt.NewTypedParamValueString(m)})
		if u, err := url.Parse(m); err == nil && u.Hostname() != "" {
			// The destination QEMU listens where the data is sent, not on
			// every address.
			params = append(params, golibvirt.TypedParam{Field: golibvirt.MigrateParamListenAddress, Value: *golibvirt.NewTypedParamValueString(u.Hostname())})
		}
	}
	return append(params, policyParams(req.Policy)...)
}

// start checks that the guest can leave src and starts its migration,
// returning the channel the migration call's result comes on. A guest
// that is shut off on src and already runs on dst (the migration ended
// before its source definition was removed) is confirmed instead: start
// then returns a nil channel and no error.
func (d *Driver) start(ctx context.Context, sc, dc *conn, dom golibvirt.Domain, before hypervisor.State,
	req hypervisor.MigrateRequest) (<-chan error, error) {
	uuid := req.UUID
	fail := func(err error) error {
		return fmt.Errorf("libvirt: migrate %s from %s to %s: %w", uuid, sc.where(), dc.where(), err)
	}
	if before == hypervisor.StateShutoff {
		// Between the end of a migration and the removal of the source
		// definition, the guest is shut off on src and runs on dst.
		if st, err := dc.stateOf(ctx, uuid); err == nil && st == hypervisor.StateRunning {
			if err := d.confirm(ctx, sc, dc, uuid); err != nil {
				return nil, fail(err)
			}
			return nil, nil
		}
		return nil, fail(fmt.Errorf("the domain is shut off on the source; live migration needs a running guest"))
	}
	if existing, err := dc.lookup(ctx, uuid); err == nil {
		if st, err := dc.state(ctx, existing); err == nil && st != hypervisor.StateShutoff {
			return nil, fail(fmt.Errorf("the domain is active on both hosts; roll the migration back first"))
		}
	} else if !errors.Is(err, hypervisor.ErrNotFound) {
		return nil, err
	}

	params := migrateParams(dc, req)
	dconnuri := golibvirt.OptString{dc.hc.URI}
	if err := sc.setMaxDowntime(ctx, dom, uuid, req.Policy.MaxDowntime); err != nil {
		return nil, fail(err)
	}
	// The last moment before anything moves.
	if err := req.CheckFence(ctx, "before the start"); err != nil {
		return nil, fail(err)
	}
	result := make(chan error, 1)
	flags := policyFlags(req.Policy)
	go func() {
		_, err := sc.l.DomainMigratePerform3Params(dom, dconnuri, params, nil, flags)
		result <- err
	}()
	return result, nil
}

// settle finds where the domain is before a migration starts: its state
// on src, whether a migration an earlier attempt started still runs there
// (running), or whether the domain already runs on dst only (done).
func (d *Driver) settle(ctx context.Context, sc, dc *conn, uuid string) (dom golibvirt.Domain, st hypervisor.State, running, done bool, err error) {
	for {
		dom, err = sc.lookup(ctx, uuid)
		if errors.Is(err, hypervisor.ErrNotFound) {
			existing, derr := dc.lookup(ctx, uuid)
			if derr != nil && !errors.Is(derr, hypervisor.ErrNotFound) {
				return dom, "", false, false, derr
			}
			if derr != nil {
				return dom, "", false, false, fmt.Errorf("libvirt: migrate %s from %s to %s: the domain is neither on the source nor on the destination: %w", uuid, sc.where(), dc.where(), hypervisor.ErrNotFound)
			}
			dst, serr := dc.state(ctx, existing)
			if serr != nil {
				return dom, "", false, false, serr
			}
			if dst != hypervisor.StateRunning {
				return dom, "", false, false, fmt.Errorf("libvirt: migrate %s from %s to %s: the domain is gone from the source and %s on the destination", uuid, sc.where(), dc.where(), dst)
			}
			return dom, "", false, true, nil
		}
		if err != nil {
			return dom, "", false, false, err
		}
		// The domain can vanish from src at any step here, when an
		// earlier attempt's migration ends; the next round sees that.
		job, err := sc.job(ctx, dom)
		if errors.Is(err, hypervisor.ErrNotFound) {
			continue
		}
		if err != nil {
			return dom, "", false, false, err
		}
		if job.active && job.operation == golibvirt.DomainJobOperationStrMigrationOut {
			return dom, hypervisor.StateRunning, true, false, nil
		}
		st, err = sc.state(ctx, dom)
		if errors.Is(err, hypervisor.ErrNotFound) {
			continue
		}
		return dom, st, false, false, err
	}
}

// errPostCopyBroke is how watch reports a taken-over migration that
// failed after its switch to post-copy.
var errPostCopyBroke = errors.New("the migration failed after its switch to post-copy")

// errEarlierFailed is how watch reports a taken-over migration that ended
// without moving the guest.
var errEarlierFailed = errors.New("the migration an earlier attempt started ended with the guest still on the source")

// watch stands in for the migration call of an earlier attempt, which
// went with its caller: it sends nil once the domain has left src (or is
// shut off there, migrated, before its definition is removed), or
// errEarlierFailed once the job has ended for two polls in a row with
// the domain still running there. It stops when stop closes.
func (d *Driver) watch(ctx context.Context, sc *conn, dom golibvirt.Domain, stop <-chan struct{}) <-chan error {
	result := make(chan error, 1)
	go func() {
		idle := 0
		for {
			select {
			case <-stop:
				return
			case <-time.After(d.cfg.ProgressInterval):
			}
			j, err := sc.job(ctx, dom)
			if err == nil && j.active {
				// A post-copy migration that failed keeps its job, waiting
				// for a resume.
				if stage, err := sc.postCopyStage(ctx, dom); err == nil && stage == postCopyFailed {
					result <- errPostCopyBroke
					return
				}
				idle = 0
				continue
			}
			var st hypervisor.State
			if err == nil {
				st, err = sc.state(ctx, dom)
			}
			switch {
			case errors.Is(err, hypervisor.ErrNotFound), err == nil && st == hypervisor.StateShutoff:
				result <- nil
				return
			case err != nil:
				result <- err
				return
			}
			// Between two of libvirt's phases the job may show ended.
			if idle++; idle == 2 {
				result <- errEarlierFailed
				return
			}
		}
	}()
	return result
}

// postCopy is how far a domain's migration has gone with post-copy, as
// the source domain's state reason says.
type postCopy int

const (
	preCopy         postCopy = iota // not switched, or not migrating
	postCopyRunning                 // switched: the guest runs on the destination
	postCopyFailed                  // switched, then failed: paused until resumed
)

// postCopyStage reads how far the domain's migration has gone with
// post-copy.
func (c *conn) postCopyStage(ctx context.Context, dom golibvirt.Domain) (postCopy, error) {
	st, reason, err := c.stateReason(ctx, dom)
	if err != nil || st != golibvirt.DomainPaused {
		return preCopy, err
	}
	switch golibvirt.DomainPausedReason(reason) {
	case golibvirt.DomainPausedPostcopy:
		return postCopyRunning, nil
	case golibvirt.DomainPausedPostcopyFailed:
		return postCopyFailed, nil
	}
	return preCopy, nil
}

// outcome is how a migration call ended, as follow saw it.
type outcome struct {
	last   hypervisor.Progress // the last progress reported
	migErr error               // the migration call's own error
	// stopped is why follow aborted the job; nil when it did not.
	stopped error
	// postCopy: the migration switched to post-copy, so it was past its
	// point of no return.
	postCopy bool
}

// follow reports progress until the migration call returns, aborting the
// job when ctx ends, req.Fence fails at a poll, or a timeout of req.Policy
// fires (or switching to post-copy instead, when the policy says so, on
// a copy under way). A guest with memory bytes sizes the completion
// timeout, counted from the first data sent (MigrationTimer); postCopy
// says the job switched before it. Its error says the
// migration did not end within the abort timeout.
func (d *Driver) follow(ctx context.Context, sc *conn, dom golibvirt.Domain, req hypervisor.MigrateRequest, memory uint64,
	postCopy bool, result <-chan error, progress func(hypervisor.Progress)) (outcome, error) {
	o := outcome{last: hypervisor.Progress{Phase: PhaseSetup}, postCopy: postCopy}
	bg := context.WithoutCancel(ctx)
	start, timer := time.Now(), req.Policy.Timer(memory)
	tick := time.NewTicker(d.cfg.ProgressInterval)
	defer tick.Stop()
	stop := func(why error) (outcome, error) {
		o.last.Phase = PhaseAborting
		progress(o.last)
		migErr, err := d.abort(bg, sc, dom, result)
		o.migErr, o.stopped = migErr, why
		return o, err
	}
	cancelled := func() error { return fmt.Errorf("cancelled; the guest stays on the source: %w", ctx.Err()) }
	done := ctx.Done()
	if postCopy {
		done = nil
	}
	// sent and sentAt are the data sent in post-copy and when it last grew.
	sent, sentAt := o.last.DataProcessed, time.Now()
	for {
		select {
		case o.migErr = <-result:
			return o, nil
		case <-done:
			return stop(cancelled())
		case <-tick.C:
			if o.postCopy {
				// Past the point of no return there is nothing left to
				// fence or abort, only a stall to pause and resume. A
				// statistics call that does not answer is no progress.
				pctx, cancel := context.WithTimeout(bg, d.cfg.PostCopyStallTimeout)
				poll(pctx, sc, dom, &o.last, PhasePostCopy, progress)
				cancel()
				if o.last.DataProcessed != sent {
					sent, sentAt = o.last.DataProcessed, time.Now()
				}
				if time.Since(sentAt) < d.cfg.PostCopyStallTimeout {
					continue
				}
				o.last.Phase = PhasePausing
				progress(o.last)
				migErr, err := d.pausePostCopy(bg, sc, dom, result)
				if migErr != nil {
					migErr = fmt.Errorf("paused after it sent no data for %v: %w", d.cfg.PostCopyStallTimeout, migErr)
				}
				o.migErr = migErr
				return o, err
			}
			if ferr := req.CheckFence(ctx, "at a progress poll"); ferr != nil {
				if ctx.Err() != nil {
					// The fence failed for the cancellation; say so.
					return stop(cancelled())
				}
				return stop(fmt.Errorf("aborted; the guest stays on the source: %w", ferr))
			}
			poll(bg, sc, dom, &o.last, "", progress)
			timeout := timer.Observe(time.Since(start), o.last)
			if timeout == nil {
				continue
			}
			// QEMU takes the switch only once the copy has begun: a copy
			// that never started is aborted, whatever the policy.
			if !req.Policy.PostCopyOnTimeout() || !timer.Copying() {
				return stop(timeout)
			}
			if ctx.Err() != nil {
				return stop(cancelled())
			}
			if err := startPostCopy(ctx, sc, dom, req); err != nil {
				timeout.NoPostCopy = err
				return stop(timeout)
			}
			o.postCopy, done = true, nil
			sent, sentAt = o.last.DataProcessed, time.Now()
			o.last.Phase = PhasePostCopy
			progress(o.last)
		}
	}
}

// poll reads the job's statistics into last and reports them, in phase
// when it is not empty. A job that is not active (between libvirt's
// phases, or just ended) changes nothing.
func poll(ctx context.Context, sc *conn, dom golibvirt.Domain, last *hypervisor.Progress, phase string, progress func(hypervisor.Progress)) {
	job, err := sc.job(ctx, dom)
	if err != nil || !job.active {
		return
	}
	*last = job.progress
	if phase != "" {
		last.Phase = phase
	}
	progress(*last)
}

// startPostCopy switches the migration to post-copy, its point of no
// return, if req.Fence still allows it right before. The call itself is
// not cut short by ctx, so that its outcome is known.
func startPostCopy(ctx context.Context, sc *conn, dom golibvirt.Domain, req hypervisor.MigrateRequest) error {
	if err := req.CheckFence(ctx, "before the switch to post-copy"); err != nil {
		return err
	}
	if err := do(context.WithoutCancel(ctx), sc, func(l *golibvirt.Libvirt) error { return l.DomainMigrateStartPostCopy(dom, 0) }); err != nil {
		return sc.errorf(err, "switch the migration of domain %s to post-copy", uuid.UUID(dom.UUID).String())
	}
	return nil
}

// setMaxDowntime sets the domain's downtime limit for its next migration,
// QEMU's default for 0.
func (c *conn) setMaxDowntime(ctx context.Context, dom golibvirt.Domain, id string, limit time.Duration) error {
	if limit <= 0 {
		limit = defaultMaxDowntime
	}
	ms := uint64(max(limit.Milliseconds(), 1))
	if err := do(ctx, c, func(l *golibvirt.Libvirt) error { return l.DomainMigrateSetMaxDowntime(dom, ms, 0) }); err != nil {
		return c.errorf(err, "set the maximum downtime of domain %s to %dms", id, ms)
	}
	return nil
}

// abort asks libvirt to abort the domain's job until the migration call
// returns.
func (d *Driver) abort(ctx context.Context, sc *conn, dom golibvirt.Domain, result <-chan error) (error, error) {
	migErr, ended := d.askUntilEnded(ctx, sc, result, func(l *golibvirt.Libvirt) error { return l.DomainAbortJob(dom) })
	if !ended {
		return nil, fmt.Errorf("aborted, but the migration did not end within %v of the abort; roll it back", d.cfg.AbortTimeout)
	}
	return migErr, nil
}

// pausePostCopy pauses a post-copy migration that stalled, as a broken
// connection would, and returns the migration call's error once it
// returns. A migration that does not pause within AbortTimeout is an
// error: its call may still return later.
func (d *Driver) pausePostCopy(ctx context.Context, sc *conn, dom golibvirt.Domain, result <-chan error) (error, error) {
	migErr, ended := d.askUntilEnded(ctx, sc, result, func(l *golibvirt.Libvirt) error {
		return l.DomainAbortJobFlags(dom, uint32(golibvirt.DomainAbortJobPostcopy))
	})
	if !ended {
		return nil, fmt.Errorf("it sent no data for %v and did not pause within %v of being asked; call Migrate again to follow it",
			d.cfg.PostCopyStallTimeout, d.cfg.AbortTimeout)
	}
	return migErr, nil
}

// askUntilEnded asks the migration job to end with ask until libvirt
// takes the request (the job may not have begun when it is first asked
// for, so it is asked again every ProgressInterval), and returns the
// migration call's error once the call returns; ended is false when it
// did not within AbortTimeout.
func (d *Driver) askUntilEnded(ctx context.Context, sc *conn, result <-chan error, ask func(*golibvirt.Libvirt) error) (migErr error, ended bool) {
	deadline := time.NewTimer(d.cfg.AbortTimeout)
	defer deadline.Stop()
	// An ask that libvirtd does not answer waits no longer than the end.
	ctx, cancel := context.WithTimeout(ctx, d.cfg.AbortTimeout)
	defer cancel()
	tick := time.NewTicker(d.cfg.ProgressInterval)
	defer tick.Stop()
	taken := false
	for {
		if !taken {
			taken = do(ctx, sc, ask) == nil
		}
		select {
		case migErr := <-result:
			return migErr, true
		case <-deadline.C:
			return nil, false
		case <-tick.C:
		}
	}
}

// confirm checks the outcome of a successful migration call: the domain
// runs on dst, and the source has no definition left.
func (d *Driver) confirm(ctx context.Context, sc, dc *conn, uuid string) error {
	dom, err := dc.lookup(ctx, uuid)
	if err != nil {
		return fmt.Errorf("libvirt reported success, but: %w", err)
	}
	st, err := dc.state(ctx, dom)
	if err != nil {
		return err
	}
	if st != hypervisor.StateRunning {
		return fmt.Errorf("libvirt reported success, but the domain is %s on the destination", st)
	}
	// UndefineSource should have removed the source definition; a leftover
	// one would make the guest appear on two hosts.
	return sc.undefine(ctx, uuid)
}

// resumeIfPaused resumes the domain when it is paused.
func (c *conn) resumeIfPaused(ctx context.Context, uuid string) error {
	dom, err := c.lookup(ctx, uuid)
	if err != nil {
		return err
	}
	st, err := c.state(ctx, dom)
	if err != nil || st != hypervisor.StatePaused {
		return err
	}
	if err := do(ctx, c, func(l *golibvirt.Libvirt) error { return l.DomainResume(dom) }); err != nil {
		return c.errorf(err, "resume domain %s (%s)", uuid, dom.Name)
	}
	return nil
}

// rejectedMigration tells a destination that refused the domain from a
// migration that failed on its way (a lost connection, a timeout). libvirt
// reports most refusals with specific codes, but QEMU failing to pin a
// thread to a CPU the destination does not have comes back as a system
// error, and a few configuration checks as generic ones; those are
// recognised by their text.
func rejectedMigration(err error) error {
	if s := classify(err); s != nil || !isLibvirtError(err) {
		return s
	}
	msg := strings.ToLower(err.Error())
	for _, m := range []string{"cannot set cpu affinity", "numa node", "doesn't match source"} {
		if strings.Contains(msg, m) {
			return hypervisor.ErrRejected
		}
	}
	return nil
}

// job is a domain's current job as libvirt reports it.
type job struct {
	active    bool
	operation golibvirt.DomainJobOperation
	progress  hypervisor.Progress
}

// job reads the domain's current job statistics, falling back to the
// older job info call on drivers without statistics.
func (c *conn) job(ctx context.Context, dom golibvirt.Domain) (job, error) {
	type stats struct {
		typ    int32
		params []golibvirt.TypedParam
	}
	s, err := call(ctx, c, func(l *golibvirt.Libvirt) (stats, error) {
		t, p, err := l.DomainGetJobStats(dom, 0)
		return stats{t, p}, err
	})
	switch libvirtCode(err) {
	case golibvirt.ErrNoSupport:
		return c.jobInfo(ctx, dom)
	case golibvirt.ErrOperationInvalid:
		return job{}, nil // the domain is not running, so it has no job
	}
	if err != nil {
		return job{}, c.errorf(err, "get the job statistics of domain %s", uuid.UUID(dom.UUID).String())
	}
	j := job{active: isActiveJob(s.typ)}
	j.operation, j.progress = jobProgress(s.params)
	return j, nil
}

// jobProgress reads a job's operation and progress from its statistics.
func jobProgress(params []golibvirt.TypedParam) (golibvirt.DomainJobOperation, hypervisor.Progress) {
	var op golibvirt.DomainJobOperation
	var p hypervisor.Progress
	for _, tp := range params {
		v, ok := paramUint(tp.Value)
		if !ok {
			continue
		}
		switch tp.Field {
		case golibvirt.DomainJobDataTotal:
			p.DataTotal = v
		case golibvirt.DomainJobDataProcessed:
			p.DataProcessed = v
		case golibvirt.DomainJobDataRemaining:
			p.DataRemaining = v
		case golibvirt.DomainJobOperationStr:
			op = golibvirt.DomainJobOperation(v)
		}
	}
	return op, withPercent(p)
}

func (c *conn) jobInfo(ctx context.Context, dom golibvirt.Domain) (job, error) {
	type info struct {
		typ                         int32
		total, processed, remaining uint64
	}
	in, err := call(ctx, c, func(l *golibvirt.Libvirt) (info, error) {
		t, _, _, total, processed, remaining, _, _, _, _, _, _, err := l.DomainGetJobInfo(dom)
		return info{t, total, processed, remaining}, err
	})
	if libvirtCode(err) == golibvirt.ErrOperationInvalid {
		return job{}, nil
	}
	if err != nil {
		return job{}, c.errorf(err, "get the job of domain %s", uuid.UUID(dom.UUID).String())
	}
	// Without statistics the operation is unknown; an active job is taken
	// to be the migration, which is what this driver starts.
	return job{
		active:    isActiveJob(in.typ),
		operation: golibvirt.DomainJobOperationStrMigrationOut,
		progress:  withPercent(hypervisor.Progress{DataTotal: in.total, DataProcessed: in.processed, DataRemaining: in.remaining}),
	}, nil
}

func isActiveJob(typ int32) bool {
	t := golibvirt.DomainJobType(typ)
	return t == golibvirt.DomainJobBounded || t == golibvirt.DomainJobUnbounded
}

// withPercent fills in the percentage and phase. Memory dirtied during the
// copy is sent again, so the percentage follows what remains and stays
// below 100 until the migration has completed.
func withPercent(p hypervisor.Progress) hypervisor.Progress {
	p.Phase = PhaseSetup
	if p.DataTotal > 0 {
		p.Phase = PhaseMigrating
		done := p.DataTotal - min(p.DataRemaining, p.DataTotal)
		p.Percent = min(99, int(done*100/p.DataTotal))
	}
	return p
}

// paramUint reads an integer typed parameter.
func paramUint(v golibvirt.TypedParamValue) (uint64, bool) {
	switch x := v.I.(type) {
	case uint64:
		return x, true
	case int64:
		return uint64(max(x, 0)), true
	case uint32:
		return uint64(x), true
	case int32:
		return uint64(max(x, 0)), true
	}
	return 0, false
}

// Rollback undoes a failed, aborted or interrupted migration: a migration
// job still running on src is aborted, the domain is destroyed and
// undefined on dst, and then resumed or started on src. It is idempotent: a
// guest that runs on src with no trace on dst needs nothing. A migration
// that completed cannot be rolled back; that is an error saying so.
func (d *Driver) Rollback(ctx context.Context, src, dst, uuid string) error {
	from, to := "host "+src, "host "+dst
	fail := func(err error) error {
		return fmt.Errorf("libvirt: roll back migration of %s from %s to %s: %w", uuid, from, to, err)
	}
	sc, err := d.connect(ctx, src)
	if err != nil {
		return err
	}
	dc, err := d.connect(ctx, dst)
	if err != nil {
		return err
	}
	from, to = sc.where(), dc.where()
	dom, err := sc.lookup(ctx, uuid)
	if errors.Is(err, hypervisor.ErrNotFound) {
		if _, derr := dc.lookup(ctx, uuid); derr == nil {
			return fail(fmt.Errorf("the migration completed: the domain is only on the destination"))
		}
		return fail(fmt.Errorf("the domain is neither on the source nor on the destination: %w", hypervisor.ErrNotFound))
	}
	if err != nil {
		return err
	}
	// Past a switch to post-copy the guest's memory is on dst: undoing the
	// migration would destroy the only current copy of it.
	if stage, err := sc.postCopyStage(ctx, dom); err != nil {
		return fail(err)
	} else if stage != preCopy {
		return fail(fmt.Errorf("%w: the migration switched to post-copy, so it cannot be rolled back; Migrate completes it", hypervisor.ErrPostCopyFailed))
	}
	if err := d.abortRunning(ctx, sc, dom); err != nil {
		return fail(err)
	}
	// The abort may have come too late; the guest is then on dst only.
	if _, err := sc.lookup(ctx, uuid); errors.Is(err, hypervisor.ErrNotFound) {
		return fail(fmt.Errorf("the migration completed before it could be aborted: the domain is only on the destination"))
	}
	// dst first, so the guest never runs on both hosts.
	if err := dc.stop(ctx, uuid); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
		return fail(err)
	}
	if err := dc.undefine(ctx, uuid); err != nil {
		return fail(err)
	}
	if err := sc.start(ctx, uuid); err != nil {
		return fail(err)
	}
	return nil
}

// abortRunning aborts a migration job still running on the source, left by
// a call whose worker went away, and waits until libvirt has ended it.
func (d *Driver) abortRunning(ctx context.Context, sc *conn, dom golibvirt.Domain) error {
	deadline := time.Now().Add(d.cfg.AbortTimeout)
	for {
		j, err := sc.job(ctx, dom)
		if errors.Is(err, hypervisor.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if !j.active || j.operation != golibvirt.DomainJobOperationStrMigrationOut {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the migration job on %s did not end within %v of the abort", sc.where(), d.cfg.AbortTimeout)
		}
		// "No job is active" means it ended meanwhile; the next look says.
		_ = do(ctx, sc, func(l *golibvirt.Libvirt) error { return l.DomainAbortJob(dom) })
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d.cfg.ProgressInterval):
		}
	}
}
