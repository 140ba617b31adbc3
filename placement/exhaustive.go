package placement

import (
	"context"

	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// Exhaustive chooses by fitting the guest on every host, each read afresh:
// of the hosts that are up, not excluded and take the guest, the one left
// with the fewest free pinnable CPUs, ties broken by name. It is the
// reference the index's choices are held to, and the chooser for callers
// without an index. When no host takes the guest it returns a
// *numa.NoFitError naming the first few hosts by name and why each
// refused, and counting the rest.
func Exhaustive(ctx context.Context, led *ledger.Ledger, r Request) (string, error) {
	q, err := newQuery(r)
	if err != nil {
		return "", err
	}
	hosts, err := led.Hosts(ctx)
	if err != nil {
		return "", err
	}
	states, err := led.HostStatuses(ctx, hosts)
	if err != nil {
		return "", err
	}
	var up []string
	var m misses
	for _, name := range hosts {
		st, registered := states[name]
		switch {
		case !q.passes(name) || !registered:
		case !Usable(st):
			m.addState(name, st)
		default:
			up = append(up, name)
		}
	}
	vers, err := led.HostVersions(ctx, up)
	if err != nil {
		return "", err
	}
	views, err := readAll(ctx, led, up, vers, map[string]*numa.Host{})
	if err != nil {
		return "", err
	}
	var best choice
	for _, v := range views {
		if v.Host == nil {
			continue // removed since it was listed
		}
		p, err := numa.Fit(v.Host, r.Request)
		if err != nil {
			m.addFit(v.Name, err)
			continue
		}
		if free := FreeAfter(v.Host, p); best.beats(v.Name, free) {
			best = choice{v.Name, free}
		}
	}
	if best.name == "" {
		return "", m.err(r.UUID)
	}
	return best.name, nil
}

// readAll reads the named hosts afresh, in order, given their versions
// as read just before and topos, the topologies the caller holds by
// digest: a topology it lacks crosses the wire once, with the first host
// that has it, and the caller gains it.
func readAll(ctx context.Context, led *ledger.Ledger, names []string, vers []ledger.HostVersion, topos map[string]*numa.Host) ([]ledger.HostView, error) {
	digest := make(map[string]string, len(names))
	var first, rest []string
	asked := map[string]bool{}
	for i, n := range names {
		d := vers[i].Digest
		digest[n] = d
		if topos[d] == nil && !asked[d] {
			asked[d] = true
			first = append(first, n)
		} else {
			rest = append(rest, n)
		}
	}
	views, err := led.ReadHosts(ctx, first, nil)
	if err != nil {
		return nil, err
	}
	for _, v := range views {
		if v.Topology != nil && topos[v.Version.Digest] == nil {
			topos[v.Version.Digest] = v.Topology
		}
	}
	more, err := led.ReadHosts(ctx, rest, func(host string) (string, *numa.Host) {
		d := digest[host]
		return d, topos[d]
	})
	if err != nil {
		return nil, err
	}
	byName := make(map[string]ledger.HostView, len(views))
	for _, v := range views {
		byName[v.Name] = v
	}
	out := make([]ledger.HostView, 0, len(names))
	for i, j := 0, 0; i < len(names); i++ {
		if v, ok := byName[names[i]]; ok {
			out = append(out, v)
		} else {
			out = append(out, more[j])
			j++
		}
	}
	return out, nil
}
