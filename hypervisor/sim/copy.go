package sim

import (
	"context"
	"time"

	"github.com/pinflow/pinflow/hypervisor"
)

// ProgressPostCopy is reported after a switch to post-copy, while the
// destination fetches the memory still on the source.
const ProgressPostCopy = "post-copy"

// defaultMaxDowntime is the downtime a migration converges within when its
// policy sets none, QEMU's default.
const defaultMaxDowntime = 300 * time.Millisecond

// The auto-converge throttle, as QEMU's: once a first pass over the memory
// did not converge, the vCPUs lose 20% of their time, and 10 points more
// every second, up to 99%.
const (
	throttleInitial   = 0.2
	throttleIncrement = 0.1
	throttleMax       = 0.99
)

const mib = 1 << 20

// copyStep is the memory copy after one step.
type copyStep struct {
	wait     time.Duration // how long the step takes
	elapsed  time.Duration // the copy's duration so far, this step included
	progress hypervisor.Progress
	// halfway: the step that sent half the memory, when an injected
	// fault strikes.
	halfway bool
	// converged: what remains can be sent within the downtime, so the
	// switchover may begin.
	converged bool
}

// copyModel is how one attempt's memory copy goes: by the migrate latency
// (latencyCopy) or by the source's rates (rateCopy).
type copyModel interface {
	// next advances the copy by one step.
	next() copyStep
	// pullTime is how long post-copy takes to fetch remaining bytes.
	pullTime(remaining uint64) time.Duration
}

// copyModelOf is the model of a's copy: the source's rates when it has
// any, else its migrate latency.
func (d *Driver) copyModelOf(ctx context.Context, a *attempt) (copyModel, error) {
	r, err := d.ratesOf(ctx, a.req.Source)
	if err != nil {
		return nil, err
	}
	if r != nil {
		return newRateCopy(a.total, *r, a.req.Policy), nil
	}
	latency, err := d.latencyOf(ctx, a.req.Source, OpMigrate)
	if err != nil {
		return nil, err
	}
	return newLatencyCopy(a.total, latency), nil
}

// latencyCopy lasts the migrate latency exactly, in minSteps steps or one
// every stepInterval, and converges at its last step; the guest dirties
// nothing, and the policy's bandwidth, downtime and auto-converge do not
// apply.
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

func (c *latencyCopy) pullTime(remaining uint64) time.Duration {
	if c.total == 0 {
		return 0
	}
	return time.Duration(float64(c.latency) * float64(remaining) / float64(c.total))
}

// rateCopy sends memory at the transfer rate, capped by the policy's
// bandwidth, while the guest dirties memory at the dirty rate, slowed by
// auto-converge when the policy allows it; what is dirtied must be sent
// again, so the data remaining falls by the difference, and never rises
// above the guest's memory. It converges once what remains can be sent
// within the policy's downtime: a guest that dirties memory as fast as it
// is sent never converges.
type rateCopy struct {
	total        float64 // bytes
	rate, dirty  float64 // bytes/s
	downtime     time.Duration
	autoConverge bool

	elapsed   time.Duration
	remaining float64
	processed float64
	half      bool
}

func newRateCopy(total uint64, r Rates, p hypervisor.MigrationPolicy) *rateCopy {
	rate := r.TransferMiBs * mib
	if p.BandwidthMiBs > 0 {
		rate = min(rate, float64(p.BandwidthMiBs)*mib)
	}
	downtime := p.MaxDowntime
	if downtime <= 0 {
		downtime = defaultMaxDowntime
	}
	return &rateCopy{total: float64(total), rate: rate, dirty: r.DirtyMiBs * mib, downtime: downtime,
		autoConverge: p.AllowAutoConverge, remaining: float64(total)}
}

func (c *rateCopy) next() copyStep {
	dt := stepInterval
	sent := min(c.rate*dt.Seconds(), c.remaining)
	c.processed += sent
	c.remaining = min(c.total, c.remaining-sent+c.dirtyRate()*dt.Seconds())
	c.elapsed += dt
	halfway := !c.half && c.processed >= c.total/2
	c.half = c.half || halfway
	remaining := uint64(c.remaining)
	p := hypervisor.Progress{DataTotal: uint64(c.total), DataProcessed: uint64(c.processed), DataRemaining: remaining, Phase: ProgressCopying}
	if c.total > 0 {
		p.Percent = min(99, int((c.total-c.remaining)*100/c.total))
	}
	return copyStep{wait: dt, elapsed: c.elapsed, progress: p, halfway: halfway,
		converged: c.remaining <= c.rate*c.downtime.Seconds()}
}

// dirtyRate is the guest's dirty rate at this point of the copy.
func (c *rateCopy) dirtyRate() float64 {
	firstPass := time.Duration(c.total / c.rate * float64(time.Second))
	if !c.autoConverge || c.elapsed < firstPass {
		return c.dirty
	}
	seconds := int((c.elapsed - firstPass) / time.Second)
	throttle := min(throttleMax, throttleInitial+throttleIncrement*float64(seconds))
	return c.dirty * (1 - throttle)
}

func (c *rateCopy) pullTime(remaining uint64) time.Duration {
	return time.Duration(float64(remaining) / c.rate * float64(time.Second))
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
