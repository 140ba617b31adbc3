package numa

import (
	"errors"
	"strings"
	"testing"
)

// TestSeparatePools: a host keeps its shared CPUs off its pinnable ones. A
// cell whose two sets are one (neither set given) keeps them pinnable; an
// overlap of two sets given is an error naming the CPUs; disjoint sets
// stay as they are.
func TestSeparatePools(t *testing.T) {
	for _, tt := range []struct {
		name                     string
		spec                     UniformSpec
		wantShared, wantPinnable string
		wantErr                  string
	}{
		{name: "neither set", spec: UniformSpec{Cells: 2, Cores: 3, Threads: 1}, wantShared: "", wantPinnable: "0-5"},
		{name: "disjoint", spec: UniformSpec{Cells: 1, Cores: 6, Threads: 1, Shared: Range(0, 1), Dedicated: Range(2, 5)},
			wantShared: "0-1", wantPinnable: "2-5"},
		{name: "dedicated only", spec: UniformSpec{Cells: 1, Cores: 4, Threads: 1, Dedicated: Range(1, 3)}, wantShared: "", wantPinnable: "1-3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.MemoryMB = 4096
			h, err := Uniform(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.SeparatePools(); err != nil {
				t.Fatalf("SeparatePools(%s) = %v, want nil", tt.name, err)
			}
			var pinnable CPUSet
			for _, c := range h.Cells {
				pinnable = pinnable.Union(c.PCPUs)
			}
			if got := h.SharedCPUs().String(); got != tt.wantShared {
				t.Errorf("SeparatePools(%s): shared CPUs %q, want %q", tt.name, got, tt.wantShared)
			}
			if got := pinnable.String(); got != tt.wantPinnable {
				t.Errorf("SeparatePools(%s): pinnable CPUs %q, want %q", tt.name, got, tt.wantPinnable)
			}
			if err := h.Validate(); err != nil {
				t.Errorf("SeparatePools(%s) left an invalid host: %v", tt.name, err)
			}
		})
	}

	// Sets given that overlap: a topology file can say so cell by cell.
	spec := HostSpec{CPUDedicatedSet: "1-3", CPUSharedSet: "0-1", Cells: []CellSpec{{ID: 0, CPUs: []int{0, 1, 2, 3}, MemoryMB: 4096}}}
	h, err := spec.Host(nil)
	if err != nil {
		t.Fatal(err)
	}
	err = h.SeparatePools()
	if err == nil || !strings.Contains(err.Error(), "cpus 1 are both shared and dedicated") {
		t.Fatalf("SeparatePools(shared 0-1, dedicated 1-3) = %v, want an error naming cpu 1", err)
	}
	if got := h.SharedCPUs().String(); got != "0" {
		t.Errorf("SeparatePools(shared 0-1, dedicated 1-3) leaves shared CPUs %q, want 0", got)
	}
	if got := h.SharedSet.String(); got != "0" {
		t.Errorf("SeparatePools(shared 0-1, dedicated 1-3) leaves cpu_shared_set %q, want 0", got)
	}
}

// TestFloatingGuestsGetTheSharedSet: Fit gives a guest without a NUMA
// topology the host's shared CPUs to float over, refuses it on a host
// without any, and Floats says where every placed guest's floating threads
// may run.
func TestFloatingGuestsGetTheSharedSet(t *testing.T) {
	h, err := Uniform(UniformSpec{Cells: 2, Cores: 4, Threads: 1, MemoryMB: 8192, Shared: NewCPUSet(0, 4), Dedicated: Range(1, 3).Union(Range(5, 7))})
	if err != nil {
		t.Fatal(err)
	}
	all := Range(0, 7)
	floating, err := NewRequest(2, 1024, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Fit(h, floating)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.FloatCPUs.String(); got != "0,4" {
		t.Errorf("Fit(floating).FloatCPUs = %q, want the shared set 0,4", got)
	}
	if got := p.Floats(all).String(); got != "0,4" {
		t.Errorf("Floats(floating) = %q, want 0,4", got)
	}
	if legacy := (&Placement{VCPUs: 2, MemoryMB: 1024}); !legacy.Floats(all).Equal(all) {
		t.Errorf("Floats(a placement without FloatCPUs) = %s, want the whole host %s", legacy.Floats(all), all)
	}
	mixed, err := NewRequest(2, 1024, map[string]string{"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "^0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = Fit(h, mixed); err != nil {
		t.Fatal(err)
	}
	pinned := p.Cells[0].PinnedPCPUs()
	if got, want := p.Floats(all), NewCPUSet(p.Cells[0].HostCPUs.List()...); !got.Equal(want) || got.Intersects(pinned) {
		t.Errorf("Floats(mixed) = %s, want its cell's shared CPUs %s and none of its pins %s", got, want, pinned)
	}

	pinnedOnly, err := Uniform(UniformSpec{Cells: 1, Cores: 4, Threads: 1, MemoryMB: 8192})
	if err != nil {
		t.Fatal(err)
	}
	if err := pinnedOnly.SeparatePools(); err != nil {
		t.Fatal(err)
	}
	var nofit *NoFitError
	if _, err := Fit(pinnedOnly, floating); !errors.As(err, &nofit) || !strings.Contains(err.Error(), "no shared CPUs") {
		t.Errorf("Fit(floating) on a host without shared CPUs = %v, want a no-fit that says it has no shared CPUs", err)
	}
	if _, err := Fit(pinnedOnly, mixed); !errors.As(err, &nofit) {
		t.Errorf("Fit(mixed) on a host without shared CPUs = %v, want a no-fit", err)
	}
}
