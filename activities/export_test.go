package activities

import (
	"context"
	"time"
)

// Lease is a step's fence lease on its claim, for the tests in package
// activities_test, which share their world with the audit's tests.
type Lease struct{ l *claimLease }

// NewLease is the lease a step of a takes on the claim, with the test's
// length and worker clock.
func NewLease(a *Activities, host, claimID, token string, length time.Duration, now func() time.Time) Lease {
	l := a.claimLease(host, claimID, token)
	l.length, l.now = length, now
	return Lease{l: l}
}

// Renew renews the lease, as a fenced step does before it acts.
func (l Lease) Renew(ctx context.Context) (time.Time, error) { return l.l.renew(ctx) }

// Held is when the lease ends by the worker's clock.
func (l Lease) Held() time.Time { return l.l.held() }
