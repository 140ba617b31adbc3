package audit_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
)

// TestReleaseQuarantineAsksTheHypervisor: Redis lost X's claim and
// record while X runs on pCPUs 0-1, and a recovery quarantined them. The
// release is refused, naming X and its pCPUs, with the ledger unchanged,
// while X runs; a boot meanwhile takes other pCPUs. Once X is destroyed
// the release goes through and the next boot takes 0-1.
func TestReleaseQuarantineAsksTheHypervisor(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.AddHost(t, "a")
	x := simcloud.UUID(501)
	cx := w.Boot(t, "a", x, activities.Owner{WorkflowID: guest.InstanceWorkflowID(x), FirstRunID: "run-x"})
	w.loseGuest(t, "a", x, cx.ClaimID)
	rec, err := w.auditor.RecoverHost(ctx, audit.RecoverHostInput{Host: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Quarantined) != 1 || rec.Quarantined[0].CPUs != "0-1" {
		t.Fatalf("RecoverHost(a) quarantined %+v, want X's pCPUs 0-1", rec.Quarantined)
	}
	q := audit.ReleaseQuarantineInput{Host: "a", ClaimID: rec.Quarantined[0].ClaimID}

	before := w.snapshot(t, "a")
	_, err = w.auditor.ReleaseQuarantine(ctx, q)
	var refused *audit.RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("ReleaseQuarantine(%+v) while X runs: %v, want an audit.RefusedError", q, err)
	}
	t.Logf("refused: %v", err)
	for _, want := range []string{"vm-" + x[:8], x, "pCPUs 0-1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ReleaseQuarantine(%+v) refusal %q does not name %q", q, err, want)
		}
	}
	if diff := cmp.Diff(before, w.snapshot(t, "a")); diff != "" {
		t.Errorf("ReleaseQuarantine(%+v) refused but changed the ledger (-before +after):\n%s", q, diff)
	}

	y := simcloud.UUID(502)
	w.Boot(t, "a", y, activities.Owner{WorkflowID: guest.InstanceWorkflowID(y), FirstRunID: "run-y"})
	w.noSharedPCPUs(t, "a")

	if err := w.Acts.DestroyDomain(ctx, activities.DomainInput{UUID: x, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	got, err := w.auditor.ReleaseQuarantine(ctx, q)
	if err != nil {
		t.Fatalf("ReleaseQuarantine(%+v) after X is gone: %v", q, err)
	}
	if got.CPUs != "0-1" || w.HasClaim(t, "a", q.ClaimID) {
		t.Errorf("ReleaseQuarantine(%+v) = %+v, claim still there %v; want 0-1 freed", q, got, w.HasClaim(t, "a", q.ClaimID))
	}
	z := simcloud.UUID(503)
	if cz := w.Boot(t, "a", z, activities.Owner{WorkflowID: guest.InstanceWorkflowID(z), FirstRunID: "run-z"}); claimedCPUs(cz) != "0-1" {
		t.Errorf("Z booted on pCPUs %s, want the released 0-1", claimedCPUs(cz))
	}
	w.noSharedPCPUs(t, "a")
}

// TestReleaseQuarantineRefusesOtherClaims: only a quarantine is released
// by hand.
func TestReleaseQuarantineRefusesOtherClaims(t *testing.T) {
	w := newWorld(t)
	w.AddHost(t, "a")
	x := simcloud.UUID(511)
	cx := w.Boot(t, "a", x, activities.Owner{WorkflowID: guest.InstanceWorkflowID(x), FirstRunID: "run-x"})
	for _, in := range []audit.ReleaseQuarantineInput{{Host: "a", ClaimID: cx.ClaimID}, {Host: "a", ClaimID: "quarantine-none"}} {
		var bad *audit.InvalidError
		if _, err := w.auditor.ReleaseQuarantine(context.Background(), in); !errors.As(err, &bad) {
			t.Errorf("ReleaseQuarantine(%+v): %v, want an audit.InvalidError", in, err)
		}
	}
	if !w.HasClaim(t, "a", cx.ClaimID) {
		t.Errorf("ReleaseQuarantine released X's boot claim %s", cx.ClaimID)
	}
}
