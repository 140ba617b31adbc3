package audit_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

func TestAuditHostDrift(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.AddHost(t, "a")
	// X runs on a at 0,1 but its claim is lost; Y's pending claim then
	// takes 0,1: X is pinned to Y's pCPUs.
	x, y, z := simcloud.UUID(301), simcloud.UUID(302), simcloud.UUID(303)
	cx := w.Boot(t, "a", x, activities.Owner{WorkflowID: guest.InstanceWorkflowID(x), FirstRunID: "run-x"})
	if err := w.Ledger.Release(ctx, "a", cx.ClaimID); err != nil {
		t.Fatal(err)
	}
	cy := w.Claim(t, "a", "c-y", y, ledger.KindUnshelve, activities.Owner{WorkflowID: guest.InstanceWorkflowID(y), FirstRunID: "run-y"})
	w.owners.set(guest.InstanceWorkflowID(y), audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "run-y", Since: time.Now()})
	// Z is resident but its domain is gone.
	cz := w.Boot(t, "a", z, activities.Owner{WorkflowID: guest.InstanceWorkflowID(z), FirstRunID: "run-z"})
	if err := w.Acts.DestroyDomain(ctx, activities.DomainInput{UUID: z, Host: "a"}); err != nil {
		t.Fatal(err)
	}
	before, err := w.Ledger.Snapshot(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	want := []audit.Drift{
		{Kind: audit.DriftPinnedToOther, Instance: x, CPUs: claimedCPUs(cy)},
		{Kind: audit.DriftDomainWithoutClaim, Instance: x, CPUs: "0-1"},
		{Kind: audit.DriftClaimWithoutDomain, Instance: z, ClaimID: cz.ClaimID, CPUs: "2-3"},
	}
	got := make([]audit.Drift, len(res.Drift))
	for i, d := range res.Drift {
		got[i] = d
		got[i].Detail = ""
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("AuditHost(a) drift (-want +got):\n%s", diff)
	}
	after, err := w.Ledger.Snapshot(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before.Pins, after.Pins); diff != "" {
		t.Errorf("AuditHost(a) changed the pins while only reporting drift (-before +after):\n%s", diff)
	}
	doms, err := w.Driver.Domains(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(doms) != 1 || doms[0].UUID != x {
		t.Errorf("domains on a after the audit: %+v, want X's alone, untouched", doms)
	}

	// Y's workflow is open: drift about Y would be marked in flight. Make
	// Z's instance workflow open too and check the mark.
	w.owners.set(guest.InstanceWorkflowID(z), audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: "del-z", Since: time.Now()})
	res = w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	for _, d := range res.Drift {
		if wantFlight := d.Instance == z; d.InFlight != wantFlight {
			t.Errorf("drift %s of %s: in flight %v, want %v", d.Kind, d.Instance, d.InFlight, wantFlight)
		}
	}
}

// TestAuditReportsBrokenGroupRules: two members of a 1-per-host
// anti-affinity group run on one host (the second started there outside
// the group's claims, as an operator could through the hypervisor): the
// audit reports the rule broken and frees nothing for it.
func TestAuditReportsBrokenGroupRules(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.AddHost(t, "a")
	if err := w.Ledger.CreateGroup(ctx, ledger.Group{Name: "db", Policy: ledger.PolicyAntiAffinity}); err != nil {
		t.Fatal(err)
	}
	m1, m2 := simcloud.UUID(311), simcloud.UUID(312)
	for i, u := range []string{m1, m2} {
		if _, err := w.Ledger.CreateMember(ctx, u, "db-"+u[len(u)-3:], simcloud.Flavor(), guest.VMBuilding, "", "db"); err != nil {
			t.Fatal(err)
		}
		kind := ledger.KindBoot
		if i == 1 {
			kind = ledger.KindQuarantine // neither counted nor refused
		}
		owner := activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-" + u}
		c := w.Claim(t, "a", "c-"+u, u, kind, owner)
		w.owners.set(owner.WorkflowID, audit.OwnerStatus{State: audit.OwnerRunning, FirstRunID: owner.FirstRunID, Since: time.Now()})
		if err := w.Acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: "a", Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
			t.Fatal(err)
		}
	}
	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	if res.Tally.Drift.Of(audit.DriftGroupRule) != 1 || res.Tally.Freed.Total() != 0 {
		t.Fatalf("AuditHost(a) drift %+v freed %+v, want one broken group rule and nothing freed", res.Drift, res.Freed)
	}
	for _, d := range res.Drift {
		if d.Kind == audit.DriftGroupRule && (!strings.Contains(d.Detail, m1) || !strings.Contains(d.Detail, m2) || !strings.Contains(d.Detail, "anti-affinity group db")) {
			t.Errorf("group drift %q does not name the group and both members", d.Detail)
		}
	}
}

// floatingXML is a hand-written domain of two vCPUs whose <cputune> (or
// <vcpu cpuset>) is cputune, with a guest NUMA cell when cell is set, as
// an operator or an older pinflow might have defined it.
func floatingXML(uuid, name, vcpu, cputune string, cell bool) string {
	numa := ""
	if cell {
		numa = `<cpu><numa><cell id='0' cpus='0-1' memory='512' unit='MiB'/></numa></cpu>`
	}
	return `<domain type='kvm'><name>` + name + `</name><uuid>` + uuid + `</uuid><memory unit='MiB'>512</memory>` +
		vcpu + cputune + numa + `</domain>`
}

// redefine replaces uuid's domain on host with xml, and starts it.
func (w *world) redefine(t *testing.T, host, uuid, xml string) {
	t.Helper()
	ctx := context.Background()
	if _, err := w.Driver.Lookup(ctx, host, uuid); err == nil {
		if err := w.Driver.Stop(ctx, host, uuid); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Driver.Define(ctx, host, xml); err != nil {
		t.Fatalf("Define(%s on %s): %v", uuid, host, err)
	}
	if err := w.Driver.Start(ctx, host, uuid); err != nil {
		t.Fatalf("Start(%s on %s): %v", uuid, host, err)
	}
}

// TestAuditLeavesFloatingCPUSetsAlone: a floating guest whose domain pins
// its vCPUs and emulator to a set of CPUs that takes in free pinnable
// pCPUs (as on a host once registered with neither set, where every CPU
// was shared) holds none of them one to one: no pins outside its claim
// are reported, and nothing is quarantined.
func TestAuditLeavesFloatingCPUSetsAlone(t *testing.T) {
	ctx := context.Background()
	floatSet := `<cputune><vcpupin vcpu='0' cpuset='0-7'/><vcpupin vcpu='1' cpuset='0-7'/><emulatorpin cpuset='0-7'/></cputune>`
	for _, tt := range []struct {
		name  string
		specs map[string]string
		cell  bool
	}{
		{name: "without NUMA cells"},
		{name: "with a NUMA cell", specs: map[string]string{"hw:numa_nodes": "1"}, cell: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t)
			w.AddSharedHost(t, "a")
			f := simcloud.Flavor()
			f.ExtraSpecs = tt.specs
			u := simcloud.UUID(321)
			w.BootFlavor(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "run-1"}, f)
			w.redefine(t, "a", u, floatingXML(u, "floater", `<vcpu placement='static'>2</vcpu>`, floatSet, tt.cell))
			before := w.snapshot(t, "a")

			res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
			if len(res.Drift) != 0 || len(res.Errors) != 0 {
				t.Errorf("AuditHost(a) of a guest floating over 0-7: drift %+v errors %v, want none", res.Drift, res.Errors)
			}
			if res.Tally.Freed.Total() != 0 {
				t.Errorf("AuditHost(a) freed %+v, want nothing", res.Freed)
			}
			after := w.snapshot(t, "a")
			if diff := cmp.Diff(before.Pins, after.Pins); diff != "" {
				t.Errorf("AuditHost(a) changed the pins (-before +after):\n%s", diff)
			}
			for _, c := range after.Claims {
				if c.Kind == ledger.KindQuarantine {
					t.Errorf("AuditHost(a) quarantined claim %s (pCPUs %v) for a floating guest", c.ID, c.Usage)
				}
			}
			if len(after.Claims) != len(before.Claims) {
				t.Errorf("AuditHost(a): %d claims after, %d before", len(after.Claims), len(before.Claims))
			}
			if dom, err := w.Driver.Lookup(ctx, "a", u); err != nil || dom.State != hypervisor.StateRunning {
				t.Errorf("domain of %s after the audit = %+v, %v; want it running", u, dom, err)
			}
		})
	}
}

// TestAuditReportsGuestsFloatingOnPinnedPCPUs: a domain started through
// the hypervisor whose threads may run on a pinned guest's pCPUs (no
// cpuset at all, a cpuset over the host, vCPUs pinned to a set, an
// unpinned emulator) breaks the promise to that guest: reported as
// floats-on-pinned naming the domain, the pCPUs and the claim, with
// nothing freed or quarantined. One kept to the shared CPUs is not.
func TestAuditReportsGuestsFloatingOnPinnedPCPUs(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name, vcpu, cputune string
		breach              bool
	}{
		{name: "no cpuset", vcpu: `<vcpu>2</vcpu>`, breach: true},
		{name: "vcpu cpuset over the host", vcpu: `<vcpu cpuset='0-7'>2</vcpu>`, breach: true},
		{name: "vCPUs pinned to a set", vcpu: `<vcpu>2</vcpu>`,
			cputune: `<cputune><vcpupin vcpu='0' cpuset='0-3'/><vcpupin vcpu='1' cpuset='0-3'/><emulatorpin cpuset='0-1'/></cputune>`, breach: true},
		{name: "emulator unpinned", vcpu: `<vcpu>2</vcpu>`,
			cputune: `<cputune><vcpupin vcpu='0' cpuset='0-1'/><vcpupin vcpu='1' cpuset='0-1'/></cputune>`, breach: true},
		{name: "on the shared CPUs", vcpu: `<vcpu cpuset='0-1'>2</vcpu>`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t)
			w.AddSharedHost(t, "a")
			p, q := simcloud.UUID(331), simcloud.UUID(332)
			cp := w.Boot(t, "a", p, activities.Owner{WorkflowID: guest.InstanceWorkflowID(p), FirstRunID: "run-p"})
			w.redefine(t, "a", q, floatingXML(q, "stray", tt.vcpu, tt.cputune, false))
			before := w.snapshot(t, "a")

			res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
			var floats []audit.Drift
			for _, d := range res.Drift {
				switch d.Kind {
				case audit.DriftFloatsOnPinned:
					floats = append(floats, d)
				case audit.DriftDomainWithoutClaim:
				default:
					t.Errorf("AuditHost(a) drift %s: %s; want only %s and %s", d.Kind, d.Detail, audit.DriftDomainWithoutClaim, audit.DriftFloatsOnPinned)
				}
			}
			if !tt.breach {
				if len(floats) != 0 {
					t.Errorf("AuditHost(a) drift %+v; a guest on the shared CPUs alone floats over no pin", floats)
				}
			} else if len(floats) != 1 {
				t.Errorf("AuditHost(a) drift %+v, want one %s of %s", res.Drift, audit.DriftFloatsOnPinned, q)
			} else {
				f := floats[0]
				if f.Instance != q || f.CPUs != claimedCPUs(cp) {
					t.Errorf("AuditHost(a) %s of %s on pCPUs %s, want of %s on %s", f.Kind, f.Instance, f.CPUs, q, claimedCPUs(cp))
				}
				for _, s := range []string{"domain stray", q, "pCPUs " + claimedCPUs(cp), "claim " + cp.ClaimID, "guest " + p} {
					if !strings.Contains(f.Detail, s) {
						t.Errorf("AuditHost(a) %s detail %q does not say %q", f.Kind, f.Detail, s)
					}
				}
			}
			if res.Tally.Drift.Of(audit.DriftFloatsOnPinned) != len(floats) {
				t.Errorf("AuditHost(a) tally %+v, want %d %s", res.Tally.Drift, len(floats), audit.DriftFloatsOnPinned)
			}
			if res.Tally.Freed.Total() != 0 {
				t.Errorf("AuditHost(a) freed %+v, want nothing", res.Freed)
			}
			after := w.snapshot(t, "a")
			if diff := cmp.Diff(before.Pins, after.Pins); diff != "" {
				t.Errorf("AuditHost(a) changed the pins (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(before.Claims, after.Claims); diff != "" {
				t.Errorf("AuditHost(a) changed the claims (-before +after):\n%s", diff)
			}
			for _, u := range []string{p, q} {
				if dom, err := w.Driver.Lookup(ctx, "a", u); err != nil || dom.State != hypervisor.StateRunning {
					t.Errorf("domain of %s after the audit = %+v, %v; want it running", u, dom, err)
				}
			}
		})
	}
}

// TestAuditReportsAPinnedPCPUOnce: a domain that holds one of another
// guest's pCPUs one to one and floats over the other is pinned to the
// first and floats on the second, each pCPU reported once.
func TestAuditReportsAPinnedPCPUOnce(t *testing.T) {
	w := newWorld(t)
	w.AddSharedHost(t, "a")
	p, q := simcloud.UUID(341), simcloud.UUID(342)
	cp := w.Boot(t, "a", p, activities.Owner{WorkflowID: guest.InstanceWorkflowID(p), FirstRunID: "run-p"})
	owned := numa.MustParse(claimedCPUs(cp)).List()
	if len(owned) != 2 {
		t.Fatalf("claim %s pins %v, want two pCPUs", cp.ClaimID, owned)
	}
	cputune := fmt.Sprintf(`<cputune><vcpupin vcpu='0' cpuset='%d'/><vcpupin vcpu='1' cpuset='0-7'/><emulatorpin cpuset='0-1'/></cputune>`, owned[0])
	w.redefine(t, "a", q, floatingXML(q, "stray", `<vcpu>2</vcpu>`, cputune, false))

	res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
	got := map[string]string{}
	for _, d := range res.Drift {
		if d.Instance == q {
			got[d.Kind] = d.CPUs
		}
	}
	want := map[string]string{
		audit.DriftPinnedToOther:      strconv.Itoa(owned[0]),
		audit.DriftFloatsOnPinned:     strconv.Itoa(owned[1]),
		audit.DriftDomainWithoutClaim: strconv.Itoa(owned[0]),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("AuditHost(a) drift of %s, kind to pCPUs (-want +got):\n%s\nall drift: %+v", q, diff, res.Drift)
	}
	if res.Tally.Freed.Total() != 0 || !w.HasClaim(t, "a", cp.ClaimID) {
		t.Errorf("AuditHost(a) freed %+v, want nothing", res.Freed)
	}
}

// TestAuditReportsResidentGuestsFloatingOnPinnedPCPUs: a resident
// floating guest whose record holds the very document its domain runs,
// one without a cpuset (as pinflow defined floating guests before hosts
// kept shared CPUs apart), floats over a pinned guest's pCPUs: reported,
// audit after audit, though its document is read only once.
func TestAuditReportsResidentGuestsFloatingOnPinnedPCPUs(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.AddSharedHost(t, "a")
	p, q := simcloud.UUID(351), simcloud.UUID(352)
	cp := w.Boot(t, "a", p, activities.Owner{WorkflowID: guest.InstanceWorkflowID(p), FirstRunID: "run-p"})
	floating := simcloud.Flavor()
	floating.ExtraSpecs = nil
	w.BootFlavor(t, "a", q, activities.Owner{WorkflowID: guest.InstanceWorkflowID(q), FirstRunID: "run-q"}, floating)
	old := floatingXML(q, "old", `<vcpu placement='static'>2</vcpu>`, "", false)
	w.redefine(t, "a", q, old)
	if err := w.Ledger.SetDomainXML(ctx, q, old); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		res := w.audit(t, audit.AuditHostInput{Host: "a", Grace: dur(0)})
		want := []audit.Drift{{Kind: audit.DriftFloatsOnPinned, Instance: q, CPUs: claimedCPUs(cp)}}
		got := make([]audit.Drift, len(res.Drift))
		for i, d := range res.Drift {
			got[i] = d
			got[i].Detail = ""
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("audit %d of a: drift (-want +got):\n%s", i+1, diff)
		}
		if res.Tally.Freed.Total() != 0 || res.Tally.Kept.Of(audit.KeptResident) != 2 {
			t.Errorf("audit %d of a: kept %+v freed %+v, want both claims kept resident", i+1, res.Tally.Kept, res.Freed)
		}
	}
}
