package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pinflow/pinflow/ledger"
)

// loseHost deletes every ledger key of host, as a Redis that lost its
// data would leave it; the hypervisor's state stays.
func (s *stack) loseHost(host string) {
	s.t.Helper()
	rdb := s.redisClient()
	defer rdb.Close()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, ledger.DefaultKeyPrefix+":host:{"+host+"}:*").Result()
	if err != nil || len(keys) == 0 {
		s.t.Fatalf("ledger keys of %s: %v %v", host, keys, err)
	}
	if err := rdb.Del(ctx, keys...).Err(); err != nil {
		s.t.Fatal(err)
	}
	if err := rdb.SRem(ctx, ledger.DefaultKeyPrefix+":hosts", host).Err(); err != nil {
		s.t.Fatal(err)
	}
}

// TestRecoverAfterLedgerLoss: host a's ledger keys are gone while its
// guests run and a migration onto it is in flight. No boot can land on a
// until it is recovered; recover restores the claims whose records
// agree, gives the open migration its pending claim back with its own
// token (so its fenced switchover goes on and it completes), quarantines
// nothing, and check and an audit pass afterwards.
func TestRecoverAfterLedgerLoss(t *testing.T) {
	t.Parallel()
	s, vmA, vmB := twoHosts(t, heldLong)
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("migrate", vmB, "--dest", "a")
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	var destClaim string
	for _, c := range s.host("a").Claims {
		if c.Instance == vmB {
			destClaim = c.ID
		}
	}
	s.loseHost("a")

	// Nothing can be placed on a host the ledger does not know.
	s.refused("unknown host", "boot", "--name", "D", "--host", "a", "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated", "--wait")
	dry := s.ok("recover", "--host", "a", "--dry-run")
	if !strings.Contains(dry, "would register its topology") || !strings.Contains(dry, "would restore claim") {
		t.Errorf("recover --dry-run says:\n%s\nwant a re-registration and restored claims", dry)
	}
	if _, _, code := s.run("host", "show", "a", "--json"); code == 0 {
		t.Errorf("after a dry run host a is registered again; a dry run changes nothing")
	}
	out := s.ok("recover", "--host", "a")
	t.Logf("recover:\n%s", out)
	if !strings.Contains(out, "restore claim") || !strings.Contains(out, vmA) {
		t.Errorf("recover did not restore A's claim:\n%s", out)
	}
	if want := "restore claim " + destClaim + " of " + vmB + " on pCPUs 2-3, pending"; !strings.Contains(out, want) {
		t.Errorf("recover did not give B's open migration its claim back (%q):\n%s", want, out)
	}
	if strings.Contains(out, "quarantine") {
		t.Errorf("recover quarantined what an open migration holds:\n%s", out)
	}
	// B's migration fences on its claim, made again with its token: it
	// completes onto a.
	s.ok("sim", "gate", "--at", "switchover", "--release")
	g := s.waitClosed(vmB)
	if hostOf(g) != "a" {
		t.Errorf("B's migration did not complete on its restored claim: it is on %q", hostOf(g))
	}
	s.ok("check")
	s.checkAgreement(vmA, "a")
	s.checkAgreement(vmB, "a")
	s.pastMinGrace()
	res := s.reconcile("--grace", "0")
	if n := res.Total.Freed.Total(); n != 0 {
		t.Errorf("the audit after the recovery freed %d claims: %+v", n, res.Hosts)
	}
	d := s.boot("D", "b", 1)
	s.noDoublePins("a", "b")
	s.checkAgreement(d, "b")

	// A host that is fine says so and succeeds; one nobody knows is refused
	// in one line; neither changes anything.
	if out := s.ok("recover", "--host", "a"); !strings.Contains(out, "host a is fine") {
		t.Errorf("recover of a host that is fine says %q, want that it is fine", out)
	}
	s.refused("unknown host", "recover", "--host", "nowhere")
	s.refused("not a quarantine", "quarantine", "release", "--host", "a", s.hostClaimOf("a", vmA))
}

// TestQuarantineReleaseAsksTheHypervisor: Redis lost host a's keys and
// A's record while A runs on pCPUs 0-1, and recover quarantined them.
// Releasing the quarantine is refused, naming A and its pCPUs, while A
// runs, so a boot cannot pin onto A; once A is stopped the release goes
// through and the boot takes 0-3.
func TestQuarantineReleaseAsksTheHypervisor(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	vmA := s.boot("A", "a", 2)
	s.loseHost("a")
	rdb := s.redisClient()
	if err := rdb.Del(context.Background(), ledger.DefaultKeyPrefix+":inst:{"+vmA+"}").Err(); err != nil {
		t.Fatal(err)
	}
	if out := s.ok("recover", "--host", "a"); !strings.Contains(out, "quarantine pCPUs 0-1 of "+vmA) {
		t.Fatalf("recover did not quarantine A's pCPUs:\n%s", out)
	}
	q := s.hostClaimOf("a", vmA)
	dom, err := s.simulator().Lookup(context.Background(), "a", vmA)
	if err != nil {
		t.Fatal(err)
	}
	line := s.refused("domain "+dom.Name+" ("+vmA+") is running on pCPUs 0-1", "quarantine", "release", "--host", "a", q)
	t.Logf("refused: %s", line)
	if got := s.hostClaimOf("a", vmA); got != q {
		t.Errorf("after the refused release A's pCPUs are held by %q, want the quarantine %q", got, q)
	}
	s.refused("", "boot", "--name", "B", "--host", "a", "--vcpus", "4", "--memory-mb", "1024", "--spec", "hw:cpu_policy=dedicated", "--wait")
	s.noDoublePins("a")

	if err := s.simulator().Stop(context.Background(), "a", vmA); err != nil {
		t.Fatal(err)
	}
	s.ok("quarantine", "release", "--host", "a", q)
	b := s.boot("B", "a", 4)
	if got := s.guest(b).pcpus(); got != "0-3" {
		t.Errorf("B pinned to %q, want 0-3 (A is stopped and its quarantine released)", got)
	}
	s.noDoublePins("a")
}

// hostClaimOf returns the id of uuid's claim on host.
func (s *stack) hostClaimOf(host, uuid string) string {
	s.t.Helper()
	for _, c := range s.host(host).Claims {
		if c.Instance == uuid {
			return c.ID
		}
	}
	s.t.Fatalf("%s has no claim on %s", uuid, host)
	return ""
}

// TestAuditQuarantinesVanishedClaims: a claim that Redis lost while its
// guest runs (the host's claims gone, its topology kept) is quarantined
// by the next audit, so a boot cannot take its pCPUs.
func TestAuditQuarantinesVanishedClaims(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	vmA := s.boot("A", "a", 2)
	s.loseClaims("a")
	res := s.reconcile("--grace", "0")
	if got := res.Total.Drift.Total(); got == 0 {
		t.Errorf("the audit found no drift after A's claim vanished: %+v", res.Hosts)
	}
	found := false
	for _, c := range s.host("a").Claims {
		if c.Kind == string(ledger.KindQuarantine) && c.Instance == vmA {
			found = true
		}
	}
	if !found {
		t.Fatalf("no quarantine for A's pCPUs after the audit: %+v", s.host("a").Claims)
	}
	b := s.boot("B", "a", 2)
	s.noDoublePins("a")
	if got := s.guest(b).pcpus(); got != "2-3" {
		t.Errorf("B pinned to %q, want 2-3 (A's 0-1 are quarantined)", got)
	}
	// The operator deletes A and releases the quarantine by hand: its
	// pCPUs take the next guest.
	s.ok("delete", vmA, "--wait")
	for _, c := range s.host("a").Claims {
		if c.Kind == string(ledger.KindQuarantine) {
			s.ok("quarantine", "release", "--host", "a", c.ID)
		}
	}
	c := s.boot("C", "a", 2)
	s.noDoublePins("a")
	if got := s.guest(c).pcpus(); got != "0-1" {
		t.Errorf("C pinned to %q, want 0-1 (the released quarantine's)", got)
	}
}

// TestScheduledAudit: the worker's Temporal Schedule runs the audit by
// itself; a claim Redis lost while its guest runs is quarantined with no
// operator acting, and a second worker leaves the one schedule as it is.
func TestScheduledAudit(t *testing.T) {
	t.Parallel()
	s := newStack(t, "PINFLOW_RECONCILE_INTERVAL=2s")
	s.startWorker()
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	vmA := s.boot("A", "a", 2)
	s.loseClaims("a")
	s.eventually("a scheduled audit quarantines A's pCPUs", time.Minute, func() bool {
		for _, c := range s.host("a").Claims {
			if c.Kind == string(ledger.KindQuarantine) && c.Instance == vmA {
				return true
			}
		}
		return false
	})
	b := s.boot("B", "a", 2)
	s.noDoublePins("a")
	if got := s.guest(b).pcpus(); got != "2-3" {
		t.Errorf("B pinned to %q, want 2-3 (A's 0-1 are quarantined)", got)
	}
}

// TestAuditRestoresAnOpenMigrationsLostClaim: Redis loses host a's claims
// while a migration onto it is in flight. The next audit makes the
// migration's destination claim again, pending and with its token, so the
// migration completes; the resident claim of A, whose guest runs, is
// quarantined (only recover restores resident claims).
func TestAuditRestoresAnOpenMigrationsLostClaim(t *testing.T) {
	t.Parallel()
	s, vmA, vmB := twoHosts(t)
	// B's migration is held, its copy done, before its switchover.
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("migrate", vmB, "--dest", "a")
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	var destClaim string
	for _, c := range s.host("a").Claims {
		if c.Instance == vmB {
			destClaim = c.ID
		}
	}
	s.loseClaims("a")
	s.reconcile("--grace", "0")
	kinds := map[string]string{}
	for _, c := range s.host("a").Claims {
		kinds[c.Instance] = c.Kind + "/" + c.ID
	}
	if want := "migration-dest/" + destClaim; kinds[vmB] != want {
		t.Errorf("after the audit B's claim on a is %q, want %q", kinds[vmB], want)
	}
	if !strings.HasPrefix(kinds[vmA], string(ledger.KindQuarantine)+"/") {
		t.Errorf("after the audit A's pCPUs on a are held by %q, want a quarantine", kinds[vmA])
	}
	s.ok("sim", "gate", "--at", "switchover", "--release")
	if g := s.waitClosed(vmB); hostOf(g) != "a" {
		t.Errorf("B's migration did not complete on its restored claim: it is on %q", hostOf(g))
	}
	s.noDoublePins("a", "b")
	s.checkAgreement(vmB, "a")
}

// loseClaims deletes host's claims, pins, usage, undo log and leases, as
// a Redis that lost them would; its topology and registration stay.
func (s *stack) loseClaims(host string) {
	s.t.Helper()
	rdb := s.redisClient()
	defer rdb.Close()
	base := ledger.DefaultKeyPrefix + ":host:{" + host + "}:"
	if err := rdb.Del(context.Background(), base+"pins", base+"claims", base+"usage", base+"undo", base+"lease").Err(); err != nil {
		s.t.Fatal(err)
	}
}
