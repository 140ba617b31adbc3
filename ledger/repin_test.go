package ledger

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/numa"
)

// repinTo is the resident claim's placement with its vCPUs pinned to
// pcpus instead, in vCPU order.
func repinTo(t *testing.T, c *Claim, pcpus ...int) *numa.Placement {
	t.Helper()
	p := *c.Placement
	p.Cells = append([]numa.PlacedCell(nil), p.Cells...)
	cell := &p.Cells[0]
	cell.Pins = maps.Clone(cell.Pins)
	vcpus := cell.DedicatedVCPUs.List()
	if len(vcpus) != len(pcpus) {
		t.Fatalf("re-pin of %d vCPUs to %v", len(vcpus), pcpus)
	}
	for i, v := range vcpus {
		cell.Pins[v] = pcpus[i]
	}
	return &p
}

func verifyHost(t *testing.T, l *Ledger, host string) *Snapshot {
	t.Helper()
	s, err := l.Snapshot(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(); err != nil {
		t.Errorf("ledger of %s: %v", host, err)
	}
	return s
}

func pinOwners(s *Snapshot) map[int]string {
	out := map[int]string{}
	for _, p := range s.Pins {
		out[p.CPU] = p.ClaimID
	}
	return out
}

// TestRepin: a re-pin claim holds the target's new pCPUs beside the
// resident claim; its commit hands them over and frees those the target
// leaves, keeping the resident's id, token, memory and counters; a
// released re-pin claim frees only its own pCPUs. Both are retried
// safely, and the ledger verifies at every step.
func TestRepin(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(1, 8))
	res, err := l.Claim(ctx, ClaimSpec{ID: "vm", Host: "h1", InstanceUUID: "u1", Kind: KindBoot, OwnerWorkflowID: "wf", OwnerRunID: "r1",
		Request: dedicated(t, 2, 1024)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Commit(ctx, "h1", "vm"); err != nil {
		t.Fatal(err)
	}
	old := pinnedOf(res.Usage)
	keep := old.List()[0]
	spec := RepinSpec{ID: "rp", Host: "h1", InstanceUUID: "u1", Resident: "vm", OwnerWorkflowID: "wf", OwnerRunID: "r2",
		Target: repinTo(t, res, keep, 6)}
	for range 2 { // a retry gets the first claim
		c, err := l.ClaimRepin(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := pinnedOf(c.Usage).String(); got != "6" || c.Repins != "vm" || c.Placement != nil {
			t.Fatalf("re-pin claim pins %s, re-pins %q, placement %v; want 6, vm and none", got, c.Repins, c.Placement)
		}
	}
	s := verifyHost(t, l, "h1")
	if o := pinOwners(s); o[6] != "rp" || o[old.List()[1]] != "vm" || o[keep] != "vm" {
		t.Errorf("pins while the re-pin is pending = %v; want 6 the re-pin's, %s the guest's", o, old)
	}
	usage := s.Usage
	// A target the resident already holds in part is taken by another
	// claim: refused, naming the pCPU.
	if _, err := l.Claim(ctx, ClaimSpec{ID: "other", Host: "h1", InstanceUUID: "u2", Kind: KindBoot, OwnerWorkflowID: "wf2", OwnerRunID: "r1",
		Placement: repinTo(t, res, 6, 7)}); !errors.Is(err, ErrConflict) {
		t.Errorf("a claim of the re-pin's pCPU 6 = %v, want ErrConflict", err)
	}

	for range 2 { // a retry returns the committed claim
		c, err := l.CommitRepin(ctx, "h1", "vm", "rp")
		if err != nil {
			t.Fatal(err)
		}
		if got := pinnedOf(c.Usage); got.String() != numa.NewCPUSet(keep, 6).String() || c.Token != res.Token || c.Repin != "rp" {
			t.Errorf("resident after the commit pins %s with token %s, repin %q; want %d,6, token %s, repin rp", got, c.Token, c.Repin, keep, res.Token)
		}
	}
	s = verifyHost(t, l, "h1")
	if o := pinOwners(s); len(o) != 2 || o[6] != "vm" || o[keep] != "vm" {
		t.Errorf("pins after the commit = %v; want %d and 6 the guest's only", o, keep)
	}
	if fmt.Sprint(s.Usage) != fmt.Sprint(usage) {
		t.Errorf("usage after the commit = %v, want it unchanged %v", s.Usage, usage)
	}
	if _, err := l.GetClaim(ctx, "h1", "rp"); !errors.Is(err, ErrUnknownClaim) {
		t.Errorf("the re-pin claim after its commit: %v, want gone", err)
	}
	got, err := l.GetClaim(ctx, "h1", "vm")
	if err != nil || got.Placement.Cells[0].PinnedPCPUs().String() != numa.NewCPUSet(keep, 6).String() {
		t.Fatalf("resident claim after the commit = %+v, %v; want its placement pinned to %d,6", got, err, keep)
	}

	// An aborted re-pin frees only what it took.
	spec = RepinSpec{ID: "rp2", Host: "h1", InstanceUUID: "u1", Resident: "vm", OwnerWorkflowID: "wf", OwnerRunID: "r3",
		Target: repinTo(t, got, 4, 5)}
	if _, err := l.ClaimRepin(ctx, spec); err != nil {
		t.Fatal(err)
	}
	verifyHost(t, l, "h1")
	if err := l.Release(ctx, "h1", "rp2"); err != nil {
		t.Fatal(err)
	}
	s = verifyHost(t, l, "h1")
	if o := pinOwners(s); len(o) != 2 || o[6] != "vm" || o[keep] != "vm" {
		t.Errorf("pins after the re-pin was released = %v; want %d and 6 the guest's only", o, keep)
	}
	if _, err := l.CommitRepin(ctx, "h1", "vm", "rp2"); !errors.Is(err, ErrUnknownClaim) {
		t.Errorf("commit of a released re-pin = %v, want ErrUnknownClaim", err)
	}
	// Releasing the resident frees everything.
	if err := l.Release(ctx, "h1", "vm"); err != nil {
		t.Fatal(err)
	}
	if s := verifyHost(t, l, "h1"); len(s.Pins) != 0 || len(s.Usage) != 0 {
		t.Errorf("after the guest's release: pins %v, usage %v; want none", s.Pins, s.Usage)
	}
}

// TestRepinRefusals: a re-pin changes pinned pCPUs only, of the
// instance's own committed claim, and changes nothing when refused.
func TestRepinRefusals(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 4))
	claim := func(id, uuid string, p *numa.Placement) *Claim {
		t.Helper()
		spec := ClaimSpec{ID: id, Host: "h1", InstanceUUID: uuid, Kind: KindBoot, OwnerWorkflowID: "wf-" + uuid, OwnerRunID: "r1",
			Request: dedicated(t, 2, 1024)}
		if p != nil {
			spec.Request, spec.Placement = nil, p
		}
		c, err := l.Claim(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Commit(ctx, "h1", id); err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := claim("a", "u1", nil)
	// b beside a in its cell.
	lo := a.Placement.Cells[0].HostCell * 4
	b := claim("b", "u2", repinTo(t, a, lo+2, lo+3))
	before := verifyHost(t, l, "h1")
	otherCell := *a.Placement
	otherCell.Cells = []numa.PlacedCell{a.Placement.Cells[0]}
	otherCell.Cells[0].HostCell = 1 - a.Placement.Cells[0].HostCell
	otherCell.Cells[0].Pins = map[int]int{}
	for i, v := range a.Placement.Cells[0].DedicatedVCPUs.List() {
		otherCell.Cells[0].Pins[v] = otherCell.Cells[0].HostCell*4 + 2 + i
	}
	bigger := *repinTo(t, a, lo+1, lo)
	bigger.Cells = append([]numa.PlacedCell(nil), bigger.Cells...)
	bigger.Cells[0].MemoryMB = 2048
	for _, tt := range []struct {
		name string
		spec RepinSpec
		want error
		says string
	}{
		{"another cell", RepinSpec{Resident: "a", InstanceUUID: "u1", Target: &otherCell}, ErrInvalid, "keeps each guest cell on its host cell"},
		{"more memory", RepinSpec{Resident: "a", InstanceUUID: "u1", Target: &bigger}, ErrInvalid, "changes pinned pCPUs only"},
		{"another guest's claim", RepinSpec{Resident: "b", InstanceUUID: "u1", Target: repinTo(t, b, lo+3, lo+2)}, ErrConflict, "not instance u1's resident claim"},
		{"pCPUs another claim holds", RepinSpec{Resident: "a", InstanceUUID: "u1", Target: repinTo(t, a, lo, lo+2)}, ErrConflict, "taken by claim b"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.ID, tt.spec.Host, tt.spec.OwnerWorkflowID, tt.spec.OwnerRunID = "rp", "h1", "wf-u1", "r2"
			_, err := l.ClaimRepin(ctx, tt.spec)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("ClaimRepin = %v; want %v saying %q", err, tt.want, tt.says)
			}
			after := verifyHost(t, l, "h1")
			if len(after.Claims) != len(before.Claims) || !maps.Equal(pinOwners(after), pinOwners(before)) {
				t.Errorf("a refused re-pin changed the host: claims %d, pins %v; before %d, %v", len(after.Claims), pinOwners(after), len(before.Claims), pinOwners(before))
			}
		})
	}
}
