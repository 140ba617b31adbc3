package defrag

import (
	"cmp"
	"context"
	"maps"
	"slices"

	"github.com/pinflow/pinflow/drain"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// suggestPlans bounds the hosts Suggest plans for: a refused boot waits
// for it, and a fleet whose first hosts by free pCPUs cannot take the
// guest after a defrag will rarely have one further down.
const suggestPlans = 16

// Suggest finds a host that takes new guests and would take r after a
// defrag, for a boot no host takes as they are: among those whose bare
// topology takes r and that have as many free pCPUs as r pins, the one
// whose plan has the fewest steps, of the suggestPlans with the most
// free pCPUs; ties go by name. ok is false when none would.
func Suggest(ctx context.Context, led *ledger.Ledger, r *numa.Request, name string, exclude []string) (Plan, bool, error) {
	hosts, err := drain.Targets(ctx, led, "")
	if err != nil {
		return Plan{}, false, err
	}
	need := 0
	for _, c := range r.Cells {
		need += c.DedicatedVCPUs.Len()
	}
	type candidate struct {
		name string
		free int
	}
	var candidates []candidate
	for n, h := range hosts {
		if slices.Contains(exclude, n) {
			continue
		}
		free := 0
		for i := range h.Cells {
			free += h.Cells[i].FreePCPUs().Len()
		}
		if _, err := numa.Fit(h.WithoutUsage(), r); err == nil && free >= need {
			candidates = append(candidates, candidate{n, free})
		}
	}
	slices.SortFunc(candidates, func(a, b candidate) int { return cmp.Or(b.free-a.free, cmp.Compare(a.name, b.name)) })
	var best Plan
	found := false
	for _, c := range candidates[:min(len(candidates), suggestPlans)] {
		// Its migrations go to the hosts read above, read once for all.
		others := func() (map[string]*numa.Host, error) {
			m := maps.Clone(hosts)
			delete(m, c.name)
			return m, nil
		}
		plan, err := planHost(ctx, led, c.name, r, name, others)
		if err != nil {
			return Plan{}, false, err
		}
		if plan.Fits && (!found || plan.Moves() < best.Moves() || plan.Moves() == best.Moves() && plan.Host < best.Host) {
			best, found = plan, true
		}
	}
	return best, found, nil
}
