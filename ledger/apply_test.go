package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/numa"
)

// TestBatchOperationsSeeEachOther runs one apply script carrying claims and
// releases that depend on each other: each operation must see every change
// made before it in the batch, exactly as if each were a script of its own.
func TestBatchOperationsSeeEachOther(t *testing.T) {
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
	ops := [][]any{
		claim1,                  // ok
		claim1,                  // the same id again: exists, with c1's record
		{"r", "c1", "nope", ""}, // wrong token: nothing released
		{"r", "c1", "", ""},     // released
		{"r", "c1", "", ""},     // already released
		claim2,                  // ok: c1's pCPUs are free again
		claim3,                  // taken by c2
		{"r", "c2", "tok-c2", "unchanged:committed"}, // c2 is pending: kept
		{"r", "c2", "tok-c2", "pending"},             // released
		claim3,                                       // ok now
	}
	args := []any{len(ops)}
	for _, op := range ops {
		args = append(args, op...)
	}
	res, err := applyScript.Run(ctx, rdb, l.hostKeys("h1").all(), args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range res {
		reply := r.([]any)
		got = append(got, fmt.Sprint(reply[0]))
	}
	want := []string{"ok", "exists", "2", "1", "0", "ok", "taken", "3", "1", "ok"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("apply replies (-want +got):\n%s", diff)
	}
	if want, _ := json.Marshal(c1); res[1].([]any)[1].(string) != string(want) {
		t.Errorf("exists reply carries %s, want c1's record %s", res[1].([]any)[1], want)
	}
	// The revisions count the changes: c1, its release, c2, c2's release, c3.
	if rev := toInt(res[9].([]any)[1]); rev != 5 {
		t.Errorf("last claim's revision = %d, want 5", rev)
	}
	s := snapshot(t, l, "h1")
	if len(s.Claims) != 1 || s.Claims[0].ID != "c3" {
		t.Fatalf("claims after the batch = %+v, want c3 alone", s.Claims)
	}
	if len(s.Pins) != 2 || s.Pins[0].ClaimID != "c3" {
		t.Errorf("pins after the batch = %+v, want c3's two", s.Pins)
	}
}
