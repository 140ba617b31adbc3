package ledger

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/pinflow/pinflow/numa"
)

// ClaimKind says why a claim was made.
type ClaimKind string

// Claim kinds.
const (
	KindInstance      ClaimKind = "instance"       // an instance's resident claim
	KindMigrationDest ClaimKind = "migration-dest" // a live migration's destination
	KindUnshelve      ClaimKind = "unshelve"       // an unshelve's new host
	KindBoot          ClaimKind = "boot"           // a boot's host
)

func (k ClaimKind) valid() bool {
	switch k {
	case KindInstance, KindMigrationDest, KindUnshelve, KindBoot:
		return true
	}
	return false
}

// ClaimState is a claim's life stage.
type ClaimState string

// Claim states.
const (
	// StatePending: the owning workflow holds the resources but the
	// instance does not run on them yet.
	StatePending ClaimState = "pending"
	// StateCommitted: the claim is the instance's resident claim.
	StateCommitted ClaimState = "committed"
)

// Claim is the record of one claim: who holds which of a host's resources.
// It carries the placement and its usage, so releasing never derives
// anything again.
type Claim struct {
	// State comes first in the stored JSON: Commit rewrites it in place.
	State       ClaimState `json:"state"`
	CommittedAt *time.Time `json:"committed_at,omitempty"`

	ID           string    `json:"id"`
	Host         string    `json:"host"`
	InstanceUUID string    `json:"instance_uuid"`
	Kind         ClaimKind `json:"kind"`
	// OwnerWorkflowID and OwnerRunID (the first run's id) name the Temporal
	// workflow that made the claim; reconciliation frees the claim only
	// when that workflow is no longer running.
	OwnerWorkflowID string `json:"owner_workflow_id"`
	OwnerRunID      string `json:"owner_run_id"`
	// Token is random; ReleaseIfToken frees the claim only with it, so a
	// reconciler's decision cannot free a claim made again meanwhile.
	Token     string    `json:"token"`
	CreatedAt time.Time `json:"created_at"`
	// Generation is the host topology generation the claim was made on.
	Generation int64            `json:"generation"`
	Placement  *numa.Placement  `json:"placement"`
	Usage      []numa.CellUsage `json:"usage"`
}

// ClaimSpec asks for a claim. Give exactly one of Request (fit it on the
// host) and Placement (claim exactly this, e.g. to restore a known
// placement).
type ClaimSpec struct {
	// ID identifies the claim; retrying with the same ID returns the first
	// result.
	ID              string
	Host            string
	InstanceUUID    string
	Kind            ClaimKind
	OwnerWorkflowID string
	OwnerRunID      string
	Request         *numa.Request
	Placement       *numa.Placement
}

func (s *ClaimSpec) check() error {
	if err := checkClaimID(s.ID); err != nil {
		return err
	}
	if err := checkHostName(s.Host); err != nil {
		return err
	}
	if err := checkUUID(s.InstanceUUID); err != nil {
		return err
	}
	if !s.Kind.valid() {
		return fmt.Errorf("claim kind %q: %w: kinds are %s, %s, %s or %s", s.Kind, ErrInvalid, KindInstance, KindMigrationDest, KindUnshelve, KindBoot)
	}
	if s.OwnerWorkflowID == "" || s.OwnerRunID == "" {
		return fmt.Errorf("%w: owner workflow id %q and run id %q must both be set", ErrInvalid, s.OwnerWorkflowID, s.OwnerRunID)
	}
	if (s.Request == nil) == (s.Placement == nil) {
		return fmt.Errorf("%w: give exactly one of a request and a placement", ErrInvalid)
	}
	if s.Placement != nil {
		if err := s.Placement.Check(); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	return nil
}

// Claim fits the spec on the host's current state and records the claim,
// pending, in one atomic script that checks every chosen pCPU is unowned,
// strict pages are free, dedicated cells do not overcommit memory and the
// topology has not changed. On a lost race it re-reads, re-fits and tries
// again, at most MaxAttempts times, then fails with ErrConflict.
//
// Claiming an existing claim id returns the recorded claim unchanged, so a
// retried activity gets its first result; an id already used for another
// instance is ErrConflict. A request that fits nowhere is a
// *numa.NoFitError; an explicit placement that does not belong on the host
// is ErrInvalid, one on pCPUs owned by others ErrConflict.
func (l *Ledger) Claim(ctx context.Context, spec ClaimSpec) (_ *Claim, err error) {
	defer func(start time.Time) { observeClaim(ctx, start, err) }(time.Now())
	wrap := func(err error) error { return fmt.Errorf("ledger: claim %s on %s: %w", spec.ID, spec.Host, err) }
	if err := spec.check(); err != nil {
		return nil, wrap(err)
	}
	var tok [16]byte
	if _, err := crand.Read(tok[:]); err != nil {
		return nil, wrap(fmt.Errorf("token: %w", err))
	}
	c := &Claim{
		State: StatePending, ID: spec.ID, Host: spec.Host, InstanceUUID: spec.InstanceUUID, Kind: spec.Kind,
		OwnerWorkflowID: spec.OwnerWorkflowID, OwnerRunID: spec.OwnerRunID,
		Token: hex.EncodeToString(tok[:]), CreatedAt: l.now().UTC(),
	}
	k := l.hostKeys(spec.Host)
	fl := l.hostInflight(spec.Host)
	lost := ""
	for attempt := range l.maxAttempts {
		if attempt > 0 {
			if err := backoff(ctx, attempt); err != nil {
				return nil, wrap(fmt.Errorf("%w (last lost race: %s)", err, lost))
			}
		}
		st, err := l.readState(ctx, spec.Host, spec.ID)
		if err != nil {
			return nil, wrap(err)
		}
		if st.existing != "" {
			return sameClaim(spec, st.existing, wrap)
		}
		c.Generation = st.gen
		if err := fl.place(st.host, &spec, c); err != nil {
			return nil, wrap(err)
		}
		args, err := claimArgs(st.host, c)
		if err != nil {
			fl.done(c.ID)
			return nil, wrap(err)
		}
		res, err := claimScript.Run(ctx, l.rdb, k.all(), args...).StringSlice()
		fl.done(c.ID)
		if err != nil {
			return nil, wrap(err)
		}
		switch res[0] {
		case "ok":
			return c, nil
		case "exists":
			return sameClaim(spec, res[1], wrap)
		case "nohost":
			return nil, wrap(fmt.Errorf("%w: %q is not registered", ErrUnknownHost, spec.Host))
		}
		lost = lostRace(res)
		observeLostRace(ctx, res[0])
	}
	return nil, wrap(fmt.Errorf("%w: lost the race for the host's resources %d times (last: %s)", ErrConflict, l.maxAttempts, lost))
}

// place chooses c's placement and usage on h (a copy, free to change) and
// records them as in flight until done(c.ID), so this process's concurrent
// claims on the host choose around them.
func (f *inflight) place(h *numa.Host, spec *ClaimSpec, c *Claim) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if spec.Placement != nil {
		us, err := numa.Usage(h, spec.Placement)
		if err != nil {
			return fmt.Errorf("%w: placement %s: %v", ErrInvalid, spec.Placement, err)
		}
		if err := h.Clone().Add(us); err != nil {
			return fmt.Errorf("%w: placement %s: %v", ErrConflict, spec.Placement, err)
		}
		c.Placement, c.Usage = spec.Placement, us
	} else {
		// Fit around the other claims in flight here; their script may not
		// have landed yet. One that has is already in h and fails to add
		// again, which leaves it out, as it should.
		busy := h.Clone()
		for _, us := range f.claims {
			_ = busy.Add(us)
		}
		p, err := numa.Fit(busy, spec.Request)
		var nofit *numa.NoFitError
		if errors.As(err, &nofit) && len(f.claims) > 0 {
			// An in-flight claim may yet fail; only the ledger itself can
			// say the request does not fit.
			p, err = numa.Fit(h, spec.Request)
		}
		if err != nil {
			return err
		}
		us, err := numa.Usage(h, p)
		if err != nil {
			return fmt.Errorf("usage of the fitted placement: %w", err)
		}
		c.Placement, c.Usage = p, us
	}
	if c.Usage == nil {
		c.Usage = []numa.CellUsage{}
	}
	f.claims[c.ID] = c.Usage
	return nil
}

func (f *inflight) done(id string) {
	f.mu.Lock()
	delete(f.claims, id)
	f.mu.Unlock()
}

// claimArgs lays out the claim script's arguments: the record, then per
// cell its usage and the capacities to check it against.
func claimArgs(h *numa.Host, c *Claim) ([]any, error) {
	rec, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode claim record: %w", err)
	}
	args := []any{c.ID, rec, c.Generation, len(c.Usage)}
	for _, u := range c.Usage {
		cell := h.Cell(u.Cell)
		var pageCap int64
		for _, p := range cell.Pages {
			if p.SizeKB == u.PageSizeKB {
				pageCap = p.Total - p.Reserved
			}
		}
		cpus := u.PinnedCPUs.List()
		args = append(args, u.Cell, u.MemoryMB, u.SharedCPUs, u.PageSizeKB, u.Pages,
			boolArg(u.Dedicated), boolArg(u.StrictPages), cell.MemoryMB, pageCap, len(cpus))
		for _, cpu := range cpus {
			args = append(args, cpu)
		}
	}
	return args, nil
}

func boolArg(b bool) int {
	if b {
		return 1
	}
	return 0
}

// lostRace describes the claim script's reason for refusing.
func lostRace(res []string) string {
	switch {
	case res[0] == "taken" && len(res) == 3:
		return fmt.Sprintf("pCPU %s was taken by claim %s", res[1], res[2])
	case res[0] == "gen" && len(res) == 2:
		return fmt.Sprintf("the host topology changed to generation %s", res[1])
	case res[0] == "memory" && len(res) == 5:
		return fmt.Sprintf("cell %s has %s of %s MiB in use, %s more do not fit", res[1], res[2], res[4], res[3])
	case res[0] == "pages" && len(res) == 6:
		return fmt.Sprintf("cell %s has %s of %s %s KiB pages in use, %s more do not fit", res[1], res[3], res[5], res[2], res[4])
	}
	return fmt.Sprintf("claim script replied %q", res)
}

// sameClaim returns the recorded claim for a retried claim id, refusing an
// id reused for another instance.
func sameClaim(spec ClaimSpec, record string, wrap func(error) error) (*Claim, error) {
	c := &Claim{}
	if err := json.Unmarshal([]byte(record), c); err != nil {
		return nil, wrap(fmt.Errorf("stored claim record: %w", err))
	}
	if c.InstanceUUID != spec.InstanceUUID || c.Kind != spec.Kind {
		return nil, wrap(fmt.Errorf("%w: the id is already claimed for %s of instance %s", ErrConflict, c.Kind, c.InstanceUUID))
	}
	return c, nil
}

// backoff sleeps a little more with each attempt, jittered so that losers
// of one race do not collide again in lockstep.
func backoff(ctx context.Context, attempt int) error {
	base := time.Duration(1<<min(attempt-1, 5)) * 200 * time.Microsecond
	d := base/2 + rand.N(base)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Commit marks a pending claim committed: the instance's resident claim.
// Committing a committed claim changes nothing; an unknown claim is
// ErrUnknownClaim.
func (l *Ledger) Commit(ctx context.Context, host, claimID string) (*Claim, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: commit %s on %s: %w", claimID, host, err) }
	if err := checkHostName(host); err != nil {
		return nil, wrap(err)
	}
	if err := checkClaimID(claimID); err != nil {
		return nil, wrap(err)
	}
	at, _ := json.Marshal(l.now().UTC())
	res, err := commitScript.Run(ctx, l.rdb, []string{l.hostKeys(host).claims}, claimID, at).StringSlice()
	if err != nil {
		return nil, wrap(err)
	}
	if res[0] != "ok" {
		return nil, wrap(fmt.Errorf("%w: host %s has no claim %q", ErrUnknownClaim, host, claimID))
	}
	c := &Claim{}
	if err := json.Unmarshal([]byte(res[1]), c); err != nil {
		return nil, wrap(fmt.Errorf("stored claim record: %w", err))
	}
	return c, nil
}

// Release frees a claim's pins and usage and deletes it, in one step.
// Releasing an unknown or already released claim succeeds and changes
// nothing: a delete after an aborted claim must not fail.
func (l *Ledger) Release(ctx context.Context, host, claimID string) error {
	_, err := l.release(ctx, "release", host, claimID, "")
	return err
}

// ReleaseIfToken releases the claim only if its token is token, and says
// whether it did: compare-and-delete for reconciliation, which decided on
// a claim it read earlier and must not free a claim made again since.
func (l *Ledger) ReleaseIfToken(ctx context.Context, host, claimID, token string) (bool, error) {
	if token == "" {
		return false, fmt.Errorf("ledger: release-if-token %s on %s: %w: empty token; use Release to release whatever the token", claimID, host, ErrInvalid)
	}
	return l.release(ctx, "release-if-token", host, claimID, token)
}

func (l *Ledger) release(ctx context.Context, op, host, claimID, token string) (bool, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: %s %s on %s: %w", op, claimID, host, err) }
	if err := checkHostName(host); err != nil {
		return false, wrap(err)
	}
	if err := checkClaimID(claimID); err != nil {
		return false, wrap(err)
	}
	n, err := releaseScript.Run(ctx, l.rdb, l.hostKeys(host).all(), claimID, token).Int()
	if err != nil {
		return false, wrap(err)
	}
	observeRelease(ctx, op, n == 1)
	return n == 1, nil
}

// Claims lists a host's claims by id. A host never registered, or with no
// claims, has none.
func (l *Ledger) Claims(ctx context.Context, host string) ([]Claim, error) {
	if err := checkHostName(host); err != nil {
		return nil, fmt.Errorf("ledger: claims: %w", err)
	}
	recs, err := l.rdb.HVals(ctx, l.hostKeys(host).claims).Result()
	if err != nil {
		return nil, fmt.Errorf("ledger: claims of %s: %w", host, err)
	}
	out, err := decodeClaims(recs)
	if err != nil {
		return nil, fmt.Errorf("ledger: claims of %s: %w", host, err)
	}
	return out, nil
}

// GetClaim returns one claim of a host, or ErrUnknownClaim.
func (l *Ledger) GetClaim(ctx context.Context, host, claimID string) (*Claim, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: claim %s on %s: %w", claimID, host, err) }
	if err := checkHostName(host); err != nil {
		return nil, wrap(err)
	}
	if err := checkClaimID(claimID); err != nil {
		return nil, wrap(err)
	}
	rec, err := l.rdb.HGet(ctx, l.hostKeys(host).claims, claimID).Result()
	if err != nil {
		if isNil(err) {
			return nil, wrap(fmt.Errorf("%w: host %s has no claim %q", ErrUnknownClaim, host, claimID))
		}
		return nil, wrap(err)
	}
	c := &Claim{}
	if err := json.Unmarshal([]byte(rec), c); err != nil {
		return nil, wrap(fmt.Errorf("stored claim record: %w", err))
	}
	return c, nil
}

func decodeClaims(records []string) ([]Claim, error) {
	out := make([]Claim, 0, len(records))
	for _, r := range records {
		var c Claim
		if err := json.Unmarshal([]byte(r), &c); err != nil {
			return nil, fmt.Errorf("stored claim record: %w", err)
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
