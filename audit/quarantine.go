package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pinflow/pinflow/ledger"
)

// ReleaseQuarantineInput names the quarantine an operator releases.
type ReleaseQuarantineInput struct {
	Host    string `json:"host"`
	ClaimID string `json:"claim_id"`
}

// ReleasedQuarantine is a quarantine released: its pCPUs are free.
type ReleasedQuarantine struct {
	Host     string `json:"host"`
	ClaimID  string `json:"claim_id"`
	Instance string `json:"instance"`
	CPUs     string `json:"cpus"`
	// Devices are the PCI devices it held, by address.
	Devices []string `json:"devices,omitempty"`
}

// ReleaseQuarantine releases a quarantine claim: an operator's
// decision that the domain whose pCPUs it held is gone. It asks the
// hypervisor first, as the audit does before it frees a claim, and
// refuses (a RefusedError, the ledger unchanged) while any domain on the host
// runs or is paused on one of those pCPUs, naming each such domain and
// the pCPUs it uses; a domain whose pins cannot be read is named too.
// Only a quarantine is released this way (an InvalidError otherwise).
func (a *Auditor) ReleaseQuarantine(ctx context.Context, in ReleaseQuarantineInput) (ReleasedQuarantine, error) {
	cl, err := a.Ledger.GetClaim(ctx, in.Host, in.ClaimID)
	if errors.Is(err, ledger.ErrUnknownClaim) {
		return ReleasedQuarantine{}, invalid(fmt.Sprintf("host %s has no claim %q", in.Host, in.ClaimID))
	}
	if err != nil {
		return ReleasedQuarantine{}, err
	}
	if cl.Kind != ledger.KindQuarantine {
		return ReleasedQuarantine{}, invalid(fmt.Sprintf("claim %s on %s is a %s claim, not a quarantine; only quarantines are released by hand", cl.ID, in.Host, cl.Kind))
	}
	held := claimHolding(cl)
	users, err := a.domainsUsing(ctx, in.Host, held)
	if err != nil {
		return ReleasedQuarantine{}, fmt.Errorf("audit: release quarantine %s on %s: %w", cl.ID, in.Host, err)
	}
	if len(users) > 0 {
		return ReleasedQuarantine{}, refused(fmt.Sprintf("quarantine %s on %s not released: %s; release it once no domain runs on its pCPUs or devices",
			cl.ID, in.Host, strings.Join(users, "; ")))
	}
	// The window between the look above and the release below is safe:
	// no domain starts on these pCPUs meanwhile, since pinflow starts a
	// domain only on pCPUs it claimed, and the quarantine holds them until
	// the release. The release is a compare-and-delete on the claim as it
	// was read, so a quarantine made again meanwhile (a new token) stays.
	ok, err := a.Ledger.ReleaseIfUnchanged(ctx, in.Host, cl.ID, cl.Token, cl.State)
	if err != nil {
		return ReleasedQuarantine{}, err
	}
	if !ok {
		return ReleasedQuarantine{}, refused(fmt.Sprintf("quarantine %s on %s changed meanwhile; look again", cl.ID, in.Host))
	}
	return ReleasedQuarantine{Host: in.Host, ClaimID: cl.ID, Instance: cl.InstanceUUID, CPUs: held.cpus.String(), Devices: held.devs}, nil
}

// domainsUsing describes each domain on host that runs or is paused on
// any of h, and each whose pins cannot be read.
func (a *Auditor) domainsUsing(ctx context.Context, host string, h holding) ([]string, error) {
	topo, err := a.Ledger.Host(ctx, host)
	if err != nil {
		return nil, err
	}
	doms, err := a.Driver.Domains(ctx, host)
	if err != nil {
		return nil, err
	}
	var users []string
	for _, d := range doms {
		used, err := domainHolding(d, topo)
		switch {
		case err != nil:
			users = append(users, fmt.Sprintf("domain %s (%s) is %s and its pins cannot be read", d.Name, d.UUID, d.State))
		case used.intersects(h):
			users = append(users, fmt.Sprintf("domain %s (%s) is %s on %s", d.Name, d.UUID, d.State, used.minus(used.minus(h))))
		}
	}
	return users, nil
}
