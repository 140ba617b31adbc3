package e2e

import (
	"context"
	"sort"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// checkClaims checks that the guest's record names host and a committed
// claim there, and that this claim is the guest's only claim on any host.
// It returns the record, the hosts and the Redis client (to close), for
// further checks.
func (s *stack) checkClaims(ctx context.Context, uuid, host string) (*ledger.Instance, []string, redis.UniversalClient) {
	t := s.t
	t.Helper()
	led, rdb, err := ledger.Open(ctx, s.redisConfig)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := led.Instance(ctx, uuid)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Host != host {
		t.Errorf("record of %s names host %q, want %q", uuid, inst.Host, host)
	}
	hosts, err := led.Hosts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(hosts)
	held := 0
	for _, h := range hosts {
		claims, err := led.Claims(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range claims {
			if c.InstanceUUID != uuid {
				continue
			}
			held++
			if h != host || c.ID != inst.ClaimID || c.State != ledger.StateCommitted {
				t.Errorf("claim %s (%s) of %s on %s; the record names claim %s on %s", c.ID, c.State, uuid, h, inst.ClaimID, host)
			}
		}
	}
	if held != 1 {
		t.Errorf("%s holds %d claims, want 1", uuid, held)
	}
	return inst, hosts, rdb
}

// checkAgreement checks that the ledger, the instance record and the
// simulated hypervisor tell the same story about guest uuid on host: the
// claims agree (checkClaims), the guest runs on host only, and its domain
// carries the claim's pins.
func (s *stack) checkAgreement(uuid, host string) {
	t := s.t
	t.Helper()
	ctx := context.Background()
	inst, hosts, rdb := s.checkClaims(ctx, uuid, host)
	defer rdb.Close()
	drv := s.simulator()
	for _, h := range hosts {
		dom, err := drv.Lookup(ctx, h, uuid)
		switch {
		case h == host && err != nil:
			t.Errorf("the hypervisor has no domain %s on %s: %v", uuid, h, err)
		case h == host:
			if dom.State != hypervisor.StateRunning {
				t.Errorf("domain %s on %s is %s, want running", uuid, h, dom.State)
			}
			got, err := xmlpatch.Read(dom.XML)
			if err != nil {
				t.Fatal(err)
			}
			want, err := xmlpatch.PinsFor(inst.Placement)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want.VCPUPins, got.VCPUPins, cmp.Comparer(numa.CPUSet.Equal)); diff != "" {
				t.Errorf("domain %s on %s: vCPU pins differ from the ledger's (-ledger +domain):\n%s", uuid, h, diff)
			}
		case err == nil:
			t.Errorf("the hypervisor still has domain %s on %s", uuid, h)
		}
	}
}
