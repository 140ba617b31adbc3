package defrag

import (
	"context"
	"errors"

	"github.com/pinflow/pinflow/drain"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/placement"
)

// PlanHost plans the defragmentation of host (Make) from the ledger as it
// is now: the host's claims, and its guests at rest, running on their
// resident claims with no operation in flight. Every other claim's pCPUs
// stay where they are. Other hosts are read only when the plan needs
// migrations. r is the flavor to make room for, name its name for
// people; nil for none. It changes nothing.
func PlanHost(ctx context.Context, led *ledger.Ledger, host string, r *numa.Request, name string) (Plan, error) {
	return planHost(ctx, led, host, r, name, func() (map[string]*numa.Host, error) { return drain.Targets(ctx, led, host) })
}

// planHost is PlanHost with the targets of its migrations read by
// targets, only when the plan needs some.
func planHost(ctx context.Context, led *ledger.Ledger, host string, r *numa.Request, name string, targets func() (map[string]*numa.Host, error)) (Plan, error) {
	snap, err := led.Snapshot(ctx, host)
	if err != nil {
		return Plan{}, err
	}
	in := Input{Host: host, State: snap.Topology, For: r, ForName: name}
	groups := map[string]*placement.ServerGroup{}
	for _, c := range snap.Claims {
		inst, err := led.Instance(ctx, c.InstanceUUID)
		if errors.Is(err, ledger.ErrUnknownInstance) {
			continue
		}
		if err != nil {
			return Plan{}, err
		}
		facts := inst.Facts()
		if c.State != ledger.StateCommitted || inst.Host != host || inst.ClaimID != c.ID || inst.Placement == nil || facts.Running() != nil {
			continue
		}
		g := Guest{UUID: inst.UUID, Name: inst.Name, Placement: inst.Placement, Migratable: facts.CanLiveMigrate() == nil && len(facts.FixedDevices()) == 0}
		if req, err := inst.Request.Request(); err == nil {
			g.Request = req
		}
		if inst.Group != "" {
			if groups[inst.Group] == nil {
				if groups[inst.Group], err = placement.MemberGroup(ctx, led, inst.UUID); err != nil {
					return Plan{}, err
				}
			}
			g.Group = groups[inst.Group]
		}
		in.Guests = append(in.Guests, g)
	}
	plan := Make(in)
	if len(plan.Unplaceable) == 0 {
		return plan, nil
	}
	if in.Targets, err = targets(); err != nil {
		return Plan{}, err
	}
	return Make(in), nil
}
