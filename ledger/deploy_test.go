package ledger

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/numa"
)

// TestCluster claims on hosts whose keys land in different slots of a
// three-master Redis Cluster: every script's keys are in one slot, so the
// cluster accepts each of them.
func TestCluster(t *testing.T) {
	ctx := context.Background()
	cluster := testenv.StartRedisCluster(t, 3)
	cfg := Config{Addrs: cluster.Addrs(), KeyPrefix: "pf"}
	l, rdb, err := Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", cfg.Endpoint(), err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("Open(cluster addrs) client is %T, want *redis.ClusterClient", rdb)
	}

	// Pick hosts until three different masters own them.
	masters := map[string]string{}
	var hosts []string
	for i := 0; len(masters) < 3 && i < 200; i++ {
		h := fmt.Sprintf("host-%d", i)
		node, err := cc.MasterForKey(ctx, l.hostKeys(h).topo)
		if err != nil {
			t.Fatal(err)
		}
		if _, seen := masters[node.Options().Addr]; !seen {
			masters[node.Options().Addr] = h
			hosts = append(hosts, h)
		}
	}
	if len(hosts) != 3 {
		t.Fatalf("found hosts on %d masters, want 3", len(hosts))
	}
	for _, h := range hosts {
		register(t, l, h, testHost(2, 4))
		for i := range 3 {
			s := spec(fmt.Sprintf("%s-c%d", h, i), h, dedicated(t, 2, 512))
			s.InstanceUUID = fmt.Sprintf("%s-u%d", h, i)
			if _, err := l.Claim(ctx, s); err != nil {
				t.Fatalf("Claim(%s): %v", s.ID, err)
			}
			if _, err := l.Commit(ctx, h, s.ID); err != nil {
				t.Fatalf("Commit(%s): %v", s.ID, err)
			}
			if _, err := l.CreateInstance(ctx, s.InstanceUUID, "vm", flavor, guest.VMBuilding, ""); err != nil {
				t.Fatalf("CreateInstance(%s): %v", s.InstanceUUID, err)
			}
			if err := l.AttachInstance(ctx, s.InstanceUUID, h, s.ID, ""); err != nil {
				t.Fatalf("AttachInstance(%s): %v", s.InstanceUUID, err)
			}
		}
		if s := snapshot(t, l, h); len(s.Claims) != 3 || len(s.Pins) != 6 {
			t.Errorf("Snapshot(%s) on the cluster: %d claims, %d pins; want 3, 6", h, len(s.Claims), len(s.Pins))
		}
		if err := l.Release(ctx, h, h+"-c0"); err != nil {
			t.Errorf("Release(%s-c0): %v", h, err)
		}
		if err := l.DetachInstance(ctx, h+"-u0", h+"-c0"); err != nil {
			t.Errorf("DetachInstance(%s-u0): %v", h, err)
		}
	}
	got, err := l.Hosts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, " ") != strings.Join(sorted(hosts), " ") {
		t.Errorf("Hosts() on the cluster = %v, want %v", got, sorted(hosts))
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

// TestClaimsSurviveRestart: with appendonly (fsync always), claims,
// instance records and the generation survive a clean restart and a kill.
func TestClaimsSurviveRestart(t *testing.T) {
	ctx := context.Background()
	l, _, srv := newLedger(t, testenv.AppendOnly())
	register(t, l, "h1", testHost(2, 4))
	if _, err := l.CreateInstance(ctx, "u1", "vm-1", flavor, guest.VMBuilding, ""); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"c1", "c2"} {
		if _, err := l.Claim(ctx, spec(id, "h1", dedicated(t, 2, 512))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Commit(ctx, "h1", "c1"); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, l, "h1")
	for _, restart := range []struct {
		name string
		do   func(testing.TB)
	}{{"Restart", srv.Restart}, {"KillAndRestart", srv.KillAndRestart}} {
		restart.do(t)
		after := snapshot(t, l, "h1")
		if d := diffSnapshots(before, after); d != "" {
			t.Errorf("Snapshot after %s (-before +after):\n%s", restart.name, d)
		}
		if _, err := l.Instance(ctx, "u1"); err != nil {
			t.Errorf("Instance(u1) after %s: %v", restart.name, err)
		}
	}
	// The ledger goes on where it was: c3 and c4 get the free pCPUs, and
	// nothing is left for c5.
	for _, id := range []string{"c3", "c4"} {
		if _, err := l.Claim(ctx, spec(id, "h1", dedicated(t, 2, 512))); err != nil {
			t.Errorf("Claim(%s) after restarts: %v", id, err)
		}
	}
	var nofit *numa.NoFitError
	if _, err := l.Claim(ctx, spec("c5", "h1", dedicated(t, 1, 512))); !errors.As(err, &nofit) {
		t.Errorf("Claim(c5) on a full host after restarts: error = %v, want *numa.NoFitError", err)
	}
	snapshot(t, l, "h1")
}
