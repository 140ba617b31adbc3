package sim

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// ErrHostOff marks a call addressed to a host that is powered off (see
// PowerOff). It is neither hypervisor.ErrRejected nor ErrNotFound: a dead
// host's hypervisor does not answer at all, and the same call may succeed
// once the host is back.
var ErrHostOff = errors.New("powered off")

// hostOff is the error of a call addressed to host while it is off.
func hostOff(host string) error {
	return fmt.Errorf("host %s is %w", host, ErrHostOff)
}

// PowerOff models a crash or a power cut of host. At once every domain on
// it is shut off (a running or paused guest just stops, a pending shutdown
// with it), and until PowerOn every driver call addressed to host fails
// with an error wrapping ErrHostOff; its definitions stay. Powering off a
// host that is off succeeds and changes nothing; an unknown host is an
// error wrapping hypervisor.ErrUnknownHost.
//
// A migration to or from host still copying when it goes off is dead, and
// is aborted as the sim aborts a dead one (see Migrate): the destination's
// paused incoming domain is gone, and the guest stays on the source,
// unmarked; running if the source is the other host, shut off if it is
// this one. The record goes, and the Migrate driving it fails at its next
// step with an error wrapping ErrHostOff. A migration past its switchover
// is never aborted: PowerOff finishes it, as a retried Migrate would. The
// guest then belongs to the destination: shut off there if that is host
// (its Migrate fails with ErrHostOff), running if host was the source,
// whose definition goes as usual. A Rollback in progress is left as it is;
// run it again once the host is back.
//
// PowerOff is idempotent: a call interrupted after the host went off, but
// before it ended the migrations, is completed by calling it again.
func (d *Driver) PowerOff(ctx context.Context, host string) error {
	fail := func(err error) error { return fmt.Errorf("sim: power off %s: %w", host, err) }
	marks, err := d.powerOff(ctx, host)
	if err != nil {
		return fail(err)
	}
	for _, u := range sortedKeys(marks) {
		if err := d.endMigration(ctx, host, u, marks[u]); err != nil {
			return fail(fmt.Errorf("the host is off, but ending the migration of %s failed (call PowerOff again): %w", u, err))
		}
	}
	return nil
}

// powerOff runs powerOffScript and returns the migration marks it found on
// host's domains, by UUID.
func (d *Driver) powerOff(ctx context.Context, host string) (map[string]mark, error) {
	// The first run turns the host off, so that its set of domains can
	// only shrink; a second one, if the set grew meanwhile, sees it all.
	for range 3 {
		uuids, err := d.rdb.SMembers(ctx, d.domainsKey(host)).Result()
		if err != nil {
			return nil, err
		}
		keys := []string{d.topoKey(host), d.domainsKey(host), d.powerKey(host)}
		args := make([]any, len(uuids))
		for i, u := range uuids {
			keys = append(keys, d.domKey(host, u))
			args[i] = u
		}
		code, rest, err := d.run(ctx, powerOffScript, keys, args...)
		if err != nil {
			return nil, err
		}
		switch code {
		case "NOHOST":
			return nil, unknownHost(host)
		case "CHANGED":
			continue
		case "OK":
		default:
			return nil, fmt.Errorf("unexpected script answer %q", code)
		}
		if len(rest)%3 != 0 {
			return nil, fmt.Errorf("script answered %d fields, want uuid, incoming, token triples", len(rest))
		}
		marks := map[string]mark{}
		for i := 0; i < len(rest); i += 3 {
			marks[rest[i]] = mark{host: host, incoming: rest[i+1] == "1", token: rest[i+2]}
		}
		return marks, nil
	}
	return nil, fmt.Errorf("the host's domains keep changing; retry")
}

// endMigration ends the migration of domain u that mk, a mark on host,
// belongs to, now that host is off: one still copying is declared dead and
// aborted, one past its switchover is finished, a mark left by an attempt
// whose record is gone is cleared.
func (d *Driver) endMigration(ctx context.Context, host, u string, mk mark) error {
	if _, _, err := d.run(ctx, hostDownScript, []string{d.migrationKey(u)}, host); err != nil {
		return err
	}
	if _, err := d.reap(ctx, u, &mk); err != nil {
		return err
	}
	f, err := d.rdb.HGetAll(ctx, d.migrationKey(u)).Result()
	if err != nil {
		return err
	}
	rec := migrationOf(f)
	if rec == nil || rec.phase != phaseSwitchover || (rec.src != host && rec.dst != host) {
		// A rollback in progress, or a migration between other hosts
		// that a leftover mark of an older attempt does not concern.
		return nil
	}
	if err := d.finish(ctx, rec.src, rec.dst, u, rec); err != nil && !errors.Is(err, ErrHostOff) {
		return err
	}
	return nil
}

// PowerOn brings host back after PowerOff: its hypervisor answers again,
// and its domains are as the power-off left them, shut off, leftovers
// included (see Define and Start). Powering on a host that is on succeeds
// and changes nothing; an unknown host is an error wrapping
// hypervisor.ErrUnknownHost.
func (d *Driver) PowerOn(ctx context.Context, host string) error {
	code, _, err := d.run(ctx, powerOnScript, []string{d.topoKey(host), d.powerKey(host)})
	if err != nil {
		return fmt.Errorf("sim: power on %s: %w", host, err)
	}
	if code == "NOHOST" {
		return fmt.Errorf("sim: power on %s: %w", host, unknownHost(host))
	}
	return nil
}

// anyOff returns the ErrHostOff error of the first of hosts that is
// powered off, or nil.
func (d *Driver) anyOff(ctx context.Context, hosts ...string) error {
	pipe := d.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(hosts))
	for i, h := range hosts {
		cmds[i] = pipe.Exists(ctx, d.powerKey(h))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	for i, c := range cmds {
		if c.Val() == 1 {
			return hostOff(hosts[i])
		}
	}
	return nil
}
