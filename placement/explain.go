package placement

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// GroupTakes is the group of the hosts that take the guest.
const GroupTakes = "takes it"

// GroupServerGroup is the group of the hosts the hard rule of the guest's
// server group refuses.
const GroupServerGroup = "its server group's rule"

// lacks names, for an operator, what a host lacks for a guest.
var lacks = map[numa.Resource]string{
	numa.ResourcePCPUs:      "no NUMA cell with enough free pCPUs",
	numa.ResourceCPUs:       "no NUMA cell with enough shared CPUs",
	numa.ResourceMemory:     "no NUMA cell with enough free memory",
	numa.ResourcePages:      "no NUMA cell with enough free huge pages of the size",
	numa.ResourceThreads:    "no NUMA cell with the thread layout the thread policy needs",
	numa.ResourceHostMemory: "host memory over its allocation ratio",
	numa.ResourceHostVCPUs:  "shared vCPUs over the host's allocation ratio",
	numa.ResourceCells:      "too few NUMA cells for the guest's",
}

// FitGroup is why Fit refused a host, as one of a few groups an operator
// reads at a glance: what the host lacks.
func FitGroup(err error) string {
	var nf *numa.NoFitError
	if !errors.As(err, &nf) {
		return "cannot fit it"
	}
	var names []string
	for _, r := range nf.Lacks() {
		if l, ok := lacks[r]; ok {
			names = append(names, l)
		}
	}
	if len(names) == 0 {
		return "cannot fit it"
	}
	return strings.Join(names, ", ")
}

// StateGroup is the group of a host whose state takes no claims.
func StateGroup(st ledger.HostStatus) string {
	return fmt.Sprintf("host %s (takes no new guests)", st.State)
}

// Verdict is whether one host takes a guest, and why not.
type Verdict struct {
	Host string `json:"host"`
	// Group is GroupTakes, or why not in a few words shared by hosts.
	Group string `json:"group"`
	// Why is the particulars: the cell that missed and by how much.
	Why string `json:"why,omitempty"`
	// FreeAfter is the pCPUs a host that takes the guest keeps free.
	FreeAfter int `json:"free_after,omitempty"`
}

// Explanation is the answer for every host: the one Exhaustive chooses,
// and each host's verdict, grouped.
type Explanation struct {
	Choice   string    `json:"choice,omitempty"`
	Verdicts []Verdict `json:"verdicts"`
	Groups   []Group   `json:"groups"`
}

// Group is the hosts of one verdict group.
type Group struct {
	Group string   `json:"group"`
	Hosts []string `json:"hosts"`
}

// Explain fits the guest on every host, each read afresh, and says what
// each makes of it; it changes nothing. A disabled host is a candidate
// only when it is named, as a guest's operation names its destination.
// For a member of server group g (nil for none), a host the group's hard
// rule refuses says so.
func Explain(ctx context.Context, led *ledger.Ledger, r Request, named string, g *ServerGroup) (*Explanation, error) {
	q, err := newQuery(r)
	if err != nil {
		return nil, err
	}
	hosts, err := led.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	if named != "" {
		hosts = []string{named}
	}
	sort.Strings(hosts)
	states, err := led.HostStatuses(ctx, hosts)
	if err != nil {
		return nil, err
	}
	ex := &Explanation{Verdicts: []Verdict{}, Groups: []Group{}}
	var up []string
	for _, name := range hosts {
		st, registered := states[name]
		switch {
		case !registered:
		case q.exclude[name]:
			ex.Verdicts = append(ex.Verdicts, Verdict{Host: name, Group: "excluded: the guest runs there"})
		case !Usable(st) && !(named != "" && st.State == ledger.HostDisabled):
			ex.Verdicts = append(ex.Verdicts, Verdict{Host: name, Group: StateGroup(st), Why: st.Reason})
		case g != nil && g.Refuses(name, r.UUID) != "":
			ex.Verdicts = append(ex.Verdicts, Verdict{Host: name, Group: GroupServerGroup, Why: g.Refuses(name, r.UUID)})
		default:
			up = append(up, name)
		}
	}
	vers, err := led.HostVersions(ctx, up)
	if err != nil {
		return nil, err
	}
	views, err := readAll(ctx, led, up, vers, map[string]*numa.Host{})
	if err != nil {
		return nil, err
	}
	var best choice
	for _, v := range views {
		if v.Host == nil {
			continue // removed since it was listed
		}
		p, err := numa.Fit(v.Host, r.Request)
		if err != nil {
			ex.Verdicts = append(ex.Verdicts, Verdict{Host: v.Name, Group: FitGroup(err), Why: fitMiss(err)})
			continue
		}
		free := FreeAfter(v.Host, p)
		ex.Verdicts = append(ex.Verdicts, Verdict{Host: v.Name, Group: GroupTakes, FreeAfter: free})
		if best.beats(v.Name, free) {
			best = choice{v.Name, free}
		}
	}
	ex.Choice = best.name
	sort.Slice(ex.Verdicts, func(i, j int) bool { return ex.Verdicts[i].Host < ex.Verdicts[j].Host })
	at := map[string]int{}
	for _, v := range ex.Verdicts {
		i, ok := at[v.Group]
		if !ok {
			i = len(ex.Groups)
			at[v.Group] = i
			ex.Groups = append(ex.Groups, Group{Group: v.Group})
		}
		ex.Groups[i].Hosts = append(ex.Groups[i].Hosts, v.Host)
	}
	return ex, nil
}
