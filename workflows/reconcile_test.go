package workflows

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
)

// auditsInBatches mocks AuditHosts as a batch of host audits, each by
// audit, at most the batch's concurrency at once, and records every
// batch's input.
func (h *harness) auditsInBatches(audit1 func(audit.AuditHostInput) audit.HostAudit) *[]activities.AuditBatchInput {
	var mu sync.Mutex
	var batches []activities.AuditBatchInput
	h.env.OnActivity(a.AuditHosts, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.AuditBatchInput) (activities.AuditBatch, error) {
			mu.Lock()
			batches = append(batches, in)
			mu.Unlock()
			out := make([]audit.HostAudit, len(in.Hosts))
			sem := make(chan struct{}, in.Concurrency)
			var wg sync.WaitGroup
			for i, host := range in.Hosts {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					out[i] = audit1(audit.AuditHostInput{Host: host, Grace: in.Grace, DryRun: in.DryRun})
				}()
			}
			wg.Wait()
			res := activities.AuditBatch{Hosts: []audit.HostAudit{}, Audited: len(in.Hosts)}
			for _, ha := range out {
				res.Total.Add(ha.Tally)
				if in.Every || len(ha.Freed) > 0 || len(ha.Errors) > 0 {
					res.Hosts = append(res.Hosts, ha)
				}
			}
			return res, nil
		})
	return &batches
}

func TestReconcileAggregatesHostsWithBoundedConcurrency(t *testing.T) {
	h := newHarness(t)
	hosts := []string{"a", "b", "c", "d", "e"}
	h.on("list", a.ListHosts, hosts, nil)
	var mu sync.Mutex
	running, most := 0, 0
	batches := h.auditsInBatches(func(in audit.AuditHostInput) audit.HostAudit {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		// Long enough for the others to start if nothing held them back.
		time.Sleep(30 * time.Millisecond)
		mu.Lock()
		running--
		mu.Unlock()
		if in.Host == "c" {
			return audit.HostAudit{Host: "c", Errors: []string{"redis: connection refused"}, Tally: audit.Tally{Errors: 1}}
		}
		res := audit.HostAudit{Host: in.Host}
		res.Tally.Claims = 2
		res.Tally.Kept.Add(audit.KeptResident, 1)
		res.Tally.Freed.Add(audit.FreedOwnerClosed, 1)
		res.Freed = []audit.FreedClaim{{ClaimID: "x-" + in.Host, Reason: audit.FreedOwnerClosed}}
		return res
	})
	stuck := audit.RecordSweep{Drift: []audit.Drift{{Kind: audit.DriftStuckBuild, Instance: "u", Detail: "instance u is building with no domain on no host"}}}
	stuck.Tally.Drift.Add(audit.DriftStuckBuild, 1)
	h.on("sweep", a.SweepBuilding, stuck, nil)
	// A worker that dies in an audit step must not hold the audit for the
	// step's whole timeout: every step heartbeats.
	var unbeaten []string
	h.env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
		if info.HeartbeatTimeout == 0 {
			unbeaten = append(unbeaten, info.ActivityType.Name)
		}
	})
	zero := time.Duration(0)
	h.env.ExecuteWorkflow(Reconcile, api.ReconcileInput{Grace: &zero, Concurrency: 2, Batch: 2})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	var parts [][]string
	for _, b := range *batches {
		parts = append(parts, b.Hosts)
	}
	slices.SortFunc(parts, func(x, y []string) int { return strings.Compare(x[0], y[0]) })
	if diff := cmp.Diff([][]string{{"a", "b"}, {"c", "d"}, {"e"}}, parts); diff != "" {
		t.Errorf("batches of 2 (-want +got):\n%s", diff)
	}
	if len(unbeaten) > 0 {
		t.Errorf("audit steps %v run without a heartbeat timeout", unbeaten)
	}
	var res api.ReconcileResult
	if err := h.env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if most > 2 {
		t.Errorf("Reconcile(concurrency 2) ran %d host audits at once", most)
	}
	want := audit.Tally{Claims: 8, Kept: audit.ReasonCounts{{Reason: audit.KeptResident, Count: 4}},
		Freed: audit.ReasonCounts{{Reason: audit.FreedOwnerClosed, Count: 4}},
		Drift: audit.ReasonCounts{{Reason: audit.DriftStuckBuild, Count: 1}}, Errors: 1}
	if diff := cmp.Diff(want, res.Total); diff != "" {
		t.Errorf("Reconcile total (-want +got):\n%s", diff)
	}
	var got []string
	for _, hr := range res.Hosts {
		got = append(got, hr.Host)
	}
	if diff := cmp.Diff(hosts, got); diff != "" {
		t.Errorf("Reconcile hosts in order (-want +got):\n%s", diff)
	}
	if len(res.Hosts) != 5 || len(res.Hosts[2].Errors) != 1 || !strings.Contains(res.Hosts[2].Errors[0], "connection refused") {
		t.Errorf("host c errors = %v, want its audit's failure", res.Hosts[2].Errors)
	}
	report := api.ReconcileReport(&res)
	for _, want := range []string{"total: 8 claims, kept 4 (resident 4), freed 4 (owner-closed 4)", "freed  claim x-a", "host c: 0 claims", "error: ",
		"building records: 0 claims, kept 0, freed 0, drift 1 (stuck-build 1)", "drift stuck-build: instance u is building"} {
		if !strings.Contains(report, want) {
			t.Errorf("ReconcileReport lacks %q:\n%s", want, report)
		}
	}
	v, err := h.env.QueryWorkflow(api.StatusQuery)
	if err != nil {
		t.Fatal(err)
	}
	var st api.Status
	if err := v.Get(&st); err != nil {
		t.Fatal(err)
	}
	if st.Operation != api.OpReconcile || st.Phase != api.PhaseCompleted || !strings.Contains(st.Detail, "audited 5/5 hosts") {
		t.Errorf("status = %+v, want reconcile completed with 5/5 hosts audited", st)
	}
	checkAuditMetrics(t, h.metrics, 5, 1)
}

// checkAuditMetrics checks that one audit recorded its metrics once: its
// duration, the hosts it covered, its errors and when it completed.
func checkAuditMetrics(t *testing.T, m *capturedMetrics, hosts, errors float64) {
	t.Helper()
	for name, want := range map[string]float64{MetricAuditHosts: hosts, MetricAuditErrors: errors} {
		got := m.of(name)
		if len(got) != 1 || got[0].value != want || got[0].tags["dry_run"] != "false" {
			t.Errorf("metric %s = %+v, want one value %v tagged dry_run=false", name, got, want)
		}
	}
	if got := m.of(MetricAuditDuration); len(got) != 1 || got[0].value < 0 {
		t.Errorf("metric %s = %+v, want one duration", MetricAuditDuration, got)
	}
	if got := m.of(MetricAuditCompleted); len(got) != 1 || got[0].value < float64(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).Unix()) {
		t.Errorf("metric %s = %+v, want one Unix time", MetricAuditCompleted, got)
	}
}

func TestReconcileGivenHostsSkipsTheList(t *testing.T) {
	h := newHarness(t)
	got := h.auditsInBatches(func(in audit.AuditHostInput) audit.HostAudit {
		return audit.HostAudit{Host: in.Host, DryRun: in.DryRun}
	})
	h.env.ExecuteWorkflow(Reconcile, api.ReconcileInput{Hosts: []string{"b"}, DryRun: true})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	want := []activities.AuditBatchInput{{Hosts: []string{"b"}, DryRun: true, Concurrency: 2, Every: true}}
	if diff := cmp.Diff(want, *got); diff != "" {
		t.Errorf("AuditHosts inputs (-want +got):\n%s", diff)
	}
	var res api.ReconcileResult
	if err := h.env.GetWorkflowResult(&res); err != nil || res.Records != nil {
		t.Errorf("Reconcile of named hosts swept the building records: %+v, %v; want no sweep", res.Records, err)
	}
}

// TestReconcilePagesALargeFleet: more hosts than a page are audited page
// by page in child runs, one page at a time; every host is audited once,
// the totals add up and only the hosts that found something are listed.
func TestReconcilePagesALargeFleet(t *testing.T) {
	h := newHarness(t)
	h.env.RegisterWorkflow(Reconcile)
	hosts := []string{"a", "b", "c", "d", "e"}
	h.on("list", a.ListHosts, hosts, nil)
	var mu sync.Mutex
	audited := map[string]int{}
	h.auditsInBatches(func(in audit.AuditHostInput) audit.HostAudit {
		mu.Lock()
		audited[in.Host]++
		mu.Unlock()
		res := audit.HostAudit{Host: in.Host}
		res.Tally.Claims = 1
		res.Tally.Kept.Add(audit.KeptResident, 1)
		if in.Host == "d" {
			res.Tally.Freed.Add(audit.FreedOwnerClosed, 1)
			res.Freed = []audit.FreedClaim{{ClaimID: "x-d", Reason: audit.FreedOwnerClosed}}
		}
		return res
	})
	h.on("sweep", a.SweepBuilding, audit.RecordSweep{}, nil).Once()
	zero := time.Duration(0)
	h.env.ExecuteWorkflow(Reconcile, api.ReconcileInput{Grace: &zero, PageSize: 2})
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	var res api.ReconcileResult
	if err := h.env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int{"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}, audited); diff != "" {
		t.Errorf("hosts audited (-want +got):\n%s", diff)
	}
	if res.Audited != 5 || res.Pages != 3 {
		t.Errorf("Reconcile of 5 hosts in pages of 2: audited %d in %d pages, want 5 in 3", res.Audited, res.Pages)
	}
	want := audit.Tally{Claims: 5, Kept: audit.ReasonCounts{{Reason: audit.KeptResident, Count: 5}},
		Freed: audit.ReasonCounts{{Reason: audit.FreedOwnerClosed, Count: 1}}}
	if diff := cmp.Diff(want, res.Total); diff != "" {
		t.Errorf("Reconcile total (-want +got):\n%s", diff)
	}
	if len(res.Hosts) != 1 || res.Hosts[0].Host != "d" {
		t.Errorf("Reconcile in pages lists hosts %+v, want only d, whose audit freed a claim", res.Hosts)
	}
	if r := api.ReconcileReport(&res); !strings.Contains(r, "5 hosts") || !strings.Contains(r, "3 pages") {
		t.Errorf("report of a paged audit:\n%s", r)
	}
	// The pages are runs of Reconcile too; only the whole audit counts.
	checkAuditMetrics(t, h.metrics, 5, 0)
}
