package api

import (
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/audit"
)

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

// DefaultReconcileBatchedPageSize is how many hosts one audit run checks
// itself, in batches. Each batch costs its run three history events, so
// 100,000 hosts cost 3,000, below Temporal's history warning (10,240
// events); a larger fleet is audited in child runs, page by page.
const DefaultReconcileBatchedPageSize = 100_000

// DefaultReconcilePageSize is how many hosts one run of an audit that
// audits each host in its own activity checks itself (runs started
// before audits ran in batches), and the most hosts an audit's result lists
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
