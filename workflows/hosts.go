package workflows

import (
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
)

// HostAdd registers a host, or registers an existing host's topology
// again. A simulated host is made in the simulator first; a libvirt
// host's topology is read from libvirt, and how to reach it is recorded
// only once the ledger registered it, so a host that cannot be reached
// or registered leaves the record of libvirt hosts as it was.
func HostAdd(ctx workflow.Context, in api.HostAddInput) (*api.HostAddResult, error) {
	s, err := newSaga(ctx, api.OpHostAdd, "", 3)
	if err != nil {
		return nil, err
	}
	s.setHosts(in.Host, "")
	switch {
	case (in.Topology == nil) == (in.Libvirt == nil):
		return nil, s.fail(activities.BadRequest("host add " + in.Host + ": give a topology or a libvirt configuration, one of the two"))
	case in.Topology != nil && in.Limits != nil:
		return nil, s.fail(activities.BadRequest("host add " + in.Host + ": a topology carries its own limits; Limits are a libvirt host's"))
	}
	topo := in.Topology
	var reach activities.LibvirtHostInput
	if in.Libvirt != nil {
		reach = activities.LibvirtHostInput{Host: in.Host, Config: *in.Libvirt}
		if err := s.hypervisorTry(ctx, "read the topology of "+in.Host+" from libvirt", &topo, a.ReadLibvirtHost, reach); err != nil {
			return nil, s.fail(err)
		}
		topo.Limits = in.Limits
	} else {
		add := activities.HostTopology{Host: in.Host, Topology: topo}
		if err := s.ledger(ctx, "add the simulated host "+in.Host, a.AddSimulatedHost, add).Get(ctx, nil); err != nil {
			return nil, s.fail(err)
		}
	}
	s.step()
	var gen int64
	register := activities.HostTopology{Host: in.Host, Topology: topo}
	if err := s.ledger(ctx, "register "+in.Host+" in the ledger", a.RegisterHost, register).Get(ctx, &gen); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	// Registered: the record of how to reach it follows whatever happens.
	ctx = s.commit(ctx)
	if in.Libvirt != nil {
		if err := s.ledger(ctx, "record how to reach "+in.Host, a.RecordLibvirtHost, reach).Get(ctx, nil); err != nil {
			return nil, s.fail(err)
		}
	}
	s.phase(api.PhaseCompleted, "")
	// The host as the ledger keeps it: shared CPUs apart from pinnable ones.
	kept := topo.Clone()
	_ = kept.SeparatePools() // RegisterHost refused an overlap
	return &api.HostAddResult{Host: in.Host, Generation: gen, Topology: kept}, nil
}

// HostDisable keeps new guests off an up host for maintenance: its guests
// stay, and it takes only operations that name it.
func HostDisable(ctx workflow.Context, in api.HostStateInput) (*activities.HostStatus, error) {
	return setHostState(ctx, api.OpHostDisable, in.Host, "disable "+in.Host, a.SetHostDisabled, activities.HostReasonInput{Host: in.Host, Reason: in.Reason})
}

// HostEnable lets pinflow choose a disabled host for new guests again.
func HostEnable(ctx workflow.Context, in api.HostStateInput) (*activities.HostStatus, error) {
	return setHostState(ctx, api.OpHostEnable, in.Host, "enable "+in.Host, a.SetHostEnabled, activities.HostInput{Host: in.Host})
}

// HostDown records an operator's statement that the host is fenced: it
// takes no claims, and its guests may be evacuated.
func HostDown(ctx workflow.Context, in api.HostStateInput) (*activities.HostStatus, error) {
	return setHostState(ctx, api.OpHostDown, in.Host, "mark "+in.Host+" down", a.SetHostDown,
		activities.HostReasonInput{Host: in.Host, Reason: in.Reason, AutoEvacuate: in.AutoEvacuate})
}

// HostAutoEvacuate turns a down host's automatic evacuation on or off:
// while on, every audit of the host starts an evacuation of each guest
// still there, so a guest no host could take yet (a full cloud, a server
// group's rule) is rebuilt once one can.
func HostAutoEvacuate(ctx workflow.Context, in api.HostAutoEvacuateInput) (*activities.HostStatus, error) {
	verb := "stop evacuating " + in.Host + " automatically"
	if in.On {
		verb = "evacuate " + in.Host + " automatically"
	}
	return setHostState(ctx, api.OpHostEvacuate, in.Host, verb, a.SetHostAutoEvacuate,
		activities.HostAutoEvacuateInput{Host: in.Host, On: in.On})
}

// setHostState is a host state change of one step, and its new status.
func setHostState(ctx workflow.Context, op api.Operation, host, summary string, step, arg any) (*activities.HostStatus, error) {
	s, err := newSaga(ctx, op, "", 1)
	if err != nil {
		return nil, err
	}
	s.setHosts(host, "")
	var st activities.HostStatus
	if err := s.ledger(ctx, summary, step, arg).Get(ctx, &st); err != nil {
		return nil, s.fail(err)
	}
	s.phase(api.PhaseCompleted, "")
	return &st, nil
}

// HostRemove removes a host that holds no guest (a fenced host that never
// comes back goes with the tombstones of its evacuated guests) from the
// ledger, and then its simulated machine.
func HostRemove(ctx workflow.Context, in api.HostRemoveInput) (*api.HostRemoveResult, error) {
	s, err := newSaga(ctx, api.OpHostRemove, "", 3)
	if err != nil {
		return nil, err
	}
	s.setHosts(in.Host, "")
	// An activity of its own, not a local one: its answer is in the
	// history before the removal runs, so a removal run again after it
	// took effect finds the host gone and knows this run removed it. It
	// heartbeats, so an attempt Temporal never delivers costs the
	// heartbeat timeout, not the ledger's.
	state := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: ledgerTimeout, HeartbeatTimeout: heartbeatTimeout, RetryPolicy: untilDone, Summary: "state of " + in.Host,
	})
	if err := workflow.ExecuteActivity(state, a.LoadHostStatus, in.Host).Get(ctx, nil); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	res := api.HostRemoveResult{Host: in.Host}
	if err := s.ledger(ctx, "remove "+in.Host+" from the ledger", a.RemoveHost, activities.HostInput{Host: in.Host}).Get(ctx, &res.Tombstones); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	// Gone from the ledger: the simulated machine follows whatever happens.
	ctx = s.commit(ctx)
	if err := s.ledger(ctx, "remove the simulated host "+in.Host, a.RemoveSimulatedHost, activities.HostInput{Host: in.Host}).Get(ctx, &res.Kept); err != nil {
		return nil, s.fail(err)
	}
	s.phase(api.PhaseCompleted, "")
	return &res, nil
}
