package api

import (
	"fmt"
	"strings"

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

// QuarantineReleaseWorkflowID is the workflow id of the release of one
// quarantine, so that two releases of it do not run at once.
func QuarantineReleaseWorkflowID(host, claimID string) string {
	return "quarantine-release-" + host + "/" + claimID
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
