package numa

// solveWith is solve for a guest whose devices or networks tie its cells
// together: the lexicographically first assignment, over Nova's order of
// host cells, whose cells each fit and whose host cells together hold d.
// Whether d holds depends only on which host cells the guest gets, so the
// search remembers each set of used cells from which no completion holds,
// prunes sets that could not supply the devices even with every cell still
// free, and stops branching once no cell left could change the answer.
// Its cost grows with the number of cells that carry the guest's devices
// or networks; other cells never multiply it.
func (m *matcher) solveWith(d *deviceNeeds) ([]int, error) {
	k, n := len(m.req.Cells), len(m.order)
	if k == n {
		// Every host cell is the guest's: one set to check.
		assign, err := m.solve()
		if err != nil {
			return nil, err
		}
		if !d.holds(m.hostIDs(assign)) {
			return nil, m.devicesMiss(d, assign)
		}
		return assign, nil
	}
	relevant := d.relevant()
	sockets := d.usesSockets()
	assign := make([]int, k)
	used := make([]bool, n)
	dead := map[string]bool{}
	var search func(i int) bool
	search = func(i int) bool {
		if i == k {
			return d.holds(m.hostIDs(assign))
		}
		key := usedKey(used)
		if dead[key] {
			return false
		}
		ok := m.completable(i, used) && d.possible(m.reach(i, used, assign))
		if ok && m.open(i, used, assign, relevant, sockets) {
			ok = false
			for pos := 0; pos < n && !ok; pos++ {
				if used[pos] || !m.fits(i, pos) {
					continue
				}
				used[pos], assign[i] = true, pos
				if ok = search(i + 1); !ok {
					used[pos] = false
				}
			}
		} else if ok {
			// The cells left add nothing devices or networks care
			// about, so the cells used so far decide.
			ok = d.holds(m.hostIDs(assign[:i])) && m.extend(i, used, assign)
		}
		if !ok {
			dead[key] = true
		}
		return ok
	}
	if search(0) {
		return assign, nil
	}
	plain, err := m.solve()
	if err != nil {
		return nil, err
	}
	return nil, m.devicesMiss(d, plain)
}

// devicesMiss explains a guest whose cells fit but whose devices or
// networks do not, on the assignment Fit would have chosen without them.
func (m *matcher) devicesMiss(d *deviceNeeds, assign []int) error {
	ids := m.hostIDs(assign)
	res := ResourceNetworks
	if _, miss := d.take(ids); miss != nil {
		res = ResourceDevices
	}
	return &NoFitError{Resource: res, Reason: "every guest cell fits, but no choice of host cells supplies the guest's " +
		"devices and networks; " + d.why(ids)}
}

// hostIDs returns the host cell ids of the positions in assign.
func (m *matcher) hostIDs(assign []int) []int {
	ids := make([]int, len(assign))
	for i, pos := range assign {
		ids[i] = m.host.Cells[m.order[pos]].ID
	}
	return ids
}

func usedKey(used []bool) string {
	b := make([]byte, (len(used)+7)/8)
	for i, u := range used {
		if u {
			b[i/8] |= 1 << (i % 8)
		}
	}
	return string(b)
}

// fitsLater reports whether some guest cell from i on fits position pos.
func (m *matcher) fitsLater(i, pos int) bool {
	for g := i; g < len(m.req.Cells); g++ {
		if m.fits(g, pos) {
			return true
		}
	}
	return false
}

// reach is the host cell ids the guest could end up with once guest cells
// 0..i-1 are placed: theirs, and every free cell a later guest cell fits.
func (m *matcher) reach(i int, used []bool, assign []int) []int {
	ids := m.hostIDs(assign[:i])
	for pos := range m.order {
		if !used[pos] && m.fitsLater(i, pos) {
			ids = append(ids, m.host.Cells[m.order[pos]].ID)
		}
	}
	return ids
}

// open reports whether a free cell that a later guest cell fits could
// still change whether devices and networks hold: one that carries them,
// or, when sockets matter, one on a socket the guest does not have yet.
func (m *matcher) open(i int, used []bool, assign []int, relevant []bool, sockets bool) bool {
	var have map[int]bool
	if sockets {
		have = make(map[int]bool, i)
		for _, pos := range assign[:i] {
			have[m.host.Cells[m.order[pos]].Socket] = true
		}
	}
	for pos, idx := range m.order {
		if used[pos] || !m.fitsLater(i, pos) {
			continue
		}
		if relevant[idx] || (sockets && !have[m.host.Cells[idx].Socket]) {
			return true
		}
	}
	return false
}

// extend completes assign from guest cell i with the lexicographically
// first distinct host cells, each checked to leave a completion; false
// when there is none.
func (m *matcher) extend(i int, used []bool, assign []int) bool {
	for g := i; g < len(m.req.Cells); g++ {
		placed := false
		for pos := range m.order {
			if used[pos] || !m.fits(g, pos) {
				continue
			}
			used[pos] = true
			if m.completable(g+1, used) {
				assign[g], placed = pos, true
				break
			}
			used[pos] = false
		}
		if !placed {
			return false
		}
	}
	return true
}
