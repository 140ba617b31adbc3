package audit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// TestSettleClaim finishes a migration whose workflow was terminated
// after the switchover: the guest runs on the destination's pending
// claim, the record still names the source.
func TestSettleClaim(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	u := simcloud.UUID(6)
	src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	dst := w.Claim(t, "b", "migration-dest-1", u, ledger.KindMigrationDest, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "mig-1"})

	if err := w.Acts.PrepareMigration(ctx, activities.PrepareMigrationInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement, DestClaimID: dst.ClaimID}); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.Migrate(ctx, activities.MigrateInput{UUID: u, Source: "a", Dest: "b", DestClaimID: dst.ClaimID, DestToken: dst.Token}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		res, err := w.auditor.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "b", ClaimID: dst.ClaimID})
		if err != nil || !res.Settled {
			t.Fatalf("SettleClaim after the move = %+v, %v; want settled", res, err)
		}
	}
	inst, err := w.Ledger.Instance(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Host != "b" || inst.ClaimID != dst.ClaimID || inst.VMState != guest.VMActive || inst.TaskState != guest.TaskNone {
		t.Errorf("record after settling = host %s claim %s %s/%q; want b, %s, active, no task", inst.Host, inst.ClaimID, inst.VMState, inst.TaskState, dst.ClaimID)
	}
	if w.HasClaim(t, "a", src.ClaimID) {
		t.Errorf("the source claim %s is still held after settling", src.ClaimID)
	}
	c, err := w.Ledger.GetClaim(ctx, "b", dst.ClaimID)
	if err != nil || c.State != ledger.StateCommitted {
		t.Errorf("destination claim after settling = %+v, %v; want committed", c, err)
	}
}

// TestSettleJudgesTheClaimItTook: a settle that finds the guest not yet
// moved settles nothing, and a step of the interrupted operation that
// comes after its judgement (a frozen worker's migration, resumed) is
// refused at its fence: the settle took the claim before it looked.
func TestSettleJudgesTheClaimItTook(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	u := simcloud.UUID(16)
	w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	dst := w.Claim(t, "b", "migration-dest-1", u, ledger.KindMigrationDest, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "mig-1"})
	if err := w.Acts.PrepareMigration(ctx, activities.PrepareMigrationInput{UUID: u, Source: "a", Dest: "b", Placement: dst.Placement, DestClaimID: dst.ClaimID}); err != nil {
		t.Fatal(err)
	}
	res, err := w.auditor.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "b", ClaimID: dst.ClaimID})
	if err != nil || res.Settled {
		t.Fatalf("SettleClaim before the move = %+v, %v; want not settled", res, err)
	}
	err = w.Acts.Migrate(ctx, activities.MigrateInput{UUID: u, Source: "a", Dest: "b", DestClaimID: dst.ClaimID, DestToken: dst.Token})
	if !errors.Is(err, hypervisor.ErrFenced) {
		t.Errorf("the operation's migration after the settle's judgement = %v, want fenced", err)
	}
	if dom, err := w.Driver.Lookup(ctx, "a", u); err != nil || dom.State != hypervisor.StateRunning {
		t.Errorf("guest on a = %+v, %v; want it running where it was", dom, err)
	}
	if _, err := w.Driver.Lookup(ctx, "b", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("guest on b after the refused migration: lookup error %v, want none there", err)
	}
}

// TestSettleFinishesADelete: a guest that an interrupted boot started
// and whose record a delete then removed is destroyed, its claim freed.
func TestSettleFinishesADelete(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddHost(t, "a")
	u := simcloud.UUID(7)
	if _, err := w.Acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: u, Name: "vm", Flavor: simcloud.Flavor()}); err != nil {
		t.Fatal(err)
	}
	c := w.Claim(t, "a", "boot-run-1", u, ledger.KindBoot, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-1"})
	if err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.DeleteInstance(ctx, u); err != nil {
		t.Fatal(err)
	}
	res, err := w.auditor.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "a", ClaimID: c.ClaimID})
	if err != nil || !res.Settled {
		t.Fatalf("SettleClaim of a deleted instance = %+v, %v; want settled", res, err)
	}
	if _, err := w.Driver.Lookup(ctx, "a", u); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("the deleted instance's guest is still on a (lookup error %v)", err)
	}
	if w.HasClaim(t, "a", c.ClaimID) {
		t.Errorf("the deleted instance's claim is still held")
	}
}

// TestSettleInterruptedResize: a resize terminated after the guest
// started on its new claim, before the record moved, is settled as
// confirmed: the new flavor, the record on the new claim, the hold freed.
func TestSettleInterruptedResize(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	u := simcloud.UUID(21)
	src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	bigger := simcloud.Flavor()
	bigger.VCPUs = 3
	if err := w.Acts.BeginResize(ctx, activities.BeginResizeInput{UUID: u, NewFlavor: bigger}); err != nil {
		t.Fatal(err)
	}
	c, err := w.Acts.Claim(ctx, activities.ClaimInput{Host: "b", ClaimID: "resize-dest-1", UUID: u, Kind: ledger.KindResizeDest,
		Owner: activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "resize-1"}, Flavor: bigger})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.HoldClaim(ctx, activities.ClaimRef{Host: "a", ClaimID: src.ClaimID}); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.PowerOff(ctx, activities.DomainInput{UUID: u, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := w.Acts.MoveResized(ctx, activities.MoveResizedInput{UUID: u, Source: "a", Dest: "b", ClaimID: c.ClaimID, Token: c.Token,
		Placement: c.Placement, Start: true}); err != nil {
		t.Fatal(err)
	}
	// Terminated here: FinishResize never runs.
	res, err := w.auditor.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "b", ClaimID: c.ClaimID})
	if err != nil || !res.Settled || res.PreviousClaimID != src.ClaimID {
		t.Fatalf("SettleClaim of the interrupted resize = %+v, %v; want settled, freeing %s", res, err, src.ClaimID)
	}
	inst, err := w.Ledger.Instance(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Host != "b" || inst.ClaimID != c.ClaimID || inst.Request.VCPUs != 3 || inst.Resize != nil || inst.VMState != guest.VMActive {
		t.Errorf("record after settling = host %s claim %s %d vCPUs %s resize %+v; want b, %s, 3, active, none",
			inst.Host, inst.ClaimID, inst.Request.VCPUs, inst.VMState, inst.Resize, c.ClaimID)
	}
	if w.HasClaim(t, "a", src.ClaimID) {
		t.Errorf("the source hold is still held after settling")
	}
}

// TestSettleStoppedResize: a resize stopped after it held the guest's
// resident claim and before the guest moved leaves the guest where it
// was, on a hold its record names. Settle makes the hold resident again,
// forgets the resize and gives the record the guest's state: active while
// the guest runs, stopped once the resize powered it off.
func TestSettleStoppedResize(t *testing.T) {
	for _, poweredOff := range []bool{false, true} {
		t.Run(map[bool]string{false: "running", true: "powered off"}[poweredOff], func(t *testing.T) {
			ctx := context.Background()
			w := newWorld(t)
			w.AddHost(t, "a")
			u := simcloud.UUID(22)
			src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
			if err := w.Acts.BeginResize(ctx, activities.BeginResizeInput{UUID: u, NewFlavor: simcloud.Flavor(), Cold: true}); err != nil {
				t.Fatal(err)
			}
			if err := w.Acts.HoldClaim(ctx, activities.ClaimRef{Host: "a", ClaimID: src.ClaimID}); err != nil {
				t.Fatal(err)
			}
			want := guest.VMActive
			if poweredOff {
				if err := w.Acts.PowerOff(ctx, activities.DomainInput{UUID: u, Host: "a"}); err != nil {
					t.Fatal(err)
				}
				want = guest.VMStopped
			}
			// Terminated here: the guest never left a.
			res, err := w.auditor.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "a", ClaimID: src.ClaimID})
			if err != nil || !res.Settled || res.PreviousClaimID != "" {
				t.Fatalf("SettleClaim of the stopped resize = %+v, %v; want settled, releasing nothing", res, err)
			}
			if c, err := w.Ledger.GetClaim(ctx, "a", src.ClaimID); err != nil || c.State != ledger.StateCommitted {
				t.Errorf("claim after settling = %+v, %v; want it committed", c, err)
			}
			inst, err := w.Ledger.Instance(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			if inst.Host != "a" || inst.ClaimID != src.ClaimID || inst.Resize != nil || inst.VMState != want || inst.TaskState != guest.TaskNone {
				t.Errorf("record after settling = host %s claim %s %s/%q resize %+v; want a, %s, %s, no task, no resize",
					inst.Host, inst.ClaimID, inst.VMState, inst.TaskState, inst.Resize, src.ClaimID, want)
			}
		})
	}
}

// TestSettleSameHostResizeThatMoved: a resize on the guest's own host
// stopped after it defined the new flavor's domain leaves a hold its
// record names and a new claim the domain is pinned to. Settling the hold
// must not make it resident under that domain (the new claim would then
// be freed while the guest uses it): it settles the new claim, forwards,
// and frees the hold; a domain whose start failed after the workflow
// ended is stopped, and stays so.
func TestSettleSameHostResizeThatMoved(t *testing.T) {
	for _, started := range []bool{true, false} {
		t.Run(fmt.Sprintf("started=%v", started), func(t *testing.T) {
			ctx := context.Background()
			w := newWorld(t)
			w.AddHost(t, "a")
			u := simcloud.UUID(23)
			src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
			bigger := simcloud.Flavor()
			bigger.VCPUs = 3
			if err := w.Acts.BeginResize(ctx, activities.BeginResizeInput{UUID: u, NewFlavor: bigger}); err != nil {
				t.Fatal(err)
			}
			c, err := w.Acts.Claim(ctx, activities.ClaimInput{Host: "a", ClaimID: "resize-dest-1", UUID: u, Kind: ledger.KindResizeDest,
				Owner: activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "resize-1"}, Flavor: bigger})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Acts.HoldClaim(ctx, activities.ClaimRef{Host: "a", ClaimID: src.ClaimID}); err != nil {
				t.Fatal(err)
			}
			if err := w.Acts.PowerOff(ctx, activities.DomainInput{UUID: u, Host: "a"}); err != nil {
				t.Fatal(err)
			}
			if err := w.Acts.MoveResized(ctx, activities.MoveResizedInput{UUID: u, Source: "a", Dest: "a", ClaimID: c.ClaimID, Token: c.Token,
				Placement: c.Placement, Start: started}); err != nil {
				t.Fatal(err)
			}
			// Terminated here: the record names the hold, the domain is
			// pinned to c.
			res, err := w.auditor.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "a", ClaimID: src.ClaimID})
			if err != nil || !res.Settled || res.PreviousClaimID != src.ClaimID {
				t.Fatalf("SettleClaim of the hold = %+v, %v; want the new claim settled, freeing the hold %s", res, err, src.ClaimID)
			}
			inst, err := w.Ledger.Instance(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			wantVM, wantDom := guest.VMActive, hypervisor.StateRunning
			if !started {
				wantVM, wantDom = guest.VMStopped, hypervisor.StateShutoff
			}
			if inst.Host != "a" || inst.ClaimID != c.ClaimID || inst.Request.VCPUs != 3 || inst.Resize != nil || inst.VMState != wantVM {
				t.Errorf("record after settling = host %s claim %s %d vCPUs resize %+v %s; want a, %s, 3, no resize, %s",
					inst.Host, inst.ClaimID, inst.Request.VCPUs, inst.Resize, inst.VMState, c.ClaimID, wantVM)
			}
			if dom, err := w.Driver.Lookup(ctx, "a", u); err != nil || dom.State != wantDom {
				t.Errorf("domain after settling = %+v, %v; want it %s", dom, err, wantDom)
			}
			if w.HasClaim(t, "a", src.ClaimID) {
				t.Errorf("the hold is still on a after settling")
			}
			if !w.HasClaim(t, "a", c.ClaimID) {
				t.Errorf("the claim the guest is pinned to is gone after settling")
			}
		})
	}
}

// TestSettleInterruptedEvacuation: an evacuation terminated after the
// guest started on its new host is settled there, and the fenced host's
// claim becomes a tombstone, not free pCPUs: the host may still define
// the guest when it returns.
func TestSettleInterruptedEvacuation(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	u := simcloud.UUID(22)
	src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	if err := w.Driver.PowerOff(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Ledger.SetHostDown(ctx, "a", "test"); err != nil {
		t.Fatal(err)
	}
	c := w.Claim(t, "b", "evacuation-dest-1", u, ledger.KindEvacuationDest, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "evac-1"})
	if err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "b", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
		t.Fatal(err)
	}
	res, err := w.auditor.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "b", ClaimID: c.ClaimID})
	if err != nil || !res.Settled {
		t.Fatalf("SettleClaim of the interrupted evacuation = %+v, %v; want settled", res, err)
	}
	old, err := w.Ledger.GetClaim(ctx, "a", src.ClaimID)
	if err != nil || old.State != ledger.StateTombstone {
		t.Errorf("the fenced host's claim after settling = %+v, %v; want a tombstone", old, err)
	}
	if inst, err := w.Ledger.Instance(ctx, u); err != nil || inst.Host != "b" || inst.ClaimID != c.ClaimID {
		t.Errorf("record after settling = %+v, %v; want it on b's claim", inst, err)
	}
	w.RunsPinned(t, u, "b", c, 2)
}

// fakeEvacuator records the evacuations an audit starts; running names
// the guests another workflow holds.
type fakeEvacuator struct {
	started []string
	running map[string]bool
}

func (f *fakeEvacuator) StartEvacuate(_ context.Context, uuid, _ string) (bool, error) {
	if f.running[uuid] {
		return false, nil
	}
	f.started = append(f.started, uuid)
	return true, nil
}

// TestAuditEvacuatesDownHosts: the audit of a host fenced down with
// automatic evacuation starts an evacuation of each guest living there,
// except one in VERIFY_RESIZE (its operator decides first) and one
// another workflow holds; a dry run, a down host without it, and an up
// host start none; the claims stay as they were.
func TestAuditEvacuatesDownHosts(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	ev := &fakeEvacuator{running: map[string]bool{}}
	w.auditor.Evacuator = ev
	var uuids []string
	for i := range 4 {
		u := simcloud.UUID(40 + i)
		w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: fmt.Sprintf("boot-%d", i)})
		w.owners.set(guest.InstanceWorkflowID(u), longClosed)
		uuids = append(uuids, u)
	}
	w.Boot(t, "b", simcloud.UUID(50), activities.Owner{WorkflowID: guest.InstanceWorkflowID(simcloud.UUID(50)), FirstRunID: "boot-1"})
	if err := w.Ledger.SetState(ctx, uuids[1], ledger.Transition{VM: guest.VMResized}); err != nil {
		t.Fatal(err)
	}
	ev.running[uuids[2]] = true

	if res := w.audit(t, audit.AuditHostInput{Host: "a"}); len(res.Evacuated) > 0 || len(ev.started) > 0 {
		t.Fatalf("audit of an up host started evacuations %v", ev.started)
	}
	if err := w.Driver.PowerOff(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Ledger.SetHostDown(ctx, "a", "psu"); err != nil {
		t.Fatal(err)
	}
	if res := w.audit(t, audit.AuditHostInput{Host: "a"}); len(res.Evacuated) > 0 || len(ev.started) > 0 {
		t.Fatalf("audit of a host down without automatic evacuation started %v", ev.started)
	}
	if _, err := w.Ledger.SetHostAutoEvacuate(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	before := w.snapshot(t, "a").Claims
	if res := w.audit(t, audit.AuditHostInput{Host: "a", DryRun: true}); len(res.Evacuated) > 0 || len(ev.started) > 0 {
		t.Fatalf("a dry run started %v", ev.started)
	}
	res := w.audit(t, audit.AuditHostInput{Host: "a"})
	want := []string{uuids[0], uuids[3]}
	slices.Sort(want)
	if !slices.Equal(res.Evacuated, want) || !slices.Equal(ev.started, want) || res.Tally.Evacuations != 2 {
		t.Fatalf("evacuations started %v (reported %v, %d), want %v: not the guest in VERIFY_RESIZE nor the one held",
			ev.started, res.Evacuated, res.Tally.Evacuations, want)
	}
	if res.Tally.Freed.Total() != 0 || len(w.snapshot(t, "a").Claims) != len(before) {
		t.Errorf("the audit of the down host freed %v", res.Freed)
	}
	if res := w.audit(t, audit.AuditHostInput{Host: "b"}); len(res.Evacuated) > 0 {
		t.Errorf("audit of up host b started %v", res.Evacuated)
	}
}

// TestSettleFloatingGuest: a floating guest whose boot was terminated
// after its start runs on its claim, which holds no pCPU, even when its
// domain pins its threads to a set of CPUs that takes in pinnable ones
// (as on a host once registered with neither set): a cpuset it floats
// over is no pin, so the claim is settled.
func TestSettleFloatingGuest(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddSharedHost(t, "a")
	u := simcloud.UUID(22)
	floating := simcloud.Flavor()
	floating.ExtraSpecs = nil
	if _, err := w.Acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: u, Name: "vm", Flavor: floating}); err != nil {
		t.Fatal(err)
	}
	c := w.ClaimFlavor(t, "a", "boot-run-1", u, ledger.KindBoot, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-1"}, floating)
	if err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
		t.Fatal(err)
	}
	w.redefine(t, "a", u, floatingXML(u, "vm", `<vcpu placement='static'>2</vcpu>`,
		`<cputune><vcpupin vcpu='0' cpuset='0-7'/><vcpupin vcpu='1' cpuset='0-7'/><emulatorpin cpuset='0-7'/></cputune>`, false))
	res, err := w.auditor.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "a", ClaimID: c.ClaimID})
	if err != nil || !res.Settled {
		t.Fatalf("SettleClaim of a floating guest over 0-7 = %+v, %v; want settled", res, err)
	}
	inst, err := w.Ledger.Instance(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Host != "a" || inst.ClaimID != c.ClaimID || inst.VMState != guest.VMActive {
		t.Errorf("record after settling = host %s claim %s %s; want a, %s, active", inst.Host, inst.ClaimID, inst.VMState, c.ClaimID)
	}
}

// TestSettleStoppedRevert: a revert stopped after it pointed the record
// back at the source, with the guest still on its destination, settles
// forwards with the new flavor, never naming the old one the record took
// back; one stopped after the destination's copy was destroyed forgets
// the resize. A revert that forgot the resize at its first step (a run
// from before the record kept it) is left as it is: the guest runs with
// 3 vCPUs and the record says 2.
func TestSettleStoppedRevert(t *testing.T) {
	for _, tt := range []struct {
		name       string
		keep       bool
		destroyed  bool
		settled    bool
		host       string
		vcpus      int
		resizeLeft bool
	}{
		{name: "guest on its destination", keep: true, settled: true, host: "b", vcpus: 3},
		{name: "destination destroyed", keep: true, destroyed: true, settled: true, host: "a", vcpus: 2},
		{name: "resize forgotten first", keep: false, settled: false, host: "a", vcpus: 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			w := newWorld(t)
			w.AddHost(t, "a")
			w.AddHost(t, "b")
			u := simcloud.UUID(26)
			src := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
			bigger := simcloud.Flavor()
			bigger.VCPUs = 3
			dst := w.ResizeTo(t, u, "a", src.ClaimID, "b", bigger)
			if err := w.Ledger.SetState(ctx, u, ledger.Transition{VM: guest.VMResized, Task: guest.TaskResizeReverting}); err != nil {
				t.Fatal(err)
			}
			back := activities.RevertRecordInput{UUID: u, Source: "a", SourceClaimID: src.ClaimID, KeepResize: tt.keep}
			if err := w.Acts.RevertRecord(ctx, back); err != nil {
				t.Fatal(err)
			}
			if tt.destroyed {
				if err := w.Acts.DestroyDomain(ctx, activities.DomainInput{UUID: u, Host: "b", ClaimID: dst.ClaimID, Token: dst.Token}); err != nil {
					t.Fatal(err)
				}
			}
			// Terminated here.
			res, err := w.auditor.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "b", ClaimID: dst.ClaimID})
			if err != nil || res.Settled != tt.settled {
				t.Fatalf("SettleClaim = %+v, %v; want settled %v", res, err, tt.settled)
			}
			inst, err := w.Ledger.Instance(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			if inst.Host != tt.host || inst.Request.VCPUs != tt.vcpus || inst.Resize != nil {
				t.Errorf("record after settling = host %s, %d vCPUs, resize %+v; want %s, %d, none", inst.Host, inst.Request.VCPUs, inst.Resize, tt.host, tt.vcpus)
			}
			if tt.settled && inst.TaskState != guest.TaskNone {
				t.Errorf("task state after settling = %q, want none", inst.TaskState)
			}
			if tt.host == "b" {
				w.RunsPinned(t, u, "b", dst, 3)
				if w.HasClaim(t, "a", src.ClaimID) {
					t.Errorf("the source claim is still held once the guest settled on b")
				}
			}
		})
	}
}

// TestSettleStoppedRepin: a re-pin terminated after the guest's pins
// changed is committed by Settle (the resident claim takes the target,
// the pCPUs it left are free); one terminated before is left for the
// audit to free, the guest on its old pins.
func TestSettleStoppedRepin(t *testing.T) {
	for _, pinned := range []bool{true, false} {
		t.Run(fmt.Sprintf("pinned=%v", pinned), func(t *testing.T) {
			ctx := context.Background()
			w := newWorld(t)
			w.AddHost(t, "a")
			u := simcloud.UUID(27)
			res := w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
			owner := activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "repin-1"}
			rp, err := w.Acts.ClaimRepin(ctx, activities.ClaimRepinInput{UUID: u, Host: "a", Resident: res.ClaimID, ClaimID: "repin-1",
				Owner: owner, PCPUs: numa.Range(6, 7)})
			if err != nil {
				t.Fatal(err)
			}
			if pinned {
				if err := w.Acts.RepinDomain(ctx, activities.RepinDomainInput{UUID: u, Host: "a", ClaimID: rp.ClaimID, Token: rp.Token, Target: rp.Placement}); err != nil {
					t.Fatal(err)
				}
			}
			// Terminated here.
			got, err := w.auditor.SettleClaim(ctx, audit.SettleInput{UUID: u, Host: "a", ClaimID: rp.ClaimID})
			if err != nil || got.Settled != pinned {
				t.Fatalf("SettleClaim of the re-pin = %+v, %v; want settled %v", got, err, pinned)
			}
			want := "6-7"
			if !pinned {
				want = res.Placement.Cells[0].PinnedPCPUs().String()
			}
			c, err := w.Ledger.GetClaim(ctx, "a", res.ClaimID)
			if err != nil || c.Placement.Cells[0].PinnedPCPUs().String() != want {
				t.Errorf("resident claim after settling = %+v, %v; want it pinned to %s", c, err, want)
			}
			inst, err := w.Ledger.Instance(ctx, u)
			if err != nil || inst.ClaimID != res.ClaimID || inst.Placement.Cells[0].PinnedPCPUs().String() != want {
				t.Errorf("record after settling = %+v, %v; want claim %s pinned to %s", inst, err, res.ClaimID, want)
			}
			if w.HasClaim(t, "a", rp.ClaimID) != !pinned {
				t.Errorf("re-pin claim held after settling: %v, want %v", !pinned, !pinned)
			}
			snap, err := w.Ledger.Snapshot(ctx, "a")
			if err != nil {
				t.Fatal(err)
			}
			if err := snap.Verify(); err != nil {
				t.Error(err)
			}
		})
	}
}
