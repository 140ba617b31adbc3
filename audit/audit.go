// Package audit keeps the ledger true to Temporal and the hypervisors: it
// judges each claim against its owning workflow and frees the ones no
// operation will finish (AuditHost, SweepBuilding), reports drift between
// the ledger and the domains, rebuilds a host's ledger after Redis lost
// data (RecoverHost), finishes forwards an operation whose guest already
// runs on its new claim (SettleClaim), and releases an operator's
// quarantine (ReleaseQuarantine). The Temporal activities that run it are
// thin methods of the activities package.
package audit

import (
	"time"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
)

// Auditor holds what the audit, the recovery and the settling need.
type Auditor struct {
	Ledger *ledger.Ledger
	Driver hypervisor.Driver
	// Owners tells the audit whether a claim's workflow is open.
	Owners OwnerChecker
	// Holders tells a recovery which claims an open operation made; nil
	// quarantines what a lost claim of an open operation held.
	Holders ClaimHolders
	// Grace is the audit's default grace period: younger claims are not
	// judged.
	Grace time.Duration
	// MinGrace is the least time a claim's owner must have been closed
	// before the audit frees the claim, whatever grace an audit asks for.
	MinGrace time.Duration
	// Settler finishes, under an instance's own workflow id, an operation
	// whose guest already runs on its new claim (see AuditHost); nil
	// leaves such claims kept and reported.
	Settler Settler
	// Evacuator starts the evacuations of the guests of a host fenced
	// down with automatic evacuation on; nil starts none.
	Evacuator Evacuator
}

// InvalidError is the error of a request that can never succeed as asked:
// retrying it is pointless.
type InvalidError struct{ msg string }

func (e *InvalidError) Error() string { return e.msg }

func invalid(msg string) error { return &InvalidError{msg: msg} }

// RefusedError is the error of a request that what the ledger or the
// hypervisor holds now forbids, and that an operator may make again once
// that has changed.
type RefusedError struct{ msg string }

func (e *RefusedError) Error() string { return e.msg }

func refused(msg string) error { return &RefusedError{msg: msg} }
