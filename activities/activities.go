// Package activities holds the steps of pinflow's workflows: each changes
// one thing (a claim in the ledger, an instance record, a guest on a
// hypervisor) and is idempotent, so Temporal can retry it after any
// failure, a lost reply or a worker crash.
package activities

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/defrag"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/guestxml"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/placement"
)

// Activities holds what the steps need. Workflows refer to its methods
// through a nil *Activities, so names are checked by the compiler.
type Activities struct {
	Ledger *ledger.Ledger
	Driver hypervisor.Driver
	// Domain says what kind of guest a boot defines.
	Domain guestxml.Options
	// ProgressEvery is how often Migrate heartbeats its progress.
	ProgressEvery time.Duration
	// Audit runs the audit, the recovery and the settling behind their
	// activities; HostLeftovers asks its owner checker too.
	Audit *audit.Auditor
	// ShutdownTimeout is how long Offload waits for the guest to power
	// itself off before destroying it; 0 destroys at once.
	ShutdownTimeout time.Duration
	// FenceLease is how long a fenced hypervisor step may take to act
	// after its fence; 0 takes DefaultFenceLease.
	FenceLease time.Duration
	// MigrationPolicy bounds every live migration (see
	// hypervisor.MigrationPolicy); the zero value sets no bound, and the
	// worker sets it from the configuration.
	MigrationPolicy hypervisor.MigrationPolicy
	// DrainMaxMoves bounds the moves all drains run at once in the whole
	// cloud (TakeMoveSlot); 0 takes DefaultDrainMaxMoves.
	DrainMaxMoves int
	// Placement chooses hosts (ChooseHost); nil fits every host for each
	// choice.
	Placement *placement.Index
	// Simulated makes and forgets simulated hosts when the worker drives
	// the simulator; nil otherwise.
	Simulated SimulatedHosts
	// Libvirt reads and records the libvirt hosts operators register.
	Libvirt LibvirtHosts
}

// LoadInstance returns the instance record.
func (a *Activities) LoadInstance(ctx context.Context, uuid string) (InstanceInfo, error) {
	inst, err := a.Ledger.Instance(ctx, uuid)
	if err != nil {
		return InstanceInfo{}, classify(err)
	}
	info := InfoOf(inst)
	if inst.Host != "" && inst.ClaimID != "" {
		c, err := a.Ledger.GetClaim(ctx, inst.Host, inst.ClaimID)
		if err != nil && !errors.Is(err, ledger.ErrUnknownClaim) {
			return InstanceInfo{}, classify(err)
		}
		if c != nil {
			info.ClaimToken = c.Token
		}
	}
	return info, nil
}

// InfoOf is what the workflows (and the CLI's pre-checks) know of the
// instance record inst.
func InfoOf(inst *ledger.Instance) InstanceInfo {
	i := InstanceInfo{UUID: inst.UUID, Name: inst.Name, Host: inst.Host, VMState: inst.VMState, TaskState: inst.TaskState,
		Flavor: inst.Request, Placement: inst.Placement, ClaimID: inst.ClaimID, Resizing: inst.Resize != nil}
	if r := inst.Resize; r != nil && (r.SourceHost != inst.Host || r.SourceClaimID != inst.ClaimID) {
		i.ResizeSource = &ClaimRef{Host: r.SourceHost, ClaimID: r.SourceClaimID}
	}
	return i
}

// CreateInstance records a new guest, building and spawning. Creating the
// same guest again is a retry and succeeds.
func (a *Activities) CreateInstance(ctx context.Context, in CreateInstanceInput) (InstanceInfo, error) {
	inst, err := a.Ledger.CreateMember(ctx, in.UUID, in.Name, in.Flavor, guest.VMBuilding, in.Creator, in.Group)
	if errors.Is(err, ledger.ErrExists) {
		return InstanceInfo{}, BadState(fmt.Sprintf("instance %s exists already; a boot creates a new instance, so give it a new uuid", in.UUID))
	}
	if err != nil {
		return InstanceInfo{}, classify(err)
	}
	if err := a.Ledger.SetState(ctx, in.UUID, ledger.Transition{Task: guest.TaskSpawning}); err != nil {
		return InstanceInfo{}, classify(err)
	}
	inst.TaskState = guest.TaskSpawning
	return InfoOf(inst), nil
}

// SetTaskState sets the instance's task state, and its vm state when
// given. The workflow id lock on the instance means no other operation is
// open, so a task state left by a terminated workflow is overwritten.
func (a *Activities) SetTaskState(ctx context.Context, in TaskStateInput) error {
	return classify(a.Ledger.SetState(ctx, in.UUID, ledger.Transition{VM: in.VMState, Task: in.TaskState}))
}

// ChooseHost returns the host that takes the guest and, of those, the one
// left with the fewest free pinnable CPUs (packing keeps whole hosts free
// for large guests), ties broken by name: through the placement index,
// or, without one, by fitting every host (placement.Exhaustive).
//
// For a member of a server group, the hosts its group's hard rule
// refuses are passed over, so the choice is one the claim takes (but for
// a race); a soft rule is kept where some host takes the guest, and
// given way to, with a warning, where none does.
func (a *Activities) ChooseHost(ctx context.Context, in ChooseHostInput) (string, error) {
	req, err := in.Flavor.Request()
	if err != nil {
		return "", classify(err)
	}
	r := placement.Request{UUID: in.UUID, Request: req, Exclude: in.Exclude}
	g, err := placement.MemberGroup(ctx, a.Ledger, in.UUID)
	if err != nil {
		return "", classify(err)
	}
	if g == nil {
		host, err := a.choose(ctx, r)
		return host, a.defragHint(ctx, in, req, err)
	}
	narrowed := r
	narrowed.Exclude = slices.Clone(r.Exclude)
	g.Narrow(&narrowed, in.UUID, true)
	host, err := a.choose(ctx, narrowed)
	var noFit *numa.NoFitError
	if !errors.As(err, &noFit) {
		return host, err
	}
	if g.Policy.Hard() {
		return "", temporal.NewNonRetryableApplicationError(groupNoFit(g, in, noFit), api.ErrTypeGroupRule, err)
	}
	host, err = a.choose(ctx, r)
	err = a.defragHint(ctx, in, req, err)
	if err == nil && activity.IsActivity(ctx) {
		activity.GetLogger(ctx).Warn("the guest's soft server group rule gives way: no host that keeps it takes the guest",
			"uuid", in.UUID, "group", g.Name, "policy", g.Policy, "host", host)
	}
	return host, err
}

// groupNoFit says why no host takes a member of hard-rule group g: the
// hosts the rule refuses, and why the rest do not take it.
func groupNoFit(g *placement.ServerGroup, in ChooseHostInput, noFit *numa.NoFitError) string {
	msg := fmt.Sprintf("no host takes guest %s and keeps the %s of group %s", in.UUID, g.Policy, g.Name)
	if g.Policy == ledger.PolicyAffinity && g.Host != "" {
		if slices.Contains(in.Exclude, g.Host) {
			return msg + fmt.Sprintf(": its members are on host %s, which this operation leaves", g.Host)
		}
		return msg + fmt.Sprintf(": its members are on host %s, and %s", g.Host, strings.TrimPrefix(noFit.Error(), "numa: "))
	}
	var held []string
	for h := range g.On {
		if g.Refuses(h, in.UUID) != "" && !slices.Contains(in.Exclude, h) {
			held = append(held, h)
		}
	}
	slices.Sort(held)
	if len(held) > 0 {
		msg += fmt.Sprintf(": hosts %s hold %d of its members each, as many as it allows", strings.Join(held, ", "), g.MaxPerHost)
	}
	if !strings.Contains(noFit.Error(), "there are no other hosts") {
		msg += "; " + strings.TrimPrefix(noFit.Error(), "numa: ")
	}
	return msg
}

// choose chooses through the placement index, or, without one, by
// fitting every host. No host is a *numa.NoFitError; anything else (Redis
// unreachable) is worth retrying.
func (a *Activities) choose(ctx context.Context, r placement.Request) (string, error) {
	if a.Placement != nil {
		return a.Placement.Choose(ctx, r)
	}
	return placement.Exhaustive(ctx, a.Ledger, r)
}

// defragHint is err, a choice's error, as the operation reports it: a
// no-fit non-retryable, and, when a host would take the guest after a
// defrag, naming the host and its plan's steps (defrag.Suggest).
func (a *Activities) defragHint(ctx context.Context, in ChooseHostInput, req *numa.Request, err error) error {
	var noFit *numa.NoFitError
	if !errors.As(err, &noFit) {
		return err
	}
	plan, ok, serr := defrag.Suggest(ctx, a.Ledger, req, in.Flavor.Summary(), in.Exclude)
	if serr != nil || !ok {
		return classify(err)
	}
	hinted := *noFit
	hinted.Reason += fmt.Sprintf("; host %s would take it after a defrag of %s ('pinflow host plan-defrag %s' with the flavor's flags)",
		plan.Host, plan.Steps(), plan.Host)
	return classify(&hinted)
}

// Claim fits the guest on the host and claims what the fit chose, owned by
// the calling workflow. Claiming the same id again returns the first claim.
func (a *Activities) Claim(ctx context.Context, in ClaimInput) (ClaimResult, error) {
	req, err := in.Flavor.Request()
	if err != nil {
		return ClaimResult{}, classify(err)
	}
	c, err := a.Ledger.Claim(ctx, ledger.ClaimSpec{ID: in.ClaimID, Host: in.Host, InstanceUUID: in.UUID, Kind: in.Kind,
		OwnerWorkflowID: in.Owner.WorkflowID, OwnerRunID: in.Owner.FirstRunID, Request: req})
	if err != nil {
		return ClaimResult{}, classify(err)
	}
	return ClaimResult{Host: c.Host, ClaimID: c.ID, Token: c.Token, State: c.State, Placement: *c.Placement}, nil
}

// ReleaseClaim frees a claim; a claim already released, or none at all, is
// no error. With OnlyPending (every compensation) it frees the claim only
// while it is pending: a claim that became an instance's resident claim
// is never a compensation's to free.
func (a *Activities) ReleaseClaim(ctx context.Context, in ReleaseInput) error {
	if in.ClaimID == "" {
		return nil
	}
	if in.OnlyPending {
		_, err := a.Ledger.ReleasePending(ctx, in.Host, in.ClaimID)
		return classify(err)
	}
	return classify(a.Ledger.Release(ctx, in.Host, in.ClaimID))
}

// CommitMigration makes a finished migration durable in three idempotent
// steps, in this order: the destination claim becomes committed, the
// record moves to the destination with the domain XML staged for that
// claim, the source claim is released. A crash
// between two steps leaves the guest attached to one committed claim, and
// the retry finishes the rest.
func (a *Activities) CommitMigration(ctx context.Context, in CommitMigrationInput) error {
	if _, err := a.Ledger.Commit(ctx, in.Dest, in.DestClaimID); err != nil {
		return classify(err)
	}
	// A resize record left by a resize interrupted before its guest moved
	// names the claim released below: it goes with it.
	m := ledger.Move{Host: in.Dest, ClaimID: in.DestClaimID, StagedXML: true, ClearResize: true}
	if err := a.Ledger.MoveInstance(ctx, in.UUID, m); err != nil {
		return classify(err)
	}
	if in.SourceClaimID != "" {
		if err := a.Ledger.Release(ctx, in.Source, in.SourceClaimID); err != nil {
			return classify(err)
		}
	}
	return classify(a.Ledger.SetState(ctx, in.UUID, ledger.Transition{VM: guest.VMActive, Task: guest.TaskNone}))
}

// ClearInstanceHost detaches the instance from its host, node, placement
// and claim, after (never before) that claim's release, and sets its vm
// state and clears its task state.
func (a *Activities) ClearInstanceHost(ctx context.Context, in ClearHostInput) error {
	inst, err := a.Ledger.Instance(ctx, in.UUID)
	if err != nil {
		return classify(err)
	}
	if inst.ClaimID != "" && (in.OnlyClaimID == "" || inst.ClaimID == in.OnlyClaimID) {
		if err := a.Ledger.DetachInstance(ctx, in.UUID, inst.ClaimID); err != nil {
			return classify(err)
		}
		if inst.Resize != nil {
			// A guest off its host has no resize to go back from.
			if err := a.Ledger.ClearResize(ctx, in.UUID); err != nil {
				return classify(err)
			}
		}
	}
	return classify(a.Ledger.SetState(ctx, in.UUID, ledger.Transition{VM: in.VMState, Task: guest.TaskNone}))
}

// DestroyDomain powers the guest off and removes it from the host; a guest
// that is not there is no error. It takes the claim it acts for first
// (fenceDomain), so an attempt whose operation ended destroys nothing.
func (a *Activities) DestroyDomain(ctx context.Context, in DomainInput) error {
	return a.heartbeating(ctx, func(ctx context.Context) error {
		f, err := a.fenceDomain(ctx, in, true)
		if err != nil {
			return err
		}
		return a.destroy(ctx, f, in.Host, in.UUID)
	})
}

// destroy stops and undefines the guest's domain on host, each under f; a
// domain that is not there is no error.
func (a *Activities) destroy(ctx context.Context, f *claimFence, host, uuid string) error {
	if err := f.do(ctx, func(ctx context.Context) error { return a.Driver.Stop(ctx, host, uuid) }); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
		return err
	}
	if err := f.do(ctx, func(ctx context.Context) error { return a.Driver.Undefine(ctx, host, uuid) }); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
		return err
	}
	return nil
}

// Attach makes a spawned guest's claim committed, then points its record
// at the claim, host and domain XML (the one staged for the claim), and
// marks it active.
func (a *Activities) Attach(ctx context.Context, in AttachInput) error {
	if _, err := a.Ledger.Commit(ctx, in.Host, in.ClaimID); err != nil {
		return classify(err)
	}
	// A guest spawned on a new claim has no resize to go back from.
	m := ledger.Move{Host: in.Host, ClaimID: in.ClaimID, StagedXML: true, ClearResize: true}
	if err := a.Ledger.MoveInstance(ctx, in.UUID, m); err != nil {
		return classify(err)
	}
	return classify(a.Ledger.SetState(ctx, in.UUID, ledger.Transition{VM: guest.VMActive, Task: guest.TaskNone}))
}

// DeleteInstance removes the instance's record; a missing record is no
// error.
func (a *Activities) DeleteInstance(ctx context.Context, uuid string) error {
	err := a.Ledger.DeleteInstance(ctx, uuid)
	if errors.Is(err, ledger.ErrUnknownInstance) {
		return nil
	}
	return classify(err)
}
