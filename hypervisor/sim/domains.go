package sim

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/hypervisor"
)

var _ hypervisor.Driver = (*Driver)(nil)

// Define makes a persistent domain on host from domainXML, named by its
// <uuid>; a new domain is shut off. Defining an existing domain replaces
// its XML and keeps its state, as libvirt does. A domain lives on one host:
// defining it on a second host is rejected while the first holds it,
// unless the first is powered off. Then the guest is rebuilt here, this
// host becomes its home, and the first keeps its definition, shut off, as
// a leftover (see Start).
func (d *Driver) Define(ctx context.Context, host, domainXML string) error {
	doc, err := parseDomain(domainXML)
	if err != nil {
		return fmt.Errorf("sim: define on %s: %w", host, err)
	}
	fail := func(err error) error {
		return fmt.Errorf("sim: define %s on %s: %w", doc.UUID, host, err)
	}
	if err := d.checkHost(ctx, host); err != nil {
		return fail(err)
	}
	if err := d.pace(ctx, host, doc.UUID, OpDefine); err != nil {
		return fail(err)
	}
	if err := d.claimHome(ctx, host, doc.UUID, false); err != nil {
		return fail(err)
	}
	code, rest, err := d.runOnDomain(ctx, defineScript, host, doc.UUID, doc.UUID, doc.Name, domainXML)
	if err != nil {
		return fail(err)
	}
	return d.codeErr(code, rest, host, doc.UUID, fail)
}

// claimHome makes host the domain's home. The home held by another host
// moves only when that host no longer has the domain (a definition whose
// undefine was interrupted, say), or, for a define (start false), when
// that host is powered off. A dead migration of the domain is aborted
// first. For a start, the incoming side of a migration in flight passes:
// the start script refuses it.
func (d *Driver) claimHome(ctx context.Context, host, uuid string, start bool) error {
	reaped := false
	for range 4 {
		code, rest, err := d.run(ctx, claimHomeScript, []string{d.homeKey(uuid), d.migrationKey(uuid)}, host)
		if err != nil {
			return err
		}
		switch code {
		case "OK":
			return nil
		case "MIGRATING":
			if start && len(rest) > 1 && rest[1] == host {
				return nil
			}
			if !reaped {
				reaped = true
				changed, err := d.reap(ctx, uuid, nil)
				if err != nil {
					return err
				}
				if changed {
					continue
				}
			}
			return fmt.Errorf("the domain is migrating from %s to %s; roll the migration back first: %w", rest[0], rest[1], hypervisor.ErrRejected)
		}
		other := rest[0]
		n, err := d.rdb.Exists(ctx, d.domKey(other, uuid)).Result()
		if err != nil {
			return err
		}
		if n == 1 && start {
			// Even with other powered off: once back, it could start its
			// copy, and two guests would write to the same disks.
			return fmt.Errorf("the domain is defined on %s too; two copies would share its disks: %w", other, hypervisor.ErrRejected)
		}
		if n == 1 {
			off, err := d.rdb.Exists(ctx, d.powerKey(other)).Result()
			if err != nil {
				return err
			}
			if off == 0 {
				return fmt.Errorf("the domain is defined on %s, and a domain lives on one host; undefine it there first: %w", other, hypervisor.ErrRejected)
			}
			// A dead host's guest is rebuilt here; its copy stays there,
			// shut off, and Start refuses it while this one exists.
		}
		if _, _, err := d.run(ctx, moveHomeScript, []string{d.homeKey(uuid)}, other, host); err != nil {
			return err
		}
	}
	return fmt.Errorf("the domain's home keeps changing under concurrent defines; retry")
}

// codeErr turns a script's status code into the error of an operation on
// domain uuid; rest is the rest of the script's answer.
func (d *Driver) codeErr(code string, rest []string, host, uuid string, fail func(error) error) error {
	switch code {
	case "OK":
		return nil
	case "NOHOST":
		return fail(unknownHost(host))
	case "OFF":
		return fail(hostOff(host))
	case "NOTFOUND":
		return fail(fmt.Errorf("%w", hypervisor.ErrNotFound))
	case "INCOMING":
		return fail(fmt.Errorf("the domain is the destination of an in-flight migration to %s; let it finish or roll it back: %w", host, hypervisor.ErrRejected))
	case "MIGRATING":
		return fail(fmt.Errorf("the domain is migrating away from %s; let it finish or roll it back: %w", host, hypervisor.ErrRejected))
	case "ACTIVE":
		return fail(fmt.Errorf("the domain is %s; stop it first: %w", rest[0], hypervisor.ErrRejected))
	case "NOTRUNNING":
		return fail(fmt.Errorf("the domain is %s, and only a running domain migrates: %w", rest[0], hypervisor.ErrRejected))
	case "SHUTTINGDOWN":
		return fail(errShuttingDown)
	case "EXISTS":
		return fail(fmt.Errorf("the domain is already defined on %s (%s): %w", host, rest[0], hypervisor.ErrRejected))
	}
	return fail(fmt.Errorf("unexpected script answer %q", code))
}

// Start boots a defined domain; a running one succeeds. A domain pinned to
// CPUs or nodes the host lacks is rejected, as a real host fails to start
// it. An injected failure leaves the domain shut off. A leftover copy (see
// Define) is rejected while the domain's home is another host that holds
// it, even a powered-off one; once it is the only copy it starts, and its
// host becomes the domain's home.
func (d *Driver) Start(ctx context.Context, host, uuid string) error {
	fail := func(err error) error { return fmt.Errorf("sim: start %s on %s: %w", uuid, host, err) }
	u, err := domainUUID(uuid)
	if err != nil {
		return fail(err)
	}
	topo, err := d.topology(ctx, host)
	if err != nil {
		return fail(err)
	}
	if err := d.pace(ctx, host, u, OpStart); err != nil {
		return fail(err)
	}
	// The placement check reads the XML outside the script; the script
	// starts the domain only if that XML is still the current one.
	for range 3 {
		dom, err := d.lookup(ctx, host, u)
		if err != nil {
			return fail(err)
		}
		if dom.State != hypervisor.StateRunning {
			if err := checkPins(topo, dom.XML); err != nil {
				return fail(err)
			}
			if err := d.claimHome(ctx, host, u, true); err != nil {
				return fail(err)
			}
		}
		code, rest, err := d.run(ctx, startScript, d.domKeys(host, u), dom.XML)
		if err != nil {
			return fail(err)
		}
		if code != "CHANGED" {
			return d.codeErr(code, rest, host, u, fail)
		}
	}
	return fail(fmt.Errorf("the domain's XML keeps changing under concurrent defines; retry"))
}

// Stop powers a domain off; a stopped one succeeds. A domain migrating
// away is not stopped: roll the migration back first.
func (d *Driver) Stop(ctx context.Context, host, uuid string) error {
	fail := func(err error) error { return fmt.Errorf("sim: stop %s on %s: %w", uuid, host, err) }
	u, err := domainUUID(uuid)
	if err != nil {
		return fail(err)
	}
	if err := d.checkHost(ctx, host); err != nil {
		return fail(err)
	}
	if err := d.pace(ctx, host, u, OpStop); err != nil {
		return fail(err)
	}
	code, rest, err := d.runOnDomain(ctx, stopScript, host, u)
	if err != nil {
		return fail(err)
	}
	return d.codeErr(code, rest, host, u, fail)
}

// Shutdown asks the guest to power off, as an ACPI power button press
// does, and returns without waiting: the domain is shut off once the
// shutdown latency of host has passed (at once when it is 0). A shutdown
// fault on host, when due, is a guest that ignores the request: Shutdown
// still returns nil and the guest keeps running (Stop powers it off). A
// shut-off domain succeeds at once; a domain migrating away is rejected, as
// Stop rejects it.
//
// The pending shutdown is stored as its due time in the domain's hash, and
// every read and every script that looks at the domain's state treats a
// domain past that time as shut off (a script also records it as such), so
// no timer has to outlive the call. Stop, and a Rollback that restarts the
// domain, cancel a pending shutdown; Start leaves it pending, and Migrate
// rejects a domain that is shutting down.
func (d *Driver) Shutdown(ctx context.Context, host, uuid string) error {
	fail := func(err error) error { return fmt.Errorf("sim: shutdown %s on %s: %w", uuid, host, err) }
	u, err := domainUUID(uuid)
	if err != nil {
		return fail(err)
	}
	if err := d.checkHost(ctx, host); err != nil {
		return fail(err)
	}
	if err := d.gate(ctx, GateShutdown, u, false); err != nil {
		return fail(err)
	}
	// The latency is the guest's, not the call's: it becomes the due time
	// instead of a wait, which is why Shutdown does not pace.
	latency, err := d.latencyOf(ctx, host, OpShutdown)
	if err != nil {
		return fail(err)
	}
	ignored := "0"
	if err := d.inject(ctx, host, OpShutdown); errors.Is(err, ErrInjected) {
		ignored = "1"
	} else if err != nil {
		return fail(err)
	}
	code, rest, err := d.runOnDomain(ctx, shutdownScript, host, u, latency.Milliseconds(), ignored)
	if err != nil {
		return fail(err)
	}
	return d.codeErr(code, rest, host, u, fail)
}

// errShuttingDown rejects a migration of a guest that is powering off.
var errShuttingDown = fmt.Errorf("the guest is shutting down (Shutdown was called), and only a running domain migrates: %w", hypervisor.ErrRejected)

// Undefine removes a stopped domain's definition; a missing one succeeds,
// a running or paused one is rejected (stop it first).
func (d *Driver) Undefine(ctx context.Context, host, uuid string) error {
	fail := func(err error) error { return fmt.Errorf("sim: undefine %s on %s: %w", uuid, host, err) }
	id, err := hypervisor.ParseUUID(uuid)
	if err != nil {
		// No domain has a malformed UUID, so there is nothing to remove.
		return d.checkHostOnly(ctx, host, fail)
	}
	u := id.String()
	if err := d.checkHost(ctx, host); err != nil {
		return fail(err)
	}
	if err := d.pace(ctx, host, u, OpUndefine); err != nil {
		return fail(err)
	}
	code, rest, err := d.runOnDomain(ctx, undefineScript, host, u, u)
	if err != nil {
		return fail(err)
	}
	if err := d.codeErr(code, rest, host, u, fail); err != nil {
		return err
	}
	if _, _, err := d.run(ctx, releaseHomeScript, []string{d.homeKey(u), d.migrationKey(u)}, host); err != nil {
		return fail(err)
	}
	return nil
}

func (d *Driver) checkHostOnly(ctx context.Context, host string, fail func(error) error) error {
	if err := d.checkHost(ctx, host); err != nil {
		return fail(err)
	}
	return nil
}

// Lookup returns one domain, or an error wrapping ErrNotFound. A domain
// held by a dead migration is read after that migration's abort (see
// Migrate): the incoming side of one is not found.
func (d *Driver) Lookup(ctx context.Context, host, uuid string) (*hypervisor.Domain, error) {
	id, err := hypervisor.ParseUUID(uuid)
	if err != nil {
		if err := d.checkHost(ctx, host); err != nil {
			return nil, fmt.Errorf("sim: lookup %s on %s: %w", uuid, host, err)
		}
		return nil, fmt.Errorf("sim: lookup on %s: %v: %w", host, err, hypervisor.ErrNotFound)
	}
	u := id.String()
	dom, err := d.lookup(ctx, host, u)
	if err != nil {
		return nil, fmt.Errorf("sim: lookup %s on %s: %w", u, host, err)
	}
	return dom, nil
}

// domainUUID is uuid in its normal form, as domains are stored. No domain
// has a malformed UUID: its error wraps hypervisor.ErrNotFound.
func domainUUID(uuid string) (string, error) {
	id, err := hypervisor.ParseUUID(uuid)
	if err != nil {
		return "", fmt.Errorf("%v: %w", err, hypervisor.ErrNotFound)
	}
	return id.String(), nil
}

// lookup reads domain u (a normalised UUID) of host.
func (d *Driver) lookup(ctx context.Context, host, u string) (*hypervisor.Domain, error) {
	m, now, err := d.readDomain(ctx, host, u)
	if err != nil {
		return nil, err
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("%w", hypervisor.ErrNotFound)
	}
	return domainOf(m, now), nil
}

// readDomain reads the hash of domain u of host (empty when there is none)
// and Redis's time; an unknown or powered-off host is an error (see
// hostStatus). A domain carrying a migration mark is read again after the
// migration's abort if it is dead.
func (d *Driver) readDomain(ctx context.Context, host, u string) (map[string]string, time.Time, error) {
	for reaped := false; ; reaped = true {
		pipe := d.rdb.Pipeline()
		exists := pipe.Exists(ctx, d.topoKey(host))
		off := pipe.Exists(ctx, d.powerKey(host))
		fields := pipe.HGetAll(ctx, d.domKey(host, u))
		now := pipe.Time(ctx)
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, time.Time{}, err
		}
		if err := hostStatus(host, exists.Val() == 1, off.Val() == 1); err != nil {
			return nil, time.Time{}, err
		}
		m := fields.Val()
		if mk, marked := markOf(host, m); marked && !reaped {
			changed, err := d.reap(ctx, u, &mk)
			if err != nil {
				return nil, time.Time{}, err
			}
			if changed {
				continue
			}
		}
		return m, now.Val(), nil
	}
}

// domainOf is the domain stored in hash m as it is at now, Redis's time:
// shut off once a pending shutdown is due, even if no script has recorded
// that yet.
func domainOf(m map[string]string, now time.Time) *hypervisor.Domain {
	st := hypervisor.State(m["state"])
	if due, pending := shutdownDue(m); pending && !now.Before(due) {
		st = hypervisor.StateShutoff
	}
	return &hypervisor.Domain{UUID: m["uuid"], Name: m["name"], State: st, XML: m["xml"]}
}

// shutdownDue returns when the pending shutdown stored in hash m is due,
// if there is one.
func shutdownDue(m map[string]string) (time.Time, bool) {
	ms, err := strconv.ParseInt(m["shutdown_due"], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// Domains lists every domain on host, with its XML, by name then UUID. The
// paused destination of an in-flight migration is listed too, as libvirt
// lists it, unless that migration is dead: Domains aborts dead migrations
// that mark domains of host before it lists them (see Migrate).
func (d *Driver) Domains(ctx context.Context, host string) ([]hypervisor.Domain, error) {
	fail := func(err error) error { return fmt.Errorf("sim: domains of %s: %w", host, err) }
	for reaped := false; ; reaped = true {
		out, marks, err := d.domains(ctx, host)
		if err != nil {
			return nil, fail(err)
		}
		if len(marks) > 0 && !reaped {
			changed, err := d.reapEach(ctx, marks)
			if err != nil {
				return nil, fail(err)
			}
			if changed {
				continue
			}
		}
		return out, nil
	}
}

// domains reads every domain on host, sorted, and the migration marks of
// those that carry one, by UUID.
func (d *Driver) domains(ctx context.Context, host string) ([]hypervisor.Domain, map[string]mark, error) {
	pipe := d.rdb.Pipeline()
	exists := pipe.Exists(ctx, d.topoKey(host))
	off := pipe.Exists(ctx, d.powerKey(host))
	members := pipe.SMembers(ctx, d.domainsKey(host))
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, nil, err
	}
	if err := hostStatus(host, exists.Val() == 1, off.Val() == 1); err != nil {
		return nil, nil, err
	}
	uuids := members.Val()
	out := make([]hypervisor.Domain, 0, len(uuids))
	if len(uuids) == 0 {
		return out, nil, nil
	}
	pipe = d.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(uuids))
	for i, u := range uuids {
		cmds[i] = pipe.HGetAll(ctx, d.domKey(host, u))
	}
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, nil, err
	}
	var marks map[string]mark
	for i, c := range cmds {
		// A domain undefined between the two reads is gone.
		m := c.Val()
		if len(m) == 0 {
			continue
		}
		out = append(out, *domainOf(m, now.Val()))
		if mk, marked := markOf(host, m); marked {
			if marks == nil {
				marks = map[string]mark{}
			}
			marks[uuids[i]] = mk
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].UUID < out[j].UUID
	})
	return out, marks, nil
}
