package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	tclient "go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// BootRequest is a guest to boot.
type BootRequest struct {
	Name   string
	Flavor guest.Flavor
	// Host is where to boot; empty lets pinflow choose.
	Host string
	// Group is the server group the guest joins for life; "" for none.
	Group string
}

// Boot starts booting a new guest, after checking the flavor as Nova's
// API does and that a named host takes guests.
func (c *Client) Boot(ctx context.Context, r BootRequest) (*Operation, error) {
	if err := ledger.CheckGuestName(r.Name); err != nil {
		return nil, fmt.Errorf("boot: %v: %w", err, ErrInvalid)
	}
	if r.Flavor.VCPUs <= 0 || r.Flavor.MemoryMB <= 0 {
		return nil, fmt.Errorf("boot %s: %d vCPUs and %d MiB: a flavor has at least 1 vCPU and 1 MiB: %w", r.Name, r.Flavor.VCPUs, r.Flavor.MemoryMB, ErrInvalid)
	}
	var err error
	if r.Flavor, err = c.resolveAliases(r.Flavor); err != nil {
		return nil, fmt.Errorf("boot %s: %w", r.Name, err)
	}
	if _, err := r.Flavor.Request(); err != nil {
		return nil, fmt.Errorf("boot %s: %w", r.Name, invalid(err))
	}
	if err := c.checkPhysnets(ctx, r.Flavor.Ports); err != nil {
		return nil, fmt.Errorf("boot %s: %w", r.Name, err)
	}
	if r.Group != "" {
		if _, err := c.group(ctx, r.Group); err != nil {
			return nil, fmt.Errorf("boot %s: %w", r.Name, err)
		}
	}
	id := uuid.NewString()
	if r.Host != "" {
		if err := c.checkTarget(ctx, r.Host); err != nil {
			return nil, err
		}
		if err := c.checkGroupTarget(ctx, "boot "+r.Name, id, r.Group, r.Host); err != nil {
			return nil, err
		}
	}
	return c.start(ctx, plan{op: api.OpBoot, workflow: api.WorkflowBoot, uuid: id,
		input:   api.BootInput{UUID: id, Name: r.Name, Flavor: r.Flavor, Host: r.Host, Group: r.Group},
		summary: fmt.Sprintf("boot %s (%d vCPUs, %d MiB)", r.Name, r.Flavor.VCPUs, r.Flavor.MemoryMB), dest: r.Host})
}

// MigrateRequest says how to migrate a guest.
type MigrateRequest struct {
	// Dest is the destination host; empty lets pinflow choose.
	Dest string
	// Cold powers the guest off, moves it and starts it there: a resize
	// to its own flavor, which waits in VERIFY_RESIZE for a decision.
	Cold bool
	// ColdFallback live-migrates, and migrates cold only when the
	// hypervisor cannot live-migrate the guest.
	ColdFallback bool
	// ConfirmWindow is how long a cold migration waits in VERIFY_RESIZE
	// before confirming by itself: 0 takes the default (an hour), and
	// NoAutoConfirm waits for an operator however long.
	ConfirmWindow time.Duration
}

// NoAutoConfirm is the confirm window of a resize that waits in
// VERIFY_RESIZE for an operator however long.
const NoAutoConfirm time.Duration = -1

// Migrate starts a live migration of the guest ref names, or a cold one.
func (c *Client) Migrate(ctx context.Context, ref string, r MigrateRequest) (*Operation, error) {
	inst, err := c.Instance(ctx, ref)
	if err != nil {
		return nil, err
	}
	if r.Cold && r.ColdFallback {
		return nil, fmt.Errorf("migrate %s: a cold migration and a cold fallback exclude each other: %w", inst.UUID, ErrInvalid)
	}
	if err := checkWindow(r.ConfirmWindow); err != nil {
		return nil, err
	}
	info := inst.Facts()
	check := info.CanLiveMigrate
	switch {
	case r.Cold:
		check = info.CanResize
	case r.ColdFallback:
		// Devices that cannot be unplugged fall back to a cold migration.
		check = info.Running
	}
	if err := check(); err != nil {
		return nil, refusal(err)
	}
	if r.Dest != "" {
		if err := c.checkTarget(ctx, r.Dest); err != nil {
			return nil, err
		}
		if r.Dest == inst.Host {
			return nil, fmt.Errorf("migrate %s: it already runs on %s; choose another destination: %w", inst.UUID, r.Dest, ErrInvalid)
		}
		if err := c.checkGroupTarget(ctx, "migrate "+inst.UUID, inst.UUID, inst.Group, r.Dest); err != nil {
			return nil, err
		}
	}
	p := plan{uuid: inst.UUID, source: inst.Host, dest: r.Dest}
	if r.Cold {
		p.op, p.workflow = api.OpColdMigration, api.WorkflowResize
		p.input = api.ResizeInput{UUID: inst.UUID, Dest: r.Dest, ConfirmWindow: r.ConfirmWindow}
		p.summary = fmt.Sprintf("cold-migrate %s from %s to %s", inst.Name, inst.Host, orChosen(r.Dest))
		return c.start(ctx, p)
	}
	in := api.LiveMigrationInput{UUID: inst.UUID, Dest: r.Dest}
	p.op, p.workflow = api.OpLiveMigration, api.WorkflowLiveMigration
	p.summary = fmt.Sprintf("live-migrate %s from %s to %s", inst.Name, inst.Host, orChosen(r.Dest))
	if r.ColdFallback {
		in.ColdFallback, in.ConfirmWindow = true, r.ConfirmWindow
		p.summary += " (cold if it cannot be live)"
	}
	p.input = in
	return c.start(ctx, p)
}

// ResizeRequest is the new flavor of a guest: a zero field keeps the
// guest's value, and ExtraSpecs or ImageProps given replace all of the
// guest's.
type ResizeRequest struct {
	VCPUs      int
	MemoryMB   int64
	ExtraSpecs map[string]string
	ImageProps map[string]string
	// Host is the destination; empty lets pinflow choose, the guest's own
	// host included.
	Host string
	// ConfirmWindow is as in MigrateRequest.
	ConfirmWindow time.Duration
}

// flavorOf is the guest's flavor with r's changes.
func (r ResizeRequest) flavorOf(inst *ledger.Instance) guest.Flavor {
	flavor := inst.Request
	if r.VCPUs != 0 {
		flavor.VCPUs = r.VCPUs
	}
	if r.MemoryMB != 0 {
		flavor.MemoryMB = r.MemoryMB
	}
	if len(r.ExtraSpecs) > 0 {
		flavor.ExtraSpecs = r.ExtraSpecs
	}
	if len(r.ImageProps) > 0 {
		flavor.ImageProps = r.ImageProps
	}
	return flavor
}

// Resize starts a resize of the guest ref names; it waits in
// VERIFY_RESIZE for ConfirmResize or RevertResize.
func (c *Client) Resize(ctx context.Context, ref string, r ResizeRequest) (*Operation, error) {
	inst, err := c.Instance(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := inst.Facts().CanResize(); err != nil {
		return nil, refusal(err)
	}
	if err := checkWindow(r.ConfirmWindow); err != nil {
		return nil, err
	}
	if r.VCPUs < 0 || r.MemoryMB < 0 {
		return nil, fmt.Errorf("resize %s: %d vCPUs and %d MiB: allowed are positive numbers, or 0 to keep the guest's: %w", inst.UUID, r.VCPUs, r.MemoryMB, ErrInvalid)
	}
	flavor := r.flavorOf(inst)
	if flavor.VCPUs == inst.Request.VCPUs && flavor.MemoryMB == inst.Request.MemoryMB &&
		maps.Equal(flavor.ExtraSpecs, inst.Request.ExtraSpecs) && maps.Equal(flavor.ImageProps, inst.Request.ImageProps) {
		return nil, fmt.Errorf("resize %s: that is its current flavor (%d vCPUs, %d MiB%s); give other vCPUs, memory, extra specs or image properties: %w",
			inst.UUID, inst.Request.VCPUs, inst.Request.MemoryMB, SpecList(inst.Request.ExtraSpecs, inst.Request.ImageProps), ErrInvalid)
	}
	if len(r.ExtraSpecs) > 0 {
		if flavor, err = c.resolveAliases(flavor); err != nil {
			return nil, fmt.Errorf("resize %s: %w", inst.UUID, err)
		}
	}
	if _, err := flavor.Request(); err != nil {
		return nil, fmt.Errorf("resize %s: %w", inst.UUID, invalid(err))
	}
	if r.Host != "" {
		if err := c.checkTarget(ctx, r.Host); err != nil {
			return nil, err
		}
		if err := c.checkGroupTarget(ctx, "resize "+inst.UUID, inst.UUID, inst.Group, r.Host); err != nil {
			return nil, err
		}
	}
	return c.start(ctx, plan{op: api.OpResize, workflow: api.WorkflowResize, uuid: inst.UUID,
		input:   api.ResizeInput{UUID: inst.UUID, Flavor: &flavor, Dest: r.Host, ConfirmWindow: r.ConfirmWindow},
		summary: fmt.Sprintf("resize %s to %d vCPUs, %d MiB on %s", inst.Name, flavor.VCPUs, flavor.MemoryMB, orChosen(r.Host)),
		source:  inst.Host, dest: r.Host})
}

// ConfirmResize keeps a resized guest where it runs and frees its source
// hold; the returned operation is the resize, which then ends.
func (c *Client) ConfirmResize(ctx context.Context, ref string) (*Operation, error) {
	return c.decide(ctx, ref, api.DecisionConfirm)
}

// RevertResize takes a resized guest back to its source pCPUs.
func (c *Client) RevertResize(ctx context.Context, ref string) (*Operation, error) {
	return c.decide(ctx, ref, api.DecisionRevert)
}

func (c *Client) decide(ctx context.Context, ref, decision string) (*Operation, error) {
	inst, err := c.Instance(ctx, ref)
	if err != nil {
		return nil, err
	}
	id := guest.InstanceWorkflowID(inst.UUID)
	h, err := c.update(ctx, id, api.ResizeDecisionUpdate, decision)
	var nf *serviceerror.NotFound
	switch {
	case errors.As(err, &nf):
		return nil, fmt.Errorf("resize %s %s: it has no resize awaiting confirmation (vm_state %s, no operation running): %w", decision, inst.UUID, inst.VMState, ErrState)
	case err != nil:
		return nil, fmt.Errorf("resize %s %s: %w", decision, inst.UUID, refusal(err))
	}
	d, err := c.temporal.DescribeWorkflow(ctx, id, h.RunID())
	if err != nil {
		return nil, fmt.Errorf("resize %s %s: %w", decision, inst.UUID, err)
	}
	op := c.operation(d, inst.UUID)
	op.decided = true
	return op, nil
}

// Shelve shuts the guest down cleanly and offloads it from its host.
func (c *Client) Shelve(ctx context.Context, ref string) (*Operation, error) {
	inst, err := c.Instance(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := inst.Facts().CanShelve(); err != nil {
		return nil, refusal(err)
	}
	return c.start(ctx, plan{op: api.OpShelveOffload, workflow: api.WorkflowShelveOffload, uuid: inst.UUID,
		input:   api.ShelveOffloadInput{UUID: inst.UUID},
		summary: fmt.Sprintf("shelve and offload %s from %s", inst.Name, inst.Host), source: inst.Host})
}

// Unshelve brings a shelved guest back onto host, or a host pinflow
// chooses when host is empty.
func (c *Client) Unshelve(ctx context.Context, ref, host string) (*Operation, error) {
	inst, err := c.Instance(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := inst.Facts().CanUnshelve(); err != nil {
		return nil, refusal(err)
	}
	if host != "" {
		if err := c.checkTarget(ctx, host); err != nil {
			return nil, err
		}
		if err := c.checkGroupTarget(ctx, "unshelve "+inst.UUID, inst.UUID, inst.Group, host); err != nil {
			return nil, err
		}
	}
	return c.start(ctx, plan{op: api.OpUnshelve, workflow: api.WorkflowUnshelve, uuid: inst.UUID,
		input:   api.UnshelveInput{UUID: inst.UUID, Host: host},
		summary: fmt.Sprintf("unshelve %s onto %s", inst.Name, orChosen(host)), dest: host})
}

// Repin moves a running guest's pinned vCPUs to other pCPUs of its host
// while it runs: each guest cell takes the pcpus of its host cell, in
// vCPU order (then a reserved emulator pCPU), or, when empty, the pCPUs
// of its cells free or its own that leave the most whole cores free
// (defrag.Target). Each guest cell stays on its host cell.
func (c *Client) Repin(ctx context.Context, ref string, pcpus numa.CPUSet) (*Operation, error) {
	inst, err := c.Instance(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := inst.Facts().Running(); err != nil {
		return nil, refusal(err)
	}
	target := "the pCPUs of its cells that leave the most whole cores free"
	if pcpus.Len() > 0 {
		target = "pCPUs " + pcpus.String()
	}
	return c.start(ctx, plan{op: api.OpRepin, workflow: api.WorkflowRepin, uuid: inst.UUID,
		input:   api.RepinInput{UUID: inst.UUID, PCPUs: pcpus},
		summary: fmt.Sprintf("re-pin %s on %s to %s", inst.Name, inst.Host, target), source: inst.Host, dest: inst.Host})
}

// Delete destroys the guest and frees what it holds.
func (c *Client) Delete(ctx context.Context, ref string) (*Operation, error) {
	inst, err := c.Instance(ctx, ref)
	if err != nil {
		return nil, err
	}
	return c.start(ctx, plan{op: api.OpDelete, workflow: api.WorkflowDelete, uuid: inst.UUID,
		input: api.DeleteInput{UUID: inst.UUID}, summary: "delete " + inst.Name, source: inst.Host})
}

// Evacuate rebuilds a guest of a fenced host on dest, or on a host pinflow
// chooses when dest is empty.
func (c *Client) Evacuate(ctx context.Context, ref, dest string) (*Operation, error) {
	inst, err := c.Instance(ctx, ref)
	if err != nil {
		return nil, err
	}
	return c.evacuate(ctx, inst, dest)
}

func (c *Client) evacuate(ctx context.Context, inst *ledger.Instance, dest string) (*Operation, error) {
	if err := inst.Facts().CanEvacuate(); err != nil {
		return nil, refusal(err)
	}
	st, err := c.led.HostStatus(ctx, inst.Host)
	if err != nil {
		return nil, err
	}
	if st.State != ledger.HostDown {
		return nil, fmt.Errorf("evacuate %s: its host %s is %s; pinflow evacuates only from a host marked down (fenced): %w",
			inst.UUID, inst.Host, st.State, ErrState)
	}
	if dest != "" {
		if err := c.checkTarget(ctx, dest); err != nil {
			return nil, err
		}
		if dest == inst.Host {
			return nil, fmt.Errorf("evacuate %s: destination %s is the fenced host itself; allowed is any other host: %w", inst.UUID, dest, ErrInvalid)
		}
		if err := c.checkGroupTarget(ctx, "evacuate "+inst.UUID, inst.UUID, inst.Group, dest); err != nil {
			return nil, err
		}
	}
	return c.start(ctx, plan{op: api.OpEvacuation, workflow: api.WorkflowEvacuate, uuid: inst.UUID,
		input:   api.EvacuateInput{UUID: inst.UUID, Dest: dest},
		summary: fmt.Sprintf("evacuate %s from %s to %s", inst.Name, inst.Host, orChosen(dest)), source: inst.Host, dest: dest})
}

// Cancel cancels the operation running on the guest: its steps are
// compensated in reverse, and a resize in VERIFY_RESIZE reverts.
func (c *Client) Cancel(ctx context.Context, ref string) (*Operation, error) {
	uuid, err := c.guestUUID(ctx, ref)
	if err != nil {
		return nil, err
	}
	id := guest.InstanceWorkflowID(uuid)
	// A cancel of an operation that ended is accepted by Temporal and
	// does nothing: refuse it instead of saying it was requested.
	d, err := c.temporal.DescribeWorkflow(ctx, id, "")
	var nf *serviceerror.NotFound
	switch {
	case errors.As(err, &nf):
		return nil, fmt.Errorf("cancel %s: no operation is running on it: %w", uuid, ErrState)
	case err != nil:
		return nil, fmt.Errorf("cancel %s: %w", uuid, err)
	case d.Status != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING:
		return nil, fmt.Errorf("cancel %s: no operation is running on it (the last one, %s, is %s): %w", uuid, d.WorkflowType.Name, statusWord(d.Status), ErrState)
	}
	if err := c.temporal.CancelWorkflow(ctx, id, d.WorkflowExecution.RunID); err != nil {
		if errors.As(err, &nf) {
			return nil, fmt.Errorf("cancel %s: no operation is running on it: %w", uuid, ErrState)
		}
		return nil, fmt.Errorf("cancel %s: %w", uuid, err)
	}
	return c.operation(d, uuid), nil
}

// Follow is the last operation on the guest, to follow again: the
// running one, or the one that ended last, whose Wait says how it ended.
func (c *Client) Follow(ctx context.Context, ref string) (*Operation, error) {
	uuid, err := c.guestUUID(ctx, ref)
	if err != nil {
		return nil, err
	}
	d, err := c.temporal.DescribeWorkflow(ctx, guest.InstanceWorkflowID(uuid), "")
	var nf *serviceerror.NotFound
	switch {
	case errors.As(err, &nf):
		return nil, fmt.Errorf("follow %s: no operation ran on it: %w", uuid, ErrState)
	case err != nil:
		return nil, fmt.Errorf("follow %s: %w", uuid, err)
	}
	return c.operation(d, uuid), nil
}

// guestUUID is the UUID of the guest ref names. A guest whose record is
// gone (a delete ran) is still named by its full UUID, so that its last
// operation can be cancelled or followed.
func (c *Client) guestUUID(ctx context.Context, ref string) (string, error) {
	inst, err := c.Instance(ctx, ref)
	if err == nil {
		return inst.UUID, nil
	}
	if id, perr := uuid.Parse(ref); perr == nil && len(ref) == 36 && errors.Is(err, ErrUnknownGuest) {
		return id.String(), nil
	}
	return "", err
}

// operation is a handle on the run d describes, an operation on the
// guest uuid, of the kind its PinflowOperation names.
func (c *Client) operation(d *tclient.WorkflowExecutionDescription, uuid string) *Operation {
	kind, ok := d.TypedSearchAttributes.GetKeyword(api.AttrOperation)
	if !ok {
		kind = d.WorkflowType.Name
	}
	return &Operation{c: c, Kind: api.Operation(kind), UUID: uuid, WorkflowID: d.WorkflowExecution.ID, RunID: d.WorkflowExecution.RunID}
}

func statusWord(s enumspb.WorkflowExecutionStatus) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "WORKFLOW_EXECUTION_STATUS_"))
}

// plan is an operation to start: its workflow, guest (empty for an
// operation on a whole host), input, summary for the Web UI, and hosts.
type plan struct {
	op           api.Operation
	workflow     string // its type, api.Workflow*
	uuid         string
	input        any
	summary      string
	source, dest string
}

// start starts p under the guest's workflow id. While another operation
// runs on the guest, the start is refused naming it.
func (c *Client) start(ctx context.Context, p plan) (*Operation, error) {
	id := guest.InstanceWorkflowID(p.uuid)
	run, err := c.startWorkflow(ctx, id, p, fmt.Sprintf("instance `%s`, operation **%s**", p.uuid, p.op))
	if alreadyRunning(err) {
		return nil, c.busy(ctx, p.uuid)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", p.op, p.uuid, err)
	}
	return &Operation{c: c, Kind: p.op, UUID: p.uuid, WorkflowID: id, RunID: run.GetRunID()}, nil
}

// startWorkflow starts p's workflow under id, with its guest (none for an
// operation on a whole host) and hosts as search attributes and details
// for the Web UI. An id runs one workflow at a time: while one runs, the
// start fails and alreadyRunning says so.
func (c *Client) startWorkflow(ctx context.Context, id string, p plan, details string) (tclient.WorkflowRun, error) {
	attrs := api.StartAttributes(p.op, p.uuid)
	if p.source != "" {
		attrs = append(attrs, api.AttrSourceHost.ValueSet(p.source))
	}
	if p.dest != "" {
		attrs = append(attrs, api.AttrDestHost.ValueSet(p.dest))
	}
	run, err := c.temporal.ExecuteWorkflow(ctx, tclient.StartWorkflowOptions{
		ID:                                       id,
		TaskQueue:                                c.taskQueue,
		WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowIDReusePolicy:                    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		TypedSearchAttributes:                    temporal.NewSearchAttributes(attrs...),
		StaticSummary:                            p.summary,
		StaticDetails:                            details,
	}, p.workflow, p.input)
	var invalid *serviceerror.InvalidArgument
	if errors.As(err, &invalid) && strings.Contains(invalid.Message, "no mapping defined for search attribute") {
		// A worker registers them when it starts.
		return nil, fmt.Errorf("the Temporal namespace does not know pinflow's search attributes yet: start a pinflow worker on it first (%s)", invalid.Message)
	}
	return run, err
}

// update runs the Update name with args on the workflow id's running run
// and waits until the workflow has completed it. A refusal of its
// validator is the error, which RootMessage says in one line.
func (c *Client) update(ctx context.Context, id, name string, args ...any) (tclient.WorkflowUpdateHandle, error) {
	h, err := c.temporal.UpdateWorkflow(ctx, tclient.UpdateWorkflowOptions{WorkflowID: id, UpdateName: name,
		Args: args, WaitForStage: tclient.WorkflowUpdateStageCompleted})
	if err == nil {
		err = h.Get(ctx, nil)
	}
	return h, err
}

// alreadyRunning says whether a start failed because a workflow runs under
// its id already.
func alreadyRunning(err error) bool {
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	return errors.As(err, &started)
}

// busy explains that another operation holds the guest's workflow id.
func (c *Client) busy(ctx context.Context, uuid string) error {
	e := &BusyError{UUID: uuid, WorkflowID: guest.InstanceWorkflowID(uuid)}
	if d, err := c.temporal.DescribeWorkflow(ctx, e.WorkflowID, ""); err == nil {
		e.Operation, e.RunID = c.operation(d, uuid).Kind, d.WorkflowExecution.RunID
	}
	return e
}

// checkWindow refuses a confirm window that is neither the default, a
// positive duration, nor NoAutoConfirm.
func checkWindow(d time.Duration) error {
	if d < 0 && d != NoAutoConfirm {
		return fmt.Errorf("confirm window %s: allowed are a positive duration, 0 for the default (%s) or no auto-confirm: %w", d, api.DefaultConfirmWindow, ErrInvalid)
	}
	return nil
}

func orChosen(host string) string {
	if host == "" {
		return "a host pinflow chooses"
	}
	return host
}

// SpecList renders extra specs and image properties as ", KEY=VALUE ...".
func SpecList(specs, props map[string]string) string {
	var parts []string
	for _, m := range []map[string]string{specs, props} {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			parts = append(parts, k+"="+m[k])
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return ", " + strings.Join(parts, " ")
}
