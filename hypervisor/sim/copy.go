package sim

import (
	"context"
	"time"

	"github.com/pinflow/pinflow/hypervisor"
)

// ProgressPostCopy is reported after a switch to post-copy, while the
// destination fetches the memory still on the source.
const ProgressPostCopy = "post-copy"

// copyStep is the memory copy after one step.
type copyStep struct {
	wait     time.Duration // how long the step takes
	elapsed  time.Duration // the copy's duration so far, this step included
	progress hypervisor.Progress
	// halfway: the step that sent half the memory, when an injected
	// fault strikes.
	halfway bool
	// converged: the copy is done, so the switchover may begin.
	converged bool
}

// latencyCopy lasts the migrate latency exactly, in minSteps steps or one
// every stepInterval, and converges at its last step; the guest dirties
// nothing, and the policy's bandwidth, downtime and auto-converge do not
// apply (the libvirt driver's tests cover them on a real QEMU).
type latencyCopy struct {
	total   uint64
	latency time.Duration
	steps   int
	i       int
	slept   time.Duration
}

func newLatencyCopy(total uint64, latency time.Duration) *latencyCopy {
	steps := minSteps
	if latency > minSteps*stepInterval {
		steps = int(latency / stepInterval)
	}
	return &latencyCopy{total: total, latency: latency, steps: steps}
}

// next advances the copy by one step.
func (c *latencyCopy) next() copyStep {
	c.i++
	// Deadlines spread over the whole latency, not a rounded step, make
	// the copy last the latency exactly.
	at := time.Duration(int64(c.latency) * int64(c.i) / int64(c.steps))
	wait := at - c.slept
	c.slept = at
	pct := min(99, c.i*100/c.steps)
	processed := c.total / 100 * uint64(pct)
	return copyStep{
		wait:      wait,
		elapsed:   at,
		progress:  hypervisor.Progress{Percent: pct, DataTotal: c.total, DataProcessed: processed, DataRemaining: c.total - processed, Phase: ProgressCopying},
		halfway:   c.i == (c.steps+1)/2,
		converged: c.i == c.steps,
	}
}

// pullTime is how long post-copy takes to fetch remaining bytes: their
// share of the latency.
func (c *latencyCopy) pullTime(remaining uint64) time.Duration {
	if c.total == 0 {
		return 0
	}
	return time.Duration(float64(c.latency) * float64(remaining) / float64(c.total))
}

// pull is post-copy, after the switch to it: the destination fetches the
// memory still on the source, reporting progress every stepInterval. Past
// the point of no return, it ignores ctx's cancellation.
func (d *Driver) pull(ctx context.Context, a *attempt) {
	ctx = context.WithoutCancel(ctx)
	last := a.last
	remaining := last.DataRemaining
	total := a.model.pullTime(remaining)
	steps := max(1, int(total/stepInterval))
	var slept time.Duration
	for i := 1; i <= steps; i++ {
		at := time.Duration(int64(total) * int64(i) / int64(steps))
		_ = d.sleep(ctx, at-slept)
		slept = at
		// A touch that fails only lets a reader finish the migration
		// early, which the attempt's own finish then finds done.
		_, _, _ = d.run(ctx, touchSwitchedScript, []string{d.migrationKey(a.u)}, a.rec.token)
		fetched := remaining / uint64(steps) * uint64(i)
		if i == steps {
			fetched = remaining
		}
		p := hypervisor.Progress{DataTotal: last.DataTotal, DataProcessed: last.DataProcessed + fetched,
			DataRemaining: remaining - fetched, Phase: ProgressPostCopy}
		if p.DataTotal > 0 {
			p.Percent = min(99, int((p.DataTotal-min(p.DataRemaining, p.DataTotal))*100/p.DataTotal))
		}
		a.progress(p)
	}
}
