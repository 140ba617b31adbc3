package ledger

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// Adoption hands a pending claim from the workflow that made it to the one
// that will use it: a drain reserves a guest's destination up front, and
// the guest's migration adopts the reservation as its own destination
// claim, so the pCPUs are never free in between.
type Adoption struct {
	Host    string
	ClaimID string
	// InstanceUUID the claim must be for.
	InstanceUUID string
	// FromWorkflowID is the owner the claim must have.
	FromWorkflowID string
	// Kind, OwnerWorkflowID and OwnerRunID are what the claim becomes.
	Kind            ClaimKind
	OwnerWorkflowID string
	OwnerRunID      string
}

// adoptAttempts bounds how often Adopt reads the claim again after it
// changed between the read and the replace.
const adoptAttempts = 5

// Adopt gives a pending claim of a.FromWorkflowID to the new owner, with a
// new token: the old owner's conditional release (ReleaseIfUnchanged with
// its token) no longer reaches it. Adopting a claim the new owner holds
// already is a retry and returns it. A claim of another owner or instance,
// or not pending, is ErrConflict; a missing one ErrUnknownClaim.
func (l *Ledger) Adopt(ctx context.Context, a Adoption) (*Claim, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: adopt %s on %s: %w", a.ClaimID, a.Host, err) }
	if err := checkHostName(a.Host); err != nil {
		return nil, wrap(err)
	}
	if err := checkClaimID(a.ClaimID); err != nil {
		return nil, wrap(err)
	}
	if !a.Kind.valid() || a.OwnerWorkflowID == "" || a.OwnerRunID == "" || a.FromWorkflowID == "" {
		return nil, wrap(fmt.Errorf("%w: kind %q, owner %q/%q, from %q: a valid kind and all owners are needed",
			ErrInvalid, a.Kind, a.OwnerWorkflowID, a.OwnerRunID, a.FromWorkflowID))
	}
	k := l.hostKeys(a.Host)
	for range adoptAttempts {
		rec, err := l.rdb.HGet(ctx, k.claims, a.ClaimID).Result()
		if isNil(err) {
			return nil, wrap(fmt.Errorf("%w: host %s has no claim %q", ErrUnknownClaim, a.Host, a.ClaimID))
		}
		if err != nil {
			return nil, wrap(err)
		}
		c := &Claim{}
		if err := json.Unmarshal([]byte(rec), c); err != nil {
			return nil, wrap(fmt.Errorf("stored claim record: %w", err))
		}
		if c.OwnerWorkflowID == a.OwnerWorkflowID && c.OwnerRunID == a.OwnerRunID && c.Kind == a.Kind {
			// Adopted by an earlier try: wait until that is durable.
			if err := l.settled(ctx, k); err != nil {
				return nil, wrap(err)
			}
			return c, nil
		}
		switch {
		case c.InstanceUUID != a.InstanceUUID:
			return nil, wrap(fmt.Errorf("%w: the claim is for instance %s, not %s", ErrConflict, c.InstanceUUID, a.InstanceUUID))
		case c.OwnerWorkflowID != a.FromWorkflowID:
			return nil, wrap(fmt.Errorf("%w: the claim belongs to %s, not %s", ErrConflict, c.OwnerWorkflowID, a.FromWorkflowID))
		case c.State != StatePending:
			return nil, wrap(fmt.Errorf("%w: the claim is %s; only a pending claim changes hands", ErrConflict, c.State))
		}
		var tok [16]byte
		if _, err := crand.Read(tok[:]); err != nil {
			return nil, wrap(fmt.Errorf("token: %w", err))
		}
		old := c.Token
		c.Kind, c.OwnerWorkflowID, c.OwnerRunID, c.Token = a.Kind, a.OwnerWorkflowID, a.OwnerRunID, hex.EncodeToString(tok[:])
		record, err := json.Marshal(c)
		if err != nil {
			return nil, wrap(fmt.Errorf("encode claim record: %w", err))
		}
		res, err := l.change(ctx, claimAdoptScript, []string{k.claims, k.undo}, a.ClaimID, rec, string(record), old, c.Token).Slice()
		if err != nil {
			return nil, wrap(err)
		}
		switch res[0] {
		case "ok":
			return c, nil
		case "unknown":
			return nil, wrap(fmt.Errorf("%w: host %s has no claim %q", ErrUnknownClaim, a.Host, a.ClaimID))
		}
		// Changed since the read (committed, adopted by a concurrent try,
		// its lease renewed): read it again.
	}
	return nil, wrap(fmt.Errorf("%w: the claim kept changing while it was adopted", ErrConflict))
}
