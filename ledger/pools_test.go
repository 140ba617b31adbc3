package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/numa"
)

// bothHost is a host of one cell whose 4 CPUs are each shared and
// pinnable, as a host given neither cpu_shared_set nor cpu_dedicated_set
// was registered before the ledger kept them apart.
func bothHost() *numa.Host {
	h := testHost(1, 4)
	h.Cells[0].CPUs = h.Cells[0].PCPUs
	return h
}

// TestRegisterHostKeepsPoolsApart: a host whose every CPU is both is
// kept with every CPU pinnable and none shared, so a floating guest is
// refused there; sets given that overlap are refused whole.
func TestRegisterHostKeepsPoolsApart(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "both", bothHost())
	s := snapshot(t, l, "both")
	if c := s.Topology.Cells[0]; !c.CPUs.IsEmpty() || c.PCPUs.String() != "0-3" {
		t.Errorf("RegisterHost(every CPU both) keeps shared %q and pinnable %q, want none shared and 0-3 pinnable", c.CPUs, c.PCPUs)
	}
	floating, err := numa.NewRequest(2, 512, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var nofit *numa.NoFitError
	if _, err := l.Claim(ctx, spec("f", "both", floating)); !errors.As(err, &nofit) || !strings.Contains(err.Error(), "no shared CPUs") {
		t.Errorf("Claim(floating) on a host without shared CPUs = %v, want a no-fit saying so", err)
	}
	if _, err := l.Claim(ctx, spec("p", "both", dedicated(t, 4, 512))); err != nil {
		t.Errorf("Claim(4 pinned) on a host of 4 pinnable CPUs: %v", err)
	}

	overlap := testHost(1, 4)
	overlap.Cells[0].CPUs = numa.Range(0, 1)
	overlap.Cells[0].PCPUs = numa.Range(1, 3)
	_, err = l.RegisterHost(ctx, "overlap", overlap)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "cpus 1 are both shared and dedicated") {
		t.Errorf("RegisterHost(shared 0-1, pinnable 1-3) = %v, want ErrInvalid naming cpu 1", err)
	}
	if hosts, err := l.Hosts(ctx); err != nil || len(hosts) != 1 {
		t.Errorf("Hosts() after a refused registration = %v, %v; want only the host registered before", hosts, err)
	}
}

// TestStoredHostKeptApart: a topology stored before the ledger kept the
// sets apart is read with every CPU that is both pinnable only, by a
// ledger that never cached it, so no new guest floats over pinned pCPUs.
func TestStoredHostKeptApart(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	register(t, l, "old", testHost(1, 4))
	data, err := json.Marshal(bothHost())
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, l.hostKeys("old").topo, "topology", data).Err(); err != nil {
		t.Fatal(err)
	}
	fresh, err := New(rdb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := fresh.Host(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	if c := h.Cells[0]; !c.CPUs.IsEmpty() || c.PCPUs.String() != "0-3" {
		t.Errorf("Host(old) reads shared %q and pinnable %q, want none shared and 0-3 pinnable", c.CPUs, c.PCPUs)
	}
	s, err := fresh.Snapshot(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Topology.Cells[0].CPUs.IsEmpty() {
		t.Errorf("Snapshot(old) reads shared CPUs %s, want none", s.Topology.Cells[0].CPUs)
	}
}

// TestVerifyFindsFloatingOverPins: a claim whose guest floats over the
// whole host (a placement recorded before floating guests had a cpuset)
// beside another guest's pinned claim breaks the promise, and Verify says
// which claims and pCPUs.
func TestVerifyFindsFloatingOverPins(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	h := testHost(1, 4)
	h.Cells[0].CPUs = numa.Range(4, 5)
	h.Cells[0].Siblings = append(h.Cells[0].Siblings, numa.Range(4, 5))
	register(t, l, "h1", h)
	if _, err := l.Claim(ctx, spec("p", "h1", dedicated(t, 2, 512))); err != nil {
		t.Fatal(err)
	}
	floating, err := numa.NewRequest(1, 512, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, spec("f", "h1", floating)); err != nil {
		t.Fatal(err)
	}
	s := snapshot(t, l, "h1") // floating over the shared set: no break
	for i := range s.Claims {
		if s.Claims[i].ID == "f" {
			p := *s.Claims[i].Placement
			p.FloatCPUs = numa.CPUSet{}
			s.Claims[i].Placement = &p
		}
	}
	pinned := ""
	for _, p := range s.Pins {
		if pinned != "" {
			pinned += ","
		}
		pinned += itoa(p.CPU)
	}
	want := "claim f of inst-f floats over pCPUs " + numa.MustParse(pinned).String() + " that claim p dedicates to inst-p"
	if err := s.Verify(); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Verify(a floating claim without a cpuset beside a pinned one) = %v, want %q", err, want)
	}
}
