package activities

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
)

// fakeSettler records the settles the audit starts.
type fakeSettler struct {
	mu      sync.Mutex
	started []audit.SettleInput
	err     error
}

func (f *fakeSettler) StartSettle(_ context.Context, in audit.SettleInput) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.started = append(f.started, in)
	return nil
}

var longClosed = audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "run-1", Since: time.Now().Add(-time.Hour)}

// TestAuditRacingACommit is the third double pin of wave one: the owner
// commits, attaches and completes between the audit's snapshot and its
// question to Temporal. The audit must see the claim as it is now.
func TestAuditRacingACommit(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.addHost(t, "a")
	u := uuidN(1)
	if _, err := w.acts.CreateInstance(ctx, CreateInstanceInput{UUID: u, Name: "vm", Flavor: testFlavor}); err != nil {
		t.Fatal(err)
	}
	owner := Owner{guest.InstanceWorkflowID(u), "run-1"}
	c := w.claim(t, "a", "boot-run-1", u, ledger.KindBoot, owner)
	if err := w.acts.Spawn(ctx, SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
		t.Fatal(err)
	}
	w.owners.before = func(id string) {
		if id != owner.WorkflowID {
			return
		}
		w.owners.before = nil
		if err := w.acts.Attach(ctx, AttachInput{UUID: u, Host: "a", ClaimID: c.ClaimID}); err != nil {
			t.Error(err)
		}
		w.owners.set(owner.WorkflowID, longClosed)
	}
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if n := res.Tally.Freed.Total(); n != 0 || !w.hasClaim(t, "a", c.ClaimID) {
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
			w.addHost(t, "a")
			// The spawn's fence lease runs out before the audit.
			w.acts.FenceLease = 50 * time.Millisecond
			settler := &fakeSettler{}
			if tt.settler {
				w.acts.Audit.Settler = settler
			}
			u := uuidN(2)
			if _, err := w.acts.CreateInstance(ctx, CreateInstanceInput{UUID: u, Name: "vm", Flavor: testFlavor}); err != nil {
				t.Fatal(err)
			}
			// A boot terminated right after its spawn: the guest runs on a
			// pending claim whose owner is closed.
			owner := Owner{guest.InstanceWorkflowID(u), "run-1"}
			c := w.claim(t, "a", "boot-run-1", u, ledger.KindBoot, owner)
			if err := w.acts.Spawn(ctx, SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
				t.Fatal(err)
			}
			if tt.stopped {
				if err := w.drv.Stop(ctx, "a", u); err != nil {
					t.Fatal(err)
				}
			}
			w.owners.set(owner.WorkflowID, longClosed)
			time.Sleep(100 * time.Millisecond)
			res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
			if tt.wantKept == "" {
				if res.Tally.Freed.Of(audit.FreedOwnerClosed) != 1 || w.hasClaim(t, "a", c.ClaimID) {
					t.Fatalf("AuditHost kept %+v freed %+v; a shut-off guest uses no pCPU, the claim goes", res.Tally.Kept, res.Tally.Freed)
				}
				return
			}
			if res.Tally.Freed.Total() != 0 || !w.hasClaim(t, "a", c.ClaimID) {
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
	w.addHost(t, "a")
	u := uuidN(3)
	owner := Owner{"wf-" + u, "run-1"}
	c := w.claim(t, "a", "c-"+u, u, ledger.KindBoot, owner)
	w.owners.set(owner.WorkflowID, longClosed)
	if _, err := w.led.Fence(ctx, "a", c.ClaimID, c.Token, time.Hour); err != nil {
		t.Fatal(err)
	}
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if res.Tally.Kept.Of(audit.KeptChanged) != 1 || !w.hasClaim(t, "a", c.ClaimID) {
		t.Errorf("AuditHost of a fenced claim kept %+v freed %+v, want it kept as changed", res.Tally.Kept, res.Tally.Freed)
	}

	v := uuidN(4)
	owner = Owner{"wf-" + v, "run-1"}
	d := w.claim(t, "a", "c-"+v, v, ledger.KindBoot, owner)
	w.owners.set(owner.WorkflowID, audit.OwnerStatus{State: audit.OwnerClosed, FirstRunID: "run-1", Since: time.Now().Add(-time.Second)})
	w.acts.Audit.MinGrace = time.Minute
	res = w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if res.Tally.Kept.Of(audit.KeptRecentlyClosed) != 1 || !w.hasClaim(t, "a", d.ClaimID) {
		t.Errorf("AuditHost with grace 0, minimum 1m, owner closed 1s ago: kept %+v freed %+v, want recently closed", res.Tally.Kept, res.Tally.Freed)
	}
}

// TestSpawnFencedOutStartsNothing: a spawn attempt whose claim the audit
// freed (its workflow long gone) defines and starts no guest.
func TestSpawnFencedOutStartsNothing(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	u := uuidN(5)
	if _, err := w.acts.CreateInstance(ctx, CreateInstanceInput{UUID: u, Name: "vm", Flavor: testFlavor}); err != nil {
		t.Fatal(err)
	}
	c := w.claim(t, "a", "boot-run-1", u, ledger.KindBoot, Owner{guest.InstanceWorkflowID(u), "run-1"})
	if err := w.led.Release(ctx, "a", c.ClaimID); err != nil {
		t.Fatal(err)
	}
	err := w.acts.Spawn(ctx, SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token})
	if !errors.Is(err, hypervisor.ErrFenced) && !isType(err, ErrTypeFenced) {
		t.Fatalf("Spawn on a released claim error = %v, want fenced", err)
	}
	if _, err := w.drv.Lookup(ctx, "a", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Spawn on a released claim left a domain (lookup error %v)", err)
	}
}

// TestFencedStepsNeedTheirClaim: a step that acts on pCPUs and names no
// claim, or not its token, is refused as bad input, for good, before it
// stages, defines or starts anything.
func TestFencedStepsNeedTheirClaim(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	w.addHost(t, "b")
	u := uuidN(10)
	w.boot(t, "a", u, Owner{guest.InstanceWorkflowID(u), "boot-1"})
	dst := w.claim(t, "b", "migration-dest-1", u, ledger.KindMigrationDest, Owner{guest.InstanceWorkflowID(u), "mig-1"})
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"Spawn without a claim", w.acts.Spawn(ctx, SpawnInput{UUID: u, Host: "b", Placement: dst.Placement})},
		{"Spawn without the token", w.acts.Spawn(ctx, SpawnInput{UUID: u, Host: "b", Placement: dst.Placement, ClaimID: dst.ClaimID})},
		{"MoveResized without a claim", w.acts.MoveResized(ctx, MoveResizedInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement, Start: true})},
		{"PrepareMigration without a claim", w.acts.PrepareMigration(ctx, PrepareMigrationInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement})},
		{"Migrate without a claim", w.acts.Migrate(ctx, MigrateInput{UUID: u, Source: "a", Dest: "b"})},
		{"Migrate without the token", w.acts.Migrate(ctx, MigrateInput{UUID: u, Source: "a", Dest: "b", DestClaimID: dst.ClaimID})},
	} {
		var app *temporal.ApplicationError
		if !errors.As(tc.err, &app) || app.Type() != ErrTypeInvalidRequest || !app.NonRetryable() {
			t.Errorf("%s = %v, want a non-retryable %s error", tc.name, tc.err, ErrTypeInvalidRequest)
		}
	}
	if _, err := w.drv.Lookup(ctx, "b", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("the refused steps left a domain on b (lookup error %v)", err)
	}
	if dom, err := w.drv.Lookup(ctx, "a", u); err != nil || dom.State != hypervisor.StateRunning {
		t.Errorf("guest on a after the refused steps = %+v, %v; want it running", dom, err)
	}
	if _, err := w.led.StagedDomainXML(ctx, u, dst.ClaimID); !errors.Is(err, ledger.ErrConflict) {
		t.Errorf("the refused steps staged XML for the claim (%v), want none", err)
	}
}

// TestSettleClaim finishes a migration whose workflow was terminated
// after the switchover: the guest runs on the destination's pending
// claim, the record still names the source.
func TestSettleClaim(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	w.addHost(t, "b")
	u := uuidN(6)
	src := w.boot(t, "a", u, Owner{guest.InstanceWorkflowID(u), "boot-1"})
	dst := w.claim(t, "b", "migration-dest-1", u, ledger.KindMigrationDest, Owner{guest.InstanceWorkflowID(u), "mig-1"})

	// Nothing to settle while the guest has not moved.
	res, err := w.acts.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "b", ClaimID: dst.ClaimID})
	if err != nil || res.Settled {
		t.Fatalf("SettleClaim before the move = %+v, %v; want not settled", res, err)
	}
	if err := w.acts.PrepareMigration(ctx, PrepareMigrationInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement, DestClaimID: dst.ClaimID}); err != nil {
		t.Fatal(err)
	}
	if err := w.acts.Migrate(ctx, MigrateInput{UUID: u, Source: "a", Dest: "b", DestClaimID: dst.ClaimID, DestToken: dst.Token}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		res, err = w.acts.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "b", ClaimID: dst.ClaimID})
		if err != nil || !res.Settled {
			t.Fatalf("SettleClaim after the move = %+v, %v; want settled", res, err)
		}
	}
	inst, err := w.led.Instance(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Host != "b" || inst.ClaimID != dst.ClaimID || inst.VMState != guest.VMActive || inst.TaskState != guest.TaskNone {
		t.Errorf("record after settling = host %s claim %s %s/%q; want b, %s, active, no task", inst.Host, inst.ClaimID, inst.VMState, inst.TaskState, dst.ClaimID)
	}
	if w.hasClaim(t, "a", src.ClaimID) {
		t.Errorf("the source claim %s is still held after settling", src.ClaimID)
	}
	c, err := w.led.GetClaim(ctx, "b", dst.ClaimID)
	if err != nil || c.State != ledger.StateCommitted {
		t.Errorf("destination claim after settling = %+v, %v; want committed", c, err)
	}
}

func isType(err error, typ string) bool {
	var app interface{ Type() string }
	return errors.As(err, &app) && app.Type() == typ
}

// TestSettleFinishesADelete: a guest that an interrupted boot started
// and whose record a delete then removed is destroyed, its claim freed.
func TestSettleFinishesADelete(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	u := uuidN(7)
	if _, err := w.acts.CreateInstance(ctx, CreateInstanceInput{UUID: u, Name: "vm", Flavor: testFlavor}); err != nil {
		t.Fatal(err)
	}
	c := w.claim(t, "a", "boot-run-1", u, ledger.KindBoot, Owner{guest.InstanceWorkflowID(u), "run-1"})
	if err := w.acts.Spawn(ctx, SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
		t.Fatal(err)
	}
	if err := w.acts.DeleteInstance(ctx, u); err != nil {
		t.Fatal(err)
	}
	res, err := w.acts.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "a", ClaimID: c.ClaimID})
	if err != nil || !res.Settled {
		t.Fatalf("SettleClaim of a deleted instance = %+v, %v; want settled", res, err)
	}
	if _, err := w.drv.Lookup(ctx, "a", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("the deleted instance's guest is still on a (lookup error %v)", err)
	}
	if w.hasClaim(t, "a", c.ClaimID) {
		t.Errorf("the deleted instance's claim is still held")
	}
}

// TestRollbackOfAGuestThatIsNowhere: a migration whose prepare found no
// guest on the source (a record left behind by an interrupted move) has
// nothing to roll back, and says so without error.
func TestRollbackOfAGuestThatIsNowhere(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.addHost(t, "a")
	w.addHost(t, "b")
	res, err := w.acts.RollbackMigration(ctx, MigrateInput{UUID: uuidN(8), Source: "a", Dest: "b"})
	if err != nil || res.OnDest {
		t.Errorf("RollbackMigration of a guest on neither host = %+v, %v; want nothing done, no error", res, err)
	}
}
