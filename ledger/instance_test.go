package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/guest"
)

var flavor = guest.Flavor{VCPUs: 2, MemoryMB: 512, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}

func TestCreateInstance(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	in, err := l.CreateInstance(ctx, "u1", "vm-1", flavor, guest.VMBuilding, "")
	if err != nil {
		t.Fatalf("CreateInstance(u1): %v", err)
	}
	want := &Instance{UUID: "u1", Name: "vm-1", VMState: guest.VMBuilding, Request: flavor, UpdatedAt: in.UpdatedAt}
	if diff := cmp.Diff(want, in); diff != "" {
		t.Errorf("CreateInstance(u1) (-want +got):\n%s", diff)
	}
	if in.UpdatedAt.IsZero() {
		t.Errorf("CreateInstance(u1) updated_at is zero")
	}
	again, err := l.CreateInstance(ctx, "u1", "vm-1", flavor, guest.VMBuilding, "")
	if err != nil || !cmp.Equal(in, again) {
		t.Errorf("CreateInstance(u1) again = %+v, %v; want the first record, nil", again, err)
	}
	// A second operation on the same uuid is not a retry of the first.
	if _, err := l.CreateInstance(ctx, "u9", "vm-9", flavor, guest.VMBuilding, "run-1"); err != nil {
		t.Fatalf("CreateInstance(u9, run-1): %v", err)
	}
	if _, err := l.CreateInstance(ctx, "u9", "vm-9", flavor, guest.VMBuilding, "run-1"); err != nil {
		t.Errorf("CreateInstance(u9, run-1) retried: %v", err)
	}
	if _, err := l.CreateInstance(ctx, "u9", "vm-9", flavor, guest.VMBuilding, "run-2"); !errors.Is(err, ErrExists) {
		t.Errorf("CreateInstance(u9, run-2) error = %v, want ErrExists", err)
	}
	for _, tc := range []struct {
		name, uuid, vmName string
		flavor             guest.Flavor
		vm                 guest.VMState
		want               error
	}{
		{"another name", "u1", "vm-2", flavor, guest.VMBuilding, ErrConflict},
		{"another flavor", "u1", "vm-1", guest.Flavor{VCPUs: 4, MemoryMB: 512}, guest.VMBuilding, ErrConflict},
		{"invalid flavor", "u2", "vm-2", guest.Flavor{VCPUs: 2, MemoryMB: 512, ExtraSpecs: map[string]string{"hw:cpu_policy": "pinned"}}, guest.VMBuilding, ErrInvalid},
		{"zero vcpus", "u2", "vm-2", guest.Flavor{MemoryMB: 512}, guest.VMBuilding, ErrInvalid},
		{"unknown vm_state", "u2", "vm-2", flavor, "running", ErrInvalid},
		{"empty name", "u2", "", flavor, guest.VMBuilding, ErrInvalid},
		{"bad uuid", "u{2}", "vm-2", flavor, guest.VMBuilding, ErrInvalid},
		{"name with a newline", "u2", "vm\n2", flavor, guest.VMBuilding, ErrInvalid},
		{"name of 10 kB", "u2", strings.Repeat("v", 10000), flavor, guest.VMBuilding, ErrInvalid},
		{"memory past the bound", "u2", "vm-2", guest.Flavor{VCPUs: 1, MemoryMB: 1<<63 - 1}, guest.VMBuilding, ErrInvalid},
	} {
		if _, err := l.CreateInstance(ctx, tc.uuid, tc.vmName, tc.flavor, tc.vm, ""); !errors.Is(err, tc.want) {
			t.Errorf("CreateInstance(%s) error = %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := l.Instance(ctx, "u2"); !errors.Is(err, ErrUnknownInstance) {
		t.Errorf("Instance(u2) after refused creations: error = %v, want ErrUnknownInstance", err)
	}
	if got, _ := l.Instance(ctx, "u1"); !cmp.Equal(in, got) {
		t.Errorf("Instance(u1) after refused creations = %+v, want %+v", got, in)
	}
}

func TestSetState(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	if _, err := l.CreateInstance(ctx, "u1", "vm-1", flavor, guest.VMShelvedOffloaded, ""); err != nil {
		t.Fatal(err)
	}
	unshelving := Transition{FromVM: []guest.VMState{guest.VMShelvedOffloaded}, FromTask: []guest.TaskState{guest.TaskNone}, Task: guest.TaskUnshelving}
	active := Transition{FromVM: []guest.VMState{guest.VMShelvedOffloaded}, FromTask: []guest.TaskState{guest.TaskUnshelving}, VM: guest.VMActive, Task: guest.TaskNone}
	for i, tc := range []struct {
		name     string
		t        Transition
		want     error
		wantVM   guest.VMState
		wantTask guest.TaskState
	}{
		{"start unshelving", unshelving, nil, guest.VMShelvedOffloaded, guest.TaskUnshelving},
		{"start unshelving again (retry)", unshelving, nil, guest.VMShelvedOffloaded, guest.TaskUnshelving},
		{"start migrating while unshelving", Transition{FromTask: []guest.TaskState{guest.TaskNone}, Task: guest.TaskMigrating}, ErrConflict, guest.VMShelvedOffloaded, guest.TaskUnshelving},
		{"unknown task state", Transition{Task: "resizing"}, ErrInvalid, guest.VMShelvedOffloaded, guest.TaskUnshelving},
		{"unknown vm state", Transition{VM: "running"}, ErrInvalid, guest.VMShelvedOffloaded, guest.TaskUnshelving},
		{"finish unshelving", active, nil, guest.VMActive, guest.TaskNone},
		{"finish unshelving again (retry)", active, nil, guest.VMActive, guest.TaskNone},
		{"start unshelving an active instance", unshelving, ErrConflict, guest.VMActive, guest.TaskNone},
		{"any to stopped", Transition{VM: guest.VMStopped}, nil, guest.VMStopped, guest.TaskNone},
	} {
		err := l.SetState(ctx, "u1", tc.t)
		if !errors.Is(err, tc.want) {
			t.Errorf("#%d SetState(%s) error = %v, want %v", i, tc.name, err, tc.want)
		}
		in, _ := l.Instance(ctx, "u1")
		if in.VMState != tc.wantVM || in.TaskState != tc.wantTask {
			t.Errorf("#%d after SetState(%s): %q/%q, want %q/%q", i, tc.name, in.VMState, in.TaskState, tc.wantVM, tc.wantTask)
		}
	}
	if err := l.SetState(ctx, "nope", Transition{VM: guest.VMActive}); !errors.Is(err, ErrUnknownInstance) {
		t.Errorf("SetState(nope) error = %v, want ErrUnknownInstance", err)
	}
}

// attachFixture is a ledger with instance u1, its pending claim c1 on h1,
// and another instance's committed claim c-other there.
type attachFixture struct {
	l *Ledger
	c *Claim
}

func newAttachFixture(t *testing.T) *attachFixture {
	t.Helper()
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 4))
	if _, err := l.CreateInstance(ctx, "u1", "vm-1", flavor, guest.VMBuilding, ""); err != nil {
		t.Fatal(err)
	}
	r, err := flavor.Request()
	if err != nil {
		t.Fatal(err)
	}
	s := spec("c1", "h1", r)
	s.InstanceUUID = "u1"
	c, err := l.Claim(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	other := spec("c-other", "h1", r)
	if _, err := l.Claim(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Commit(ctx, "h1", "c-other"); err != nil {
		t.Fatal(err)
	}
	return &attachFixture{l: l, c: c}
}

// attach commits c1 and attaches u1 to it with domain XML "<domain/>".
func (f *attachFixture) attach(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if _, err := f.l.Commit(ctx, "h1", "c1"); err != nil {
		t.Fatal(err)
	}
	if err := f.l.AttachInstance(ctx, "u1", "h1", "c1", "<domain/>"); err != nil {
		t.Fatalf("AttachInstance(committed claim): %v", err)
	}
}

// detach releases c1 and detaches u1 from it.
func (f *attachFixture) detach(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := f.l.Release(ctx, "h1", "c1"); err != nil {
		t.Fatal(err)
	}
	if err := f.l.DetachInstance(ctx, "u1", "c1"); err != nil {
		t.Fatalf("DetachInstance after Release: %v", err)
	}
}

func TestAttachDetachDelete(t *testing.T) {
	ctx := context.Background()
	t.Run("refused attachments leave the record as it was", func(t *testing.T) {
		f := newAttachFixture(t)
		detached, _ := f.l.Instance(ctx, "u1")
		for _, tc := range []struct {
			name, host, claim string
			want              error
		}{
			{"pending claim", "h1", "c1", ErrConflict},
			{"unknown claim", "h1", "c9", ErrUnknownClaim},
			{"claim on another host", "h2", "c1", ErrUnknownClaim},
			{"another instance's claim", "h1", "c-other", ErrConflict},
			{"empty claim id", "h1", "", ErrInvalid},
		} {
			if err := f.l.AttachInstance(ctx, "u1", tc.host, tc.claim, "<domain/>"); !errors.Is(err, tc.want) {
				t.Errorf("AttachInstance(%s) error = %v, want %v", tc.name, err, tc.want)
			}
			if got, _ := f.l.Instance(ctx, "u1"); !cmp.Equal(detached, got) {
				t.Errorf("AttachInstance(%s) changed the record: %+v", tc.name, got)
			}
		}
	})

	t.Run("attaching a committed claim twice records host, claim, node, placement and XML", func(t *testing.T) {
		f := newAttachFixture(t)
		f.attach(t)
		if err := f.l.AttachInstance(ctx, "u1", "h1", "c1", "<domain/>"); err != nil {
			t.Fatalf("AttachInstance(committed claim) again: %v", err)
		}
		in, _ := f.l.Instance(ctx, "u1")
		c := f.c
		if in.Host != "h1" || in.ClaimID != "c1" || !cmp.Equal(in.Node, []int{c.Usage[0].Cell}) ||
			in.Placement.String() != c.Placement.String() || in.DomainXML != "<domain/>" {
			t.Errorf("attached instance = host %q claim %q node %v placement %s xml %q; want h1 c1 [%d] %s <domain/>",
				in.Host, in.ClaimID, in.Node, in.Placement, in.DomainXML, c.Usage[0].Cell, c.Placement)
		}
	})

	t.Run("SetDomainXML replaces the XML of a known instance only", func(t *testing.T) {
		f := newAttachFixture(t)
		f.attach(t)
		if err := f.l.SetDomainXML(ctx, "u1", "<domain type='kvm'/>"); err != nil {
			t.Errorf("SetDomainXML: %v", err)
		}
		if in, _ := f.l.Instance(ctx, "u1"); in.DomainXML != "<domain type='kvm'/>" {
			t.Errorf("after SetDomainXML the record has xml %q, want <domain type='kvm'/>", in.DomainXML)
		}
		if err := f.l.SetDomainXML(ctx, "nope", "<domain/>"); !errors.Is(err, ErrUnknownInstance) {
			t.Errorf("SetDomainXML(nope) error = %v, want ErrUnknownInstance", err)
		}
	})

	// Host and NUMA data go after, never before, the release.
	t.Run("detach and delete are refused before the release", func(t *testing.T) {
		f := newAttachFixture(t)
		f.attach(t)
		if err := f.l.DetachInstance(ctx, "u1", "c1"); !errors.Is(err, ErrConflict) {
			t.Errorf("DetachInstance before Release: error = %v, want ErrConflict", err)
		}
		if err := f.l.DeleteInstance(ctx, "u1"); !errors.Is(err, ErrConflict) {
			t.Errorf("DeleteInstance while attached: error = %v, want ErrConflict", err)
		}
		if got, _ := f.l.Instance(ctx, "u1"); got.Host != "h1" || got.ClaimID != "c1" {
			t.Errorf("refused detach/delete changed the record: %+v", got)
		}
	})

	t.Run("detaching after the release twice clears all but the domain XML", func(t *testing.T) {
		f := newAttachFixture(t)
		f.attach(t)
		if err := f.l.Release(ctx, "h1", "c1"); err != nil {
			t.Fatal(err)
		}
		if err := f.l.DetachInstance(ctx, "u1", "c-other"); !errors.Is(err, ErrConflict) {
			t.Errorf("DetachInstance(another claim) error = %v, want ErrConflict", err)
		}
		for i := range 2 {
			if err := f.l.DetachInstance(ctx, "u1", "c1"); err != nil {
				t.Errorf("DetachInstance after Release #%d: %v", i+1, err)
			}
		}
		in, _ := f.l.Instance(ctx, "u1")
		if in.Host != "" || in.ClaimID != "" || in.Node != nil || in.Placement != nil || in.DomainXML != "<domain/>" {
			t.Errorf("detached instance = host %q claim %q node %v placement %v xml %q; want all cleared but the domain XML",
				in.Host, in.ClaimID, in.Node, in.Placement, in.DomainXML)
		}
	})

	t.Run("deleting a detached instance twice removes its record", func(t *testing.T) {
		f := newAttachFixture(t)
		f.attach(t)
		f.detach(t)
		for i := range 2 {
			if err := f.l.DeleteInstance(ctx, "u1"); err != nil {
				t.Errorf("DeleteInstance #%d: %v", i+1, err)
			}
		}
		if _, err := f.l.Instance(ctx, "u1"); !errors.Is(err, ErrUnknownInstance) {
			t.Errorf("Instance after DeleteInstance: error = %v, want ErrUnknownInstance", err)
		}
		if err := f.l.DetachInstance(ctx, "u1", "c1"); !errors.Is(err, ErrUnknownInstance) {
			t.Errorf("DetachInstance(deleted) error = %v, want ErrUnknownInstance", err)
		}
	})
}

// TestMigrationMovesAttachment walks the end of a live migration: the
// destination claim is committed and attached, then the source released.
func TestMigrationMovesAttachment(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "src", testHost(1, 4))
	register(t, l, "dst", testHost(1, 4))
	if _, err := l.CreateInstance(ctx, "u1", "vm-1", flavor, guest.VMActive, ""); err != nil {
		t.Fatal(err)
	}
	r, _ := flavor.Request()
	claim := func(id, host string, kind ClaimKind) {
		s := spec(id, host, r)
		s.InstanceUUID, s.Kind = "u1", kind
		if _, err := l.Claim(ctx, s); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Commit(ctx, host, id); err != nil {
			t.Fatal(err)
		}
	}
	claim("a", "src", KindInstance)
	if err := l.AttachInstance(ctx, "u1", "src", "a", ""); err != nil {
		t.Fatal(err)
	}
	claim("b", "dst", KindMigrationDest)
	if err := l.AttachInstance(ctx, "u1", "dst", "b", ""); err != nil {
		t.Fatalf("AttachInstance(destination): %v", err)
	}
	// The source claim is no longer named by the instance: detaching from
	// it is refused, releasing it is what remains.
	if err := l.DetachInstance(ctx, "u1", "a"); !errors.Is(err, ErrConflict) {
		t.Errorf("DetachInstance(source claim) after the move: error = %v, want ErrConflict", err)
	}
	if err := l.Release(ctx, "src", "a"); err != nil {
		t.Fatal(err)
	}
	in, _ := l.Instance(ctx, "u1")
	if in.Host != "dst" || in.ClaimID != "b" {
		t.Errorf("after migration: host %q claim %q, want dst b", in.Host, in.ClaimID)
	}
	if s := snapshot(t, l, "src"); len(s.Claims) != 0 {
		t.Errorf("source claims after migration: %v, want none", s.Claims)
	}
}

// TestStagedDomainXML: a move that takes the XML staged for its claim makes
// it the record's domain XML, with its digest, and forgets it; its retry
// changes nothing; a move whose claim has nothing staged leaves no stale
// XML behind.
func TestStagedDomainXML(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "src", testHost(1, 4))
	register(t, l, "dst", testHost(1, 4))
	if _, err := l.CreateInstance(ctx, "u1", "vm-1", flavor, guest.VMActive, ""); err != nil {
		t.Fatal(err)
	}
	claim := func(id, host string) { committedClaim(t, l, id, host, "u1", KindInstance, flavor) }
	record := func(want Home, wantXML string) {
		t.Helper()
		in, err := l.Instance(ctx, "u1")
		if err != nil {
			t.Fatal(err)
		}
		home, err := l.Home(ctx, "u1")
		if err != nil {
			t.Fatal(err)
		}
		home.VMState, home.TaskState = "", "" // TestHome's
		if in.DomainXML != wantXML || home != want {
			t.Errorf("record: xml %q, home %+v; want %q, %+v", in.DomainXML, home, wantXML, want)
		}
	}
	claim("a", "src")
	if err := l.AttachInstance(ctx, "u1", "src", "a", "<src/>"); err != nil {
		t.Fatal(err)
	}

	if err := l.StageDomainXML(ctx, "u1", "b", "<dst/>"); err != nil {
		t.Fatalf("StageDomainXML: %v", err)
	}
	if got, err := l.StagedDomainXML(ctx, "u1", "b"); err != nil || got != "<dst/>" {
		t.Errorf("StagedDomainXML(b) = %q, %v; want <dst/>", got, err)
	}
	if _, err := l.StagedDomainXML(ctx, "u1", "a"); !errors.Is(err, ErrConflict) {
		t.Errorf("StagedDomainXML(a), staged for b = %v, want ErrConflict", err)
	}
	// Staging changes nothing the record says until the move.
	record(Home{Host: "src", ClaimID: "a", DomainDigest: DomainDigest("<src/>")}, "<src/>")

	claim("b", "dst")
	toDst := Move{Host: "dst", ClaimID: "b", StagedXML: true, ClearResize: true}
	for _, try := range []string{"move", "retry"} {
		if err := l.MoveInstance(ctx, "u1", toDst); err != nil {
			t.Fatalf("%s taking the staged XML: %v", try, err)
		}
		record(Home{Host: "dst", ClaimID: "b", DomainDigest: DomainDigest("<dst/>")}, "<dst/>")
	}
	if _, err := l.StagedDomainXML(ctx, "u1", "b"); !errors.Is(err, ErrConflict) {
		t.Errorf("StagedDomainXML(b) after the move took it = %v, want ErrConflict", err)
	}

	// Staged for another claim than the one moved to: the record's XML,
	// made for b's pins, goes.
	if err := l.StageDomainXML(ctx, "u1", "stray", "<stray/>"); err != nil {
		t.Fatal(err)
	}
	claim("c", "src")
	if err := l.MoveInstance(ctx, "u1", Move{Host: "src", ClaimID: "c", StagedXML: true}); err != nil {
		t.Fatalf("move with nothing staged for its claim: %v", err)
	}
	record(Home{Host: "src", ClaimID: "c"}, "")
	if got, err := l.StagedDomainXML(ctx, "u1", "stray"); err != nil || got != "<stray/>" {
		t.Errorf("another claim's staged XML after the move = %q, %v; want it kept", got, err)
	}

	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"StageDomainXML(unknown instance)", l.StageDomainXML(ctx, "nope", "b", "<x/>"), ErrUnknownInstance},
		{"StageDomainXML(bad claim id)", l.StageDomainXML(ctx, "u1", "b c", "<x/>"), ErrInvalid},
		{"StageDomainXML(empty XML)", l.StageDomainXML(ctx, "u1", "b", ""), ErrInvalid},
		{"MoveInstance(XML given and staged)", l.MoveInstance(ctx, "u1", Move{Host: "src", ClaimID: "c", DomainXML: "<x/>", StagedXML: true}), ErrInvalid},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s = %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	if _, err := l.StagedDomainXML(ctx, "nope", "b"); !errors.Is(err, ErrUnknownInstance) {
		t.Errorf("StagedDomainXML(unknown instance) = %v, want ErrUnknownInstance", err)
	}
	if got, _ := l.StagedDomainXML(ctx, "u1", "stray"); got != "<stray/>" {
		t.Errorf("refused calls changed the staged XML to %q", got)
	}
	record(Home{Host: "src", ClaimID: "c"}, "")
}

func TestHome(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 4))
	if _, err := l.Home(ctx, "u-none"); !errors.Is(err, ErrUnknownInstance) {
		t.Errorf("Home(unknown) error = %v, want ErrUnknownInstance", err)
	}
	if _, err := l.CreateInstance(ctx, "u1", "vm-1", flavor, guest.VMBuilding, ""); err != nil {
		t.Fatal(err)
	}
	if h, err := l.Home(ctx, "u1"); err != nil || h != (Home{VMState: guest.VMBuilding}) {
		t.Errorf("Home(detached) = %+v, %v; want no host, building", h, err)
	}
	r, err := flavor.Request()
	if err != nil {
		t.Fatal(err)
	}
	s := spec("c1", "h1", r)
	s.InstanceUUID = "u1"
	if _, err := l.Claim(ctx, s); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Commit(ctx, "h1", "c1"); err != nil {
		t.Fatal(err)
	}
	if err := l.AttachInstance(ctx, "u1", "h1", "c1", "<domain/>"); err != nil {
		t.Fatal(err)
	}
	want := Home{Host: "h1", ClaimID: "c1", DomainDigest: DomainDigest("<domain/>"), VMState: guest.VMBuilding}
	if h, err := l.Home(ctx, "u1"); err != nil || h != want {
		t.Errorf("Home(attached) = %+v, %v; want %+v", h, err, want)
	}
	if err := l.SetDomainXML(ctx, "u1", "<domain><name>x</name></domain>"); err != nil {
		t.Fatal(err)
	}
	if h, _ := l.Home(ctx, "u1"); h.DomainDigest != DomainDigest("<domain><name>x</name></domain>") || h.DomainDigest == want.DomainDigest {
		t.Errorf("Home after SetDomainXML has digest %q, want the new document's", h.DomainDigest)
	}
}
