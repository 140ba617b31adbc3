package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/ledger"
)

// loseHost deletes every ledger key of host, as a Redis that lost its
// data would leave it; the hypervisor's state stays.
func (s *stack) loseHost(host string) {
	s.t.Helper()
	opts, err := redis.ParseURL(s.redisURL)
	if err != nil {
		s.t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
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
// agree, quarantines what no record explains, and check and an audit
// pass afterwards.
func TestRecoverAfterLedgerLoss(t *testing.T) {
	s, vmA, vmB := twoHosts(t)
	s.ok("sim", "latency", "--op", "migrate", "--seconds", "8")
	s.ok("migrate", vmB, "--dest", "a")
	s.waitDestClaim("a", vmB)
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
	if !strings.Contains(out, "quarantine pCPUs 2-3 of "+vmB) {
		t.Errorf("recover did not quarantine the pCPUs of B's incoming side:\n%s", out)
	}
	// B's migration lost its destination claim: its fence refuses the
	// switchover, and B stays on b; the incoming side's pCPUs were
	// quarantined until then.
	g := s.waitClosed(vmB)
	if hostOf(g) != "b" {
		t.Errorf("B migrated onto a claim that vanished: it is on %q", hostOf(g))
	}
	s.ok("check")
	// What the quarantine held is released by an operator once B's
	// incoming side is gone.
	for _, c := range s.host("a").Claims {
		if c.Kind == string(ledger.KindQuarantine) {
			s.ok("quarantine", "release", "--host", "a", c.ID)
		}
	}
	s.checkAgreement(vmA, "a")
	s.checkAgreement(vmB, "b")
	time.Sleep(2500 * time.Millisecond) // the minimum grace
	res := s.reconcile("--grace", "0")
	if n := res.Total.Freed.Total(); n != 0 {
		t.Errorf("the audit after the recovery freed %d claims: %+v", n, res.Hosts)
	}
	d := s.boot("D", "a", 1)
	s.noDoublePins("a", "b")
	s.checkAgreement(d, "a")

	// A host that is fine, and one nobody knows: one line, nothing changed.
	s.refused("is fine", "recover", "--host", "a")
	s.refused("unknown host", "recover", "--host", "nowhere")
	s.refused("not a quarantine", "quarantine", "release", "--host", "a", s.hostClaimOf("a", vmA))
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
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	vmA := s.boot("A", "a", 2)
	opts, err := redis.ParseURL(s.redisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ctx := context.Background()
	base := ledger.DefaultKeyPrefix + ":host:{a}:"
	if err := rdb.Del(ctx, base+"pins", base+"claims", base+"usage", base+"undo", base+"lease").Err(); err != nil {
		t.Fatal(err)
	}
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
}
