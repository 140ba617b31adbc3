package activities

import (
	"context"
	"errors"
	"fmt"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// The steps of host administration: registering a host, its state as
// operators set it (disabled, enabled, down), and its removal. Each is
// safe to run again after it took effect, and refuses for good, with the
// ledger's own words, what the host's state forbids when it runs.

// SimulatedHosts makes and forgets the simulator's machines
// (sim.Driver).
type SimulatedHosts interface {
	// AddHost makes the host with the topology; the same again succeeds,
	// another topology is an error wrapping hypervisor.ErrRejected.
	AddHost(ctx context.Context, host string, topo *numa.Host) error
	// RemoveHost forgets the host; an unknown one succeeds, one that
	// holds domains is an error wrapping hypervisor.ErrRejected.
	RemoveHost(ctx context.Context, host string) error
}

// LibvirtHosts reads libvirt hosts and records how to reach them
// (libvirt.Registrar).
type LibvirtHosts interface {
	// Capabilities reads the topology of the host hc reaches, through a
	// connection of its own.
	Capabilities(ctx context.Context, host string, hc libvirthost.Config) (*numa.Host, error)
	// Record records how every worker reaches the host.
	Record(ctx context.Context, host string, hc libvirthost.Config) error
}

// HostTopology is a host and its topology, to register.
type HostTopology struct {
	Host     string     `json:"host"`
	Topology *numa.Host `json:"topology"`
}

// LibvirtHostInput is a libvirt host and how to reach it.
type LibvirtHostInput struct {
	Host   string             `json:"host"`
	Config libvirthost.Config `json:"config"`
}

// HostInput names a host.
type HostInput struct {
	Host string `json:"host"`
}

// HostReasonInput is a change of a host's state with the operator's
// reason.
type HostReasonInput struct {
	Host   string `json:"host"`
	Reason string `json:"reason"`
	// AutoEvacuate, when a host goes down, has the audit evacuate its
	// guests (HostAutoEvacuateInput).
	AutoEvacuate bool `json:"auto_evacuate,omitempty"`
}

// HostAutoEvacuateInput turns a down host's automatic evacuation on or
// off.
type HostAutoEvacuateInput struct {
	Host string `json:"host"`
	On   bool   `json:"on"`
}

// checkTopology refuses a host name or topology that no retry can
// register.
func checkTopology(in HostTopology) error {
	if err := ledger.CheckHostName(in.Host); err != nil {
		return BadRequest(err.Error())
	}
	if in.Topology == nil {
		return BadRequest(fmt.Sprintf("host %s: no topology given", in.Host))
	}
	topo := in.Topology.WithoutUsage()
	if err := topo.Validate(); err != nil {
		return BadRequest(fmt.Sprintf("host %s: %v", in.Host, err))
	}
	if err := topo.SeparatePools(); err != nil {
		return BadRequest(fmt.Sprintf("host %s: %v", in.Host, err))
	}
	return nil
}

// AddSimulatedHost makes the host in the simulator, with its topology. A
// worker that drives no simulator has nothing to do: its driver reaches
// the host through its own configuration.
func (a *Activities) AddSimulatedHost(ctx context.Context, in HostTopology) error {
	if err := checkTopology(in); err != nil {
		return err
	}
	if a.Simulated == nil {
		return nil
	}
	return classify(a.Simulated.AddHost(ctx, in.Host, in.Topology))
}

// ReadLibvirtHost reads the topology of the host through libvirt. It
// records nothing: until RecordLibvirtHost, the workers know the host as
// they did.
func (a *Activities) ReadLibvirtHost(ctx context.Context, in LibvirtHostInput) (*numa.Host, error) {
	if err := checkLibvirtHost(in); err != nil {
		return nil, err
	}
	if a.Libvirt == nil {
		return nil, BadRequest(fmt.Sprintf("host %s: this worker reaches no libvirt host", in.Host))
	}
	var topo *numa.Host
	err := a.heartbeating(ctx, func(ctx context.Context) (err error) {
		topo, err = a.Libvirt.Capabilities(ctx, in.Host, in.Config)
		return err
	})
	return topo, classify(err)
}

// RecordLibvirtHost records how every worker reaches the host; it comes
// after the ledger registered the host, so a host that could not be read
// or registered leaves the record as it was.
func (a *Activities) RecordLibvirtHost(ctx context.Context, in LibvirtHostInput) error {
	if err := checkLibvirtHost(in); err != nil {
		return err
	}
	if a.Libvirt == nil {
		return BadRequest(fmt.Sprintf("host %s: this worker reaches no libvirt host", in.Host))
	}
	return classify(a.Libvirt.Record(ctx, in.Host, in.Config))
}

func checkLibvirtHost(in LibvirtHostInput) error {
	if err := ledger.CheckHostName(in.Host); err != nil {
		return BadRequest(err.Error())
	}
	if err := in.Config.Validate(); err != nil {
		return BadRequest(fmt.Sprintf("libvirt host %s: %v", in.Host, err))
	}
	return nil
}

// RegisterHost registers the host's topology in the ledger and returns its
// generation; the same topology again changes nothing. A changed topology
// that a claim of the host would no longer fit is refused.
func (a *Activities) RegisterHost(ctx context.Context, in HostTopology) (int64, error) {
	if err := checkTopology(in); err != nil {
		return 0, err
	}
	gen, err := a.Ledger.RegisterHost(ctx, in.Host, in.Topology)
	return gen, forbidden(err)
}

// SetHostDisabled keeps new guests off the host (an operator's
// maintenance); a disabled host takes the new reason. A host that is down
// or returning is refused.
func (a *Activities) SetHostDisabled(ctx context.Context, in HostReasonInput) (HostStatus, error) {
	st, err := a.Ledger.SetHostDisabled(ctx, in.Host, in.Reason)
	return st, forbidden(err)
}

// SetHostEnabled lets pinflow choose a disabled host again; an up host
// stays up. A host that is down or returning is refused.
func (a *Activities) SetHostEnabled(ctx context.Context, in HostInput) (HostStatus, error) {
	st, err := a.Ledger.SetHostEnabled(ctx, in.Host)
	return st, forbidden(err)
}

// SetHostDown records an operator's statement that the host is fenced,
// with a new fencing token; a host down already keeps its token and
// reason.
func (a *Activities) SetHostDown(ctx context.Context, in HostReasonInput) (HostStatus, error) {
	st, err := a.Ledger.SetHostDown(ctx, in.Host, in.Reason)
	if err == nil && in.AutoEvacuate {
		st, err = a.Ledger.SetHostAutoEvacuate(ctx, in.Host, true)
	}
	return st, forbidden(err)
}

// SetHostAutoEvacuate turns a down host's automatic evacuation on or off:
// while on, every audit of the host starts an evacuation of each guest
// still there. A host that is not down is refused.
func (a *Activities) SetHostAutoEvacuate(ctx context.Context, in HostAutoEvacuateInput) (HostStatus, error) {
	st, err := a.Ledger.SetHostAutoEvacuate(ctx, in.Host, in.On)
	return st, forbidden(err)
}

// RemoveHost removes the host from the ledger, with the tombstones of
// the guests evacuated from it, and returns how many went. A host that
// holds any other claim is refused. The workflow checks that the host is
// registered first, so an unknown host here is one an earlier attempt
// removed: that is a success, of tombstones no longer counted.
func (a *Activities) RemoveHost(ctx context.Context, in HostInput) (int, error) {
	n, err := a.Ledger.RemoveHost(ctx, in.Host)
	if errors.Is(err, ledger.ErrUnknownHost) {
		return 0, nil
	}
	return n, forbidden(err)
}

// RemoveSimulatedHost forgets the host's simulated machine, once the
// ledger has let the host go. A machine that still holds domains is kept,
// as a dead machine keeps its guests: the result says so, and it is no
// failure.
func (a *Activities) RemoveSimulatedHost(ctx context.Context, in HostInput) (string, error) {
	if a.Simulated == nil {
		return "", nil
	}
	err := a.Simulated.RemoveHost(ctx, in.Host)
	if errors.Is(err, hypervisor.ErrRejected) {
		return err.Error(), nil
	}
	return "", err
}

// forbidden is classify for steps where the ledger's refusal (ErrConflict)
// is final: the host's state forbids the change, and retrying cannot
// change that.
func forbidden(err error) error {
	if errors.Is(err, ledger.ErrConflict) {
		return BadState(err.Error())
	}
	return classify(err)
}
