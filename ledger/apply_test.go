package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/numa"
)

// TestClaimAndReleaseScripts runs claims and releases that depend on each
// other, one script each, and checks every reply and the host's revision:
// it counts the changes, and a refused or repeated operation leaves it.
func TestClaimAndReleaseScripts(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	register(t, l, "h1", testHost(1, 4))
	h, err := l.Host(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	req := dedicated(t, 2, 512)
	// c1, c2 and c3 are all fitted on the empty host: the same pCPUs.
	claim := func(id string) (*Claim, []any) {
		c := &Claim{State: StatePending, ID: id, Host: "h1", InstanceUUID: "inst-" + id, Kind: KindBoot,
			OwnerWorkflowID: "wf-" + id, OwnerRunID: "run", Token: "tok-" + id, Generation: 1}
		if c.Placement, err = numa.Fit(h, req); err != nil {
			t.Fatal(err)
		}
		if c.Usage, err = numa.Usage(h, c.Placement); err != nil {
			t.Fatal(err)
		}
		args, err := claimArgs(h, c)
		if err != nil {
			t.Fatal(err)
		}
		return c, args
	}
	c1, claim1 := claim("c1")
	_, claim2 := claim("c2")
	_, claim3 := claim("c3")
	var cpus []string
	for _, cpu := range c1.Usage[0].PinnedCPUs.List() {
		cpus = append(cpus, strconv.Itoa(cpu))
	}
	pins := strings.Join(cpus, ",")
	record, err := json.Marshal(c1)
	if err != nil {
		t.Fatal(err)
	}
	for i, op := range []struct {
		s    *script
		args []any
		want []string // the reply; "*" matches anything
	}{
		{claimScript, claim1, []string{"ok", "1", "*", "*"}},
		{claimScript, claim1, []string{"exists", string(record)}},
		{releaseScript, []any{"c1", "nope", ""}, []string{"token"}},
		{releaseScript, []any{"c1", "", ""}, []string{"released", "2", pins, "*"}},
		{releaseScript, []any{"c1", "", ""}, []string{"absent"}},
		{claimScript, claim2, []string{"ok", "3", "*", "*"}},
		{claimScript, claim3, []string{"taken", "3", pins, "*", cpus[0], "c2"}},
		{releaseScript, []any{"c2", "tok-c2", "unchanged:committed"}, []string{"unmet"}},
		{releaseScript, []any{"c2", "tok-c2", "pending"}, []string{"released", "4", pins, "*"}},
		{claimScript, claim3, []string{"ok", "5", "*", "*"}},
	} {
		res, err := op.s.Run(ctx, rdb, l.hostKeys("h1").all(), op.args...).Slice()
		if err != nil {
			t.Fatalf("op %d: %s script: %v", i, op.s.name, err)
		}
		got := make([]string, len(res))
		for j, v := range res {
			got[j] = fmt.Sprint(v)
			if j < len(op.want) && op.want[j] == "*" {
				got[j] = "*"
			}
		}
		if diff := cmp.Diff(op.want, got); diff != "" {
			t.Errorf("op %d: %s script %v replied (-want +got):\n%s", i, op.s.name, op.args[:3], diff)
		}
	}
	s := snapshot(t, l, "h1")
	if len(s.Claims) != 1 || s.Claims[0].ID != "c3" {
		t.Fatalf("claims at the end = %+v, want c3 alone", s.Claims)
	}
	if len(s.Pins) != 2 || s.Pins[0].ClaimID != "c3" {
		t.Errorf("pins at the end = %+v, want c3's two", s.Pins)
	}
}

// TestClaimOfManyPCPUs claims and releases a guest pinned to more pCPUs
// than Lua passes to one Redis command: the scripts send them in slices.
func TestClaimOfManyPCPUs(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(1, 4200))
	empty := snapshot(t, l, "h1")
	c, err := l.Claim(ctx, spec("big", "h1", dedicated(t, 4100, 512)))
	if err != nil {
		t.Fatalf("Claim(4100 pCPUs): %v", err)
	}
	if n := c.Usage[0].PinnedCPUs.Len(); n != 4100 {
		t.Fatalf("claim pins %d pCPUs, want 4100", n)
	}
	if s := snapshot(t, l, "h1"); len(s.Pins) != 4100 {
		t.Errorf("%d pCPUs pinned after the claim, want 4100", len(s.Pins))
	}
	if ok, err := l.ReleasePending(ctx, "h1", "big"); err != nil || !ok {
		t.Fatalf("ReleasePending(big) = %v, %v; want true, nil", ok, err)
	}
	if diff := diffSnapshots(empty, snapshot(t, l, "h1")); diff != "" {
		t.Errorf("after the release (-empty +after):\n%s", diff)
	}
}
