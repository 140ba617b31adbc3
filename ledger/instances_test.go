package ledger

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv"
)

// TestInstances lists records on and off hosts, without their domain XML,
// and leaves out deleted records, other prefixes' records and keys that
// only look like records.
func TestInstances(t *testing.T) {
	ctx := context.Background()
	l, rdb, srv := newLedger(t)
	register(t, l, "h1", testHost(1, 8))
	if _, err := l.CreateInstance(ctx, "u-placed", "vm-placed", flavor, guest.VMBuilding, ""); err != nil {
		t.Fatal(err)
	}
	s := spec("c1", "h1", dedicated(t, 2, 512))
	s.InstanceUUID = "u-placed"
	if _, err := l.Claim(ctx, s); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Commit(ctx, "h1", "c1"); err != nil {
		t.Fatal(err)
	}
	if err := l.AttachInstance(ctx, "u-placed", "h1", "c1", "<domain/>"); err != nil {
		t.Fatal(err)
	}
	if err := l.SetState(ctx, "u-placed", Transition{VM: guest.VMActive}); err != nil {
		t.Fatal(err)
	}
	// A member of a group: a listing names its group too.
	if err := l.CreateGroup(ctx, Group{Name: "db", Policy: PolicyAntiAffinity}); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"u-shelved", "u-gone"} {
		if _, err := l.CreateMember(ctx, u, "vm-"+u, flavor, guest.VMShelvedOffloaded, "", "db"); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.DeleteInstance(ctx, "u-gone"); err != nil {
		t.Fatal(err)
	}
	other, err := New(rdb, Options{KeyPrefix: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.CreateInstance(ctx, "u-other", "vm-other", flavor, guest.VMBuilding, ""); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, "pinflow:inst:{not a uuid}", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}

	got, err := l.Instances(ctx)
	if err != nil {
		t.Fatalf("Instances: %v", err)
	}
	var want []*Instance
	for _, u := range []string{"u-placed", "u-shelved"} {
		in, err := l.Instance(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		in.DomainXML = ""
		want = append(want, in)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Instances (-want +got):\n%s", diff)
	}
	if got, err := secondLedger(t, srv.Addr).Instances(ctx); err != nil || len(got) != 2 {
		t.Errorf("Instances from another ledger = %d records, %v; want 2", len(got), err)
	}
	if got, err := other.Instances(ctx); err != nil || len(got) != 1 || got[0].UUID != "u-other" {
		t.Errorf("Instances(prefix other) = %v, %v; want u-other alone", got, err)
	}
}

// TestInstancesMany lists more records than one SCAN step and one pipeline
// take.
func TestInstancesMany(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	n := 2*listBatch + 17
	for i := range n {
		if _, err := l.CreateInstance(ctx, fmt.Sprintf("u%05d", i), "vm", flavor, guest.VMBuilding, ""); err != nil {
			t.Fatal(err)
		}
	}
	got, err := l.Instances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("Instances() = %d records, want %d", len(got), n)
	}
	for i, in := range got {
		if want := fmt.Sprintf("u%05d", i); in.UUID != want {
			t.Fatalf("Instances()[%d] = %s, want %s (in uuid order)", i, in.UUID, want)
		}
	}
}

// TestInstancesOnCluster: records of every master of a Redis Cluster are
// listed.
func TestInstancesOnCluster(t *testing.T) {
	ctx := context.Background()
	cluster := testenv.StartRedisCluster(t, 3)
	l, rdb, err := Open(ctx, Config{Addrs: cluster.Addrs(), KeyPrefix: "pf"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	cc := rdb.(*redis.ClusterClient)
	masters := map[string]bool{}
	var want []string
	for i := range 30 {
		u := fmt.Sprintf("u%02d", i)
		if _, err := l.CreateInstance(ctx, u, "vm", flavor, guest.VMBuilding, ""); err != nil {
			t.Fatal(err)
		}
		node, err := cc.MasterForKey(ctx, l.instKey(u))
		if err != nil {
			t.Fatal(err)
		}
		masters[node.Options().Addr] = true
		want = append(want, u)
	}
	if len(masters) != 3 {
		t.Fatalf("30 records on %d masters, want 3", len(masters))
	}
	got, err := l.Instances(ctx)
	if err != nil {
		t.Fatalf("Instances on the cluster: %v", err)
	}
	var uuids []string
	for _, in := range got {
		uuids = append(uuids, in.UUID)
	}
	if diff := cmp.Diff(want, uuids); diff != "" {
		t.Errorf("Instances on the cluster (-want +got):\n%s", diff)
	}
}
