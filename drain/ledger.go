package drain

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/placement"
)

// PlanHost plans where every guest at rest on host goes (Make), from the
// ledger as it is now: the host's resident claims and their instance
// records, and every other host that takes new guests (up; disabled,
// down and returning hosts are no targets). Claims that are no guest at
// rest are reported as blocking, and, for a live drain, guests whose
// devices cannot be unplugged as not live. It changes nothing.
func PlanHost(ctx context.Context, led *ledger.Ledger, host string, live bool) (Plan, error) {
	snap, err := led.Snapshot(ctx, host)
	if err != nil {
		return Plan{}, err
	}
	var guests []Guest
	var blocked, notLive []Unplaceable
	groups := map[string]*placement.ServerGroup{}
	for _, c := range snap.Claims {
		inst, err := led.Instance(ctx, c.InstanceUUID)
		if err != nil && !errors.Is(err, ledger.ErrUnknownInstance) {
			return Plan{}, err
		}
		if c.State == ledger.StateCommitted && inst != nil && inst.Host == host && inst.ClaimID == c.ID {
			req, err := inst.Request.Request()
			if err != nil {
				blocked = append(blocked, Unplaceable{UUID: inst.UUID, Name: inst.Name, Reason: fmt.Sprintf("its flavor makes no request: %v", err)})
				continue
			}
			g, err := sharedGroup(ctx, led, groups, inst)
			if err != nil {
				return Plan{}, err
			}
			if fixed := inst.Facts().FixedDevices(); live && len(fixed) > 0 {
				notLive = append(notLive, Unplaceable{UUID: inst.UUID, Name: inst.Name,
					Reason: fmt.Sprintf("it passes through %s, which cannot be unplugged; --policy live-then-cold moves it cold", strings.Join(fixed, " and "))})
				continue
			}
			guests = append(guests, Guest{UUID: inst.UUID, Name: inst.Name, Request: req, Group: g})
			continue
		}
		b := Unplaceable{UUID: c.InstanceUUID, Reason: blockReason(&c)}
		if inst != nil {
			b.Name = inst.Name
		}
		blocked = append(blocked, b)
	}
	targets, err := Targets(ctx, led, host)
	if err != nil {
		return Plan{}, err
	}
	plan := Make(host, guests, targets)
	plan.Blocked, plan.NotLive = blocked, notLive
	return plan, nil
}

// blockReason says why a claim on a host to drain is no guest at rest.
func blockReason(c *ledger.Claim) string {
	switch {
	case c.Kind == ledger.KindQuarantine:
		return fmt.Sprintf("quarantine %s holds pCPUs until an operator releases it", c.ID)
	case c.State == ledger.StatePending:
		return fmt.Sprintf("claim %s (%s) is pending: operation %s is in flight", c.ID, c.Kind, c.OwnerWorkflowID)
	case c.State == ledger.StateHeld:
		return fmt.Sprintf("claim %s is a resize's source hold: confirm or revert the resize", c.ID)
	case c.State == ledger.StateTombstone:
		return fmt.Sprintf("claim %s is a tombstone of an evacuated guest", c.ID)
	default:
		return fmt.Sprintf("claim %s (%s, %s) is not its instance's resident claim on this host", c.ID, c.Kind, c.State)
	}
}

// Targets reads every host but source that takes new guests, in
// pipelines: one read per host in turn made a plan over 100,000 hosts
// wait on 100,000 round trips.
func Targets(ctx context.Context, led *ledger.Ledger, source string) (map[string]*numa.Host, error) {
	names, err := led.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	states, err := led.HostStatuses(ctx, names)
	if err != nil {
		return nil, err
	}
	var usable []string
	for _, n := range names {
		if n != source && placement.Usable(states[n]) {
			usable = append(usable, n)
		}
	}
	views, err := led.ReadHosts(ctx, usable, nil)
	if err != nil {
		return nil, err
	}
	// The views of one topology share its parts; Make clones each
	// host before it places a guest on it.
	targets := make(map[string]*numa.Host, len(views))
	for _, v := range views {
		if v.Host != nil { // removed meanwhile
			targets[v.Name] = v.Host
		}
	}
	return targets, nil
}

// sharedGroup is serverGroup of inst, read once per group for a plan of
// many guests: the plan counts its moves in it.
func sharedGroup(ctx context.Context, led *ledger.Ledger, groups map[string]*placement.ServerGroup, inst *ledger.Instance) (*placement.ServerGroup, error) {
	if inst.Group == "" {
		return nil, nil
	}
	if g, ok := groups[inst.Group]; ok {
		return g, nil
	}
	g, err := placement.MemberGroup(ctx, led, inst.UUID)
	if err != nil {
		return nil, err
	}
	groups[inst.Group] = g
	return g, nil
}
