package activities

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// TestReleaseQuarantineAsksTheHypervisor: Redis lost X's claim and
// record while X runs on pCPUs 0-1, and a recovery quarantined them. The
// release is refused, naming X and its pCPUs, with the ledger unchanged,
// while X runs; a boot meanwhile takes other pCPUs. Once X is destroyed
// the release goes through and the next boot takes 0-1.
func TestReleaseQuarantineAsksTheHypervisor(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.addHost(t, "a")
	x := uuidN(501)
	cx := w.boot(t, "a", x, Owner{guest.InstanceWorkflowID(x), "run-x"})
	w.loseGuest(t, "a", x, cx.ClaimID)
	rec, err := w.acts.RecoverHost(ctx, audit.RecoverHostInput{Host: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Quarantined) != 1 || rec.Quarantined[0].CPUs != "0-1" {
		t.Fatalf("RecoverHost(a) quarantined %+v, want X's pCPUs 0-1", rec.Quarantined)
	}
	q := audit.ReleaseQuarantineInput{Host: "a", ClaimID: rec.Quarantined[0].ClaimID}

	before := w.snapshot(t, "a")
	_, err = w.acts.ReleaseQuarantineClaim(ctx, q)
	if !isType(err, ErrTypeBadState) {
		t.Fatalf("ReleaseQuarantineClaim(%+v) while X runs: %v, want a BadState refusal", q, err)
	}
	t.Logf("refused: %v", err)
	for _, want := range []string{"vm-" + x[:8], x, "pCPUs 0-1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ReleaseQuarantineClaim(%+v) refusal %q does not name %q", q, err, want)
		}
	}
	if diff := cmp.Diff(before, w.snapshot(t, "a")); diff != "" {
		t.Errorf("ReleaseQuarantineClaim(%+v) refused but changed the ledger (-before +after):\n%s", q, diff)
	}

	y := uuidN(502)
	w.boot(t, "a", y, Owner{guest.InstanceWorkflowID(y), "run-y"})
	w.noSharedPCPUs(t, "a")

	if err := w.acts.DestroyDomain(ctx, DomainInput{UUID: x, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	got, err := w.acts.ReleaseQuarantineClaim(ctx, q)
	if err != nil {
		t.Fatalf("ReleaseQuarantineClaim(%+v) after X is gone: %v", q, err)
	}
	if got.CPUs != "0-1" || w.hasClaim(t, "a", q.ClaimID) {
		t.Errorf("ReleaseQuarantineClaim(%+v) = %+v, claim still there %v; want 0-1 freed", q, got, w.hasClaim(t, "a", q.ClaimID))
	}
	z := uuidN(503)
	if cz := w.boot(t, "a", z, Owner{guest.InstanceWorkflowID(z), "run-z"}); claimedCPUs(cz) != "0-1" {
		t.Errorf("Z booted on pCPUs %s, want the released 0-1", claimedCPUs(cz))
	}
	w.noSharedPCPUs(t, "a")
}

// TestReleaseQuarantineRefusesOtherClaims: only a quarantine is released
// by hand.
func TestReleaseQuarantineRefusesOtherClaims(t *testing.T) {
	w := newWorld(t)
	w.addHost(t, "a")
	x := uuidN(511)
	cx := w.boot(t, "a", x, Owner{guest.InstanceWorkflowID(x), "run-x"})
	for _, in := range []audit.ReleaseQuarantineInput{{Host: "a", ClaimID: cx.ClaimID}, {Host: "a", ClaimID: "quarantine-none"}} {
		if _, err := w.acts.ReleaseQuarantineClaim(context.Background(), in); !isType(err, ErrTypeInvalidRequest) {
			t.Errorf("ReleaseQuarantineClaim(%+v): %v, want an InvalidRequest refusal", in, err)
		}
	}
	if !w.hasClaim(t, "a", cx.ClaimID) {
		t.Errorf("ReleaseQuarantineClaim released X's boot claim %s", cx.ClaimID)
	}
}

// loseGuest drops the guest's claim and record from the ledger, as a
// Redis that lost them would; its domain runs on.
func (w *world) loseGuest(t testing.TB, host, uuid, claimID string) {
	t.Helper()
	ctx := context.Background()
	if err := w.led.Release(ctx, host, claimID); err != nil {
		t.Fatal(err)
	}
	if err := w.led.DetachInstance(ctx, uuid, claimID); err != nil {
		t.Fatal(err)
	}
	if err := w.led.DeleteInstance(ctx, uuid); err != nil {
		t.Fatal(err)
	}
}

func (w *world) snapshot(t testing.TB, host string) *ledger.Snapshot {
	t.Helper()
	s, err := w.led.Snapshot(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// noSharedPCPUs fails the test if two domains that run or are paused on
// host use one pCPU.
func (w *world) noSharedPCPUs(t testing.TB, host string) {
	t.Helper()
	doms, err := w.drv.Domains(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	var seen numa.CPUSet
	for _, d := range doms {
		used, err := hypervisor.UsedCPUs(d)
		if err != nil {
			t.Fatal(err)
		}
		if used.Intersects(seen) {
			t.Errorf("domain %s on %s uses pCPUs %s that another domain uses", d.UUID, host, used.Intersection(seen))
		}
		seen = seen.Union(used)
	}
}
