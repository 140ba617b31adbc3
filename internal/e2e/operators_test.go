package e2e

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/ledger"
)

// What operators do during a chaos run, at random moments: fence a host
// and bring it back, recover a healthy host's ledger and release the
// quarantines they find, and start a worker of another namespace by
// mistake. Each runs the CLI as an operator would, through s.run: these
// run off the test goroutine, so they report rather than fail.

// takeHost picks a random host that no drain, fence or recovery holds,
// and holds it for what; "" when every host is held.
func (c *chaos) takeHost(rng *rand.Rand, what string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var free []string
	for _, h := range c.hosts {
		if c.held[h] == "" {
			free = append(free, h)
		}
	}
	if len(free) == 0 {
		return ""
	}
	h := free[rng.IntN(len(free))]
	c.held[h] = what
	return h
}

// freeHost lets other operator actions take host again.
func (c *chaos) freeHost(host string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.held, host)
}

// count adds one to the outcomes of kind ("fence", "recover", ...).
func (c *chaos) count(kind, outcome string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.outcomes[kind+"->"+outcome]++
}

// cli runs the CLI and reports a failure other than one whose stderr
// contains any of expected; it returns stdout, stderr and whether it
// succeeded.
func (c *chaos) cli(expected []string, args ...string) (string, string, bool) {
	out, errOut, code := c.s.run(args...)
	if code == 0 {
		return out, errOut, true
	}
	for _, e := range expected {
		if strings.Contains(errOut, e) {
			return out, errOut, false
		}
	}
	c.report("pinflow %s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
	return out, errOut, false
}

// pause rests up to d, as an operator between two commands.
func pause(rng *rand.Rand, d time.Duration) { time.Sleep(time.Duration(rng.Int64N(int64(d)))) }

// fence cuts a random host's power, fences it, evacuates its guests,
// powers it on and brings it back as an operator would: host up is
// refused while operations on its guests run, and is tried again until
// it succeeds, past the end of the operations if need be.
func (c *chaos) fence(ctx context.Context, rng *rand.Rand) {
	h := c.takeHost(rng, "fence")
	if h == "" {
		return
	}
	defer c.freeHost(h)
	c.fences.Add(1)
	began := time.Since(c.begun).Round(time.Second)
	if _, _, ok := c.cli(nil, "sim", "power", "--host", h, "--off"); !ok {
		return
	}
	if _, _, ok := c.cli(nil, "host", "down", h, "--fence", "--reason", "chaos"); !ok {
		c.cli(nil, "sim", "power", "--host", h, "--on")
		return
	}
	pause(rng, time.Second)
	// An evacuation fails for want of room, or does not start while an
	// operation on the guest runs: the operator tries again, then gives up
	// on those guests, which stay on the host.
	evacuated, why := "some failed", ""
	for range 3 {
		out, _, ok := c.cli([]string{"evacuations failed"}, "host", "evacuate", h, "--wait")
		if ok {
			evacuated = "ok"
			break
		}
		why = strings.ReplaceAll(strings.TrimSpace(out), "\n", "; ")
		pause(rng, 2*time.Second)
	}
	c.count("fence evacuate", evacuated)
	if _, _, ok := c.cli(nil, "sim", "power", "--host", h, "--on"); !ok {
		return
	}
	// A try whose answer was lost (the worker killed, Redis restarting)
	// may have brought the host up: the next is refused as the host being
	// up, and the cycle is over. Any other refusal is reported, and ends it.
	refusals := []string{"operations run on its guests", "coming back already"}
	for tries := 1; ctx.Err() == nil; tries++ {
		_, errOut, ok := c.cli(append(refusals, "host "+h+" is up;"), "host", "up", h, "--wait")
		if ok || strings.Contains(errOut, "host "+h+" is up;") {
			c.count("fence host up", map[bool]string{true: "ok at once", false: "ok after refusals"}[tries == 1])
			c.t.Logf("fence cycle of %s from %s to %s: evacuation %s (%s), up at try %d", h, began, time.Since(c.begun).Round(time.Second), evacuated, why, tries)
			return
		}
		if !slices.ContainsFunc(refusals, func(r string) bool { return strings.Contains(errOut, r) }) {
			return
		}
		pause(rng, 2*time.Second)
	}
	c.report("host %s fenced by the run is not up again by its end", h)
}

// recoverHost runs recover on a random host that is up: on a ledger that
// agrees with the hypervisors it changes nothing and says so. A claim restored may be one an operation made between
// recover's two looks, which it only makes again; a quarantine means a
// domain ran on pCPUs no claim held. Then it releases every quarantine it
// finds.
func (c *chaos) recoverHost(ctx context.Context, rng *rand.Rand) {
	h := c.takeHost(rng, "recover")
	if h == "" {
		return
	}
	c.recovers.Add(1)
	out, _, ok := c.cli(nil, "recover", "--host", h, "--json")
	c.freeHost(h)
	outcome := "unchanged"
	if ok {
		var res api.RecoverResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			c.report("recover --host %s --json: %v: %s", h, err, out)
			return
		}
		for _, r := range res.Hosts {
			if len(r.Unresolved) > 0 {
				outcome = "unresolved"
			}
			if len(r.Quarantined) > 0 {
				c.report("recover of %s, a host whose ledger was never lost, quarantined %+v", h, r.Quarantined)
				outcome = "quarantined"
			} else if len(r.Restored) > 0 {
				outcome = "restored"
			}
		}
		c.t.Logf("recover of %s (%s): %s", h, outcome, strings.TrimSpace(out))
	}
	c.count("recover", outcome)
	c.releaseQuarantines(ctx)
}

// releaseQuarantines asks to release every quarantine claim of every
// host: a release is refused while a running domain uses its pCPUs.
func (c *chaos) releaseQuarantines(ctx context.Context) {
	for _, h := range c.hosts {
		snap, err := c.led.Snapshot(ctx, h)
		if err != nil {
			continue
		}
		for _, cl := range snap.Claims {
			if cl.Kind != ledger.KindQuarantine {
				continue
			}
			_, _, ok := c.cli([]string{"not released", "changed meanwhile", "has no claim"}, "quarantine", "release", "--host", h, cl.ID)
			c.count("quarantine release", map[bool]string{true: "released", false: "refused"}[ok])
		}
	}
}

// foreignWorker starts a worker configured with another Temporal
// namespace on the same Redis: the ledger is bound to the stack's
// namespace, so it must exit non-zero at once with one line naming both.
func (c *chaos) foreignWorker(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	w := exec.CommandContext(ctx, c.s.worker)
	w.Env = append(slices.Clip(c.s.env), "PINFLOW_TEMPORAL_NAMESPACE=other")
	out, err := w.CombinedOutput()
	c.foreign.Add(1)
	want := `serves Temporal namespace "` + c.s.namespace() + `", not "other"`
	line := strings.TrimSpace(string(out))
	if err == nil || strings.Contains(line, "\n") || !strings.HasPrefix(line, "pinflow-worker: ") || !strings.Contains(line, want) {
		c.report("worker of namespace other: exit %v, output %q; want a non-zero exit and one line containing %q", err, line, want)
		c.count("foreign worker", "not refused")
		return
	}
	c.count("foreign worker", "refused")
}
