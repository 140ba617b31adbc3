package numa

import (
	"fmt"
	"math"
)

// HostUsage is what a guest takes of its host as a whole, against the
// host's totals (Nova's MEMORY_MB and VCPU inventories in Placement):
// every guest's memory, and its vCPUs that float on shared CPUs. Pinned
// vCPUs take pCPUs instead, which never overcommit.
type HostUsage struct {
	MemoryMB int64 `json:"memory_mb"`
	VCPUs    int   `json:"vcpus"`
}

// defaultLimits are the host-level limits of a host without Limits:
// Nova's initial allocation ratios and no reserved memory. A host has
// only so much memory, limits or none.
var defaultLimits = Limits{CPUAllocationRatio: 4, RAMAllocationRatio: 1}

// HostUsage returns what the placed guest takes of its host as a whole:
// its cells' memory and shared vCPUs, or without a NUMA topology its
// memory and all its vCPUs.
func (p *Placement) HostUsage() HostUsage {
	if !p.HasNUMA() {
		return HostUsage{MemoryMB: p.MemoryMB, VCPUs: p.VCPUs}
	}
	var u HostUsage
	for _, c := range p.Cells {
		u.MemoryMB += c.MemoryMB
		u.VCPUs += c.SharedVCPUs.Len()
	}
	return u
}

// HostLimits returns the most memory (MiB) and shared vCPUs all guests of
// h may take together: the cells' memory times the RAM allocation ratio
// less the reserved memory, and the cells' shared CPUs times the CPU
// allocation ratio. Without Limits, Nova's initial ratios apply (1 for
// memory, 4 for CPUs).
func (h *Host) HostLimits() (memoryMB, vcpus int64) {
	l := h.Limits
	if l == nil {
		l = &defaultLimits
	}
	var mem int64
	for _, c := range h.Cells {
		mem += c.MemoryMB
	}
	return max(0, floorLimit(float64(mem)*l.RAMAllocationRatio)-l.ReservedHostMemoryMB),
		floorLimit(float64(h.SharedCPUs().Len()) * l.CPUAllocationRatio)
}

// floorLimit is the largest whole number not above limit, as usage >
// limit refuses whole numbers; a limit too large to bind (or not a
// number) is 2^62.
func floorLimit(limit float64) int64 {
	if !(limit < 1<<62) {
		return 1 << 62
	}
	return int64(math.Floor(max(limit, 0)))
}

// FitsHost says whether u more fits h's host-level limits (HostLimits)
// beside the host-level usage h has; no fit is a *NoFitError.
func (h *Host) FitsHost(u HostUsage) error {
	mem, vcpus := h.HostLimits()
	if u.MemoryMB > 0 && h.MemoryUsedMB+u.MemoryMB > mem {
		return &NoFitError{Reason: fmt.Sprintf("host memory usage would be %d MiB, above the limit %d MiB", h.MemoryUsedMB+u.MemoryMB, mem), Resource: ResourceHostMemory}
	}
	if u.VCPUs > 0 && h.SharedCPUs().IsEmpty() {
		return &NoFitError{Reason: "the host has no shared CPUs for vCPUs that float (no cpu_shared_set); its CPUs are for pinned vCPUs only", Resource: ResourceHostVCPUs}
	}
	if u.VCPUs > 0 && int64(h.VCPUUsage+u.VCPUs) > vcpus {
		return &NoFitError{Reason: fmt.Sprintf("host shared vCPU usage would be %d, above the limit %d", h.VCPUUsage+u.VCPUs, vcpus), Resource: ResourceHostVCPUs}
	}
	return nil
}

// AddHost adds u to h's host-level usage, as a claim does; it refuses,
// changing nothing, what FitsHost refuses.
func (h *Host) AddHost(u HostUsage) error {
	if err := h.FitsHost(u); err != nil {
		return err
	}
	h.MemoryUsedMB += u.MemoryMB
	h.VCPUUsage += u.VCPUs
	return nil
}

// RemoveHost takes u off h's host-level usage, as a release does.
func (h *Host) RemoveHost(u HostUsage) {
	h.MemoryUsedMB = max(0, h.MemoryUsedMB-u.MemoryMB)
	h.VCPUUsage = max(0, h.VCPUUsage-u.VCPUs)
}
