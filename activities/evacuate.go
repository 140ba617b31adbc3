package activities

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
)

// An evacuation rebuilds the guest of a dead host elsewhere. pinflow
// evacuates only from a host an operator fenced (ledger.HostDown): a
// host that merely stopped answering may still run its guests, and a
// rebuild beside a running copy shares its disks and its identity. The
// dead host's claim of an evacuated guest becomes a tombstone, so that
// when the host returns nothing lands on those pCPUs until the leftover
// guest there is destroyed (HostUp).

// HostStatus is a host's state as operators set it.
type HostStatus = ledger.HostStatus

// LoadHostStatus returns the host's state.
func (a *Activities) LoadHostStatus(ctx context.Context, host string) (HostStatus, error) {
	var st HostStatus
	err := a.heartbeating(ctx, func(ctx context.Context) (err error) {
		st, err = a.Ledger.HostStatus(ctx, host)
		return err
	})
	return st, classify(err)
}

// TombstoneClaim turns an evacuated guest's claim on its dead host into
// a tombstone.
func (a *Activities) TombstoneClaim(ctx context.Context, in ClaimRef) error {
	_, err := a.Ledger.Tombstone(ctx, in.Host, in.ClaimID)
	if errors.Is(err, ledger.ErrUnknownClaim) {
		// Nothing is held there any more (an operator released it).
		return nil
	}
	return classify(err)
}

// HostDownInput marks a host down.
type HostDownInput struct {
	Host   string `json:"host"`
	Reason string `json:"reason"`
}

// MarkHostDown records that the host is fenced (again: a host that could
// not come back).
func (a *Activities) MarkHostDown(ctx context.Context, in HostDownInput) error {
	reason := in.Reason
	if strings.TrimSpace(reason) == "" {
		reason = "marked down"
	}
	_, err := a.Ledger.SetHostDown(ctx, in.Host, reason)
	return classify(err)
}

// MarkHostReturning moves a fenced host to returning: it still takes no
// claims, and no evacuation starts from it any more.
func (a *Activities) MarkHostReturning(ctx context.Context, host string) error {
	_, err := a.Ledger.SetHostReturning(ctx, host)
	if errors.Is(err, ledger.ErrConflict) {
		return BadState(fmt.Sprintf("host %s is up; only a host marked down with 'pinflow host down %s --fence' comes back with host up", host, host))
	}
	return classify(err)
}

// HostLeftovers lists the tombstones of a returning host. It refuses
// while an operation on any guest with a claim there is open: an
// evacuation that started before the host was marked returning may still
// be about to tombstone its claim.
func (a *Activities) HostLeftovers(ctx context.Context, host string) ([]api.Leftover, error) {
	claims, err := a.Ledger.Claims(ctx, host)
	if err != nil {
		return nil, classify(err)
	}
	var out []api.Leftover
	var busy []string
	for _, c := range claims {
		if c.Kind == ledger.KindQuarantine {
			continue
		}
		st, err := a.Audit.Owners.OwnerStatus(ctx, guest.InstanceWorkflowID(c.InstanceUUID))
		if err != nil {
			return nil, err
		}
		if st.State == audit.OwnerRunning {
			busy = append(busy, c.InstanceUUID)
		}
		if c.State == ledger.StateTombstone {
			out = append(out, api.Leftover{Host: host, UUID: c.InstanceUUID, ClaimID: c.ID, Token: c.Token})
		}
	}
	if len(busy) > 0 {
		return nil, BadState(fmt.Sprintf("host %s cannot come up while operations run on its guests %s; wait for them and run host up again",
			host, strings.Join(busy, ", ")))
	}
	return out, nil
}

// ClearTombstone destroys the leftover of an evacuated guest on the
// returning host and then releases its tombstone. A guest whose record
// names the tombstone is not a leftover: it is refused.
func (a *Activities) ClearTombstone(ctx context.Context, in api.Leftover) error {
	return a.heartbeating(ctx, func(ctx context.Context) error {
		var home ledger.Home
		err := waitLedger(ctx, func(ctx context.Context) (err error) { home, err = a.Ledger.Home(ctx, in.UUID); return err })
		switch {
		case errors.Is(err, ledger.ErrUnknownInstance):
		case err != nil:
			return classify(err)
		case home.Host == in.Host && home.ClaimID == in.ClaimID:
			return BadState(fmt.Sprintf("instance %s lives on %s by its record; its claim %s is no leftover", in.UUID, in.Host, in.ClaimID))
		}
		// Under the tombstone, taken for this run: an attempt of an
		// earlier one, on a host that came up since, destroys nothing.
		f, err := a.fenceDomain(ctx, DomainInput{UUID: in.UUID, Host: in.Host, ClaimID: in.ClaimID, Token: in.Token}, true)
		if errors.Is(err, ledger.ErrUnknownClaim) {
			return nil // released: by this step's retry, or another run's
		}
		if err != nil {
			return err
		}
		if err := a.destroy(ctx, f, in.Host, in.UUID); err != nil {
			return err
		}
		return classify(waitLedger(ctx, func(ctx context.Context) error { return a.Ledger.Release(ctx, in.Host, in.ClaimID) }))
	})
}

// MarkHostUp lets the returned host take claims again; it refuses while
// a tombstone is left there.
func (a *Activities) MarkHostUp(ctx context.Context, host string) error {
	_, err := a.Ledger.SetHostUp(ctx, host)
	return classify(err)
}
