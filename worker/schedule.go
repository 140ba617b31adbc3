package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/config"
	"github.com/pinflow/pinflow/workflows"
)

// reconcileCatchup is the schedule's catchup window: an audit missed while
// the server was down is worth running late only briefly; the next one
// comes soon anyway.
const reconcileCatchup = time.Minute

// ensureReconcileSchedule makes the Temporal Schedule that runs the ledger
// audit every rc.Interval exist as configured: created, or updated in
// place when another worker created it, or deleted when the interval is 0.
// Its runs skip while one is still running (overlap SKIP) and take the
// workers' configured grace period.
func ensureReconcileSchedule(ctx context.Context, tc client.Client, taskQueue string, rc config.Reconcile, logger *slog.Logger) error {
	sc := tc.ScheduleClient()
	h := sc.GetHandle(ctx, workflows.ReconcileScheduleID)
	if rc.Interval <= 0 {
		err := h.Delete(ctx)
		var nf *serviceerror.NotFound
		if err != nil && !errors.As(err, &nf) {
			return fmt.Errorf("delete schedule %s: %w", workflows.ReconcileScheduleID, err)
		}
		logger.Info("reconcile schedule off", "schedule", workflows.ReconcileScheduleID)
		return nil
	}
	spec := client.ScheduleSpec{Intervals: []client.ScheduleIntervalSpec{{Every: rc.Interval}}}
	action := &client.ScheduleWorkflowAction{
		// The schedule appends the action time: reconcile-<timestamp>.
		ID:                    api.ReconcileWorkflowIDPrefix,
		Workflow:              workflows.Reconcile,
		Args:                  []any{api.ReconcileInput{Concurrency: rc.Concurrency}},
		TaskQueue:             taskQueue,
		TypedSearchAttributes: temporal.NewSearchAttributes(api.StartAttributes(api.OpReconcile, "")...),
		StaticSummary:         "periodic ledger audit",
	}
	policy := &client.SchedulePolicies{Overlap: enumspb.SCHEDULE_OVERLAP_POLICY_SKIP, CatchupWindow: reconcileCatchup}
	_, err := sc.Create(ctx, client.ScheduleOptions{
		ID: workflows.ReconcileScheduleID, Spec: spec, Action: action,
		Overlap: policy.Overlap, CatchupWindow: policy.CatchupWindow,
		Note: "created by pinflow-worker from PINFLOW_RECONCILE_*",
	})
	if errors.Is(err, temporal.ErrScheduleAlreadyRunning) {
		err = h.Update(ctx, client.ScheduleUpdateOptions{DoUpdate: func(in client.ScheduleUpdateInput) (*client.ScheduleUpdate, error) {
			s := in.Description.Schedule
			s.Spec, s.Action, s.Policy = &spec, action, policy
			return &client.ScheduleUpdate{Schedule: &s}, nil
		}})
	}
	if err != nil {
		return fmt.Errorf("schedule %s: %w", workflows.ReconcileScheduleID, err)
	}
	logger.Info("reconcile schedule on", "schedule", workflows.ReconcileScheduleID, "every", rc.Interval,
		"grace", rc.Grace, "concurrency", rc.Concurrency)
	return nil
}
