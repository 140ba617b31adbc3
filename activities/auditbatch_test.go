package activities_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/testsuite"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
)

// closedOwners says every owner closed an hour ago.
type closedOwners struct{}

func (closedOwners) OwnerStatus(_ context.Context, id string) (audit.OwnerStatus, error) {
	return audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "boot", Since: time.Now().Add(-time.Hour)}, nil
}

func (closedOwners) Retention(context.Context) (time.Duration, error) { return 24 * time.Hour, nil }

// TestAuditHostsInBatches audits a batch of hosts in one activity: every
// host once, the totals add up, a host that fails (not registered) is
// reported with its error while the others are audited, and without
// Every only the hosts that found something are listed. A retry of the
// batch after a heartbeat audits only the hosts the heartbeat lacks.
func TestAuditHostsInBatches(t *testing.T) {
	w := simcloud.New(t)
	var hosts []string
	for i := range 6 {
		h := fmt.Sprintf("h%d", i)
		w.AddHost(t, h)
		hosts = append(hosts, h)
		u := simcloud.UUID(70 + i)
		w.Boot(t, h, u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot"})
	}
	// A domain no claim covers on h3: drift, which a batch lists.
	ctx := context.Background()
	leftover := simcloud.UUID(90)
	c := w.Boot(t, "h3", leftover, activities.Owner{WorkflowID: guest.InstanceWorkflowID(leftover), FirstRunID: "boot-leftover"})
	if err := w.Ledger.Release(ctx, "h3", c.ClaimID); err != nil {
		t.Fatal(err)
	}
	if err := w.Ledger.DetachInstance(ctx, leftover, c.ClaimID); err != nil {
		t.Fatal(err)
	}
	if err := w.Ledger.DeleteInstance(ctx, leftover); err != nil {
		t.Fatal(err)
	}
	acts := *w.Acts
	acts.Audit = &audit.Auditor{Ledger: w.Ledger, Driver: w.Driver, Owners: closedOwners{}, Grace: time.Minute}
	batch := append(slices.Clone(hosts), "gone")

	var env testsuite.WorkflowTestSuite
	run := func(in activities.AuditBatchInput, beat any) activities.AuditBatch {
		t.Helper()
		ae := env.NewTestActivityEnvironment()
		ae.RegisterActivity(&acts)
		if beat != nil {
			ae.SetHeartbeatDetails(beat)
		}
		v, err := ae.ExecuteActivity(acts.AuditHosts, in)
		if err != nil {
			t.Fatalf("AuditHosts(%v): %v", in.Hosts, err)
		}
		var res activities.AuditBatch
		if err := v.Get(&res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	found := run(activities.AuditBatchInput{Hosts: batch, Concurrency: 2}, nil)
	var listed []string
	for _, h := range found.Hosts {
		listed = append(listed, h.Host)
	}
	if !slices.Equal(listed, []string{"h3", "gone"}) || found.Total.Claims != 6 || found.Total.Drift.Total() != 1 {
		t.Errorf("batch listing findings only: %v, total %+v; want h3 (its leftover domain) and gone, 6 claims counted", listed, found.Total)
	}

	all := run(activities.AuditBatchInput{Hosts: batch, Concurrency: 3, Every: true}, nil)
	listed = nil
	for _, h := range all.Hosts {
		listed = append(listed, h.Host)
	}
	if !slices.Equal(listed, batch) || all.Audited != len(batch) || all.Total.Claims != 7 || all.Total.Errors != 1 {
		t.Fatalf("batch of every host: listed %v, audited %d, total %+v; want every host in order, 7 claims (the leftover's quarantine), 1 error", listed, all.Audited, all.Total)
	}
	if errs := all.Hosts[len(batch)-1].Errors; len(errs) != 1 || !strings.Contains(errs[0], "gone") {
		t.Errorf("the unknown host's audit: %v, want its error", errs)
	}

	// A retry after a heartbeat that covered h0-h4: only h5 and gone are
	// audited again, the heartbeat's results are kept as they were.
	type audited struct {
		I     int             `json:"i"`
		Audit audit.HostAudit `json:"audit"`
	}
	var beat []audited
	for i := range 5 {
		a := all.Hosts[i]
		a.Tally.Kept.Add("from-heartbeat", 1)
		beat = append(beat, audited{I: i, Audit: a})
	}
	resumed := run(activities.AuditBatchInput{Hosts: batch, Concurrency: 2, Every: true}, beat)
	for i, h := range resumed.Hosts {
		fromBeat := slices.ContainsFunc(h.Tally.Kept, func(c audit.ReasonCount) bool { return c.Reason == "from-heartbeat" })
		if fromBeat != (i < 5) || h.Host != batch[i] {
			t.Errorf("resumed batch host %d = %s (from the heartbeat: %v); want %s, from the heartbeat only before h5", i, h.Host, fromBeat, batch[i])
		}
	}
}
