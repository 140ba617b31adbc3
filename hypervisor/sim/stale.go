package sim

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// A migration is driven by the goroutine that called Migrate. If the
// process running it dies during the copy, nothing drives it any more: its
// record stays in phase copying, the destination keeps the paused incoming
// domain and the source stays marked. A real hypervisor ends such a
// migration (libvirt fails one whose client disconnected), so the sim does
// too, lazily: the attempt touches its record at every step of the copy,
// and whoever reads a domain that carries a migration mark first asks
// staleScript whether the migration is dead (not touched for
// Options.StaleMigration) and, if so, aborts it as Migrate's own abort
// would. A migration past its switchover cannot be aborted: when its
// attempt stops showing itself, the reader finishes it, as libvirt
// finishes a migration whose destination already runs the guest. Only
// marked domains are looked at, so reading unmarked ones costs nothing
// more.

// mark is a migration mark seen on a stored domain: the token of the
// attempt that set it, on host, as the incoming side or as the source.
type mark struct {
	host     string
	incoming bool
	token    string
}

// markOf returns the migration mark of the domain hash m stored on host.
func markOf(host string, m map[string]string) (mark, bool) {
	mk := mark{host: host, incoming: m["incoming"] == "1", token: m["migration"]}
	return mk, mk.incoming || mk.token != ""
}

// markOfRefusal returns the mark behind a script's refusal, on host, to
// act on a domain held by a migration (see the scripts' answers).
func markOfRefusal(host, code string, rest []string) (mark, bool) {
	if code != "INCOMING" && code != "MIGRATING" {
		return mark{}, false
	}
	mk := mark{host: host, incoming: code == "INCOMING"}
	if len(rest) > 0 {
		mk.token = rest[0]
	}
	return mk, true
}

// reap aborts the migration of domain u if it is dead (see staleScript).
// seen, when not nil, is the mark that made the caller look. reap reports
// whether it may have changed anything, in which case the caller reads
// again.
func (d *Driver) reap(ctx context.Context, u string, seen *mark) (bool, error) {
	code, rest, err := d.run(ctx, staleScript, []string{d.migrationKey(u)}, d.stale.Milliseconds())
	if err != nil {
		return false, fmt.Errorf("checking for a dead migration: %w", err)
	}
	return d.settleReap(ctx, u, scriptAnswer{code, rest}, seen)
}

// reapEach is reap for several domains, with one round trip for the
// verdicts: marks maps each domain's UUID to the mark seen on it.
func (d *Driver) reapEach(ctx context.Context, marks map[string]mark) (bool, error) {
	us := sortedKeys(marks)
	keys := make([][]string, len(us))
	for i, u := range us {
		keys[i] = []string{d.migrationKey(u)}
	}
	verdicts, err := d.runEach(ctx, staleScript, keys, d.stale.Milliseconds())
	if err != nil {
		return false, fmt.Errorf("checking for dead migrations: %w", err)
	}
	changed := false
	for i, u := range us {
		mk := marks[u]
		c, err := d.settleReap(ctx, u, verdicts[i], &mk)
		if err != nil {
			return changed, err
		}
		changed = changed || c
	}
	return changed, nil
}

// settleReap acts on staleScript's verdict v on the migration of domain u.
// A dead migration is aborted as Migrate's abort does, with the dead
// attempt's token: the incoming domain leaves the destination, the source
// is unmarked (it still runs: a marked domain cannot be stopped), and the
// record goes last, so that a caller that dies halfway leaves the record
// in phase aborting for the next one to finish. Each step is idempotent and
// acts only on what carries that token, so concurrent callers, and the
// dead attempt itself should it come back and abort, do each step at most
// once and never touch a newer migration.
//
// A mark seen without a migration in flight, or with another token than
// the dead migration's, was left by an attempt whose record is gone or was
// replaced by a later attempt's (one that died between its steps 1 and 2,
// say); it is cleared too, by its own token, on both hosts of the dead
// migration.
func (d *Driver) settleReap(ctx context.Context, u string, v scriptAnswer, seen *mark) (bool, error) {
	fail := func(err error) error { return fmt.Errorf("aborting a dead migration: %w", err) }
	switch v.code {
	case "LIVE":
		return false, nil
	case "ORPHANED":
		return true, d.finishOrphaned(ctx, u, v)
	case "NONE":
		// What the caller read, a mark or a migration in flight, is gone
		// or was left behind; either way it must read again.
		if seen != nil {
			if err := d.clearMark(ctx, u, *seen); err != nil {
				return false, fail(err)
			}
		}
		return true, nil
	case "DEAD":
	default:
		return false, fail(fmt.Errorf("unexpected script answer %q", v.code))
	}
	if len(v.rest) != 3 {
		return false, fail(fmt.Errorf("script answered DEAD with %d fields, want token, src, dst", len(v.rest)))
	}
	token, src, dst := v.rest[0], v.rest[1], v.rest[2]
	if err := d.crashAt("reaping"); err != nil {
		return false, err
	}
	tokens := []string{token}
	if seen != nil && seen.token != "" && seen.token != token {
		tokens = append(tokens, seen.token)
	}
	for _, t := range tokens {
		if err := d.clearMark(ctx, u, mark{host: dst, incoming: true, token: t}); err != nil {
			return false, fail(err)
		}
		if err := d.clearMark(ctx, u, mark{host: src, token: t}); err != nil {
			return false, fail(err)
		}
	}
	if seen != nil && seen.host != src && seen.host != dst {
		if err := d.clearMark(ctx, u, *seen); err != nil {
			return false, fail(err)
		}
	}
	if _, _, err := d.run(ctx, abortRecordScript, []string{d.migrationKey(u)}, token); err != nil {
		return false, fail(err)
	}
	return true, nil
}

// clearMark undoes what the attempt that set mk did to domain u on
// mk.host: an incoming domain goes, a source is unmarked.
func (d *Driver) clearMark(ctx context.Context, u string, mk mark) error {
	if mk.incoming {
		_, _, err := d.run(ctx, abortIncomingScript, []string{d.domainsKey(mk.host), d.domKey(mk.host, u)}, u, mk.token)
		return err
	}
	_, _, err := d.run(ctx, unmarkSourceScript, []string{d.domKey(mk.host, u)}, mk.token)
	return err
}

// runOnDomain runs s, a script on domain u of host (KEYS topo, domains,
// dom), and when the domain's migration mark makes it refuse, aborts the
// migration if it is dead and runs s once more.
func (d *Driver) runOnDomain(ctx context.Context, s *redis.Script, host, u string, args ...any) (string, []string, error) {
	code, rest, err := d.run(ctx, s, d.domKeys(host, u), args...)
	if err != nil {
		return "", nil, err
	}
	mk, marked := markOfRefusal(host, code, rest)
	if !marked {
		return code, rest, nil
	}
	changed, err := d.reap(ctx, u, &mk)
	if err != nil || !changed {
		return code, rest, err
	}
	return d.run(ctx, s, d.domKeys(host, u), args...)
}

// finishOrphaned finishes a migration past its switchover whose attempt
// stopped (see staleScript): the same steps a retry of it would run, each
// a no-op if done, so the attempt itself, should it come back, and
// concurrent readers agree.
func (d *Driver) finishOrphaned(ctx context.Context, u string, v scriptAnswer) error {
	if len(v.rest) != 3 {
		return fmt.Errorf("finishing an orphaned migration: script answered ORPHANED with %d fields, want token, src, dst", len(v.rest))
	}
	f, err := d.rdb.HGetAll(ctx, d.migrationKey(u)).Result()
	if err != nil {
		return fmt.Errorf("finishing an orphaned migration: %w", err)
	}
	rec := migrationOf(f)
	if rec == nil || rec.token != v.rest[0] || rec.phase != phaseSwitchover {
		// Finished or rolled back meanwhile.
		return nil
	}
	if err := d.finish(ctx, rec.src, rec.dst, u, rec); err != nil && !errors.Is(err, ErrHostOff) {
		return fmt.Errorf("finishing an orphaned migration: %w", err)
	}
	return nil
}
