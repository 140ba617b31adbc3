package workflows

import (
	"fmt"

	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
)

// Recover rebuilds hosts' ledgers after Redis lost data, one host after
// the other (activities.RecoverHost): it restores the resident claims
// whose records agree with the running domains and the pending claims of
// open operations whose guests run pinned to them, and quarantines the
// pCPUs of running domains that nothing explains. It only adds claims,
// never frees one.
func Recover(ctx workflow.Context, in api.RecoverInput) (*api.RecoverResult, error) {
	s, err := newSaga(ctx, api.OpRecover, "", 1)
	if err != nil {
		return nil, err
	}
	hosts := in.Hosts
	if len(hosts) == 0 {
		if err := s.ledger(ctx, "list hosts", a.ListHosts).Get(ctx, &hosts); err != nil {
			return nil, s.fail(err)
		}
	}
	s.steps = len(hosts)
	res := &api.RecoverResult{DryRun: in.DryRun}
	for _, h := range hosts {
		s.phase(api.PhaseRecovering, "recovering "+h)
		var hr audit.RecoverHostResult
		rin := audit.RecoverHostInput{Host: h, DryRun: in.DryRun}
		if err := s.ledger(ctx, "recover "+h, a.RecoverHost, rin).Get(ctx, &hr); err != nil {
			return nil, s.fail(err)
		}
		res.Hosts = append(res.Hosts, hr)
		s.step()
	}
	restored, quarantined := 0, 0
	for _, h := range res.Hosts {
		restored, quarantined = restored+len(h.Restored), quarantined+len(h.Quarantined)
	}
	s.phase(api.PhaseCompleted, fmt.Sprintf("%d hosts: %d claims restored, %d quarantines", len(res.Hosts), restored, quarantined))
	return res, nil
}

// ReleaseQuarantine releases a quarantine an operator has resolved, on
// the worker, where the hypervisor driver is: the release is refused
// while a domain on the host runs on its pCPUs
// (activities.ReleaseQuarantineClaim).
func ReleaseQuarantine(ctx workflow.Context, in audit.ReleaseQuarantineInput) (*audit.ReleasedQuarantine, error) {
	s, err := newSaga(ctx, api.OpUnquarantine, "", 1)
	if err != nil {
		return nil, err
	}
	s.setHosts(in.Host, "")
	s.phase(api.PhaseReleasing, "releasing quarantine "+in.ClaimID)
	var res audit.ReleasedQuarantine
	summary := "release quarantine " + in.ClaimID + " on " + in.Host
	if err := s.hypervisorTry(ctx, summary, &res, a.ReleaseQuarantineClaim, in); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	s.phase(api.PhaseCompleted, "pCPUs "+res.CPUs+" are free")
	return &res, nil
}
