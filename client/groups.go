package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/placement"
)

// GroupView is a server group as an operator reads it: its rule, its
// members and where they are, and whether the rule holds now.
type GroupView struct {
	ledger.Group
	// Guests are the members, by uuid.
	Guests []GroupMember `json:"guests"`
	// OnHosts lists, per host, the members with a claim there (a member
	// moving has one on each end).
	OnHosts map[string][]string `json:"on_hosts"`
	// Holds says whether the ledger's claims keep the rule; Broken says
	// how they do not.
	Holds  bool     `json:"holds"`
	Broken []string `json:"broken,omitempty"`
	// AtRisk says how the rule breaks when a host fenced down comes back
	// with members that were not evacuated.
	AtRisk []string `json:"at_risk,omitempty"`
	// Moving are the members holding a slot of the disruption budget.
	Moving []string `json:"moving"`
}

// GroupMember is one member of a group.
type GroupMember struct {
	UUID    string `json:"uuid"`
	Name    string `json:"name"`
	Host    string `json:"host,omitempty"`
	VMState string `json:"vm_state"`
}

// CreateGroup makes a server group. Bad input (a name, a policy, a limit
// the policy does not take) wraps ErrInvalid; a group of that name with
// another rule is refused.
func (c *Client) CreateGroup(ctx context.Context, g ledger.Group) error {
	if err := ledger.CheckGroup(&g); err != nil {
		return fmt.Errorf("group create: %v: %w", err, ErrInvalid)
	}
	// Groups are keyed by name: a second create of one, even with the
	// same rule, is a mistake worth a line (the ledger lets it through).
	switch old, err := c.led.Group(ctx, g.Name); {
	case err == nil:
		rule := fmt.Sprintf("policy %s", old.Policy)
		if old.Policy == ledger.PolicyAntiAffinity {
			rule += fmt.Sprintf(", at most %d per host", old.MaxPerHost)
		}
		if old.MaxUnavailable > 0 {
			rule += fmt.Sprintf(", at most %d moving at once", old.MaxUnavailable)
		}
		return fmt.Errorf("group create %s: group %s exists with %s; choose another name, or delete group %s first", g.Name, g.Name, rule, g.Name)
	case !errors.Is(err, ledger.ErrUnknownGroup):
		return err
	}
	if err := c.led.CreateGroup(ctx, g); err != nil {
		if errors.Is(err, ledger.ErrExists) {
			return fmt.Errorf("group create %s: %s", g.Name, strings.TrimPrefix(err.Error(), "ledger: create group "+g.Name+": "))
		}
		return err
	}
	return nil
}

// DeleteGroup deletes a server group without members; one with members
// is refused, naming them.
func (c *Client) DeleteGroup(ctx context.Context, name string) error {
	if _, err := c.group(ctx, name); err != nil {
		return err
	}
	if err := c.led.DeleteGroup(ctx, name); err != nil {
		if errors.Is(err, ledger.ErrConflict) {
			return fmt.Errorf("group delete %s: %s", name, strings.TrimPrefix(err.Error(), "ledger: delete group "+name+": conflict: "))
		}
		return err
	}
	return nil
}

// Groups lists every server group with its members.
func (c *Client) Groups(ctx context.Context) ([]GroupView, error) {
	gs, err := c.led.Groups(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]GroupView, 0, len(gs))
	for _, g := range gs {
		v, err := c.view(ctx, &g)
		if err != nil {
			return nil, err
		}
		out = append(out, *v)
	}
	return out, nil
}

// Group reads one server group with its members, where they are, and
// whether its rule holds.
func (c *Client) Group(ctx context.Context, name string) (*GroupView, error) {
	g, err := c.group(ctx, name)
	if err != nil {
		return nil, err
	}
	return c.view(ctx, g)
}

// group reads group name, refusing an unknown one with one line.
func (c *Client) group(ctx context.Context, name string) (*ledger.Group, error) {
	if err := ledger.CheckGroupName(name); err != nil {
		return nil, fmt.Errorf("%v: %w", err, ErrInvalid)
	}
	g, err := c.led.Group(ctx, name)
	if errors.Is(err, ledger.ErrUnknownGroup) {
		return nil, fmt.Errorf("no server group %q: %w", name, ErrUnknownGroup)
	}
	return g, err
}

func (c *Client) view(ctx context.Context, g *ledger.Group) (*GroupView, error) {
	on, err := c.led.GroupMembers(ctx, g.Name)
	if err != nil {
		return nil, err
	}
	moving, err := c.led.GroupMoving(ctx, g.Name)
	if err != nil {
		return nil, err
	}
	v := &GroupView{Group: *g, Guests: []GroupMember{}, OnHosts: on, Moving: moving}
	for _, u := range g.Members {
		inst, err := c.led.Instance(ctx, u)
		if errors.Is(err, ledger.ErrUnknownInstance) {
			// Its delete was cut short; the group's delete drops it.
			v.Guests = append(v.Guests, GroupMember{UUID: u, VMState: "gone"})
			continue
		}
		if err != nil {
			return nil, err
		}
		v.Guests = append(v.Guests, GroupMember{UUID: u, Name: inst.Name, Host: inst.Host, VMState: string(inst.VMState)})
	}
	// A host fenced down keeps the tombstones of the members evacuated
	// from it: they run nowhere, and break no rule.
	states, err := c.led.HostStatuses(ctx, slices.Collect(maps.Keys(on)))
	if err != nil {
		return nil, err
	}
	live := map[string][]string{}
	for h, ms := range on {
		if st, ok := states[h]; !ok || st.State != ledger.HostDown {
			live[h] = ms
		}
	}
	v.Broken = breaches(g, live)
	v.Holds = len(v.Broken) == 0
	v.AtRisk = atRisk(g, v.Guests, states)
	return v, nil
}

// atRisk says how an affinity group's rule breaks when a host fenced
// down comes back: its members there that were not evacuated run again,
// beside members on another host (evacuated, or booted elsewhere).
func atRisk(g *ledger.Group, guests []GroupMember, states map[string]ledger.HostStatus) []string {
	if g.Policy != ledger.PolicyAffinity && g.Policy != ledger.PolicySoftAffinity {
		return nil
	}
	down := map[string][]string{}
	var elsewhere []string
	for _, m := range guests {
		switch {
		case m.Host == "":
		case states[m.Host].State == ledger.HostDown:
			down[m.Host] = append(down[m.Host], m.UUID)
		default:
			elsewhere = append(elsewhere, m.Host)
		}
	}
	var out []string
	for _, h := range slices.Sorted(maps.Keys(down)) {
		line := fmt.Sprintf("host %s is down with members %s not evacuated: evacuating the host moves them to the group's new host",
			h, strings.Join(down[h], ", "))
		if len(elsewhere) > 0 {
			slices.Sort(elsewhere)
			line += fmt.Sprintf("; if it comes back first, they run beside the members on %s", strings.Join(slices.Compact(elsewhere), ", "))
		}
		out = append(out, line)
	}
	return out
}

// GroupRulesOn says how the hard rules of the server groups with members
// on host are broken now, each with the way to repair it: a fenced host
// that came back runs its members that were not evacuated beside those
// moved or booted elsewhere meanwhile.
func (c *Client) GroupRulesOn(ctx context.Context, host string) ([]string, error) {
	views, err := c.Groups(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, v := range views {
		if v.Holds || !v.Policy.Hard() || !slices.ContainsFunc(v.Guests, func(m GroupMember) bool { return m.Host == host }) {
			continue
		}
		for _, b := range v.Broken {
			out = append(out, fmt.Sprintf("group %s: %s; migrate members until the group's rule holds", v.Name, b))
		}
	}
	return out, nil
}

// breaches says how the members' claims break the group's rule, hard or
// soft: a host with more anti-affinity members than allowed (a soft one:
// more than one), or affinity members on several hosts.
func breaches(g *ledger.Group, on map[string][]string) []string {
	var out []string
	hosts := slices.Sorted(maps.Keys(on))
	switch g.Policy {
	case ledger.PolicyAntiAffinity, ledger.PolicySoftAntiAffinity:
		max := max(g.MaxPerHost, 1)
		for _, h := range hosts {
			if len(on[h]) > max {
				out = append(out, fmt.Sprintf("host %s holds %d members (%s), the group allows %d", h, len(on[h]), strings.Join(on[h], ", "), max))
			}
		}
	case ledger.PolicyAffinity, ledger.PolicySoftAffinity:
		if len(hosts) > 1 {
			out = append(out, fmt.Sprintf("members are on %d hosts (%s), the group wants one", len(hosts), strings.Join(hosts, ", ")))
		}
	}
	return out
}

// checkGroupTarget refuses a host named for member uuid of group (""
// for none) when the group's hard rule would refuse the claim there,
// naming the rule and the members in the way, before anything starts.
func (c *Client) checkGroupTarget(ctx context.Context, op, uuid, group, host string) error {
	if group == "" || host == "" {
		return nil
	}
	g, err := placement.ReadServerGroup(ctx, c.led, group)
	if err != nil {
		return err
	}
	if why := g.Refuses(host, uuid); why != "" {
		return fmt.Errorf("%s: %w", op, &GroupRuleError{Host: host, Reason: why + "; another host, or none named, may keep it"})
	}
	return nil
}
