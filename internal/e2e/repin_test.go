package e2e

import (
	"context"
	"testing"

	"github.com/pinflow/pinflow/xmlpatch"
)

// TestRepin re-pins a running guest by hand and then packs it down by
// itself: each time its domain runs on the new pCPUs at the hypervisor,
// its record and claim say so, the pCPUs it left are free for the next
// boot, and the ledger checks. A re-pin onto another guest's pCPUs, or
// of the wrong count, is refused and changes nothing.
func TestRepin(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "8", "--memory-mb", "8192")
	vmA := s.boot("A", "a", 2)
	vmB := s.boot("B", "a", 2)
	runsOn := func(uuid, want string) {
		t.Helper()
		if got := s.guest(uuid).pcpus(); got != want {
			t.Errorf("the record of %s pins %q, want %q", uuid, got, want)
		}
		dom, err := s.simulator().Lookup(context.Background(), "a", uuid)
		if err != nil {
			t.Fatal(err)
		}
		pins, err := xmlpatch.Read(dom.XML)
		if err != nil {
			t.Fatal(err)
		}
		if got := pins.PinnedCPUs().String(); got != want {
			t.Errorf("the domain of %s is pinned to %q, want %q", uuid, got, want)
		}
		s.ok("check")
		s.noDoublePins("a")
	}
	runsOn(vmB, "2-3")

	s.ok("repin", vmB, "--pcpus", "6-7", "--wait")
	runsOn(vmB, "6-7")
	// The pCPUs B left are free: C boots onto them.
	vmC := s.boot("C", "a", 2)
	runsOn(vmC, "2-3")

	// Packed down: with A gone, B takes the lowest free pCPUs.
	s.ok("delete", vmA, "--wait")
	s.ok("repin", vmB, "--wait")
	runsOn(vmB, "0-1")

	before := s.ok("host", "show", "a")
	s.refused("taken by claim", "repin", vmB, "--pcpus", "2,4", "--wait")
	s.refused("3 pCPUs given", "repin", vmB, "--pcpus", "4-6", "--wait")
	s.refused("1 of those given are there", "repin", vmB, "--pcpus", "4,40", "--wait")
	if after := s.ok("host", "show", "a"); after != before {
		t.Errorf("a refused re-pin changed host a:\n%s\nthen\n%s", before, after)
	}
	runsOn(vmB, "0-1")
}
