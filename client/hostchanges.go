package client

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	tclient "go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// Every change of a host (its registration, its state, its return and
// its removal) is a workflow run under api.HostWorkflowID: two
// changes of one host never interleave, and each is on record with the
// host and the operation as search attributes (History).

// AddHostRequest is a host to register: by its NUMA topology (a simulated
// host, or one the hypervisor driver reaches by its own configuration),
// or through libvirt, which reports the topology.
type AddHostRequest struct {
	Name string
	// Topology is the host's NUMA topology with its limits
	// (Topology.Limits: allocation ratios and reserved memory; nil takes
	// Nova's defaults). Usage in it is ignored: the ledger's claims are
	// the usage.
	Topology *numa.Host
	// Libvirt is how libvirt reaches the host.
	Libvirt *libvirthost.Config
	// Limits are a libvirt host's limits; nil takes Nova's defaults.
	Limits *numa.Limits
}

// AddHost registers a host, or an existing host's topology again (its
// generation grows when the topology changed), and returns the
// registration once it is done.
func (c *Client) AddHost(ctx context.Context, r AddHostRequest) (*api.HostAddResult, error) {
	const verb = "host add"
	if err := ledger.CheckHostName(r.Name); err != nil {
		return nil, fmt.Errorf("%s: %v: %w", verb, err, ErrInvalid)
	}
	in := api.HostAddInput{Host: r.Name}
	summary := "register host " + r.Name
	switch {
	case r.Topology != nil && r.Libvirt != nil:
		return nil, fmt.Errorf("%s %s: give a topology or a libvirt configuration, not both: libvirt reports the topology: %w", verb, r.Name, ErrInvalid)
	case r.Libvirt != nil:
		if err := r.Libvirt.Validate(); err != nil {
			return nil, fmt.Errorf("%s %s: %v: %w", verb, r.Name, err, ErrInvalid)
		}
		if err := r.Limits.Validate(); err != nil {
			return nil, fmt.Errorf("%s %s: %v: %w", verb, r.Name, err, ErrInvalid)
		}
		in.Libvirt, in.Limits = r.Libvirt, r.Limits
		summary += " through libvirt"
	case r.Topology != nil:
		if r.Limits != nil {
			return nil, fmt.Errorf("%s %s: a topology carries its own limits (Topology.Limits); Limits are a libvirt host's: %w", verb, r.Name, ErrInvalid)
		}
		in.Topology = r.Topology.WithoutUsage()
		if err := in.Topology.Validate(); err != nil {
			return nil, fmt.Errorf("%s %s: %v: %w", verb, r.Name, err, ErrInvalid)
		}
		if err := in.Topology.SeparatePools(); err != nil {
			return nil, fmt.Errorf("%s %s: %v: %w", verb, r.Name, err, ErrInvalid)
		}
	default:
		return nil, fmt.Errorf("%s %s: give a topology or a libvirt configuration: %w", verb, r.Name, ErrInvalid)
	}
	var res api.HostAddResult
	p := plan{op: api.OpHostAdd, workflow: api.WorkflowHostAdd, input: in, summary: summary, source: r.Name}
	if err := c.changeHost(ctx, verb, p, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// DisableHost keeps new guests off an up host for maintenance, for the
// operator's reason (1 to ledger.MaxReason printable characters): its
// guests stay, and it takes only operations that name it. A disabled host
// takes the new reason. It returns the host's new status.
func (c *Client) DisableHost(ctx context.Context, host, reason string) (ledger.HostStatus, error) {
	const verb = "host disable"
	st, err := c.hostToChange(ctx, verb, host, &reason)
	if err != nil {
		return st, err
	}
	if st.State != ledger.HostUp && st.State != ledger.HostDisabled {
		return st, fmt.Errorf("%s %s: the host is %s; only an up host is disabled, once it is back up: %w", verb, host, st.State, ErrState)
	}
	p := plan{op: api.OpHostDisable, workflow: api.WorkflowHostDisable, input: api.HostStateInput{Host: host, Reason: reason},
		summary: fmt.Sprintf("disable host %s: %s", host, reason), source: host}
	return c.changeHostState(ctx, verb, p)
}

// EnableHost lets pinflow choose a disabled host for new guests again; an
// up host stays up. It returns the host's new status.
func (c *Client) EnableHost(ctx context.Context, host string) (ledger.HostStatus, error) {
	const verb = "host enable"
	st, err := c.hostToChange(ctx, verb, host, nil)
	if err != nil {
		return st, err
	}
	if st.State != ledger.HostUp && st.State != ledger.HostDisabled {
		return st, fmt.Errorf("%s %s: the host is %s, not disabled; a host marked down comes back with UpHost: %w", verb, host, st.State, ErrState)
	}
	p := plan{op: api.OpHostEnable, workflow: api.WorkflowHostEnable, input: api.HostStateInput{Host: host},
		summary: "enable host " + host, source: host}
	return c.changeHostState(ctx, verb, p)
}

// DownHost records the caller's statement that the host is fenced:
// powered off, or cut off from its guests' storage and network. A down
// host takes no claims, and only then may its guests be evacuated
// (EvacuateHost); UpHost brings it back. A host down already keeps its
// fencing token and reason. With autoEvacuate, every audit of the host
// then evacuates its guests (AutoEvacuateHost). It returns the host's new
// status, with the token.
func (c *Client) DownHost(ctx context.Context, host, reason string, autoEvacuate bool) (ledger.HostStatus, error) {
	const verb = "host down"
	if _, err := c.hostToChange(ctx, verb, host, &reason); err != nil {
		return ledger.HostStatus{}, err
	}
	p := plan{op: api.OpHostDown, workflow: api.WorkflowHostDown,
		input:   api.HostStateInput{Host: host, Reason: reason, AutoEvacuate: autoEvacuate},
		summary: fmt.Sprintf("mark host %s down (fenced): %s", host, reason), source: host}
	return c.changeHostState(ctx, verb, p)
}

// AutoEvacuateHost turns a down host's automatic evacuation on or off.
// While on, every audit of the host (the schedule's, or 'pinflow
// reconcile') starts an evacuation of each guest still there that no
// other operation holds, so a guest no host could take when the host went
// down (a full cloud, a server group's rule) is rebuilt once a host can.
// It goes off when the host returns.
func (c *Client) AutoEvacuateHost(ctx context.Context, host string, on bool) (ledger.HostStatus, error) {
	const verb = "host evacuate"
	st, err := c.hostToChange(ctx, verb, host, nil)
	if err != nil {
		return st, err
	}
	if st.State != ledger.HostDown {
		return st, fmt.Errorf("%s %s: the host is %s; pinflow evacuates only from a host marked down (fenced): %w", verb, host, st.State, ErrState)
	}
	summary := "evacuate host " + host + " at every audit"
	if !on {
		summary = "stop evacuating host " + host + " at every audit"
	}
	p := plan{op: api.OpHostEvacuate, workflow: api.WorkflowHostAutoEvacuate, input: api.HostAutoEvacuateInput{Host: host, On: on},
		summary: summary, source: host}
	return c.changeHostState(ctx, verb, p)
}

// HostUpRun is a running host up: the host takes guests again once the
// leftovers of its evacuated guests are destroyed.
type HostUpRun struct {
	c          *Client
	Host       string
	WorkflowID string
	RunID      string
}

// UpHost starts bringing back a host marked down: the leftovers of the
// guests evacuated from it are destroyed and their tombstones cleared,
// then it takes guests again. It refuses while operations on its guests
// run.
func (c *Client) UpHost(ctx context.Context, host string) (*HostUpRun, error) {
	const verb = "host up"
	st, err := c.hostToChange(ctx, verb, host, nil)
	if err != nil {
		return nil, err
	}
	switch st.State {
	case ledger.HostUp:
		return nil, fmt.Errorf("%s %s: the host is up already; only a host marked down comes back: %w", verb, host, ErrState)
	case ledger.HostDisabled:
		return nil, fmt.Errorf("%s %s: the host is disabled, not down; enable it to let pinflow choose it again: %w", verb, host, ErrState)
	}
	run, err := c.startHostChange(ctx, verb, plan{op: api.OpHostUp, workflow: api.WorkflowHostUp, input: api.HostUpInput{Host: host},
		summary: "bring host " + host + " back", source: host})
	if err != nil {
		return nil, err
	}
	return &HostUpRun{c: c, Host: host, WorkflowID: run.GetID(), RunID: run.GetRunID()}, nil
}

// Wait waits until the host is up and says which leftovers were
// destroyed. A failure is an *OperationError of one line; when ctx ends
// first, the host up goes on and the error wraps ctx's.
func (r *HostUpRun) Wait(ctx context.Context) (*api.HostUpResult, error) {
	var res api.HostUpResult
	if err := waitError(ctx, api.OpHostUp, r.Host, r.WorkflowID, r.RunID, r.c.result(ctx, r.WorkflowID, r.RunID, &res)); err != nil {
		return nil, err
	}
	return &res, nil
}

// RemoveHost removes a host that holds no guest: a fenced host that never
// comes back goes with the tombstones of the guests evacuated from it. It
// returns what went with the host.
func (c *Client) RemoveHost(ctx context.Context, host string) (*api.HostRemoveResult, error) {
	const verb = "host remove"
	if _, err := c.hostToChange(ctx, verb, host, nil); err != nil {
		return nil, err
	}
	// The ledger refuses too, naming a claim; the operator moves guests.
	guests, err := c.guestsHeldOn(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", verb, host, err)
	}
	if len(guests) > 0 {
		return nil, fmt.Errorf("%s %s: it holds guests %s; evacuate, migrate or delete them first", verb, host, strings.Join(guests, ", "))
	}
	var res api.HostRemoveResult
	p := plan{op: api.OpHostRemove, workflow: api.WorkflowHostRemove, input: api.HostRemoveInput{Host: host},
		summary: "remove host " + host, source: host}
	if err := c.changeHost(ctx, verb, p, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// guestsHeldOn names the guests with a live claim (not a tombstone) on
// host as "NAME (UUID)", sorted.
func (c *Client) guestsHeldOn(ctx context.Context, host string) ([]string, error) {
	claims, err := c.led.Claims(ctx, host)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, cl := range claims {
		if cl.State == ledger.StateTombstone || seen[cl.InstanceUUID] {
			continue
		}
		seen[cl.InstanceUUID] = true
		name := "(no record)"
		if inst, err := c.led.Instance(ctx, cl.InstanceUUID); err == nil {
			name = inst.Name
		}
		out = append(out, fmt.Sprintf("%s (%s)", name, cl.InstanceUUID))
	}
	sort.Strings(out)
	return out, nil
}

// HostEvacuation is the evacuation of one guest of a fenced host: Op once
// it started, or Err when it was refused.
type HostEvacuation struct {
	UUID string
	Op   *Operation
	Err  error
}

// EvacuateHost starts an evacuation of every guest whose record names the
// fenced host, each under its own instance workflow id, onto a host
// pinflow chooses. A guest refused does not stop the others.
func (c *Client) EvacuateHost(ctx context.Context, host string) ([]HostEvacuation, error) {
	const verb = "host evacuate"
	st, err := c.hostToChange(ctx, verb, host, nil)
	if err != nil {
		return nil, err
	}
	if st.State != ledger.HostDown {
		return nil, fmt.Errorf("%s %s: the host is %s; pinflow evacuates only from a host marked down (fenced): %w", verb, host, st.State, ErrState)
	}
	claims, err := c.led.Claims(ctx, host)
	if err != nil {
		return nil, err
	}
	var out []HostEvacuation
	for _, cl := range claims {
		inst, err := c.led.Instance(ctx, cl.InstanceUUID)
		if errors.Is(err, ledger.ErrUnknownInstance) {
			continue
		}
		if err != nil {
			return out, err
		}
		if inst.Host != host || inst.ClaimID != cl.ID {
			continue // not a guest that lives here
		}
		op, err := c.Evacuate(ctx, inst.UUID, "")
		out = append(out, HostEvacuation{UUID: inst.UUID, Op: op, Err: err})
	}
	return out, nil
}

// hostToChange checks the host's name and, when reason is not nil, the
// operator's reason, and returns the host's status: an unknown host is
// refused naming a few registered ones.
func (c *Client) hostToChange(ctx context.Context, verb, host string, reason *string) (ledger.HostStatus, error) {
	if err := ledger.CheckHostName(host); err != nil {
		return ledger.HostStatus{}, fmt.Errorf("%s: %v: %w", verb, err, ErrInvalid)
	}
	if reason != nil {
		if err := ledger.CheckReason(*reason); err != nil {
			return ledger.HostStatus{}, fmt.Errorf("%s %s: %v: %w", verb, host, err, ErrInvalid)
		}
	}
	return c.HostStatus(ctx, host)
}

// changeHostState runs p, a change of a host's state, and returns the
// host's new status.
func (c *Client) changeHostState(ctx context.Context, verb string, p plan) (ledger.HostStatus, error) {
	var st ledger.HostStatus
	err := c.changeHost(ctx, verb, p, &st)
	return st, err
}

// changeHost runs p, a change of the host p.source, and waits for its
// result: the changes of state are short, and their callers want the
// outcome, not a run to follow.
func (c *Client) changeHost(ctx context.Context, verb string, p plan, result any) error {
	run, err := c.startHostChange(ctx, verb, p)
	if err != nil {
		return err
	}
	return waitError(ctx, p.op, p.source, run.GetID(), run.GetRunID(), c.result(ctx, run.GetID(), run.GetRunID(), result))
}

// startHostChange starts p under the workflow id of its host, p.source.
// While another change of the host runs, the start is refused naming it.
func (c *Client) startHostChange(ctx context.Context, verb string, p plan) (tclient.WorkflowRun, error) {
	id := api.HostWorkflowID(p.source)
	run, err := c.startWorkflow(ctx, id, p, fmt.Sprintf("host `%s`, operation **%s**", p.source, p.op))
	if alreadyRunning(err) {
		return nil, c.hostBusy(ctx, verb, p.source)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", verb, p.source, err)
	}
	return run, nil
}

// hostBusy explains that another change holds the host's workflow id.
func (c *Client) hostBusy(ctx context.Context, verb, host string) error {
	e := &BusyError{Host: host, WorkflowID: api.HostWorkflowID(host)}
	if d, err := c.temporal.DescribeWorkflow(ctx, e.WorkflowID, ""); err == nil {
		e.Operation, e.RunID = c.operation(d, "").Kind, d.WorkflowExecution.RunID
		if e.Operation == api.OpHostUp {
			return fmt.Errorf("%s %s: it is coming back already (workflow %s): %w", verb, host, e.WorkflowID, e)
		}
	}
	return fmt.Errorf("%s: %w", verb, e)
}
