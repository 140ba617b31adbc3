package placement

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/pinflow/pinflow/ledger"
)

// ServerGroup is what a choice must keep of a server group: its rule and where
// its members hold claims. The ledger's claim enforces the hard rules
// whatever a choice does; a choice that keeps them too never proposes a
// host the claim would refuse (but for claims made since it read).
type ServerGroup struct {
	Name       string
	Policy     ledger.GroupPolicy
	MaxPerHost int
	// Host is where an affinity group's members are; "" when none is yet,
	// or when that host is fenced down and the next claim takes the group
	// elsewhere.
	Host string
	// On lists, per host, the members with a claim there.
	On map[string][]string
}

// others counts the members on host other than uuid.
func (g *ServerGroup) others(host, uuid string) int {
	n := 0
	for _, m := range g.On[host] {
		if m != uuid {
			n++
		}
	}
	return n
}

// Refuses says why the group's hard rule refuses member uuid on host, ""
// when it does not.
func (g *ServerGroup) Refuses(host, uuid string) string {
	switch g.Policy {
	case ledger.PolicyAffinity:
		if g.Host != "" && g.Host != host {
			return fmt.Sprintf("affinity group %s keeps its members on host %s", g.Name, g.Host)
		}
	case ledger.PolicyAntiAffinity:
		if n := g.others(host, uuid); n >= g.MaxPerHost {
			return fmt.Sprintf("anti-affinity group %s allows %d of its members per host, and %s holds %s", g.Name, g.MaxPerHost, host, g.membersOn(host, uuid))
		}
	}
	return ""
}

// Prefers ranks host for member uuid under a soft rule: lower is better,
// 0 for a host that keeps the rule (and for every host of a hard rule).
func (g *ServerGroup) Prefers(host, uuid string) int {
	switch g.Policy {
	case ledger.PolicySoftAntiAffinity:
		return g.others(host, uuid)
	case ledger.PolicySoftAffinity:
		if g.others(host, uuid) == 0 && g.hasOthers(uuid) {
			return 1
		}
	}
	return 0
}

// hasOthers says whether any member but uuid holds a claim anywhere.
func (g *ServerGroup) hasOthers(uuid string) bool {
	for h := range g.On {
		if g.others(h, uuid) > 0 {
			return true
		}
	}
	return false
}

// Add counts member uuid on host, as a plan that puts it there does.
func (g *ServerGroup) Add(host, uuid string) {
	if g.On == nil {
		g.On = map[string][]string{}
	}
	if !slices.Contains(g.On[host], uuid) {
		g.On[host] = append(g.On[host], uuid)
	}
	if g.Policy == ledger.PolicyAffinity && g.Host == "" {
		g.Host = host
	}
}

func (g *ServerGroup) membersOn(host, uuid string) string {
	var out []string
	for _, m := range g.On[host] {
		if m != uuid {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// Narrow applies the group's rule for member uuid to r: the hosts a hard
// rule refuses are excluded (an affinity group's host is the only one),
// and with soft set, so are the hosts a soft rule would rather avoid. A
// caller that finds no host with soft set narrows again without it: a
// soft rule gives way.
func (g *ServerGroup) Narrow(r *Request, uuid string, soft bool) {
	if g.Policy == ledger.PolicyAffinity && g.Host != "" {
		r.Only = []string{g.Host}
		return
	}
	for h := range g.On {
		if g.Refuses(h, uuid) != "" || (soft && g.Policy == ledger.PolicySoftAntiAffinity && g.Prefers(h, uuid) > 0) {
			r.Exclude = append(r.Exclude, h)
		}
	}
	if soft && g.Policy == ledger.PolicySoftAffinity && g.hasOthers(uuid) {
		for h := range g.On {
			if g.others(h, uuid) > 0 && !slices.Contains(r.Exclude, h) {
				r.Only = append(r.Only, h)
			}
		}
		slices.Sort(r.Only)
	}
	slices.Sort(r.Exclude)
}

// MemberGroup reads the server group guest uuid is a member of, with
// where its members hold claims; nil when it is no member. An affinity
// group whose host is fenced down has none: the next claim takes it
// elsewhere.
func MemberGroup(ctx context.Context, led *ledger.Ledger, uuid string) (*ServerGroup, error) {
	name, err := led.GroupOf(ctx, uuid)
	if err != nil || name == "" {
		return nil, err
	}
	return ReadServerGroup(ctx, led, name)
}

// ReadServerGroup reads server group name (ledger.ErrUnknownGroup if
// there is none) as MemberGroup does.
func ReadServerGroup(ctx context.Context, led *ledger.Ledger, name string) (*ServerGroup, error) {
	g, err := led.Group(ctx, name)
	if err != nil {
		return nil, err
	}
	on, err := led.GroupMembers(ctx, name)
	if err != nil {
		return nil, err
	}
	sg := &ServerGroup{Name: g.Name, Policy: g.Policy, MaxPerHost: g.MaxPerHost, Host: g.Host, On: on}
	if sg.Host != "" {
		st, err := led.HostStatus(ctx, sg.Host)
		switch {
		case errors.Is(err, ledger.ErrUnknownHost):
			sg.Host = ""
		case err != nil:
			return nil, err
		case st.State == ledger.HostDown:
			sg.Host = ""
		}
	}
	return sg, nil
}
