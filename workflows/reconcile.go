package workflows

import (
	"fmt"
	"strconv"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
)

// ReconcileScheduleID is the id of the Temporal Schedule that runs the
// audit periodically; the worker creates or updates it at start.
const ReconcileScheduleID = "pinflow-reconcile"

// maxAuditBatchesAtOnce bounds the batches an audit runs at once.
const maxAuditBatchesAtOnce = 4

// auditTimeout bounds one host's audit attempt; auditAttempts its tries.
// A host that fails them all is reported, and the others still audited.
const (
	auditTimeout  = 10 * time.Minute
	auditAttempts = 3
)

// Reconcile audits hosts' ledgers against Temporal and the hypervisors,
// in batches of hosts, one activity per batch, at most Concurrency hosts
// at once. It frees only claims
// whose owning workflow is provably closed (see activities.AuditHost) and
// reports drift, repairing only what AuditHost says it does. A host whose
// audit fails is reported and the rest go on.
func Reconcile(ctx workflow.Context, in api.ReconcileInput) (*api.ReconcileResult, error) {
	s, err := newSaga(ctx, api.OpReconcile, "", 0)
	if err != nil {
		return nil, err
	}
	start := workflow.Now(ctx)
	hosts := in.Hosts
	if len(hosts) == 0 {
		if err := s.ledger(ctx, "list the registered hosts", a.ListHosts).Get(ctx, &hosts); err != nil {
			return nil, s.fail(err)
		}
	}
	if workflow.GetVersion(ctx, changeAuditBatches, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		return reconcileEachHost(ctx, s, in, hosts, start)
	}
	page := in.PageSize
	if page <= 0 {
		page = api.DefaultReconcileBatchedPageSize
	}
	if len(hosts) > page {
		return reconcilePages(ctx, s, in, hosts, page, start)
	}
	return reconcileBatches(ctx, s, in, hosts, start)
}

// reconcileBatches audits hosts in batches of in.Batch, one AuditHosts
// activity per batch, with at most in.Concurrency hosts audited at once
// across the batches running. A batch whose activity fails its tries is
// reported as not audited, and the rest go on.
func reconcileBatches(ctx workflow.Context, s *saga, in api.ReconcileInput, hosts []string, start time.Time) (*api.ReconcileResult, error) {
	size := in.Batch
	if size <= 0 {
		size = api.DefaultAuditBatch
	}
	limit := in.Concurrency
	if limit <= 0 {
		limit = api.DefaultReconcileConcurrency
	}
	// A few batches run at once so that one slow host does not idle the
	// others' share, and each audits its part of the concurrency.
	running := min(maxAuditBatchesAtOnce, limit)
	perBatch := (limit + running - 1) / running
	every := len(hosts) <= api.DefaultReconcilePageSize
	batches := (len(hosts) + size - 1) / size
	s.steps = batches
	res := &api.ReconcileResult{DryRun: in.DryRun, Hosts: []audit.HostAudit{}, Audited: len(hosts)}
	s.auditPhase(api.PhaseAuditing, res, 0, len(hosts))
	found := make([][]audit.HostAudit, batches)
	sel := workflow.NewSelector(ctx)
	done := 0
	auditBatch := func(b int) {
		part := hosts[b*size : min((b+1)*size, len(hosts))]
		actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: auditTimeout, HeartbeatTimeout: heartbeatTimeout,
			RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2,
				MaximumAttempts: auditAttempts, NonRetryableErrorTypes: activities.NonRetryableErrorTypes},
			Summary: fmt.Sprintf("audit hosts %s to %s", part[0], part[len(part)-1]),
		})
		f := workflow.ExecuteActivity(actx, a.AuditHosts, activities.AuditBatchInput{Hosts: part, Grace: in.Grace, DryRun: in.DryRun,
			Concurrency: perBatch, Every: every})
		sel.AddFuture(f, func(f workflow.Future) {
			var got activities.AuditBatch
			if err := f.Get(ctx, &got); err != nil {
				got = activities.AuditBatch{Audited: len(part), Hosts: []audit.HostAudit{{Host: fmt.Sprintf("%s..%s", part[0], part[len(part)-1]),
					DryRun: in.DryRun, Tally: audit.Tally{Errors: len(part)}, Errors: []string{fmt.Sprintf("audit of %d hosts: %v", len(part), err)}}}}
				got.Total.Errors = len(part)
			}
			found[b] = got.Hosts
			res.Total.Add(got.Total)
			done += got.Audited
			s.step()
			s.auditPhase(api.PhaseAuditing, res, done, len(hosts))
		})
	}
	next := 0
	for ; next < batches && next < running; next++ {
		auditBatch(next)
	}
	for range batches {
		sel.Select(ctx)
		if next < batches {
			auditBatch(next)
			next++
		}
	}
	for _, f := range found {
		res.Hosts = append(res.Hosts, f...)
	}
	return s.finishAudit(ctx, in, res, done, len(hosts), start), nil
}

// reconcileEachHost is the audit of runs started before
// changeAuditBatches: one AuditHost activity per host, in pages of
// DefaultReconcilePageSize.
func reconcileEachHost(ctx workflow.Context, s *saga, in api.ReconcileInput, hosts []string, start time.Time) (*api.ReconcileResult, error) {
	page := in.PageSize
	if page <= 0 {
		page = api.DefaultReconcilePageSize
	}
	if len(hosts) > page {
		return reconcilePages(ctx, s, in, hosts, page, start)
	}
	s.steps = len(hosts)
	res := &api.ReconcileResult{DryRun: in.DryRun, Hosts: make([]audit.HostAudit, len(hosts)), Audited: len(hosts)}
	s.auditPhase(api.PhaseAuditing, res, 0, len(hosts))

	limit := in.Concurrency
	if limit <= 0 {
		limit = api.DefaultReconcileConcurrency
	}
	sel := workflow.NewSelector(ctx)
	done := 0
	auditHost := func(i int) {
		actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: auditTimeout, HeartbeatTimeout: heartbeatTimeout,
			RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2,
				MaximumAttempts: auditAttempts, NonRetryableErrorTypes: activities.NonRetryableErrorTypes},
			Summary: "audit host " + hosts[i],
		})
		f := workflow.ExecuteActivity(actx, a.AuditHost, audit.AuditHostInput{Host: hosts[i], Grace: in.Grace, DryRun: in.DryRun})
		sel.AddFuture(f, func(f workflow.Future) {
			var h audit.HostAudit
			if err := f.Get(ctx, &h); err != nil {
				h = audit.HostAudit{Host: hosts[i], DryRun: in.DryRun, Errors: []string{err.Error()}}
				h.Tally.Errors = 1
			}
			res.Hosts[i] = h
			res.Total.Add(h.Tally)
			done++
			s.step()
			s.auditPhase(api.PhaseAuditing, res, done, len(hosts))
		})
	}
	next := 0
	for ; next < len(hosts) && next < limit; next++ {
		auditHost(next)
	}
	for range hosts {
		sel.Select(ctx)
		if next < len(hosts) {
			auditHost(next)
			next++
		}
	}
	return s.finishAudit(ctx, in, res, done, len(hosts), start), nil
}

// reconcilePages audits the hosts page by page, each page a child run of
// Reconcile under this run's id, one page at a time so that Concurrency
// still bounds the hosts audited at once. It keeps the hosts that found
// something and the totals.
func reconcilePages(ctx workflow.Context, s *saga, in api.ReconcileInput, hosts []string, page int, start time.Time) (*api.ReconcileResult, error) {
	res := &api.ReconcileResult{DryRun: in.DryRun, Hosts: []audit.HostAudit{}}
	pages := (len(hosts) + page - 1) / page
	s.steps = pages
	s.auditPhase(api.PhaseAuditing, res, 0, len(hosts))
	id := workflow.GetInfo(ctx).WorkflowExecution.ID
	for p := range pages {
		part := hosts[p*page : min((p+1)*page, len(hosts))]
		child := in
		child.Hosts, child.PageSize = part, page
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID:    fmt.Sprintf("%s-page-%d", id, p+1),
			StaticSummary: fmt.Sprintf("audit page %d of %d: hosts %s to %s", p+1, pages, part[0], part[len(part)-1]),
		})
		var pr api.ReconcileResult
		if err := workflow.ExecuteChildWorkflow(cctx, Reconcile, child).Get(ctx, &pr); err != nil {
			// The page's hosts are reported as not audited; the rest go on.
			res.Hosts = append(res.Hosts, audit.HostAudit{Host: fmt.Sprintf("%s..%s", part[0], part[len(part)-1]), DryRun: in.DryRun,
				Tally: audit.Tally{Errors: len(part)}, Errors: []string{fmt.Sprintf("audit page %d: %v", p+1, err)}})
			res.Total.Errors += len(part)
		} else {
			for _, h := range pr.Hosts {
				if len(h.Freed) > 0 || len(h.Drift) > 0 || len(h.Errors) > 0 || len(h.Evacuated) > 0 {
					res.Hosts = append(res.Hosts, h)
				}
			}
			res.Total.Add(pr.Total)
		}
		res.Audited += len(part)
		res.Pages++
		s.step()
		s.auditPhase(api.PhaseAuditing, res, res.Audited, len(hosts))
	}
	return s.finishAudit(ctx, in, res, res.Audited, len(hosts), start), nil
}

// finishAudit sweeps the building records, times the audit, and reports
// it in the search attributes, the status, the Web UI and, unless it is a
// page of a larger audit, the metrics.
func (s *saga) finishAudit(ctx workflow.Context, in api.ReconcileInput, res *api.ReconcileResult, done, of int, start time.Time) *api.ReconcileResult {
	s.sweepRecords(ctx, in, res)
	res.Duration = workflow.Now(ctx).Sub(start)
	_ = workflow.UpsertTypedSearchAttributes(ctx, api.AttrFreed.ValueSet(int64(res.Total.Freed.Total())),
		api.AttrDrift.ValueSet(int64(res.Total.Drift.Total())))
	s.auditPhase(api.PhaseCompleted, res, done, of)
	if workflow.GetInfo(ctx).ParentWorkflowExecution == nil {
		recordAudit(ctx, res)
	}
	return res
}

// Metrics of each whole audit. An audit that takes longer than the
// schedule's interval makes the schedule skip runs, so an alert on the
// duration against the interval, or on the age of the last completion,
// sees the audit falling behind before a leak waits long for it.
const (
	MetricAuditDuration  = "pinflow.reconcile.duration"
	MetricAuditHosts     = "pinflow.reconcile.hosts"
	MetricAuditErrors    = "pinflow.reconcile.errors"
	MetricAuditCompleted = "pinflow.reconcile.completed.time"
)

// recordAudit records the audit's metrics through Temporal's workflow
// metrics handler, which records nothing while a history replays.
func recordAudit(ctx workflow.Context, res *api.ReconcileResult) {
	m := workflow.GetMetricsHandler(ctx).WithTags(map[string]string{"dry_run": strconv.FormatBool(res.DryRun)})
	m.Timer(MetricAuditDuration).Record(res.Duration)
	m.Gauge(MetricAuditHosts).Update(float64(res.Audited))
	m.Counter(MetricAuditErrors).Inc(int64(res.Total.Errors))
	m.Gauge(MetricAuditCompleted).Update(float64(workflow.Now(ctx).Unix()))
}

// sweepRecords sweeps the instance records stuck in building, which no
// host's audit reaches, when the audit is of every host (its pages, which
// name their hosts, leave it to their parent). A sweep that fails is
// reported as an error of the audit.
func (s *saga) sweepRecords(ctx workflow.Context, in api.ReconcileInput, res *api.ReconcileResult) {
	if len(in.Hosts) > 0 {
		return
	}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: auditTimeout, HeartbeatTimeout: heartbeatTimeout,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2,
			MaximumAttempts: auditAttempts, NonRetryableErrorTypes: activities.NonRetryableErrorTypes},
		Summary: "sweep the records stuck in building",
	})
	sweep := audit.RecordSweep{DryRun: in.DryRun}
	if err := workflow.ExecuteActivity(actx, a.SweepBuilding, audit.SweepBuildingInput{Grace: in.Grace, DryRun: in.DryRun}).Get(ctx, &sweep); err != nil {
		sweep.Errors, sweep.Tally.Errors = []string{err.Error()}, 1
	}
	res.Records = &sweep
	res.Total.Add(sweep.Tally)
}

// auditPhase records the phase with the counts so far in the status query
// and, as the report the CLI prints, in the Web UI's current details.
func (s *saga) auditPhase(p api.Phase, res *api.ReconcileResult, done, of int) {
	t := res.Total
	s.phase(p, fmt.Sprintf("audited %d/%d hosts: %d claims, kept %d, freed %d, drift %d, errors %d",
		done, of, t.Claims, t.Kept.Total(), t.Freed.Total(), t.Drift.Total(), t.Errors))
	if p == api.PhaseCompleted {
		workflow.SetCurrentDetails(s.ctx, "```\n"+api.ReconcileReport(res)+"```\n")
	}
}
