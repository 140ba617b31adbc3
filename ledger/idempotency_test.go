package ledger

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/numa"
)

var snapOpts = []cmp.Option{cpuSetCmp, cmpopts.IgnoreUnexported(numa.CPUSet{})}

func TestClaimRetriedAfterLostReply(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 8))
	first, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatalf("Claim(c1): %v", err)
	}
	before := snapshot(t, l, "h1")
	// The activity never saw the reply and runs again.
	again, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatalf("Claim(c1) retried: %v", err)
	}
	if diff := cmp.Diff(first, again, snapOpts...); diff != "" {
		t.Errorf("Claim(c1) retried returned another claim (-first +retry):\n%s", diff)
	}
	if diff := cmp.Diff(before, snapshot(t, l, "h1"), snapOpts...); diff != "" {
		t.Errorf("Claim(c1) retried changed the ledger (-before +after):\n%s", diff)
	}
	// The id is the instance's: reusing it for another instance is a bug
	// in the caller, not a retry.
	other := spec("c1", "h1", dedicated(t, 2, 512))
	other.InstanceUUID = "someone-else"
	if _, err := l.Claim(ctx, other); !errors.Is(err, ErrConflict) {
		t.Errorf("Claim(c1) for another instance error = %v, want ErrConflict", err)
	}
}

// TestClaimScriptChecksExistingClaim runs the claim script as a retry
// whose read missed the first try: the script itself must return the first
// record and change nothing.
func TestClaimScriptChecksExistingClaim(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	register(t, l, "h1", testHost(1, 8))
	first, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatalf("Claim(c1): %v", err)
	}
	before := snapshot(t, l, "h1")
	h, err := l.Host(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	// A second fit of the same id on the current state picks other pCPUs.
	retry := &Claim{State: StatePending, ID: "c1", Host: "h1", InstanceUUID: "inst-c1", Kind: KindBoot, Generation: 1, Token: "other"}
	retry.Placement, err = numa.Fit(h, dedicated(t, 2, 512))
	if err != nil {
		t.Fatal(err)
	}
	if retry.Usage, err = numa.Usage(h, retry.Placement); err != nil {
		t.Fatal(err)
	}
	args, err := claimArgs(h, retry)
	if err != nil {
		t.Fatal(err)
	}
	res, err := claimOne(ctx, rdb, l.hostKeys("h1"), args)
	if err != nil {
		t.Fatalf("claim script: %v", err)
	}
	if res[0] != "exists" {
		t.Fatalf("claim script for an existing id replied %q, want exists", res)
	}
	got, err := sameClaim(spec("c1", "h1", nil), res[1], func(err error) error { return err })
	if err != nil {
		t.Fatal(err)
	}
	if got.Token != first.Token || !got.Usage[0].PinnedCPUs.Equal(first.Usage[0].PinnedCPUs) {
		t.Errorf("claim script for an existing id returned token %s pins %s, want the first: %s %s", got.Token, got.Usage[0].PinnedCPUs, first.Token, first.Usage[0].PinnedCPUs)
	}
	if diff := cmp.Diff(before, snapshot(t, l, "h1"), snapOpts...); diff != "" {
		t.Errorf("claim script for an existing id changed the ledger (-before +after):\n%s", diff)
	}
}

func TestClaimScriptRefusesStaleGeneration(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	register(t, l, "h1", testHost(1, 8))
	h, _ := l.Host(ctx, "h1")
	grown := testHost(2, 8)
	if gen := register(t, l, "h1", grown); gen != 2 {
		t.Fatalf("RegisterHost(h1, grown) generation = %d, want 2", gen)
	}
	before := snapshot(t, l, "h1")
	c := &Claim{State: StatePending, ID: "c1", Host: "h1", InstanceUUID: "i", Kind: KindBoot, Generation: 1}
	c.Placement, _ = numa.Fit(h, dedicated(t, 2, 512))
	c.Usage, _ = numa.Usage(h, c.Placement)
	args, _ := claimArgs(h, c)
	res, err := claimOne(ctx, rdb, l.hostKeys("h1"), args)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"gen", "2"}, res); diff != "" {
		t.Errorf("claim script fitted on generation 1 of a generation 2 host (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, snapshot(t, l, "h1"), snapOpts...); diff != "" {
		t.Errorf("refused claim changed the ledger (-before +after):\n%s", diff)
	}
}

func TestReleaseIdempotent(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(1, 8))
	empty := snapshot(t, l, "h1")
	if _, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512))); err != nil {
		t.Fatal(err)
	}
	kept, err := l.Claim(ctx, spec("c2", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := l.Release(ctx, "h1", "c1"); err != nil {
			t.Errorf("Release(c1) #%d: %v", i+1, err)
		}
	}
	after := snapshot(t, l, "h1")
	if len(after.Claims) != 1 || after.Claims[0].ID != "c2" || len(after.Pins) != 2 {
		t.Errorf("after releasing c1 twice: claims %v pins %v, want only c2 with its 2 pins", after.Claims, after.Pins)
	}
	if err := l.Release(ctx, "h1", "never-made"); err != nil {
		t.Errorf("Release(never-made): %v", err)
	}
	if err := l.Release(ctx, "unregistered", "never-made"); err != nil {
		t.Errorf("Release on an unregistered host: %v", err)
	}
	if diff := cmp.Diff(after, snapshot(t, l, "h1"), snapOpts...); diff != "" {
		t.Errorf("Release(never-made) changed the ledger (-before +after):\n%s", diff)
	}

	ok, err := l.ReleaseIfUnchanged(ctx, "h1", "c2", "0123456789abcdef0123456789abcdef", StatePending)
	if err != nil || ok {
		t.Errorf("ReleaseIfUnchanged(c2, stale token) = %v, %v; want false, nil", ok, err)
	}
	if diff := cmp.Diff(after, snapshot(t, l, "h1"), snapOpts...); diff != "" {
		t.Errorf("ReleaseIfUnchanged with a stale token changed the ledger (-before +after):\n%s", diff)
	}
	if _, err := l.ReleaseIfUnchanged(ctx, "h1", "c2", "", StatePending); !errors.Is(err, ErrInvalid) {
		t.Errorf("ReleaseIfUnchanged(c2, empty token) error = %v, want ErrInvalid", err)
	}
	ok, err = l.ReleaseIfUnchanged(ctx, "h1", "c2", kept.Token, StatePending)
	if err != nil || !ok {
		t.Errorf("ReleaseIfUnchanged(c2, its token) = %v, %v; want true, nil", ok, err)
	}
	ok, err = l.ReleaseIfUnchanged(ctx, "h1", "c2", kept.Token, StatePending)
	if err != nil || ok {
		t.Errorf("ReleaseIfUnchanged(c2) again = %v, %v; want false, nil", ok, err)
	}
	if diff := cmp.Diff(empty, snapshot(t, l, "h1"), snapOpts...); diff != "" {
		t.Errorf("ledger after releasing everything differs from the empty one (-empty +after):\n%s", diff)
	}
}

// TestReleaseNeverUnpinsAnotherOwner corrupts a pin so that it names
// another claim: releasing must leave that pin alone.
func TestReleaseNeverUnpinsAnotherOwner(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	register(t, l, "h1", testHost(1, 8))
	c, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatal(err)
	}
	cpu := c.Usage[0].PinnedCPUs.Min()
	if err := rdb.HSet(ctx, l.hostKeys("h1").pins, cpu, "intruder").Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, "h1", "c1"); err != nil {
		t.Fatal(err)
	}
	pins, err := rdb.HGetAll(ctx, l.hostKeys("h1").pins).Result()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{itoa(cpu): "intruder"}, pins); diff != "" {
		t.Errorf("pins after releasing c1 (-want +got):\n%s", diff)
	}
}

func diffSnapshots(a, b *Snapshot) string { return cmp.Diff(a, b, snapOpts...) }

// claimOne runs the claim script, bypassing the ledger's applier, and
// returns its reply as strings.
func claimOne(ctx context.Context, rdb redis.UniversalClient, k *hostKeys, args []any) ([]string, error) {
	reply, err := claimScript.Run(ctx, rdb, k.all(), args...).Slice()
	if err != nil {
		return nil, err
	}
	out := make([]string, len(reply))
	for i, v := range reply {
		out[i] = fmt.Sprint(v)
	}
	return out, nil
}

// claimArgs is newClaimCall's argument list alone.
func claimArgs(h *numa.Host, c *Claim) ([]any, error) {
	call, err := newClaimCall(h, c, "")
	if err != nil {
		return nil, err
	}
	return call.args, nil
}
