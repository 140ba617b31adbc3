package workflows

import (
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/numa"
)

// HostWorkflowID is the workflow id of every change to a whole host: its
// registration, its state as operators set it, its return (HostUp) and
// its removal. Started with conflict policy FAIL, it keeps two changes of
// one host from interleaving.
func HostWorkflowID(host string) string { return "host-" + host }

// HostAddInput is a host to register: its topology, or how libvirt
// reaches it (libvirt then reports the topology) and its limits.
type HostAddInput struct {
	Host     string              `json:"host"`
	Topology *numa.Host          `json:"topology,omitempty"`
	Libvirt  *libvirthost.Config `json:"libvirt,omitempty"`
	// Limits are a libvirt host's; a topology carries its own.
	Limits *numa.Limits `json:"limits,omitempty"`
}

// HostAddResult is a registration: the topology registered and the
// host's generation, which grows each time its topology changes.
type HostAddResult struct {
	Host       string     `json:"host"`
	Generation int64      `json:"generation"`
	Topology   *numa.Host `json:"topology"`
}

// HostAdd registers a host, or registers an existing host's topology
// again. A simulated host is made in the simulator first; a libvirt
// host's topology is read from libvirt, and how to reach it is recorded
// only once the ledger registered it, so a host that cannot be reached
// or registered leaves the record of libvirt hosts as it was.
func HostAdd(ctx workflow.Context, in HostAddInput) (*HostAddResult, error) {
	s, err := newSaga(ctx, OpHostAdd, "", 3)
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
	s.phase(PhaseCompleted, "")
	// The host as the ledger keeps it: shared CPUs apart from pinnable ones.
	kept := topo.Clone()
	_ = kept.SeparatePools() // RegisterHost refused an overlap
	return &HostAddResult{Host: in.Host, Generation: gen, Topology: kept}, nil
}

// HostStateInput is a change of a host's state; the reason is the
// operator's, for the record.
type HostStateInput struct {
	Host   string `json:"host"`
	Reason string `json:"reason,omitempty"`
	// AutoEvacuate, for HostDown, has every audit of the host evacuate
	// its guests until it returns (HostAutoEvacuate).
	AutoEvacuate bool `json:"auto_evacuate,omitempty"`
}

// HostDisable keeps new guests off an up host for maintenance: its guests
// stay, and it takes only operations that name it.
func HostDisable(ctx workflow.Context, in HostStateInput) (*activities.HostStatus, error) {
	return setHostState(ctx, OpHostDisable, in.Host, "disable "+in.Host, a.SetHostDisabled, activities.HostReasonInput{Host: in.Host, Reason: in.Reason})
}

// HostEnable lets pinflow choose a disabled host for new guests again.
func HostEnable(ctx workflow.Context, in HostStateInput) (*activities.HostStatus, error) {
	return setHostState(ctx, OpHostEnable, in.Host, "enable "+in.Host, a.SetHostEnabled, activities.HostInput{Host: in.Host})
}

// HostDown records an operator's statement that the host is fenced: it
// takes no claims, and its guests may be evacuated.
func HostDown(ctx workflow.Context, in HostStateInput) (*activities.HostStatus, error) {
	return setHostState(ctx, OpHostDown, in.Host, "mark "+in.Host+" down", a.SetHostDown,
		activities.HostReasonInput{Host: in.Host, Reason: in.Reason, AutoEvacuate: in.AutoEvacuate})
}

// HostAutoEvacuateInput turns a down host's automatic evacuation on or
// off.
type HostAutoEvacuateInput struct {
	Host string `json:"host"`
	On   bool   `json:"on"`
}

// HostAutoEvacuate turns a down host's automatic evacuation on or off:
// while on, every audit of the host starts an evacuation of each guest
// still there, so a guest no host could take yet (a full cloud, a server
// group's rule) is rebuilt once one can.
func HostAutoEvacuate(ctx workflow.Context, in HostAutoEvacuateInput) (*activities.HostStatus, error) {
	verb := "stop evacuating " + in.Host + " automatically"
	if in.On {
		verb = "evacuate " + in.Host + " automatically"
	}
	return setHostState(ctx, OpHostEvacuate, in.Host, verb, a.SetHostAutoEvacuate,
		activities.HostAutoEvacuateInput{Host: in.Host, On: in.On})
}

// setHostState is a host state change of one step, and its new status.
func setHostState(ctx workflow.Context, op Operation, host, summary string, step, arg any) (*activities.HostStatus, error) {
	s, err := newSaga(ctx, op, "", 1)
	if err != nil {
		return nil, err
	}
	s.setHosts(host, "")
	var st activities.HostStatus
	if err := s.ledger(ctx, summary, step, arg).Get(ctx, &st); err != nil {
		return nil, s.fail(err)
	}
	s.phase(PhaseCompleted, "")
	return &st, nil
}

// HostRemoveInput names a host to remove.
type HostRemoveInput struct {
	Host string `json:"host"`
}

// HostRemoveResult says what went with a removed host.
type HostRemoveResult struct {
	Host string `json:"host"`
	// Tombstones is how many tombstones of guests evacuated from the
	// host went with it.
	Tombstones int `json:"tombstones"`
	// Kept says why the simulator keeps the host's machine, when it does:
	// it still holds domains, as a dead machine would.
	Kept string `json:"kept,omitempty"`
}

// HostRemove removes a host that holds no guest (a fenced host that never
// comes back goes with the tombstones of its evacuated guests) from the
// ledger, and then its simulated machine.
func HostRemove(ctx workflow.Context, in HostRemoveInput) (*HostRemoveResult, error) {
	s, err := newSaga(ctx, OpHostRemove, "", 3)
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
	res := HostRemoveResult{Host: in.Host}
	if err := s.ledger(ctx, "remove "+in.Host+" from the ledger", a.RemoveHost, activities.HostInput{Host: in.Host}).Get(ctx, &res.Tombstones); err != nil {
		return nil, s.fail(err)
	}
	s.step()
	// Gone from the ledger: the simulated machine follows whatever happens.
	ctx = s.commit(ctx)
	if err := s.ledger(ctx, "remove the simulated host "+in.Host, a.RemoveSimulatedHost, activities.HostInput{Host: in.Host}).Get(ctx, &res.Kept); err != nil {
		return nil, s.fail(err)
	}
	s.phase(PhaseCompleted, "")
	return &res, nil
}
