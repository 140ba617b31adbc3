package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	tclient "go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/ledger"
)

// Audit is a run of the ledger audit, to follow.
type Audit struct {
	c          *Client
	WorkflowID string
	RunID      string
}

// Reconcile starts the ledger audit the schedule runs, now, of in.Hosts
// or of every registered host: claims whose owners have been closed for
// the grace are freed unless a domain of their instance uses their pCPUs,
// interrupted moves are settled forwards, and pCPUs a running domain uses
// that no claim explains are quarantined; with DryRun it only reports. A
// nil Grace takes the workers'. An unknown host is refused.
func (c *Client) Reconcile(ctx context.Context, in api.ReconcileInput) (*Audit, error) {
	if in.Grace != nil && *in.Grace < 0 {
		return nil, fmt.Errorf("reconcile: grace %v: give a duration of 0 or more: %w", *in.Grace, ErrInvalid)
	}
	for _, h := range in.Hosts {
		if _, err := c.HostStatus(ctx, h); err != nil {
			return nil, fmt.Errorf("reconcile: %w", err)
		}
	}
	id := reconcileWorkflowID(time.Now())
	summary := "ledger audit of every host"
	if len(in.Hosts) > 0 {
		summary = "ledger audit of " + strings.Join(in.Hosts, ", ")
	}
	if in.DryRun {
		summary += " (dry run)"
	}
	run, err := c.temporal.ExecuteWorkflow(ctx, tclient.StartWorkflowOptions{
		ID:                    id,
		TaskQueue:             c.taskQueue,
		TypedSearchAttributes: temporal.NewSearchAttributes(api.StartAttributes(api.OpReconcile, "")...),
		StaticSummary:         summary,
	}, api.WorkflowReconcile, in)
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	return &Audit{c: c, WorkflowID: id, RunID: run.GetRunID()}, nil
}

// reconcileWorkflowID names an audit run started now: its time, and a
// random suffix so two started in one millisecond do not collide.
func reconcileWorkflowID(now time.Time) string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return fmt.Sprintf("%s-%s-%s", api.ReconcileWorkflowIDPrefix, now.UTC().Format("20060102T150405.000Z"), hex.EncodeToString(b))
}

// Status asks the running audit where it stands.
func (a *Audit) Status(ctx context.Context) (api.Status, error) {
	var st api.Status
	err := a.c.query(ctx, a.WorkflowID, a.RunID, api.StatusQuery, &st)
	return st, err
}

// Wait follows the audit to its end and returns what it kept, freed and
// found. progress, when not nil, is called whenever its status changes.
// A failure is an *OperationError of one line; when ctx ends first, the
// audit goes on and the error wraps ctx's.
func (a *Audit) Wait(ctx context.Context, progress func(api.Status)) (*api.ReconcileResult, error) {
	var res api.ReconcileResult
	var last api.Status
	err := a.c.follow(ctx, a.WorkflowID, a.RunID, &res, 300*time.Millisecond, func() bool {
		if progress == nil {
			return false
		}
		if st, err := a.Status(ctx); err == nil && st != last {
			progress(st)
			last = st
		}
		return false
	})
	if err := waitError(ctx, api.OpReconcile, a.WorkflowID, a.WorkflowID, a.RunID, err); err != nil {
		return nil, err
	}
	return &res, nil
}

// Recover rebuilds the ledgers of in.Hosts, or of every registered host,
// after Redis lost data, from the domains their hypervisors run and the
// instance records, and waits for it: it registers a lost topology
// again, restores the resident claims the records agree with, and
// quarantines pCPUs no record explains. It only adds claims, never frees
// one; with DryRun it changes nothing. A host whose ledger keys are all
// gone is no longer registered, so it must be named.
func (c *Client) Recover(ctx context.Context, in api.RecoverInput) (*api.RecoverResult, error) {
	for _, h := range in.Hosts {
		if err := ledger.CheckHostName(h); err != nil {
			return nil, fmt.Errorf("recover: %v: %w", err, ErrInvalid)
		}
	}
	id := fmt.Sprintf("recover-%s", time.Now().UTC().Format("20060102T150405.000Z"))
	run, err := c.temporal.ExecuteWorkflow(ctx, tclient.StartWorkflowOptions{
		ID: id, TaskQueue: c.taskQueue,
		TypedSearchAttributes: temporal.NewSearchAttributes(api.StartAttributes(api.OpRecover, "")...),
		StaticSummary:         "ledger recovery from the hypervisors",
	}, api.WorkflowRecover, in)
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	var res api.RecoverResult
	if err := waitError(ctx, api.OpRecover, "", id, run.GetRunID(), c.result(ctx, id, run.GetRunID(), &res)); err != nil {
		return nil, err
	}
	return &res, nil
}

// ReleaseQuarantine releases a quarantine claim on host: an operator's
// decision that the pCPUs it held are free. It runs on a worker, which
// asks the hypervisor and refuses, naming the domain, while a running or
// paused domain uses any of them; a claim that is no quarantine is
// refused too.
func (c *Client) ReleaseQuarantine(ctx context.Context, host, claimID string) (*audit.ReleasedQuarantine, error) {
	if err := ledger.CheckHostName(host); err != nil {
		return nil, fmt.Errorf("quarantine release: %v: %w", err, ErrInvalid)
	}
	if claimID == "" {
		return nil, fmt.Errorf("quarantine release: an empty claim id; allowed is the id of a quarantine claim on %s: %w", host, ErrInvalid)
	}
	id := api.QuarantineReleaseWorkflowID(host, claimID)
	run, err := c.startWorkflow(ctx, id, plan{op: api.OpUnquarantine, workflow: api.WorkflowReleaseQuarantine,
		input:   audit.ReleaseQuarantineInput{Host: host, ClaimID: claimID},
		summary: "release quarantine " + claimID + " on " + host, source: host}, "")
	switch {
	case alreadyRunning(err):
		return nil, fmt.Errorf("quarantine release: claim %s on %s is being released already: %w", claimID, host,
			&BusyError{Host: host, Operation: api.OpUnquarantine, WorkflowID: id})
	case err != nil:
		return nil, fmt.Errorf("quarantine release: %w", err)
	}
	var res audit.ReleasedQuarantine
	if err := waitError(ctx, api.OpUnquarantine, host, id, run.GetRunID(), c.result(ctx, id, run.GetRunID(), &res)); err != nil {
		return nil, err
	}
	return &res, nil
}
