package ledger

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/guest"
)

// TestLostHosts: a host whose topology key is gone is found by whatever
// still names it: the registry, its own keys, an instance record; an
// intact host, or one removed whole, is not.
func TestLostHosts(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	for _, h := range []string{"both", "keys", "listed", "intact", "removed"} {
		register(t, l, h, testHost(1, 8))
	}
	for _, h := range []string{"both", "keys", "intact"} {
		if _, err := l.Claim(ctx, spec("c-"+h, h, dedicated(t, 2, 512))); err != nil {
			t.Fatal(err)
		}
	}
	// The guest of both's claim is attached to it.
	if _, err := l.CreateInstance(ctx, "inst-c-both", "vm", flavor, guest.VMBuilding, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Commit(ctx, "both", "c-both"); err != nil {
		t.Fatal(err)
	}
	if err := l.AttachInstance(ctx, "inst-c-both", "both", "c-both", "<domain/>"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.RemoveHost(ctx, "removed"); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"both", "keys", "listed"} {
		if err := rdb.Del(ctx, l.hostKeys(h).topo).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.SRem(ctx, l.hostsKey(), "keys").Err(); err != nil {
		t.Fatal(err)
	}
	got, err := l.LostHosts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	claimed := []string{"claims", "pins", "undo", "usage"}
	want := []LostHost{
		{Host: "both", Registered: true, Keys: claimed, Instances: []string{"inst-c-both"}},
		{Host: "keys", Keys: claimed},
		{Host: "listed", Registered: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("LostHosts mismatch (-want +got):\n%s", diff)
	}
}
