package workflows

import (
	"fmt"
	"strings"

	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/audit"
)

// RecoverInput says which hosts' ledgers to rebuild from the hypervisors.
type RecoverInput struct {
	// Hosts to recover; empty recovers every registered host.
	Hosts  []string `json:"hosts,omitempty"`
	DryRun bool     `json:"dry_run,omitempty"`
}

// RecoverResult is what each host's recovery found and did.
type RecoverResult struct {
	DryRun bool                      `json:"dry_run,omitempty"`
	Hosts  []audit.RecoverHostResult `json:"hosts"`
}

// Recover rebuilds hosts' ledgers after Redis lost data, one host after
// the other (activities.RecoverHost): it restores the resident claims
// whose records agree with the running domains and the pending claims of
// open operations whose guests run pinned to them, and quarantines the
// pCPUs of running domains that nothing explains. It only adds claims,
// never frees one.
func Recover(ctx workflow.Context, in RecoverInput) (*RecoverResult, error) {
	s, err := newSaga(ctx, OpRecover, "", 1)
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
	res := &RecoverResult{DryRun: in.DryRun}
	for _, h := range hosts {
		s.phase(PhaseRecovering, "recovering "+h)
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
	s.phase(PhaseCompleted, fmt.Sprintf("%d hosts: %d claims restored, %d quarantines", len(res.Hosts), restored, quarantined))
	return res, nil
}

// QuarantineReleaseWorkflowID is the workflow id of the release of one
// quarantine, so that two releases of it do not run at once.
func QuarantineReleaseWorkflowID(host, claimID string) string {
	return "quarantine-release-" + host + "/" + claimID
}

// ReleaseQuarantine releases a quarantine an operator has resolved, on
// the worker, where the hypervisor driver is: the release is refused
// while a domain on the host runs on its pCPUs
// (activities.ReleaseQuarantineClaim).
func ReleaseQuarantine(ctx workflow.Context, in audit.ReleaseQuarantineInput) (*audit.ReleasedQuarantine, error) {
	s, err := newSaga(ctx, OpUnquarantine, "", 1)
	if err != nil {
		return nil, err
	}
	s.setHosts(in.Host, "")
	s.phase(PhaseReleasing, "releasing quarantine "+in.ClaimID)
	var res audit.ReleasedQuarantine
	summary := "release quarantine " + in.ClaimID + " on " + in.Host
	if err := s.hypervisorTry(ctx, summary, &res, a.ReleaseQuarantineClaim, in); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	s.phase(PhaseCompleted, "pCPUs "+res.CPUs+" are free")
	return &res, nil
}

// RecoverReport renders a recovery for people.
func RecoverReport(res *RecoverResult) string {
	var b strings.Builder
	verb := map[bool]string{true: "would ", false: ""}[res.DryRun]
	for _, h := range res.Hosts {
		fmt.Fprintf(&b, "%s:", h.Host)
		if !h.Changed() && len(h.Unresolved) == 0 {
			fmt.Fprintf(&b, " fine: %d running domains agree with their claims; nothing to recover\n", h.Agreeing)
			continue
		}
		fmt.Fprintf(&b, " %d running domains agree with their claims\n", h.Agreeing)
		if h.Registered {
			fmt.Fprintf(&b, "  %sregister its topology again from the hypervisor\n", verb)
		}
		for _, c := range h.Restored {
			state := "committed"
			if c.Pending {
				state = "pending"
			}
			fmt.Fprintf(&b, "  %srestore claim %s of %s on pCPUs %s, %s: %s\n", verb, c.ClaimID, c.Instance, c.CPUs, state, c.Why)
		}
		for _, c := range h.Quarantined {
			fmt.Fprintf(&b, "  %squarantine pCPUs %s of %s as claim %s: %s\n", verb, c.CPUs, c.Instance, c.ClaimID, c.Why)
		}
		for _, u := range h.Unresolved {
			fmt.Fprintf(&b, "  needs an operator: %s\n", u)
		}
	}
	return b.String()
}
