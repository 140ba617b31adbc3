package numa

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomHost builds a host the way real ones look: cells of SMT cores,
// a shared/dedicated split or the legacy layout, some pCPUs pinned, page
// pools partly used.
func randomHost(rng *rand.Rand) *Host {
	ncells := 1 + rng.IntN(6)
	threads := 1 + rng.IntN(2)
	cores := 1 + rng.IntN(8)
	split := rng.IntN(3)
	h := &Host{PackCells: rng.IntN(4) == 0}
	if rng.IntN(3) > 0 {
		h.Limits = &Limits{CPUAllocationRatio: float64(1 + rng.IntN(16)), RAMAllocationRatio: 1 + rng.Float64()}
	}
	for i := 0; i < ncells; i++ {
		c := Cell{ID: i, MemoryMB: int64(1024 * (1 + rng.IntN(16))), Socket: i / 2}
		var all CPUSet
		for core := 0; core < cores; core++ {
			var ids []int
			for th := 0; th < threads; th++ {
				ids = append(ids, th*ncells*cores+i*cores+core)
			}
			s := NewCPUSet(ids...)
			c.Siblings = append(c.Siblings, s)
			all = all.Union(s)
		}
		switch split {
		case 0: // legacy: every CPU both shared and pinnable
			c.CPUs, c.PCPUs = all, all
		case 1: // the first core shared, the rest dedicated
			c.CPUs, c.PCPUs = c.Siblings[0], all.Difference(c.Siblings[0])
		default:
			c.PCPUs = all
		}
		for _, id := range c.PCPUs.List() {
			if rng.IntN(4) == 0 {
				c.PinnedCPUs = c.PinnedCPUs.Union(NewCPUSet(id))
			}
		}
		c.MemoryUsedMB = int64(rng.IntN(int(c.MemoryMB)))
		c.CPUUsage = rng.IntN(4)
		small := c.MemoryMB * 256
		c.Pages = []PagePool{{SizeKB: 4, Total: small, Used: rng.Int64N(small)}}
		if rng.IntN(2) == 0 {
			n := int64(256 + rng.IntN(1024))
			c.Pages = append(c.Pages, PagePool{SizeKB: 2048, Total: n, Used: rng.Int64N(n)})
		}
		h.Cells = append(h.Cells, c)
	}
	return h
}

func randomSpecs(rng *rand.Rand, vcpus int) map[string]string {
	pick := func(opts ...string) string { return opts[rng.IntN(len(opts))] }
	es := map[string]string{}
	set := func(k, v string) {
		if v != "" {
			es[k] = v
		}
	}
	set("hw:cpu_policy", pick("", "dedicated", "dedicated", "shared", "mixed"))
	set("hw:cpu_thread_policy", pick("", "", "prefer", "isolate", "require"))
	set("hw:emulator_threads_policy", pick("", "", "share", "isolate"))
	set("hw:numa_nodes", pick("", "", "1", "2", "3"))
	set("hw:mem_page_size", pick("", "", "small", "large", "any", "2048", "2MB"))
	if es["hw:cpu_policy"] == "mixed" {
		set("hw:cpu_dedicated_mask", fmt.Sprintf("^0-%d", rng.IntN(max(1, vcpus-1))))
	}
	if rng.IntN(8) == 0 {
		set("hw:cpu_realtime", "yes")
		set("hw:cpu_realtime_mask", "^0")
	}
	return es
}

func TestFitRandomPlacementsAreValid(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	fits := 0
	for i := 0; i < 3000; i++ {
		h := randomHost(rng)
		vcpus := 1 + rng.IntN(8)
		req, err := NewRequest(vcpus, int64(512*(1+rng.IntN(8))), randomSpecs(rng, vcpus), nil)
		if err != nil {
			var inv *InvalidRequestError
			if !errors.As(err, &inv) {
				t.Fatalf("NewRequest: %v is not an *InvalidRequestError", err)
			}
			continue
		}
		if fitOnce(t, h, req) {
			fits++
		}
	}
	if fits < 300 {
		t.Errorf("only %d of 3000 random requests fit; the generator or Fit is broken", fits)
	}
}

// fitOnce fits req on h, checks the placement and claims it on a copy.
func fitOnce(t *testing.T, h *Host, req *Request) bool {
	t.Helper()
	if err := h.Validate(); err != nil {
		t.Fatalf("random host invalid: %v", err)
	}
	p, err := Fit(h, req)
	if err != nil {
		var nf *NoFitError
		if !errors.As(err, &nf) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("Fit error %q is not a one-line *NoFitError", err)
		}
		return false
	}
	for _, prob := range placementProblems(h, req, p) {
		t.Errorf("Fit(%v) = %s: %s", req, p, prob)
	}
	if err := p.Check(); err != nil {
		t.Errorf("Fit placement fails Check: %v", err)
	}
	us, err := Usage(h, p)
	if err != nil {
		t.Fatalf("Usage(%s): %v", p, err)
	}
	claimed := h.Clone()
	if err := claimed.Add(us); err != nil {
		t.Fatalf("Add(Usage(%s)): %v", p, err)
	}
	claimed.Remove(us)
	for i := range h.Cells {
		if !claimed.Cells[i].PinnedCPUs.Equal(h.Cells[i].PinnedCPUs) || claimed.Cells[i].MemoryUsedMB != h.Cells[i].MemoryUsedMB {
			t.Errorf("Add then Remove of %s did not restore cell %d", p, h.Cells[i].ID)
		}
	}
	return true
}

func FuzzFit(f *testing.F) {
	for i := uint64(0); i < 16; i++ {
		f.Add(i, i*7+3)
	}
	f.Fuzz(func(t *testing.T, a, b uint64) {
		rng := rand.New(rand.NewPCG(a, b))
		h := randomHost(rng)
		vcpus := 1 + rng.IntN(12)
		req, err := NewRequest(vcpus, int64(256*(1+rng.IntN(16))), randomSpecs(rng, vcpus), nil)
		if err != nil {
			return
		}
		fitOnce(t, h, req)
	})
}

func TestFitNoFitSaysWhy(t *testing.T) {
	h := &Host{Cells: []Cell{
		{ID: 0, PCPUs: MustParse("0-3"), Siblings: singles("0-3"), MemoryMB: 4096, PinnedCPUs: MustParse("0-2"),
			Pages: []PagePool{{SizeKB: 4, Total: 1 << 20}}},
		{ID: 1, PCPUs: MustParse("4-7"), Siblings: singles("4-7"), MemoryMB: 1024,
			Pages: []PagePool{{SizeKB: 4, Total: 1 << 18}}},
	}}
	req, err := NewRequest(2, 2048, map[string]string{"hw:cpu_policy": "dedicated"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Fit(h, req)
	var nf *NoFitError
	if !errors.As(err, &nf) || len(nf.Misses) != 2 {
		t.Fatalf("Fit = %v, want a NoFitError with one miss per host cell", err)
	}
	want := map[int]Resource{0: ResourcePCPUs, 1: ResourceMemory}
	for _, m := range nf.Misses {
		if want[m.HostCell] != m.Resource {
			t.Errorf("miss on host cell %d: resource %q, want %q (%s)", m.HostCell, m.Resource, want[m.HostCell], m.Detail)
		}
	}
}

func TestFitFindsMatchingNovaMisses(t *testing.T) {
	// Guest cell 0 fits host cells 0 and 1; guest cell 1 only host cell 0.
	// The lexicographically first complete assignment is 0->1, 1->0.
	h := &Host{Cells: []Cell{
		{ID: 0, PCPUs: MustParse("0-3"), Siblings: singles("0-3"), MemoryMB: 8192, Pages: []PagePool{{SizeKB: 4, Total: 1 << 21}}},
		{ID: 1, PCPUs: MustParse("4-5"), Siblings: singles("4-5"), MemoryMB: 8192, Pages: []PagePool{{SizeKB: 4, Total: 1 << 21}}},
	}}
	req, err := NewRequest(5, 2048, map[string]string{"hw:cpu_policy": "dedicated", "hw:numa_nodes": "2",
		"hw:numa_cpus.0": "0", "hw:numa_mem.0": "1024", "hw:numa_cpus.1": "1-4", "hw:numa_mem.1": "1024"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Fit(h, req)
	if err != nil {
		t.Fatalf("Fit: %v", err)
	}
	if got := cellMapOf(p); got != "0->1,1->0" {
		t.Errorf("Fit mapping = %s, want 0->1,1->0", got)
	}
}

func singles(spec string) []CPUSet {
	var out []CPUSet
	for _, id := range MustParse(spec).List() {
		out = append(out, NewCPUSet(id))
	}
	return out
}
