package numa

import (
	"fmt"
	"strings"
	"testing"
)

// poolProperty is a pool's value of a property a device spec names, read
// from the pool as the case gives it, without the fitting code.
func poolProperty(p DevicePool, key string) (string, bool) {
	switch key {
	case "vendor_id":
		return p.VendorID, true
	case "product_id":
		return p.ProductID, true
	case "dev_type":
		return string(p.DevType), true
	case "count", "numa_node":
		return "", false
	}
	v, ok := p.Tags[key]
	return v, ok
}

// poolServes reports whether a pool's devices may serve request r: they
// have every property of one of its specs, and are PFs, vDPA devices or
// remote-managed only when r asks for such.
func poolServes(p DevicePool, r PCIRequest) bool {
	matched := false
	for _, s := range r.Specs {
		all := true
		for k, v := range s {
			pv, ok := poolProperty(p, k)
			if !ok || !strings.EqualFold(pv, v) {
				all = false
			}
		}
		matched = matched || all
	}
	asked := func(k, v string) bool {
		for _, s := range r.Specs {
			if s[k] == v {
				return true
			}
		}
		return false
	}
	truthy := func(v string) bool {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "1", "t", "true", "on", "y", "yes":
			return true
		}
		return false
	}
	askedRemote := false
	for _, s := range r.Specs {
		askedRemote = askedRemote || truthy(s["remote_managed"])
	}
	switch {
	case !matched:
		return false
	case p.DevType == DeviceTypePF && !asked("dev_type", "type-PF"):
		return false
	case p.DevType == DeviceTypeVDPA && !asked("dev_type", "vdpa"):
		return false
	case truthy(p.Tags["remote_managed"]) && !askedRemote:
		return false
	}
	return true
}

// deviceProblems lists every way p's PCI devices break r's requests on h:
// a take from a pool that cannot serve its request, a request given more
// or fewer devices than its count, a pool giving more than it has, a
// device farther from the guest's host cells than the request's policy
// allows.
func deviceProblems(h *Host, r *Request, p *Placement) []string {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	cells := map[int]bool{}
	sockets := map[int]bool{}
	for _, pc := range p.Cells {
		cells[pc.HostCell] = true
		if c := h.Cell(pc.HostCell); c != nil {
			sockets[c.Socket] = true
		}
	}
	socketsKnown := true
	for _, c := range h.Cells {
		socketsKnown = socketsKnown && !c.SocketUnknown
	}
	got := make([]int, len(r.PCI))
	fromPool := make([]int, len(h.Devices))
	for _, d := range p.Devices {
		if d.Request < 0 || d.Request >= len(r.PCI) || d.Pool < 0 || d.Pool >= len(h.Devices) || d.Count < 1 {
			bad("device take %+v names no request, no pool or no devices", d)
			continue
		}
		req, pool := r.PCI[d.Request], h.Devices[d.Pool]
		got[d.Request] += d.Count
		fromPool[d.Pool] += d.Count
		if !poolServes(pool, req) {
			bad("request %d (%v) takes from pool %d (%v), which does not serve it", d.Request, req.Specs, d.Pool, pool.String())
		}
		if (d.HostCell == nil) != (pool.NUMANode == nil) || (d.HostCell != nil && *d.HostCell != *pool.NUMANode) {
			bad("pool %d is on %v, the take says %v", d.Pool, pool.NUMANode, d.HostCell)
		}
		if !p.HasNUMA() {
			continue
		}
		near := pool.NUMANode != nil && cells[*pool.NUMANode]
		switch req.Policy {
		case PCIPolicyRequired:
			if !near {
				bad("request %d is required on host cells %v, pool %d is not", d.Request, cells, d.Pool)
			}
		case PCIPolicyLegacy, "":
			if !near && pool.NUMANode != nil {
				bad("request %d (legacy) takes pool %d on another host cell", d.Request, d.Pool)
			}
		case PCIPolicySocket:
			if !near {
				c := h.Cell(*pool.NUMANode)
				if pool.NUMANode == nil || c == nil || !socketsKnown || !sockets[c.Socket] {
					bad("request %d (socket) takes pool %d off the guest's sockets", d.Request, d.Pool)
				}
			}
		}
	}
	for i, req := range r.PCI {
		if got[i] != req.Count {
			bad("request %d wants %d devices, got %d", i, req.Count, got[i])
		}
	}
	for i, n := range fromPool {
		if n > h.Devices[i].Count {
			bad("pool %d has %d devices, %d taken", i, h.Devices[i].Count, n)
		}
	}
	return probs
}

// deviceDifference explains a case where pinflow refuses a guest whose
// devices Nova's NUMA fit accepted without looking at them, or returns "".
// Each reason is checked here from the case alone.
func deviceDifference(c *Case, want novaAnswer, got Answer) string {
	if !want.Fit || got.Fit || got.Error != nil || want.Error != nil {
		return ""
	}
	h, r, err := c.Inputs()
	if err != nil || len(r.PCI) == 0 {
		return ""
	}
	if len(h.Devices) == 0 {
		return "the host has no PCI devices and the guest asks for some: Nova's fit was given no device stats and " +
			"skipped them (given the host's empty stats, Nova refuses it too)"
	}
	if r.HasNUMA() {
		return ""
	}
	for i, req := range r.PCI {
		n := 0
		for _, p := range h.Devices {
			if poolServes(p, req) {
				n += p.Count
			}
		}
		if n < req.Count {
			return fmt.Sprintf("the guest has no NUMA topology, so Nova's NUMA fit never looks at its devices; "+
				"request %d wants %d and the host has %d that serve it, which Nova's PCI filter refuses too", i, req.Count, n)
		}
	}
	return ""
}

// checkCleanWalk checks Fit against a walk of every permutation of host
// cells in Nova's order, without Nova's caches: for guests with devices or
// networks, the search Fit does instead must find the same first fit.
func checkCleanWalk(t *testing.T, id string, c *Case, got Answer) {
	t.Helper()
	h, r, err := c.Inputs()
	if err != nil || !r.HasNUMA() || (len(r.PCI) == 0 && r.Network == nil) ||
		permutationCount(len(h.Cells), len(r.Cells), 200000) > 200000 {
		return
	}
	want := cleanWalk(h, r)
	if got.Placement == nil {
		// A fit by cells that fails the host-level limits is pinflow's
		// own refusal, which the walk does not check.
		if want.fit && !strings.Contains(got.Why, "no fit: host ") {
			t.Errorf("%s: Fit: no fit (%s); walking every permutation fits %v", id, got.Why, want.mapping)
		}
		return
	}
	mapping := make([]int, len(got.Placement.Cells))
	for i, pc := range got.Placement.Cells {
		mapping[i] = pc.HostCell
	}
	if !want.fit || fmt.Sprint(mapping) != fmt.Sprint(want.mapping) {
		t.Errorf("%s: Fit: host cells %v; walking every permutation: fit=%v %v", id, mapping, want.fit, want.mapping)
	}
}
