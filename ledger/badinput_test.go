package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/numa"
)

func TestBadInputChangesNothing(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 4))
	held, err := l.Claim(ctx, spec("held", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatal(err)
	}
	// A placement of two vCPUs on pCPUs 8 and 9, which the host lacks.
	foreign := &numa.Placement{Cells: []numa.PlacedCell{{GuestCell: 0, HostCell: 0, DedicatedVCPUs: numa.MustParse("0-1"),
		Pins: map[int]int{0: 8, 1: 9}, MemoryMB: 512, CPUPolicy: numa.CPUPolicyDedicated}}}
	unknownCell := &numa.Placement{Cells: []numa.PlacedCell{{GuestCell: 0, HostCell: 7, DedicatedVCPUs: numa.MustParse("0"),
		Pins: map[int]int{0: 0}, MemoryMB: 512, CPUPolicy: numa.CPUPolicyDedicated}}}
	badPages := &numa.Placement{Cells: []numa.PlacedCell{{GuestCell: 0, HostCell: 1, DedicatedVCPUs: numa.MustParse("0"),
		Pins: map[int]int{0: 6}, MemoryMB: 512, PageSizeKB: 1048576, CPUPolicy: numa.CPUPolicyDedicated}}}
	malformed := &numa.Placement{Cells: []numa.PlacedCell{{GuestCell: 0, HostCell: 1, DedicatedVCPUs: numa.MustParse("0-1"),
		Pins: map[int]int{0: 6, 1: 6}, MemoryMB: 512, CPUPolicy: numa.CPUPolicyDedicated}}}

	with := func(f func(*ClaimSpec)) ClaimSpec {
		s := spec("new", "h1", dedicated(t, 1, 256))
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name string
		spec ClaimSpec
		want error
		// in is text the message must hold: the bad value and what is allowed.
		in string
	}{
		{"unknown host", with(func(s *ClaimSpec) { s.Host = "h9" }), ErrUnknownHost, `"h9" is not registered`},
		{"empty claim id", with(func(s *ClaimSpec) { s.ID = "" }), ErrInvalid, `claim id "": invalid input: claim ids are 1-200`},
		{"host name with a hash tag", with(func(s *ClaimSpec) { s.Host = "h{1}" }), ErrInvalid, `host name "h{1}"`},
		{"bad kind", with(func(s *ClaimSpec) { s.Kind = "resize" }), ErrInvalid, `claim kind "resize": invalid input: kinds are instance, migration-dest, unshelve, boot, quarantine, resize-dest, evacuation-dest or reservation`},
		{"no owner", with(func(s *ClaimSpec) { s.OwnerRunID = "" }), ErrInvalid, "must both be set"},
		{"request and placement", with(func(s *ClaimSpec) { s.Placement = foreign }), ErrInvalid, "exactly one of"},
		{"neither request nor placement", with(func(s *ClaimSpec) { s.Request = nil }), ErrInvalid, "exactly one of"},
		{"placement on pCPUs the host lacks", with(func(s *ClaimSpec) { s.Request, s.Placement = nil, foreign }), ErrInvalid, "pCPUs 8-9 are not pinnable"},
		{"placement on an unknown cell", with(func(s *ClaimSpec) { s.Request, s.Placement = nil, unknownCell }), ErrInvalid, "host has no cell 7"},
		{"placement with a page size the cell lacks", with(func(s *ClaimSpec) { s.Request, s.Placement = nil, badPages }), ErrInvalid, "no 1048576 KiB pages"},
		{"malformed placement", with(func(s *ClaimSpec) { s.Request, s.Placement = nil, malformed }), ErrInvalid, "share a pCPU"},
		{"placement on pCPUs another claim owns", with(func(s *ClaimSpec) { s.Request, s.Placement = nil, held.Placement }), ErrConflict, "already pinned"},
		{"claim id reused for another instance", with(func(s *ClaimSpec) { s.ID = "held" }), ErrConflict, "already claimed for boot of instance inst-held"},
	} {
		before := snapshot(t, l, "h1")
		_, err := l.Claim(ctx, tc.spec)
		if !errors.Is(err, tc.want) {
			t.Errorf("Claim(%s) error = %v, want %v", tc.name, err, tc.want)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "ledger: ") || strings.Count(msg, "ledger:") != 1 || !strings.Contains(msg, tc.in) {
			t.Errorf("Claim(%s) error = %q, want one \"ledger: \" prefix and %q", tc.name, msg, tc.in)
		}
		if diff := cmp.Diff(before, snapshot(t, l, "h1"), snapOpts...); diff != "" {
			t.Errorf("Claim(%s) changed the ledger (-before +after):\n%s", tc.name, diff)
		}
	}
	hosts, err := l.Hosts(ctx)
	if err != nil || !cmp.Equal(hosts, []string{"h1"}) {
		t.Errorf("Hosts() after bad input = %v, %v; want [h1]", hosts, err)
	}
}

func TestClaimExplicitPlacement(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 4))
	// Restore pCPUs 6 and 7 on cell 1, which Fit would not choose first.
	p := &numa.Placement{Cells: []numa.PlacedCell{{GuestCell: 0, HostCell: 1, DedicatedVCPUs: numa.MustParse("0-1"),
		Pins: map[int]int{0: 6, 1: 7}, MemoryMB: 512, CPUPolicy: numa.CPUPolicyDedicated}}}
	s := spec("restore", "h1", nil)
	s.Placement, s.Kind = p, KindInstance
	c, err := l.Claim(ctx, s)
	if err != nil {
		t.Fatalf("Claim(explicit placement): %v", err)
	}
	want := []numa.CellUsage{{Cell: 1, PinnedCPUs: numa.MustParse("6-7"), MemoryMB: 512, PageSizeKB: 4, Pages: 512 * 256, Dedicated: true}}
	if diff := cmp.Diff(want, c.Usage, cpuSetCmp); diff != "" {
		t.Errorf("Claim(explicit placement) usage (-want +got):\n%s", diff)
	}
	snapshot(t, l, "h1")
}

func TestRegisterHost(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 4))
	if _, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512))); err != nil {
		t.Fatal(err)
	}
	// Claim c2 on cell 1, pCPUs 4-5.
	p := &numa.Placement{Cells: []numa.PlacedCell{{GuestCell: 0, HostCell: 1, DedicatedVCPUs: numa.MustParse("0-1"),
		Pins: map[int]int{0: 4, 1: 5}, MemoryMB: 6000, CPUPolicy: numa.CPUPolicyDedicated}}}
	s := spec("c2", "h1", nil)
	s.Placement = p
	if _, err := l.Claim(ctx, s); err != nil {
		t.Fatal(err)
	}

	oneCell := testHost(1, 4)
	lessCPUs := testHost(2, 4)
	lessCPUs.Cells[1].PCPUs = numa.MustParse("6-7")
	lessCPUs.Cells[1].Siblings = []numa.CPUSet{numa.MustParse("6-7")}
	lessMemory := testHost(2, 4)
	lessMemory.Cells[1].MemoryMB = 4096
	dupCell := testHost(2, 4)
	dupCell.Cells[1].ID = 0
	// Usage in a registered topology is ignored: the claims are the usage.
	withUsage := testHost(2, 4)
	withUsage.Cells[0].MemoryUsedMB = 100
	grown := testHost(3, 4)
	hugeMemory := testHost(1, 1)
	hugeMemory.Cells[0].MemoryMB = 1<<63 - 1

	for _, tc := range []struct {
		name    string
		host    string
		topo    *numa.Host
		want    error
		wantGen int64
	}{
		{"identical", "h1", testHost(2, 4), nil, 1},
		{"identical but for usage", "h1", withUsage, nil, 1},
		{"dropping a cell a claim uses", "h1", oneCell, ErrConflict, 0},
		{"dropping pCPUs a claim pins", "h1", lessCPUs, ErrConflict, 0},
		{"too little memory for the claims", "h1", lessMemory, ErrConflict, 0},
		{"malformed topology", "h1", dupCell, ErrInvalid, 0},
		{"no topology", "h1", nil, ErrInvalid, 0},
		{"bad host name", "h 1", testHost(1, 1), ErrInvalid, 0},
		{"host name with the key separator", "h:2", testHost(1, 1), ErrInvalid, 0},
		{"memory past the bound", "h2", hugeMemory, ErrInvalid, 0},
		{"malformed topology of a new host", "h2", &numa.Host{}, ErrInvalid, 0},
		{"growing", "h1", grown, nil, 2},
	} {
		before := snapshot(t, l, "h1")
		gen, err := l.RegisterHost(ctx, tc.host, tc.topo)
		if !errors.Is(err, tc.want) || gen != tc.wantGen {
			t.Errorf("RegisterHost(%s, %s) = %d, %v; want %d, %v", tc.host, tc.name, gen, err, tc.wantGen, tc.want)
			continue
		}
		if tc.want == nil {
			continue
		}
		if diff := cmp.Diff(before, snapshot(t, l, "h1"), snapOpts...); diff != "" {
			t.Errorf("RegisterHost(%s, %s) changed the ledger (-before +after):\n%s", tc.host, tc.name, diff)
		}
	}
	s2 := snapshot(t, l, "h1")
	if s2.Generation != 2 || len(s2.Topology.Cells) != 3 || len(s2.Claims) != 2 {
		t.Errorf("after growing: generation %d, %d cells, %d claims; want 2, 3, 2", s2.Generation, len(s2.Topology.Cells), len(s2.Claims))
	}
	hosts, _ := l.Hosts(ctx)
	if !cmp.Equal(hosts, []string{"h1"}) {
		t.Errorf("Hosts() = %v, want [h1]: refused registrations list nothing", hosts)
	}
	// This ledger cached generation 1; a claim now fits on the new cell.
	for _, id := range []string{"c3", "c4", "c5"} {
		if _, err := l.Claim(ctx, spec(id, "h1", dedicated(t, 2, 512))); err != nil {
			t.Fatalf("Claim(%s) after growing: %v", id, err)
		}
	}
	if s := snapshot(t, l, "h1"); s.Topology.Cell(2).PinnedCPUs.IsEmpty() {
		t.Errorf("claims after growing never used the new cell 2: pins %v", s.Pins)
	}
}
