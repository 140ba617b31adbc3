package audit

import (
	"testing"
	"time"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
)

func TestDecide(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	old := now.Add(-time.Hour)
	rules := auditRules{grace: time.Minute, minGrace: 30 * time.Second, namespace: "default", now: now}
	claim := func(state ledger.ClaimState) *ledger.Claim {
		return &ledger.Claim{ID: "c1", Host: "h1", InstanceUUID: "u1", Kind: ledger.KindInstance, State: state,
			OwnerWorkflowID: "wf-u1", OwnerRunID: "run-1", CreatedAt: old}
	}
	closed := &OwnerStatus{State: OwnerClosed, FirstRunID: "run-1", Since: old}
	running := &OwnerStatus{State: OwnerRunning, FirstRunID: "run-2", Since: old}
	notFound := &OwnerStatus{State: OwnerNotFound}
	day, halfHour := 24*time.Hour, 30*time.Minute
	inNamespace := func(c *ledger.Claim, ns string) *ledger.Claim { c.Namespace = ns; return c }
	kind := func(c *ledger.Claim, k ledger.ClaimKind) *ledger.Claim { c.Kind = k; return c }
	tests := []struct {
		name  string
		claim *ledger.Claim
		facts claimFacts
		want  verdict
	}{
		{"young", &ledger.Claim{State: ledger.StatePending, CreatedAt: now}, claimFacts{}, verdict{kept: KeptYoung}},
		{"committed, record unread", claim(ledger.StateCommitted), claimFacts{}, verdict{need: needRecord}},
		{"resident, Temporal not asked", claim(ledger.StateCommitted),
			claimFacts{record: &ledger.Home{Host: "h1", ClaimID: "c1"}}, verdict{kept: KeptResident}},
		{"record elsewhere, owner unasked", claim(ledger.StateCommitted),
			claimFacts{record: &ledger.Home{Host: "h2", ClaimID: "c9"}}, verdict{need: needOwner}},
		{"pending, owner closed long ago", claim(ledger.StatePending),
			claimFacts{owner: closed, ownerAt: now}, verdict{freed: FreedOwnerClosed}},
		{"pending, owner closed just now", claim(ledger.StatePending),
			claimFacts{owner: &OwnerStatus{State: OwnerClosed, FirstRunID: "run-1", Since: now.Add(-time.Second)}, ownerAt: now},
			verdict{kept: KeptRecentlyClosed}},
		{"pending, owner id runs another chain", claim(ledger.StatePending),
			claimFacts{owner: running, ownerAt: now}, verdict{freed: FreedOwnerReplaced}},
		{"committed, no record, instance workflow unasked", claim(ledger.StateCommitted),
			claimFacts{noRecord: true, owner: closed, ownerAt: now}, verdict{need: needInstance}},
		{"committed, no record, instance workflow closed", claim(ledger.StateCommitted),
			claimFacts{noRecord: true, owner: closed, ownerAt: now, instance: closed}, verdict{freed: FreedInstanceGone}},
		{"hold, instance workflow open", claim(ledger.StateHeld),
			claimFacts{record: &ledger.Home{Host: "h2"}, owner: closed, ownerAt: now, instance: running}, verdict{kept: KeptSourceHold}},
		{"pending, owner not found, retention unread", claim(ledger.StatePending),
			claimFacts{owner: notFound, ownerAt: now}, verdict{need: needRetention}},
		{"pending, owner not found, younger than the retention", claim(ledger.StatePending),
			claimFacts{owner: notFound, ownerAt: now, retention: &day}, verdict{kept: KeptOwnerUnseen}},
		{"pending, owner not found, older than the retention", claim(ledger.StatePending),
			claimFacts{owner: notFound, ownerAt: now, retention: &halfHour}, verdict{freed: FreedOwnerNotFound}},
		{"hold, instance workflow not found, younger than the retention", claim(ledger.StateHeld),
			claimFacts{record: &ledger.Home{Host: "h2"}, owner: closed, ownerAt: now, instance: notFound, retention: &day},
			verdict{kept: KeptOwnerUnseen}},
		{"hold, instance workflow not found, older than the retention", claim(ledger.StateHeld),
			claimFacts{record: &ledger.Home{Host: "h2"}, owner: closed, ownerAt: now, instance: notFound, retention: &halfHour},
			verdict{freed: FreedNotResident}},
		{"resize destination, its revert stopped midway", kind(claim(ledger.StateCommitted), ledger.KindResizeDest),
			claimFacts{record: &ledger.Home{Host: "h2", ClaimID: "c9", TaskState: guest.TaskResizeReverting}, owner: closed, ownerAt: now, instance: closed},
			verdict{settle: true}},
		{"resize destination, its record's task ended", kind(claim(ledger.StateCommitted), ledger.KindResizeDest),
			claimFacts{record: &ledger.Home{Host: "h2", ClaimID: "c9"}, owner: closed, ownerAt: now, instance: closed},
			verdict{freed: FreedNotResident}},
		{"resident hold, record unread", claim(ledger.StateHeld), claimFacts{}, verdict{need: needRecord}},
		{"resident hold, Temporal unasked", claim(ledger.StateHeld),
			claimFacts{record: &ledger.Home{Host: "h1", ClaimID: "c1"}}, verdict{need: needOwner}},
		{"resident hold, its resize open", claim(ledger.StateHeld),
			claimFacts{record: &ledger.Home{Host: "h1", ClaimID: "c1"}, owner: closed, ownerAt: now, instance: running}, verdict{kept: KeptSourceHold}},
		{"resident hold, its resize closed just now", claim(ledger.StateHeld),
			claimFacts{record: &ledger.Home{Host: "h1", ClaimID: "c1"}, owner: &OwnerStatus{State: OwnerClosed, FirstRunID: "run-2", Since: now.Add(-time.Second)}, ownerAt: now},
			verdict{kept: KeptRecentlyClosed}},
		{"resident hold, its resize closed long ago", claim(ledger.StateHeld),
			claimFacts{record: &ledger.Home{Host: "h1", ClaimID: "c1"}, owner: closed, ownerAt: now, instance: closed}, verdict{settle: true}},
		{"pending, owner in the audit's namespace", inNamespace(claim(ledger.StatePending), "default"),
			claimFacts{}, verdict{need: needOwner}},
		{"pending, owner in another namespace, Temporal not asked", inNamespace(claim(ledger.StatePending), "other"),
			claimFacts{}, verdict{kept: KeptOtherNamespace}},
		{"hold, owner in another namespace", inNamespace(claim(ledger.StateHeld), "other"),
			claimFacts{record: &ledger.Home{Host: "h2"}, owner: notFound, ownerAt: now, retention: &halfHour}, verdict{kept: KeptOtherNamespace}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := decide(tt.claim, tt.facts, rules); got != tt.want {
				t.Errorf("decide(%s claim, %+v) = %+v, want %+v", tt.claim.State, tt.facts, got, tt.want)
			}
		})
	}
}
