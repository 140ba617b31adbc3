package ledger

import (
	"context"
	"errors"

	"github.com/pinflow/pinflow/numa"
)

// Sentinel errors. Every error the ledger returns for one of these causes
// wraps the sentinel, so callers test with errors.Is; a request that fits
// nowhere wraps the *numa.NoFitError instead, for errors.As.
var (
	// ErrUnknownHost: the host was never registered.
	ErrUnknownHost = errors.New("unknown host")
	// ErrUnknownClaim: the host has no claim of that id.
	ErrUnknownClaim = errors.New("unknown claim")
	// ErrUnknownInstance: there is no record of that instance uuid.
	ErrUnknownInstance = errors.New("unknown instance")
	// ErrInvalid: the input is malformed or does not belong on the host;
	// nothing was changed.
	ErrInvalid = errors.New("invalid input")
	// ErrExists: the instance exists already, made by another operation.
	ErrExists = errors.New("instance exists")
	// ErrConflict: the ledger's state forbids the change (a pCPU owned by
	// another claim, a claim id reused for another instance, a race lost
	// too often, a step run out of order); nothing was changed.
	ErrConflict = errors.New("conflict")
	// ErrUnknownGroup: there is no server group of that name.
	ErrUnknownGroup = errors.New("unknown group")
	// ErrHostDown: an operator marked the host down (fenced) or returning,
	// and it takes no new claims until it is up again; nothing was changed.
	ErrHostDown = errors.New("host is down")
	// ErrNotDurable: the change was made on the Redis master, but not
	// acknowledged with the durability the ledger waits for (Durability:
	// replicas that received it, a local fsync) within the wait's
	// timeout. It may survive a crash or failover or not. Retrying the
	// call is safe, since every change is idempotent, and waits again.
	ErrNotDurable = errors.New("not durable")
)

// answers are the sentinels of the ledger's own answers.
var answers = []error{ErrUnknownHost, ErrUnknownClaim, ErrUnknownInstance, ErrUnknownGroup, ErrInvalid, ErrExists, ErrConflict, ErrHostDown}

// Unavailable says whether err means that the ledger gave no answer:
// Redis down, failing over or loading, a connection lost, or a change not
// made durable (ErrNotDurable). Calling again is safe, and waiting for
// Redis is all that helps. Every other error is the ledger's answer, or
// the caller's context ending.
func Unavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	for _, answer := range answers {
		if errors.Is(err, answer) {
			return false
		}
	}
	var noFit *numa.NoFitError
	return !errors.As(err, &noFit)
}
