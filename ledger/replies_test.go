package ledger

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestUndoEntry: an undo entry reads back as written, with and without
// the member part, and anything else is refused with the format named.
func TestUndoEntry(t *testing.T) {
	for _, u := range []undoEntry{
		{token: "t", pins: pinSet{cpus: []int{2, 3}, devs: []string{"0000:81:00.1"}}, counters: []counter{{"0:mem", 512}, {hostMemField, 512}}},
		{token: "t", pins: pinSet{cpus: []int{4}}, counters: []counter{{"1:shared", 2}}, group: "web", uuid: "u-1"},
		{token: "t"},
	} {
		got, err := parseUndo(u.String())
		if err != nil {
			t.Fatalf("parseUndo(%q): %v", u.String(), err)
		}
		if diff := cmp.Diff(u, got, cmp.AllowUnexported(undoEntry{}, pinSet{}, counter{})); diff != "" {
			t.Errorf("parseUndo(%q) (-want +got):\n%s", u.String(), diff)
		}
	}
	for _, bad := range []string{"t|1,2", "t|1|0:mem,1|web", "t|1|0:mem,1|web|u|x"} {
		if _, err := parseUndo(bad); err == nil || !strings.Contains(err.Error(), "token|pins|counters") {
			t.Errorf("parseUndo(%q) = %v, want an error naming the format", bad, err)
		}
	}
}

// TestDecodeReplies: each script's reply decodes into its named fields,
// and a shape the script does not send is an error that shows it.
func TestDecodeReplies(t *testing.T) {
	full, err := decodeClaim([]any{"full", int64(7), "1,2", "0:mem,100", "0:mem", "100", "50", "120"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "cell 0 MiB has 100 of 120 in use, 50 more do not fit"; full.rev != 7 || full.pins != "1,2" || full.lostRace() != want {
		t.Errorf("decodeClaim(full) = %+v, %q; want rev 7, pins 1,2 and %q", full, full.lostRace(), want)
	}
	ok, err := decodeClaim([]any{"ok", int64(3), int64(10), "20"})
	if err != nil || ok.rev != 3 || !cmp.Equal(ok.values, []int64{10, 20}) {
		t.Errorf("decodeClaim(ok) = %+v, %v; want rev 3 and values [10 20]", ok, err)
	}
	rel, err := decodeRelease([]any{"released", int64(4), "1,2", "0:mem,0"})
	if err != nil || rel.rev != 4 || rel.freed != "1,2" || rel.counters != "0:mem,0" {
		t.Errorf("decodeRelease(released) = %+v, %v", rel, err)
	}
	for _, bad := range [][]any{{"taken", int64(1)}, {"bogus"}} {
		if _, err := decodeClaim(bad); err == nil || !strings.Contains(err.Error(), "claim script replied") {
			t.Errorf("decodeClaim(%v) = %v, want an error showing the reply", bad, err)
		}
	}
	for _, bad := range [][]any{{int64(1), int64(2), "", ""}, {"released"}} {
		if _, err := decodeRelease(bad); err == nil || !strings.Contains(err.Error(), "release script replied") {
			t.Errorf("decodeRelease(%v) = %v, want an error showing the reply", bad, err)
		}
	}
	if _, known, err := decodeRead(nil); known || err != nil {
		t.Errorf("decodeRead(empty) = known %v, %v; want an unknown host", known, err)
	}
}

// TestDecodeStatusReplies: the replies of the scripts that answer with a
// status and a few values decode into named fields, and a status or a
// length the script does not send is an error.
func TestDecodeStatusReplies(t *testing.T) {
	if r, err := decodeHostRemove([]string{"notdown", "returning", "3"}); err != nil || r.hostState != "returning" || r.tombstones != 3 {
		t.Errorf("decodeHostRemove(notdown) = %+v, %v", r, err)
	}
	if r, err := decodeGroupSlot([]string{"full", "2", "u2", "u1"}); err != nil || r.max != 2 || !slices.Equal(r.members, []string{"u2", "u1"}) {
		t.Errorf("decodeGroupSlot(full) = %+v, %v", r, err)
	}
	if r, err := decodeGroup("group_create", []string{"conflict", "affinity", "", "0"}); err != nil || r.policy != "affinity" || r.maxMoving != "0" {
		t.Errorf("decodeGroup(conflict) = %+v, %v", r, err)
	}
	if r, err := decodeLease("fence", []string{"ok", "1700000000000"}); err != nil || r.until != 1700000000000 {
		t.Errorf("decodeLease(fence ok) = %+v, %v", r, err)
	}
	if r, err := decodeRepinCommit([]string{"owner", "6", "other"}); err != nil || r.pin != "6" || r.owner != "other" {
		t.Errorf("decodeRepinCommit(owner) = %+v, %v", r, err)
	}
	for _, bad := range []struct {
		name string
		err  error
	}{
		{"host_remove", func() error { _, err := decodeHostRemove([]string{"live", "c1"}); return err }()},
		{"group_slot", func() error { _, err := decodeGroupSlot([]string{"full"}); return err }()},
		{"group_join", func() error { _, err := decodeGroup("group_join", []string{"joined"}); return err }()},
		{"take", func() error { _, err := decodeLease("take", []string{"leased", "soon"}); return err }()},
		{"claim_state", func() error { _, err := decodeClaimState(nil); return err }()},
	} {
		if bad.err == nil || !strings.Contains(bad.err.Error(), bad.name+" script replied") {
			t.Errorf("a reply %s does not send = %v, want an error naming the script", bad.name, bad.err)
		}
	}
}
