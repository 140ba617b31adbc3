package numa

import (
	"errors"
	"testing"
)

// TestFitHoldsHostLevelLimits: Fit holds every guest, with a NUMA topology
// or without one, to the host's totals less what its guests already take.
func TestFitHoldsHostLevelLimits(t *testing.T) {
	// Two cells of 4096 MiB and 4 CPUs each, shared and pinnable.
	host := func(limits *Limits, usedMB int64, usedVCPUs int) *Host {
		h, err := Uniform(UniformSpec{Cells: 2, Cores: 4, Threads: 1, MemoryMB: 4096})
		if err != nil {
			t.Fatal(err)
		}
		h.Limits, h.MemoryUsedMB, h.VCPUUsage = limits, usedMB, usedVCPUs
		return h
	}
	req := func(vcpus int, memoryMB int64, specs map[string]string) *Request {
		r, err := NewRequest(vcpus, memoryMB, specs, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ratios := &Limits{CPUAllocationRatio: 2, RAMAllocationRatio: 1.5, ReservedHostMemoryMB: 512}
	pinned := map[string]string{"hw:cpu_policy": "dedicated"}
	for _, tc := range []struct {
		name    string
		h       *Host
		r       *Request
		fits    bool
		limitMB int64
		limitV  int64
	}{
		{"floating within the memory without limits", host(nil, 4096, 0), req(2, 4096, nil), true, 8192, 32},
		{"floating past the memory without limits", host(nil, 4096, 0), req(2, 4097, nil), false, 8192, 32},
		{"floating of 93 TiB", host(nil, 0, 0), req(2, 99999999999, nil), false, 8192, 32},
		{"floating past the vCPUs without limits", host(nil, 0, 30), req(3, 512, nil), false, 8192, 32},
		{"floating within the ratios less reserved", host(ratios, 0, 14), req(2, 11776, nil), true, 11776, 16},
		{"floating past the reserved memory", host(ratios, 0, 0), req(2, 11777, nil), false, 11776, 16},
		{"pinned past the host beside floating guests", host(nil, 7168, 0), req(2, 2048, pinned), false, 8192, 32},
		{"pinned takes no host vCPUs", host(nil, 0, 32), req(2, 1024, pinned), true, 8192, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if mem, vcpus := tc.h.HostLimits(); mem != tc.limitMB || vcpus != tc.limitV {
				t.Errorf("HostLimits() = %d MiB, %d vCPUs; want %d, %d", mem, vcpus, tc.limitMB, tc.limitV)
			}
			p, err := Fit(tc.h, tc.r)
			var nofit *NoFitError
			switch {
			case tc.fits && err != nil:
				t.Errorf("Fit(%d vCPUs, %d MiB) = %v, want a fit", tc.r.VCPUs, tc.r.MemoryMB, err)
			case !tc.fits && !errors.As(err, &nofit):
				t.Errorf("Fit(%d vCPUs, %d MiB) = %v, %v; want a *NoFitError", tc.r.VCPUs, tc.r.MemoryMB, p, err)
			}
		})
	}
}
