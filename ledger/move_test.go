package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/guest"
)

var bigFlavor = guest.Flavor{VCPUs: 4, MemoryMB: 1024, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}

// committedClaim claims flavor f for instance uuid on host and commits it.
func committedClaim(t *testing.T, l *Ledger, id, host, uuid string, kind ClaimKind, f guest.Flavor) *Claim {
	t.Helper()
	ctx := context.Background()
	r, err := f.Request()
	if err != nil {
		t.Fatal(err)
	}
	s := spec(id, host, r)
	s.InstanceUUID, s.Kind = uuid, kind
	if _, err := l.Claim(ctx, s); err != nil {
		t.Fatalf("Claim(%s on %s): %v", id, host, err)
	}
	c, err := l.Commit(ctx, host, id)
	if err != nil {
		t.Fatalf("Commit(%s on %s): %v", id, host, err)
	}
	return c
}

// TestResizeMovesAndReverts walks a resize: the source claim held, the
// record moved to the destination with the new flavor and the resize info
// in one step, then a revert back to the source with the old flavor, and a
// confirmation that clears the info.
func TestResizeMovesAndReverts(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "src", testHost(1, 8))
	register(t, l, "dst", testHost(1, 8))
	if _, err := l.CreateInstance(ctx, "u1", "vm-1", flavor, guest.VMActive, ""); err != nil {
		t.Fatal(err)
	}
	a := committedClaim(t, l, "a", "src", "u1", KindInstance, flavor)
	if err := l.AttachInstance(ctx, "u1", "src", "a", "<old/>"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Hold(ctx, "src", "a"); err != nil {
		t.Fatal(err)
	}
	b := committedClaim(t, l, "b", "dst", "u1", KindResizeDest, bigFlavor)
	rec := &ResizeRecord{SourceHost: "src", SourceClaimID: "a", OldFlavor: flavor, OldDomainXML: "<old/>", NewFlavor: &bigFlavor}

	toDst := Move{Host: "dst", ClaimID: "b", DomainXML: "<new/>", Flavor: &bigFlavor, Resize: rec}
	if err := l.MoveInstance(ctx, "u1", toDst); err != nil {
		t.Fatalf("MoveInstance(to the destination): %v", err)
	}
	moved, err := l.Instance(ctx, "u1")
	if err != nil {
		t.Fatal(err)
	}
	want := &Instance{UUID: "u1", Name: "vm-1", Host: "dst", Node: []int{0}, VMState: guest.VMActive, Request: bigFlavor,
		Placement: b.Placement, DomainXML: "<new/>", ClaimID: "b", Resize: rec, UpdatedAt: moved.UpdatedAt}
	if diff := cmp.Diff(want, moved, snapOpts...); diff != "" {
		t.Errorf("instance after MoveInstance(to the destination) (-want +got):\n%s", diff)
	}
	if h, _ := l.Home(ctx, "u1"); h.DomainDigest != DomainDigest("<new/>") {
		t.Errorf("Home after the move has digest %q, want the new XML's", h.DomainDigest)
	}
	// A retry finds the move made and writes nothing of the record.
	if err := l.MoveInstance(ctx, "u1", toDst); err != nil {
		t.Errorf("MoveInstance(to the destination) retried: %v", err)
	}
	if again, _ := l.Instance(ctx, "u1"); !cmp.Equal(moved, again, snapOpts...) {
		t.Errorf("MoveInstance retried changed the record:\n%s", cmp.Diff(moved, again, snapOpts...))
	}
	// The same claim with other resize info is a change, not a retry.
	cold := *rec
	cold.Cold = true
	if err := l.MoveInstance(ctx, "u1", Move{Host: "dst", ClaimID: "b", Resize: &cold}); err != nil {
		t.Fatal(err)
	}
	if got, _ := l.Instance(ctx, "u1"); got.Resize == nil || !got.Resize.Cold || got.DomainXML != "<new/>" || !cmp.Equal(got.Request, bigFlavor) {
		t.Errorf("MoveInstance(resize info alone) = resize %+v xml %q request %+v; want cold, the XML and request kept", got.Resize, got.DomainXML, got.Request)
	}

	// Revert: the hold becomes resident again, the record goes back.
	if _, err := l.Unhold(ctx, "src", "a"); err != nil {
		t.Fatal(err)
	}
	back := Move{Host: "src", ClaimID: "a", DomainXML: rec.OldDomainXML, Flavor: &rec.OldFlavor, ClearResize: true}
	for i := range 2 {
		if err := l.MoveInstance(ctx, "u1", back); err != nil {
			t.Fatalf("MoveInstance(back to the source) #%d: %v", i+1, err)
		}
	}
	reverted, _ := l.Instance(ctx, "u1")
	want = &Instance{UUID: "u1", Name: "vm-1", Host: "src", Node: []int{0}, VMState: guest.VMActive, Request: flavor,
		Placement: a.Placement, DomainXML: "<old/>", ClaimID: "a", UpdatedAt: reverted.UpdatedAt}
	if diff := cmp.Diff(want, reverted, snapOpts...); diff != "" {
		t.Errorf("instance after the revert (-want +got):\n%s", diff)
	}

	// Confirm: on the destination, then the info cleared on its own.
	if err := l.MoveInstance(ctx, "u1", toDst); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := l.ClearResize(ctx, "u1"); err != nil {
			t.Errorf("ClearResize #%d: %v", i+1, err)
		}
	}
	confirmed, _ := l.Instance(ctx, "u1")
	if confirmed.Resize != nil || confirmed.ClaimID != "b" || !cmp.Equal(confirmed.Request, bigFlavor) {
		t.Errorf("after ClearResize: resize %+v claim %q request %+v; want no resize, claim b, the new flavor", confirmed.Resize, confirmed.ClaimID, confirmed.Request)
	}
	if err := l.ClearResize(ctx, "nope"); !errors.Is(err, ErrUnknownInstance) {
		t.Errorf("ClearResize(unknown) error = %v, want ErrUnknownInstance", err)
	}
	if err := l.ClearResize(ctx, "u{1}"); !errors.Is(err, ErrInvalid) {
		t.Errorf("ClearResize(bad uuid) error = %v, want ErrInvalid", err)
	}
}

// TestMoveInstanceBadInput: a refused move leaves the record as it was.
func TestMoveInstanceBadInput(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(1, 8))
	if _, err := l.CreateInstance(ctx, "u1", "vm-1", flavor, guest.VMActive, ""); err != nil {
		t.Fatal(err)
	}
	committedClaim(t, l, "a", "h1", "u1", KindInstance, flavor)
	committedClaim(t, l, "held", "h1", "u1", KindInstance, flavor)
	if _, err := l.Hold(ctx, "h1", "held"); err != nil {
		t.Fatal(err)
	}
	r, _ := flavor.Request()
	pending := spec("pending", "h1", r)
	pending.InstanceUUID = "u1"
	if _, err := l.Claim(ctx, pending); err != nil {
		t.Fatal(err)
	}
	rec := &ResizeRecord{SourceHost: "h1", SourceClaimID: "held", OldFlavor: flavor}
	badFlavor := guest.Flavor{VCPUs: 0, MemoryMB: 512}
	before, _ := l.Instance(ctx, "u1")
	for _, tc := range []struct {
		name string
		m    Move
		want error
		in   string
	}{
		{"resize info stored and cleared", Move{Host: "h1", ClaimID: "a", Resize: rec, ClearResize: true}, ErrInvalid, "either stores resize info or clears it"},
		{"flavor that makes no request", Move{Host: "h1", ClaimID: "a", Flavor: &badFlavor}, ErrInvalid, "flavor:"},
		{"resize from a bad host name", Move{Host: "h1", ClaimID: "a", Resize: &ResizeRecord{SourceHost: "h{1}", SourceClaimID: "x", OldFlavor: flavor}}, ErrInvalid, `resize source: host name "h{1}"`},
		{"resize from no claim", Move{Host: "h1", ClaimID: "a", Resize: &ResizeRecord{SourceHost: "h1", OldFlavor: flavor}}, ErrInvalid, `resize source: claim id ""`},
		{"resize with an old flavor that makes no request", Move{Host: "h1", ClaimID: "a", Resize: &ResizeRecord{SourceHost: "h1", SourceClaimID: "x", OldFlavor: badFlavor}}, ErrInvalid, "resize old flavor"},
		{"resize with a new flavor that makes no request", Move{Host: "h1", ClaimID: "a", Resize: &ResizeRecord{SourceHost: "h1", SourceClaimID: "x", OldFlavor: flavor, NewFlavor: &badFlavor}}, ErrInvalid, "resize new flavor"},
		{"pending claim", Move{Host: "h1", ClaimID: "pending", Flavor: &bigFlavor}, ErrConflict, "the claim is pending"},
		{"held claim", Move{Host: "h1", ClaimID: "held", Flavor: &bigFlavor}, ErrConflict, "the claim is held"},
		{"unknown claim", Move{Host: "h1", ClaimID: "c9", Resize: rec}, ErrUnknownClaim, `no claim "c9"`},
		{"unknown host", Move{Host: "h9", ClaimID: "a", ClearResize: true}, ErrUnknownClaim, `no claim "a"`},
	} {
		err := l.MoveInstance(ctx, "u1", tc.m)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if !errors.Is(err, tc.want) || !strings.Contains(msg, tc.in) || !strings.HasPrefix(msg, "ledger: move instance u1") || strings.Count(msg, "ledger:") != 1 {
			t.Errorf("MoveInstance(%s) error = %v, want %v with one \"ledger: move instance u1\" prefix, saying %q", tc.name, err, tc.want, tc.in)
		}
		if got, _ := l.Instance(ctx, "u1"); !cmp.Equal(before, got, snapOpts...) {
			t.Errorf("MoveInstance(%s) changed the record:\n%s", tc.name, cmp.Diff(before, got, snapOpts...))
		}
	}
	if err := l.MoveInstance(ctx, "nope", Move{Host: "h1", ClaimID: "a"}); !errors.Is(err, ErrConflict) {
		t.Errorf("MoveInstance(another instance's claim) error = %v, want ErrConflict", err)
	}
}

// TestResizeStates: the states a resize, a cold migration and an
// evacuation go through are accepted, and listed when a state is not.
func TestResizeStates(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	if _, err := l.CreateInstance(ctx, "u1", "vm-1", flavor, guest.VMActive, ""); err != nil {
		t.Fatal(err)
	}
	for _, tr := range []Transition{
		{Task: guest.TaskResizePrep}, {Task: guest.TaskResizeMigrating}, {Task: guest.TaskResizeFinish},
		{VM: guest.VMResized, Task: guest.TaskNone}, {Task: guest.TaskResizeConfirming}, {Task: guest.TaskResizeReverting},
		{VM: guest.VMActive, Task: guest.TaskRebuilding}, {Task: guest.TaskNone},
	} {
		if err := l.SetState(ctx, "u1", tr); err != nil {
			t.Errorf("SetState(%q/%q): %v", tr.VM, tr.Task, err)
		}
	}
	err := l.SetState(ctx, "u1", Transition{Task: "resize"})
	want := `allowed are "" (none), spawning, migrating, shelving, unshelving, deleting, resize_prep, resize_migrating, resize_finish, resize_confirming, resize_reverting, rebuilding`
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("SetState(task resize) error = %v, want ErrInvalid saying %s", err, want)
	}
	if err := l.SetState(ctx, "u1", Transition{VM: "verify_resize"}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "resized") {
		t.Errorf("SetState(vm verify_resize) error = %v, want ErrInvalid listing resized", err)
	}
}
