package activities

import (
	"testing"
	"time"

	"github.com/pinflow/pinflow/ledger"
)

func TestDecide(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	old := now.Add(-time.Hour)
	rules := auditRules{grace: time.Minute, minGrace: 30 * time.Second, now: now}
	claim := func(state ledger.ClaimState) *ledger.Claim {
		return &ledger.Claim{ID: "c1", Host: "h1", InstanceUUID: "u1", Kind: ledger.KindInstance, State: state,
			OwnerWorkflowID: "wf-u1", OwnerRunID: "run-1", CreatedAt: old}
	}
	closed := &OwnerStatus{State: OwnerClosed, FirstRunID: "run-1", Since: old}
	running := &OwnerStatus{State: OwnerRunning, FirstRunID: "run-2", Since: old}
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := decide(tt.claim, tt.facts, rules); got != tt.want {
				t.Errorf("decide(%s claim, %+v) = %+v, want %+v", tt.claim.State, tt.facts, got, tt.want)
			}
		})
	}
}
