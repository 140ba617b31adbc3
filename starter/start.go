package main

import (
	"errors"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	tclient "go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/workflows"
)

// opPlan is an operation on a whole host to start: its workflow input,
// the summary shown in the Web UI, and its hosts.
type opPlan struct {
	op           workflows.Operation
	wf           any
	input        any
	summary      string
	source, dest string
}

// checkHost refuses a host the ledger does not know.
func checkHost(a *app, host string) error {
	api, err := a.ledgerClient()
	if err != nil {
		return err
	}
	_, err = api.HostStatus(a.ctx, host)
	return err
}

// startWorkflow starts p's workflow under id, for the guest uuid (empty
// for an operation on a whole host), with its hosts as search attributes
// and details for the Web UI. An id runs one workflow at a time: while one
// runs, the start fails and alreadyRunning says so.
func startWorkflow(a *app, c tclient.Client, id, uuid string, p opPlan, details string) (tclient.WorkflowRun, error) {
	attrs := workflows.StartAttributes(p.op, uuid)
	if p.source != "" {
		attrs = append(attrs, workflows.AttrSourceHost.ValueSet(p.source))
	}
	if p.dest != "" {
		attrs = append(attrs, workflows.AttrDestHost.ValueSet(p.dest))
	}
	return c.ExecuteWorkflow(a.ctx, tclient.StartWorkflowOptions{
		ID:                                       id,
		TaskQueue:                                a.cfg.TaskQueue,
		WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowIDReusePolicy:                    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		TypedSearchAttributes:                    temporal.NewSearchAttributes(attrs...),
		StaticSummary:                            p.summary,
		StaticDetails:                            details,
	}, p.wf, p.input)
}

// alreadyRunning says whether a start failed because a workflow runs under
// its id already.
func alreadyRunning(err error) bool {
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	return errors.As(err, &started)
}
