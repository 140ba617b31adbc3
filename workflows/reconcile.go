package workflows

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
)

// ReconcileScheduleID is the id of the Temporal Schedule that runs the
// audit periodically; the worker creates or updates it at start.
const ReconcileScheduleID = "pinflow-reconcile"

// ReconcileWorkflowIDPrefix starts the workflow id of every audit run, by
// the schedule or by `pinflow reconcile`. It is not a per-instance id: an
// audit never holds a guest's lock.
const ReconcileWorkflowIDPrefix = "reconcile"

// DefaultReconcileConcurrency is how many hosts an audit checks at once
// when its input does not say.
const DefaultReconcileConcurrency = 8

// Typed search attributes an audit sets when it ends: how many claims it
// freed and how much drift it found, so dashboards can find the runs that
// did something.
var (
	AttrFreed = temporal.NewSearchAttributeKeyInt64("PinflowFreed")
	AttrDrift = temporal.NewSearchAttributeKeyInt64("PinflowDrift")
)

// ReconcileInput says which hosts to audit and how.
type ReconcileInput struct {
	// Hosts to audit; empty audits every registered host.
	Hosts []string `json:"hosts,omitempty"`
	// Grace overrides the worker's grace period: claims younger than it
	// are not judged. Zero judges every claim however young.
	Grace *time.Duration `json:"grace,omitempty"`
	// DryRun decides and reports but frees nothing.
	DryRun bool `json:"dry_run,omitempty"`
	// Concurrency bounds how many hosts are audited at once;
	// DefaultReconcileConcurrency when 0.
	Concurrency int `json:"concurrency,omitempty"`
	// PageSize bounds the hosts one run audits itself; more are audited
	// page by page in child runs. DefaultReconcileBatchedPageSize when 0.
	PageSize int `json:"page_size,omitempty"`
	// Batch is how many hosts one activity audits; DefaultAuditBatch
	// when 0.
	Batch int `json:"batch,omitempty"`
}

// DefaultAuditBatch is how many hosts one AuditHosts activity audits:
// enough that Temporal's dispatch of activities costs little next to the
// reads, few enough that a retry repeats little and the batch's result
// stays small.
const DefaultAuditBatch = 100

// maxAuditBatchesAtOnce bounds the batches an audit runs at once.
const maxAuditBatchesAtOnce = 4

// DefaultReconcileBatchedPageSize is how many hosts one audit run checks
// itself, in batches. Each batch costs its run three history events, so
// 100,000 hosts cost 3,000, below Temporal's history warning (10,240
// events); a larger fleet is audited in child runs, page by page.
const DefaultReconcileBatchedPageSize = 100_000

// DefaultReconcilePageSize is how many hosts one run of an audit that
// audits each host in its own activity checks itself (runs started
// before auditBatchesChange), and the most hosts an audit's result lists
// one by one: a larger audit lists only the hosts that found something.
const DefaultReconcilePageSize = 500

// ReconcileResult is what an audit kept, freed and found, per host and in
// total.
type ReconcileResult struct {
	DryRun bool `json:"dry_run,omitempty"`
	// Hosts are the hosts audited, each with what it found; an audit of
	// more than DefaultReconcilePageSize hosts lists only the hosts with a
	// claim freed, drift, an evacuation started or an error, so that its
	// result stays small (a batch that failed is one entry, named by its
	// first and last host).
	Hosts []audit.HostAudit `json:"hosts"`
	// Audited is how many hosts the audit checked; Pages how many child
	// runs it took (0: it checked them itself).
	Audited int         `json:"audited"`
	Pages   int         `json:"pages,omitempty"`
	Total   audit.Tally `json:"total"`
	// Records is the sweep of the instance records stuck in building, run
	// by an audit of every host.
	Records *audit.RecordSweep `json:"records,omitempty"`
	// Duration is the audit's wall time, from the workflow's clock.
	Duration time.Duration `json:"duration"`
}

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
func Reconcile(ctx workflow.Context, in ReconcileInput) (*ReconcileResult, error) {
	s, err := newSaga(ctx, OpReconcile, "", 0)
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
	if workflow.GetVersion(ctx, auditBatchesChange, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		return reconcileEachHost(ctx, s, in, hosts, start)
	}
	page := in.PageSize
	if page <= 0 {
		page = DefaultReconcileBatchedPageSize
	}
	if len(hosts) > page {
		return reconcilePages(ctx, s, in, hosts, page, start)
	}
	return reconcileBatches(ctx, s, in, hosts, start)
}

// auditBatchesChange is the change to auditing hosts in batches, one
// activity per batch, instead of one activity per host.
const auditBatchesChange = "audit-batches"

// reconcileBatches audits hosts in batches of in.Batch, one AuditHosts
// activity per batch, with at most in.Concurrency hosts audited at once
// across the batches running. A batch whose activity fails its tries is
// reported as not audited, and the rest go on.
func reconcileBatches(ctx workflow.Context, s *saga, in ReconcileInput, hosts []string, start time.Time) (*ReconcileResult, error) {
	size := in.Batch
	if size <= 0 {
		size = DefaultAuditBatch
	}
	limit := in.Concurrency
	if limit <= 0 {
		limit = DefaultReconcileConcurrency
	}
	// A few batches run at once so that one slow host does not idle the
	// others' share, and each audits its part of the concurrency.
	running := min(maxAuditBatchesAtOnce, limit)
	perBatch := (limit + running - 1) / running
	every := len(hosts) <= DefaultReconcilePageSize
	batches := (len(hosts) + size - 1) / size
	s.steps = batches
	res := &ReconcileResult{DryRun: in.DryRun, Hosts: []audit.HostAudit{}, Audited: len(hosts)}
	s.auditPhase(PhaseAuditing, res, 0, len(hosts))
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
			s.auditPhase(PhaseAuditing, res, done, len(hosts))
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
// auditBatchesChange: one AuditHost activity per host, in pages of
// DefaultReconcilePageSize.
func reconcileEachHost(ctx workflow.Context, s *saga, in ReconcileInput, hosts []string, start time.Time) (*ReconcileResult, error) {
	page := in.PageSize
	if page <= 0 {
		page = DefaultReconcilePageSize
	}
	if len(hosts) > page {
		return reconcilePages(ctx, s, in, hosts, page, start)
	}
	s.steps = len(hosts)
	res := &ReconcileResult{DryRun: in.DryRun, Hosts: make([]audit.HostAudit, len(hosts)), Audited: len(hosts)}
	s.auditPhase(PhaseAuditing, res, 0, len(hosts))

	limit := in.Concurrency
	if limit <= 0 {
		limit = DefaultReconcileConcurrency
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
			s.auditPhase(PhaseAuditing, res, done, len(hosts))
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
func reconcilePages(ctx workflow.Context, s *saga, in ReconcileInput, hosts []string, page int, start time.Time) (*ReconcileResult, error) {
	res := &ReconcileResult{DryRun: in.DryRun, Hosts: []audit.HostAudit{}}
	pages := (len(hosts) + page - 1) / page
	s.steps = pages
	s.auditPhase(PhaseAuditing, res, 0, len(hosts))
	id := workflow.GetInfo(ctx).WorkflowExecution.ID
	for p := range pages {
		part := hosts[p*page : min((p+1)*page, len(hosts))]
		child := in
		child.Hosts, child.PageSize = part, page
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID:    fmt.Sprintf("%s-page-%d", id, p+1),
			StaticSummary: fmt.Sprintf("audit page %d of %d: hosts %s to %s", p+1, pages, part[0], part[len(part)-1]),
		})
		var pr ReconcileResult
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
		s.auditPhase(PhaseAuditing, res, res.Audited, len(hosts))
	}
	return s.finishAudit(ctx, in, res, res.Audited, len(hosts), start), nil
}

// finishAudit sweeps the building records, times the audit, and reports
// it in the search attributes, the status, the Web UI and, unless it is a
// page of a larger audit, the metrics.
func (s *saga) finishAudit(ctx workflow.Context, in ReconcileInput, res *ReconcileResult, done, of int, start time.Time) *ReconcileResult {
	s.sweepRecords(ctx, in, res)
	res.Duration = workflow.Now(ctx).Sub(start)
	_ = workflow.UpsertTypedSearchAttributes(ctx, AttrFreed.ValueSet(int64(res.Total.Freed.Total())),
		AttrDrift.ValueSet(int64(res.Total.Drift.Total())))
	s.auditPhase(PhaseCompleted, res, done, of)
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
func recordAudit(ctx workflow.Context, res *ReconcileResult) {
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
func (s *saga) sweepRecords(ctx workflow.Context, in ReconcileInput, res *ReconcileResult) {
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
func (s *saga) auditPhase(p Phase, res *ReconcileResult, done, of int) {
	t := res.Total
	s.phase(p, fmt.Sprintf("audited %d/%d hosts: %d claims, kept %d, freed %d, drift %d, errors %d",
		done, of, t.Claims, t.Kept.Total(), t.Freed.Total(), t.Drift.Total(), t.Errors))
	if p == PhaseCompleted {
		workflow.SetCurrentDetails(s.ctx, "```\n"+ReconcileReport(res)+"```\n")
	}
}

// ReconcileReport renders an audit's result as the text `pinflow
// reconcile` prints and the Web UI shows for scheduled runs.
func ReconcileReport(res *ReconcileResult) string {
	var b strings.Builder
	dry := ""
	if res.DryRun {
		dry = " (dry run: nothing was freed)"
	}
	pages := ""
	switch {
	case res.Pages > 0:
		pages = fmt.Sprintf(" (%d pages; only hosts that found something are listed)", res.Pages)
	case res.Audited > DefaultReconcilePageSize:
		pages = " (only hosts that found something are listed)"
	}
	b.WriteString(fmt.Sprintf("reconcile%s: %d hosts in %s%s\n", dry, res.Audited, res.Duration.Round(time.Millisecond), pages))
	b.WriteString(fmt.Sprintf("total: %s\n", tallyLine(res.Total)))
	if r := res.Records; r != nil {
		b.WriteString(fmt.Sprintf("building records: %s\n", tallyLine(r.Tally)))
		writeDrift(&b, r.Drift, r.Errors)
	}
	for _, h := range res.Hosts {
		if h.Host == "" {
			continue
		}
		b.WriteString(fmt.Sprintf("host %s: %s\n", h.Host, tallyLine(h.Tally)))
		for _, f := range h.Freed {
			verb := "freed"
			if h.DryRun {
				verb = "would free"
			}
			b.WriteString(fmt.Sprintf("  %s %s claim %s of %s (owner %s) pCPUs %s: %s\n", verb, f.State, f.ClaimID, f.Instance, f.Owner, orDashCPUs(f.CPUs), f.Reason))
		}
		for _, uuid := range h.Evacuated {
			b.WriteString(fmt.Sprintf("  evacuation of %s started (the host is down, with automatic evacuation)\n", uuid))
		}
		writeDrift(&b, h.Drift, h.Errors)
	}
	return b.String()
}

// writeDrift writes an audit's drift and error lines.
func writeDrift(b *strings.Builder, drift []audit.Drift, errs []string) {
	for _, d := range drift {
		flight := ""
		if d.InFlight {
			flight = " [its workflow is open: may be a step in progress]"
		}
		b.WriteString(fmt.Sprintf("  drift %s: %s%s\n", d.Kind, d.Detail, flight))
	}
	for _, e := range errs {
		b.WriteString(fmt.Sprintf("  error: %s\n", e))
	}
}

func tallyLine(t audit.Tally) string {
	line := fmt.Sprintf("%d claims, kept %d%s, freed %d%s, drift %d%s, errors %d",
		t.Claims, t.Kept.Total(), reasons(t.Kept), t.Freed.Total(), reasons(t.Freed), t.Drift.Total(), reasons(t.Drift), t.Errors)
	if t.Evacuations > 0 {
		line += fmt.Sprintf(", evacuations started %d", t.Evacuations)
	}
	return line
}

func reasons(rc audit.ReasonCounts) string {
	if len(rc) == 0 {
		return ""
	}
	parts := make([]string, len(rc))
	for i, c := range rc {
		parts[i] = fmt.Sprintf("%s %d", c.Reason, c.Count)
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func orDashCPUs(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
