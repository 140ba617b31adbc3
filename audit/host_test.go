package audit_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
)

func TestAuditHostDecisions(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	old := time.Now().Add(-time.Hour)
	long := audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "run-1", Since: old}
	beyond := time.Now().Add(-testRetention - time.Hour)

	tests := []struct {
		name string
		// setup makes the case's claim on host (uuid u) and the owners'
		// answers; it returns the claim id to watch.
		setup     func(t *testing.T, host, u string) string
		grace     time.Duration
		dryRun    bool
		wantKept  string // the reason the claim was kept, or ""
		wantFreed string // the reason it was freed, or ""
	}{
		{"pending, owner running with its first run id", func(t *testing.T, host, u string) string {
			w.owners.set("wf-"+u, audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "run-1", Since: old})
			return w.Claim(t, host, "c-"+u, u, ledger.KindMigrationDest, activities.Owner{WorkflowID: "wf-" + u, FirstRunID: "run-1"}).ClaimID
		}, 0, false, audit.KeptOwnerRunning, ""},
		{"pending, owner runs another chain", func(t *testing.T, host, u string) string {
			w.owners.set("wf-"+u, audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "run-2", Since: old})
			return w.Claim(t, host, "c-"+u, u, ledger.KindMigrationDest, activities.Owner{WorkflowID: "wf-" + u, FirstRunID: "run-1"}).ClaimID
		}, 0, false, "", audit.FreedOwnerReplaced},
		{"pending, owner closed long ago", func(t *testing.T, host, u string) string {
			w.owners.set("wf-"+u, long)
			return w.Claim(t, host, "c-"+u, u, ledger.KindUnshelve, activities.Owner{WorkflowID: "wf-" + u, FirstRunID: "run-1"}).ClaimID
		}, time.Minute, false, "", audit.FreedOwnerClosed},
		{"pending, owner closed within the grace period", func(t *testing.T, host, u string) string {
			w.owners.set("wf-"+u, audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "run-1", Since: time.Now().Add(-10 * time.Second)})
			return w.Claim(t, host, "c-"+u, u, ledger.KindUnshelve, activities.Owner{WorkflowID: "wf-" + u, FirstRunID: "run-1"}).ClaimID
		}, time.Minute, false, audit.KeptRecentlyClosed, ""},
		{"pending, owner not found, younger than the retention", func(t *testing.T, host, u string) string {
			return w.Claim(t, host, "c-"+u, u, ledger.KindBoot, activities.Owner{WorkflowID: "wf-" + u, FirstRunID: "run-1"}).ClaimID
		}, 0, false, audit.KeptOwnerUnseen, ""},
		{"pending, owner not found, older than the retention", func(t *testing.T, host, u string) string {
			w.At(beyond)
			defer w.At(old)
			return w.Claim(t, host, "c-"+u, u, ledger.KindBoot, activities.Owner{WorkflowID: "wf-" + u, FirstRunID: "run-1"}).ClaimID
		}, 0, false, "", audit.FreedOwnerNotFound},
		{"pending, owner in another namespace", func(t *testing.T, host, u string) string {
			w.owners.set("wf-"+u, long)
			return w.claimIn(t, "other", host, "c-"+u, u, activities.Owner{WorkflowID: "wf-" + u, FirstRunID: "run-1"}).ClaimID
		}, 0, false, audit.KeptOtherNamespace, ""},
		{"pending, younger than the grace period", func(t *testing.T, host, u string) string {
			w.At(time.Now())
			defer w.At(old)
			return w.Claim(t, host, "c-"+u, u, ledger.KindBoot, activities.Owner{WorkflowID: "wf-" + u, FirstRunID: "run-1"}).ClaimID
		}, time.Minute, false, audit.KeptYoung, ""},
		{"pending, owner closed, dry run", func(t *testing.T, host, u string) string {
			w.owners.set("wf-"+u, long)
			return w.Claim(t, host, "c-"+u, u, ledger.KindUnshelve, activities.Owner{WorkflowID: "wf-" + u, FirstRunID: "run-1"}).ClaimID
		}, 0, true, "", audit.FreedOwnerClosed},
		{"committed and resident, owner long closed", func(t *testing.T, host, u string) string {
			w.owners.set(guest.InstanceWorkflowID(u), long)
			return w.Boot(t, host, u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-" + u}).ClaimID
		}, 0, false, audit.KeptResident, ""},
		{"committed, instance elsewhere, no workflow open", func(t *testing.T, host, u string) string {
			w.Boot(t, "elsewhere", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-" + u})
			c := w.Claim(t, host, "c-"+u, u, ledger.KindMigrationDest, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "mig-" + u})
			if _, err := w.Ledger.Commit(ctx, host, c.ClaimID); err != nil {
				t.Fatal(err)
			}
			w.owners.set(guest.InstanceWorkflowID(u), audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "mig-" + u, Since: old})
			return c.ClaimID
		}, 0, false, "", audit.FreedNotResident},
		{"committed, instance elsewhere, another workflow of it open", func(t *testing.T, host, u string) string {
			w.Boot(t, "elsewhere", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-" + u})
			c := w.Claim(t, host, "c-"+u, u, ledger.KindMigrationDest, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "mig-" + u})
			if _, err := w.Ledger.Commit(ctx, host, c.ClaimID); err != nil {
				t.Fatal(err)
			}
			w.owners.set(guest.InstanceWorkflowID(u), audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "del-" + u, Since: old})
			return c.ClaimID
		}, 0, false, audit.KeptInstanceBusy, ""},
		{"committed, instance record gone, no workflow known, younger than the retention", func(t *testing.T, host, u string) string {
			c := w.Claim(t, host, "c-"+u, u, ledger.KindBoot, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-" + u})
			if _, err := w.Ledger.Commit(ctx, host, c.ClaimID); err != nil {
				t.Fatal(err)
			}
			return c.ClaimID
		}, 0, false, audit.KeptOwnerUnseen, ""},
		{"committed, instance record gone, no workflow known, older than the retention", func(t *testing.T, host, u string) string {
			w.At(beyond)
			defer w.At(old)
			c := w.Claim(t, host, "c-"+u, u, ledger.KindBoot, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-" + u})
			if _, err := w.Ledger.Commit(ctx, host, c.ClaimID); err != nil {
				t.Fatal(err)
			}
			return c.ClaimID
		}, 0, false, "", audit.FreedInstanceGone},
		{"pending, owner cannot be asked", func(t *testing.T, host, u string) string {
			w.owners.mu.Lock()
			w.owners.errs["wf-"+u] = errors.New("deadline exceeded")
			w.owners.mu.Unlock()
			return w.Claim(t, host, "c-"+u, u, ledger.KindMigrationDest, activities.Owner{WorkflowID: "wf-" + u, FirstRunID: "run-1"}).ClaimID
		}, 0, false, audit.KeptDoubt, ""},
	}
	w.At(old)
	w.AddHost(t, "elsewhere")
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host, u := fmt.Sprintf("h%d", i), simcloud.UUID(i+1)
			w.AddHost(t, host)
			id := tt.setup(t, host, u)
			res := w.audit(t, audit.AuditHostInput{Host: host, Grace: dur(tt.grace), DryRun: tt.dryRun})
			var want decision
			if tt.wantKept != "" {
				want.kept.Add(tt.wantKept, 1)
			}
			if tt.wantFreed != "" {
				want.freed.Add(tt.wantFreed, 1)
			}
			got := decision{kept: res.Tally.Kept, freed: res.Tally.Freed}
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(decision{})); diff != "" {
				t.Errorf("AuditHost(%s, grace %s): tally (-want +got):\n%s\nerrors: %v", host, tt.grace, diff, res.Errors)
			}
			stillThere := tt.wantFreed == "" || tt.dryRun
			if got := w.HasClaim(t, host, id); got != stillThere {
				t.Errorf("AuditHost(%s): claim %s still there = %v, want %v", host, id, got, stillThere)
			}
			if tt.wantKept == audit.KeptDoubt && len(res.Errors) == 0 {
				t.Errorf("AuditHost(%s): kept in doubt but reported no error", host)
			}
			snap, err := w.Ledger.Snapshot(ctx, host)
			if err != nil {
				t.Fatal(err)
			}
			if err := snap.Verify(); err != nil {
				t.Errorf("after AuditHost(%s): %v", host, err)
			}
		})
	}
}

// decision is the part of a audit.Tally the decision test compares.
type decision struct {
	kept, freed audit.ReasonCounts
}

// TestAuditHostResidentNeedsNoDescribe: a host of resident claims costs
// no question to Temporal.
func TestAuditHostResidentNeedsNoDescribe(t *testing.T) {
	w := newWorld(t)
	w.AddHost(t, "a")
	for i := range 3 {
		u := simcloud.UUID(100 + i)
		w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-" + u})
	}
	w.owners.calls = nil
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if got := res.Tally.Kept.Of(audit.KeptResident); got != 3 {
		t.Errorf("AuditHost(a): kept resident %d, want 3 (%+v)", got, res.Tally)
	}
	if len(w.owners.calls) != 0 {
		t.Errorf("AuditHost(a) asked about %v, want no question for resident claims", w.owners.calls)
	}
}

// TestAuditHostReleaseRace: a claim released and made again (same id, new
// token) between the audit's read and its compare-and-delete survives.
func TestAuditHostReleaseRace(t *testing.T) {
	w := newWorld(t)
	w.AddHost(t, "a")
	u := simcloud.UUID(200)
	owner := activities.Owner{WorkflowID: "wf-race", FirstRunID: "run-1"}
	w.owners.set(owner.WorkflowID, audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: owner.FirstRunID, Since: time.Now().Add(-time.Hour)})
	c := w.Claim(t, "a", "c-race", u, ledger.KindUnshelve, owner)
	before, err := w.Ledger.GetClaim(context.Background(), "a", c.ClaimID)
	if err != nil {
		t.Fatal(err)
	}
	w.owners.before = func(string) {
		w.owners.before = nil
		if err := w.Ledger.Release(context.Background(), "a", c.ClaimID); err != nil {
			t.Error(err)
		}
		w.Claim(t, "a", c.ClaimID, u, ledger.KindUnshelve, owner)
	}
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if got := res.Tally.Kept.Of(audit.KeptChanged); got != 1 || res.Tally.Freed.Total() != 0 {
		t.Errorf("AuditHost(a) with the claim made again meanwhile: tally %+v, want kept changed 1 and nothing freed", res.Tally)
	}
	after, err := w.Ledger.GetClaim(context.Background(), "a", c.ClaimID)
	if err != nil {
		t.Fatalf("the claim made again is gone: %v", err)
	}
	if after.Token == before.Token {
		t.Errorf("claim %s kept its token %s; the test did not make it again", c.ClaimID, after.Token)
	}
}

func TestAuditHostUnknownHostFails(t *testing.T) {
	w := newWorld(t)
	if _, err := w.auditor.AuditHost(context.Background(), audit.AuditHostInput{Host: "nowhere"}); !errors.Is(err, ledger.ErrUnknownHost) {
		t.Fatalf("AuditHost(nowhere) = %v, want ledger.ErrUnknownHost", err)
	}
	var bad *audit.InvalidError
	if _, err := w.auditor.AuditHost(context.Background(), audit.AuditHostInput{Host: "nowhere", Grace: dur(-time.Second)}); !errors.As(err, &bad) {
		t.Fatalf("AuditHost with a negative grace = %v, want an audit.InvalidError", err)
	}
}

// TestAuditSettlesOnlyWhatItSees: a resize waiting in VERIFY_RESIZE
// whose workflow Temporal does not know keeps its source hold, and the
// audit starts no Settle (which would end the hold a revert needs),
// unless the resize is older than the namespace's retention.
func TestAuditSettlesOnlyWhatItSees(t *testing.T) {
	for _, tt := range []struct {
		name        string
		age         time.Duration
		wantKept    string
		wantSettles int
	}{
		{"younger than the retention", time.Hour, audit.KeptOwnerUnseen, 0},
		{"older than the retention", testRetention + time.Hour, audit.KeptSettling, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t)
			w.At(time.Now().Add(-tt.age))
			settler := &fakeSettler{}
			w.auditor.Settler = settler
			w.AddHost(t, "a")
			w.AddHost(t, "b")
			u := simcloud.UUID(30)
			src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
			bigger := simcloud.Flavor()
			bigger.VCPUs = 3
			w.ResizeTo(t, u, "a", src.ClaimID, "b", bigger)
			res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
			if got := res.Tally.Kept.Of(tt.wantKept); got != 1 || res.Tally.Freed.Total() != 0 {
				t.Errorf("AuditHost(a): tally %+v, want the source hold kept %s", res.Tally, tt.wantKept)
			}
			if len(settler.started) != tt.wantSettles {
				t.Errorf("AuditHost(a) started %d settles (%+v), want %d", len(settler.started), settler.started, tt.wantSettles)
			}
			if !w.HasClaim(t, "a", src.ClaimID) {
				t.Errorf("AuditHost(a) freed the source hold %s", src.ClaimID)
			}
		})
	}
}

// TestAuditRacingACommit is the third double pin of wave one: the owner
// commits, attaches and completes between the audit's snapshot and its
// question to Temporal. The audit must see the claim as it is now.
func TestAuditRacingACommit(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.AddHost(t, "a")
	u := simcloud.UUID(1)
	if _, err := w.Acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: u, Name: "vm", Flavor: simcloud.Flavor()}); err != nil {
		t.Fatal(err)
	}
	owner := activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-1"}
	c := w.Claim(t, "a", "boot-run-1", u, ledger.KindBoot, owner)
	if err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
		t.Fatal(err)
	}
	w.owners.before = func(id string) {
		if id != owner.WorkflowID {
			return
		}
		w.owners.before = nil
		if err := w.Acts.Attach(ctx, activities.AttachInput{UUID: u, Host: "a", ClaimID: c.ClaimID}); err != nil {
			t.Error(err)
		}
		w.owners.set(owner.WorkflowID, longClosed)
	}
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if n := res.Tally.Freed.Total(); n != 0 || !w.HasClaim(t, "a", c.ClaimID) {
		t.Fatalf("AuditHost freed %d claims (%+v); the claim committed and attached meanwhile must stay", n, res.Freed)
	}
	if got := res.Tally.Kept.Of(audit.KeptChanged); got != 1 {
		t.Errorf("AuditHost kept %+v, want the claim kept as changed since the snapshot", res.Tally.Kept)
	}
}

// TestAuditGuardsClaimsInUse: a pending claim of a closed owner whose own
// guest runs on it is never freed; a guest pinned exactly to it is
// settled, one that also uses other pCPUs is only reported.
func TestAuditGuardsClaimsInUse(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name     string
		settler  bool
		stopped  bool
		wantKept string
	}{
		{"exactly pinned, settler", true, false, audit.KeptSettling},
		{"exactly pinned, no settler", false, false, audit.KeptInUse},
		{"shut off", true, true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t)
			w.AddHost(t, "a")
			// The spawn's fence lease runs out before the audit (waitLeaseEnds),
			// and lasts the spawn on a loaded machine.
			w.Acts.FenceLease = 2 * time.Second
			settler := &fakeSettler{}
			if tt.settler {
				w.auditor.Settler = settler
			}
			u := simcloud.UUID(2)
			if _, err := w.Acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: u, Name: "vm", Flavor: simcloud.Flavor()}); err != nil {
				t.Fatal(err)
			}
			// A boot terminated right after its spawn: the guest runs on a
			// pending claim whose owner is closed.
			owner := activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-1"}
			c := w.Claim(t, "a", "boot-run-1", u, ledger.KindBoot, owner)
			if err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
				t.Fatal(err)
			}
			if tt.stopped {
				if err := w.Driver.Stop(ctx, "a", u); err != nil {
					t.Fatal(err)
				}
			}
			w.owners.set(owner.WorkflowID, longClosed)
			w.waitLeaseEnds(t, "a", c.ClaimID)
			res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
			if tt.wantKept == "" {
				if res.Tally.Freed.Of(audit.FreedOwnerClosed) != 1 || w.HasClaim(t, "a", c.ClaimID) {
					t.Fatalf("AuditHost kept %+v freed %+v; a shut-off guest uses no pCPU, the claim goes", res.Tally.Kept, res.Tally.Freed)
				}
				return
			}
			if res.Tally.Freed.Total() != 0 || !w.HasClaim(t, "a", c.ClaimID) {
				t.Fatalf("AuditHost freed %+v: the claim its guest runs on must stay", res.Freed)
			}
			if got := res.Tally.Kept.Of(tt.wantKept); got != 1 {
				t.Errorf("AuditHost kept %+v, want one %s", res.Tally.Kept, tt.wantKept)
			}
			if res.Tally.Drift.Of(audit.DriftClaimInUse) != 1 {
				t.Errorf("AuditHost drift %+v, want one %s", res.Drift, audit.DriftClaimInUse)
			}
			want := 0
			if tt.settler {
				want = 1
			}
			if len(settler.started) != want {
				t.Errorf("AuditHost started %d settles (%+v), want %d", len(settler.started), settler.started, want)
			}
		})
	}
}

// TestAuditRespectsFenceAndMinimumGrace: a claim under a fence lease, or
// whose owner closed less than the minimum grace ago, is kept even by an
// audit asked for no grace at all.
func TestAuditRespectsFenceAndMinimumGrace(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddHost(t, "a")
	u := simcloud.UUID(3)
	owner := activities.Owner{WorkflowID: "wf-" + u, FirstRunID: "run-1"}
	c := w.Claim(t, "a", "c-"+u, u, ledger.KindBoot, owner)
	w.owners.set(owner.WorkflowID, longClosed)
	if _, err := w.Ledger.Fence(ctx, "a", c.ClaimID, c.Token, time.Hour); err != nil {
		t.Fatal(err)
	}
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if res.Tally.Kept.Of(audit.KeptChanged) != 1 || !w.HasClaim(t, "a", c.ClaimID) {
		t.Errorf("AuditHost of a fenced claim kept %+v freed %+v, want it kept as changed", res.Tally.Kept, res.Tally.Freed)
	}

	v := simcloud.UUID(4)
	owner = activities.Owner{WorkflowID: "wf-" + v, FirstRunID: "run-1"}
	d := w.Claim(t, "a", "c-"+v, v, ledger.KindBoot, owner)
	w.owners.set(owner.WorkflowID, audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "run-1", Since: time.Now().Add(-time.Second)})
	w.auditor.MinGrace = time.Minute
	res = w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if res.Tally.Kept.Of(audit.KeptRecentlyClosed) != 1 || !w.HasClaim(t, "a", d.ClaimID) {
		t.Errorf("AuditHost with grace 0, minimum 1m, owner closed 1s ago: kept %+v freed %+v, want recently closed", res.Tally.Kept, res.Tally.Freed)
	}
}

// TestAuditGuardsFloatingGuests: a guest without dedicated pCPUs names
// nothing of its claim in its XML, yet runs on its memory. A boot
// terminated right after its spawn leaves such a guest on a pending claim
// of a closed owner: the audit keeps that claim while the guest is up,
// and frees it once the guest is off, or when the claim is a leftover
// beside the one the instance's record names on the same host.
func TestAuditGuardsFloatingGuests(t *testing.T) {
	ctx := context.Background()
	floating := simcloud.Flavor()
	floating.ExtraSpecs = nil
	for _, tt := range []struct {
		name string
		// leftover: the guest was booted and attached first, and the
		// judged claim is a second one of it on the same host.
		stopped, leftover bool
		wantFreed         bool
	}{
		{name: "running"},
		{name: "shut off", stopped: true, wantFreed: true},
		{name: "leftover beside its resident claim", leftover: true, wantFreed: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t)
			w.AddSharedHost(t, "a")
			w.Acts.FenceLease = 2 * time.Second
			settler := &fakeSettler{}
			w.auditor.Settler = settler
			u := simcloud.UUID(5)
			owner := activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-2"}
			var c activities.ClaimResult
			if tt.leftover {
				w.BootFlavor(t, "a", u, activities.Owner{WorkflowID: owner.WorkflowID, FirstRunID: "run-1"}, floating)
				c = w.ClaimFlavor(t, "a", "resize-run-2", u, ledger.KindResizeDest, owner, floating)
			} else {
				if _, err := w.Acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: u, Name: "vm", Flavor: floating}); err != nil {
					t.Fatal(err)
				}
				c = w.ClaimFlavor(t, "a", "boot-run-2", u, ledger.KindBoot, owner, floating)
				if err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
					t.Fatal(err)
				}
				w.waitLeaseEnds(t, "a", c.ClaimID)
			}
			if tt.stopped {
				if err := w.Driver.Stop(ctx, "a", u); err != nil {
					t.Fatal(err)
				}
			}
			w.owners.set(owner.WorkflowID, audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "run-2", Since: time.Now().Add(-time.Hour)})
			res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
			if tt.wantFreed {
				if res.Tally.Freed.Of(audit.FreedOwnerClosed) != 1 || w.HasClaim(t, "a", c.ClaimID) {
					t.Fatalf("AuditHost kept %+v freed %+v (errors %v), want claim %s freed", res.Tally.Kept, res.Tally.Freed, res.Errors, c.ClaimID)
				}
				return
			}
			if res.Tally.Freed.Total() != 0 || !w.HasClaim(t, "a", c.ClaimID) {
				t.Fatalf("AuditHost freed %+v: the claim a floating guest runs on must stay", res.Freed)
			}
			if res.Tally.Kept.Of(audit.KeptSettling) != 1 || len(settler.started) != 1 {
				t.Errorf("AuditHost kept %+v and started settles %+v, want one settle of claim %s", res.Tally.Kept, settler.started, c.ClaimID)
			}
			if res.Tally.Drift.Of(audit.DriftClaimInUse) != 1 {
				t.Errorf("AuditHost drift %+v, want one %s", res.Drift, audit.DriftClaimInUse)
			}
		})
	}
}
