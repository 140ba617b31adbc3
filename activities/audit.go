package activities

import (
	"context"
	"errors"

	"github.com/pinflow/pinflow/audit"
)

// The activities of the audit, the recovery and the settling: thin steps
// over the audit package, which keep the activity names the workflows'
// histories record and turn the audit's errors into the error types
// workflows branch on.

// ListHosts returns the ledger's registered hosts, for an audit or a
// recovery of all.
func (a *Activities) ListHosts(ctx context.Context) ([]string, error) {
	return a.Ledger.Hosts(ctx)
}

// AuditHost audits one host's claims and compares them with its domains
// (audit.Auditor.AuditHost). It heartbeats, so that an audit whose worker
// died is retried at once rather than after its timeout.
func (a *Activities) AuditHost(ctx context.Context, in audit.AuditHostInput) (audit.HostAudit, error) {
	var res audit.HostAudit
	err := a.heartbeating(ctx, func(ctx context.Context) error {
		var err error
		res, err = a.Audit.AuditHost(ctx, in)
		return auditErr(err)
	})
	return res, err
}

// SweepBuilding marks failed the records stuck in building whose boot is
// over (audit.Auditor.SweepBuilding). It heartbeats, as AuditHost does.
func (a *Activities) SweepBuilding(ctx context.Context, in audit.SweepBuildingInput) (audit.RecordSweep, error) {
	var res audit.RecordSweep
	err := a.heartbeating(ctx, func(ctx context.Context) error {
		var err error
		res, err = a.Audit.SweepBuilding(ctx, in)
		return auditErr(err)
	})
	return res, err
}

// RecoverHost rebuilds a host's ledger after Redis lost data, from its
// hypervisor and the instance records (audit.Auditor.RecoverHost).
func (a *Activities) RecoverHost(ctx context.Context, in audit.RecoverHostInput) (audit.RecoverHostResult, error) {
	res, err := a.Audit.RecoverHost(ctx, in)
	return res, auditErr(err)
}

// SettleClaim makes a claim its instance already runs on the instance's
// resident claim (audit.Auditor.SettleClaim).
func (a *Activities) SettleClaim(ctx context.Context, in audit.SettleInput) (audit.SettleResult, error) {
	in.Token = runToken(ctx)
	res, err := a.Audit.SettleClaim(ctx, in)
	return res, auditErr(err)
}

// ReleaseQuarantineClaim releases a quarantine an operator has resolved,
// refused while a domain on the host runs on its pCPUs
// (audit.Auditor.ReleaseQuarantine).
func (a *Activities) ReleaseQuarantineClaim(ctx context.Context, in audit.ReleaseQuarantineInput) (audit.ReleasedQuarantine, error) {
	var res audit.ReleasedQuarantine
	err := a.heartbeating(ctx, func(ctx context.Context) (err error) {
		res, err = a.Audit.ReleaseQuarantine(ctx, in)
		return err
	})
	return res, auditErr(err)
}

// auditErr gives the audit's errors the types workflows and the CLI
// branch on: a request that can never succeed, one the state forbids, or
// what classify makes of the ledger's and the hypervisor's.
func auditErr(err error) error {
	var bad *audit.InvalidError
	var refused *audit.RefusedError
	switch {
	case errors.As(err, &bad):
		return BadRequest(bad.Error())
	case errors.As(err, &refused):
		return BadState(refused.Error())
	}
	return classify(err)
}
