package activities

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pinflow/pinflow/ledger"
)

// claimLease is the fence lease a hypervisor step holds on the claim it
// acts for (ledger.Fence). While the lease runs the audit cannot free the
// claim, so the step may act on its pCPUs until the lease ends.
//
// A ledger that does not answer for a while (a Redis failover, a restart)
// is waited out rather than failing the step: a lease already held still
// keeps the claim, so the step goes on until that lease runs out, and a
// step that holds none yet waits for the ledger before it acts. Only a
// refusal (the claim gone, or made again) is final.
type claimLease struct {
	ledger               *ledger.Ledger
	host, claimID, token string
	length               time.Duration
	// teardown fences for a step that only stops, undefines or unplugs:
	// a host marked down or returning does not refuse it.
	teardown bool
	// now is this worker's clock; time.Now, whose monotonic reading is
	// what every comparison of the lease's times uses.
	now func() time.Time

	mu sync.Mutex
	// until is when the lease ends by this worker's clock (see leaseEnd).
	until time.Time
}

func (a *Activities) claimLease(host, claimID, token string) *claimLease {
	return &claimLease{ledger: a.Ledger, host: host, claimID: claimID, token: token, length: a.lease(), now: time.Now}
}

// leaseEnd is when a lease renewed by a call sent at sent ends by this
// worker's clock: half the lease after the sending. Redis starts the lease
// by its own clock when the fence script runs, which is after sent, so
// the lease lasts at least until sent plus its length; the worker counts
// only the duration from its own reading, never Redis' end against its own
// wall clock, so no skew between the two clocks moves it. The other half
// is the margin for the two clocks' rates and for the step's own call to
// return (see the ledger's doc, Fences).
func leaseEnd(sent time.Time, length time.Duration) time.Time {
	return sent.Add(length / 2)
}

// leaseRetry bounds the wait between two tries of a renewal the ledger
// did not answer.
const leaseRetry = 2 * time.Second

// renew renews the lease and returns when it ends by this worker's clock.
// A refusal is returned at once (see refused). A ledger error is retried
// while ctx lasts and, once a lease is held, only while it runs: its
// error then says the lease ran out.
func (l *claimLease) renew(ctx context.Context) (time.Time, error) {
	wait := 100 * time.Millisecond
	for {
		sent := l.now()
		fence := l.ledger.Fence
		if l.teardown {
			fence = l.ledger.FenceTeardown
		}
		_, err := fence(ctx, l.host, l.claimID, l.token, l.length)
		if err == nil {
			return l.extend(leaseEnd(sent, l.length)), nil
		}
		if !ledger.Unavailable(err) {
			return time.Time{}, err
		}
		held := l.held()
		if !held.IsZero() && l.now().Add(wait).After(held) {
			return time.Time{}, fmt.Errorf("the fence lease on claim %s ran out while the ledger did not answer: %w", l.claimID, err)
		}
		if err := pause(ctx, err, &wait); err != nil {
			return time.Time{}, err
		}
	}
}

// waitLedger makes read, a ledger call a hypervisor step needs before it
// acts, until the ledger answers or ctx ends: a failover costs the step
// time, not one of its few attempts.
func waitLedger(ctx context.Context, read func(ctx context.Context) error) error {
	wait := 100 * time.Millisecond
	for {
		err := read(ctx)
		if !ledger.Unavailable(err) {
			return err
		}
		if err := pause(ctx, err, &wait); err != nil {
			return err
		}
	}
}

// pause waits *wait, doubled for the next time up to leaseRetry, before
// another try of a call that failed with err; it returns an error when
// ctx ends first.
func pause(ctx context.Context, err error, wait *time.Duration) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w while the ledger did not answer: %w", ctx.Err(), err)
	case <-time.After(*wait):
	}
	*wait = min(2**wait, leaseRetry)
	return nil
}

// keep renews the lease every interval until the returned stop is called,
// so that it runs as long as a step that no longer fences itself (a
// migration past its switch to post-copy) does.
func (l *claimLease) keep(ctx context.Context, interval time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_, _ = l.renew(ctx)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// end ends the lease in the ledger, once the step's act has returned, so
// that another operation may take the claim at once. Best effort: a
// lease left runs out.
func (l *claimLease) end(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseRetry)
	defer cancel()
	_ = l.ledger.Unfence(ctx, l.host, l.claimID, l.token)
}

func (l *claimLease) extend(until time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if until.After(l.until) {
		l.until = until
	}
	return l.until
}

func (l *claimLease) held() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.until
}

// refused says whether a renewal failed because the claim is gone or was
// made again: no retry brings it back.
func refused(err error) bool {
	return errors.Is(err, ledger.ErrUnknownClaim) || errors.Is(err, ledger.ErrConflict)
}
