package numa

// novaEmulation replays Nova's numa_fit_instance_to_host on top of this
// package's per-cell fit: the walk over every permutation of host cells, the
// fit / not-fit caches keyed on a guest cell id that a successful fit
// overwrites with the host cell id (reusing the cached cell as it is), and the
// page-size request that the first host cell tried resolves for good, and,
// on a host with PCI devices, the device and network check of each
// complete assignment (Nova is given no device stats for a host without
// devices, so there it checks only networks). When the emulation
// reproduces Nova's answer, the per-cell rules agree with Nova's, and any
// difference between Fit and Nova comes from those bugs.
type novaEmulation struct {
	fit     bool
	mapping []int // host cell id per guest cell
}

// permutationCount returns P(n, k), capped at limit+1.
func permutationCount(n, k int, limit int) int {
	p := 1
	for i := 0; i < k; i++ {
		p *= n - i
		if p > limit {
			return limit + 1
		}
	}
	return p
}

func emulateNova(h *Host, r *Request) novaEmulation { return walkPermutations(h, r, true) }

// cleanWalk is Nova's walk without its caches and page-size mutation, and
// with the devices checked on every host: the answer Fit must give, found
// by trying every permutation of host cells in order.
func cleanWalk(h *Host, r *Request) novaEmulation { return walkPermutations(h, r, false) }

func walkPermutations(h *Host, r *Request, bugs bool) novaEmulation {
	if !r.HasNUMA() {
		return novaEmulation{fit: true}
	}
	k, n := len(r.Cells), len(h.Cells)
	if n < k {
		return novaEmulation{}
	}
	order := h.cellOrder(r)
	d := newDeviceNeeds(h, r)
	holds := func(ids []int) bool {
		if bugs && len(h.Devices) == 0 {
			return d.networksReach(ids)
		}
		return d.holds(ids)
	}
	views := make([]*cellView, n)
	for pos, idx := range order {
		views[pos] = newCellView(&h.Cells[idx])
	}
	// Mutable guest cell state, as Nova's InstanceNUMACell objects.
	ids := make([]int, k)
	pages := make([]PageSize, k)
	hostOf := make([]int, k)
	for i := range r.Cells {
		ids[i], pages[i] = r.Cells[i].ID, r.Cells[i].PageSize
	}
	type pair struct{ host, guest int }
	fitCache, notFit := map[pair]bool{}, map[pair]bool{}

	perm := make([]int, k)
	used := make([]bool, n)
	var walk func(depth int) bool
	try := func() bool {
		for i := 0; i < k; i++ {
			v := views[perm[i]]
			key := pair{v.cell.ID, ids[i]}
			if bugs && notFit[key] {
				return false
			}
			if bugs && fitCache[key] {
				ids[i], hostOf[i] = v.cell.ID, v.cell.ID
				continue
			}
			g := r.Cells[i]
			if bugs {
				g.PageSize = pages[i]
			}
			reserved := 0
			if r.EmulatorPolicy == EmulatorPolicyIsolate && i == 0 {
				reserved = 1
			}
			if g.PageSize != 0 {
				if size := v.choosePageSize(g.PageSize, g.MemoryMB*1024); size != 0 {
					pages[i] = PageSize(size)
				}
			}
			if _, miss := v.fit(&g, reserved, h.Limits); miss != nil {
				notFit[key] = true
				return false
			}
			fitCache[key] = true
			ids[i], hostOf[i] = v.cell.ID, v.cell.ID
		}
		return holds(hostOf)
	}
	walk = func(depth int) bool {
		if depth == k {
			return try()
		}
		for pos := 0; pos < n; pos++ {
			if used[pos] {
				continue
			}
			used[pos] = true
			perm[depth] = pos
			ok := walk(depth + 1)
			used[pos] = false
			if ok {
				return true
			}
		}
		return false
	}
	if walk(0) {
		return novaEmulation{fit: true, mapping: hostOf}
	}
	return novaEmulation{}
}
