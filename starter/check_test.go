package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// TestCheckFindsALostHost: `pinflow check` fails, naming the host, when a
// registered host's topology key is gone while its claims remain.
func TestCheckFindsALostHost(t *testing.T) {
	ctx := context.Background()
	r := testenv.StartRedis(t)
	t.Setenv("PINFLOW_REDIS_URL", r.URL())
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	led, err := ledger.New(rdb, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	spec := numa.HostSpec{Cells: []numa.CellSpec{{ID: 0, CPUs: []int{0, 1, 2, 3}, MemoryMB: 4096}}}
	topo, err := spec.Host(nil)
	if err != nil {
		t.Fatal(err)
	}
	req, err := numa.NewRequest(2, 512, map[string]string{"hw:cpu_policy": "dedicated"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	drv := sim.New(rdb, sim.Options{})
	for _, h := range []string{"h1", "h2"} {
		if err := drv.AddHost(ctx, h, topo); err != nil {
			t.Fatal(err)
		}
		if _, err := led.RegisterHost(ctx, h, topo); err != nil {
			t.Fatal(err)
		}
		if _, err := led.Claim(ctx, ledger.ClaimSpec{ID: "boot-" + h, Host: h, InstanceUUID: "vm-" + h, Kind: ledger.KindBoot,
			OwnerWorkflowID: "instance-vm-" + h, OwnerRunID: "run-1", Request: req}); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := dispatch([]string{"check"}, &out); err != nil {
		t.Fatalf("check on an intact ledger = %v\n%s", err, out.String())
	}
	if err := rdb.Del(ctx, ledger.DefaultKeyPrefix+":host:{h2}:topo").Err(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = dispatch([]string{"check"}, &out)
	if err == nil || !strings.Contains(out.String(), "PROBLEM: host h2 has no topology key") {
		t.Fatalf("check with h2's topology gone = %v, want a problem naming h2:\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "host h1") {
		t.Errorf("check names the intact host h1:\n%s", out.String())
	}
}

// TestBreachProblems: check's line for each domain of a host that may run
// on pCPUs another guest's claim dedicates, and none for a domain on its
// own pins, on the shared CPUs alone, or shut off.
func TestBreachProblems(t *testing.T) {
	const p, q, r = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002", "00000000-0000-4000-8000-000000000003"
	topo, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: 8, Threads: 1, Shared: numa.Range(0, 1), Dedicated: numa.Range(2, 7), MemoryMB: 16384})
	if err != nil {
		t.Fatal(err)
	}
	// Claim boot-p pins 2-3 for p; claim gone, which Verify would report
	// missing, pins 4 for r.
	snap := &ledger.Snapshot{Host: "h1", Topology: topo,
		Pins: []ledger.Pin{
			{CPU: 2, ClaimID: "boot-p", InstanceUUID: p},
			{CPU: 3, ClaimID: "boot-p", InstanceUUID: p},
			{CPU: 4, ClaimID: "gone", InstanceUUID: r},
		},
		Claims: []ledger.Claim{{ID: "boot-p", InstanceUUID: p}},
	}
	dom := func(uuid, name string, state hypervisor.State, vcpu, cputune string) hypervisor.Domain {
		return hypervisor.Domain{UUID: uuid, Name: name, State: state,
			XML: `<domain type='kvm'><name>` + name + `</name><uuid>` + uuid + `</uuid><memory unit='MiB'>512</memory>` + vcpu + cputune + `</domain>`}
	}
	pinned := dom(p, "p", hypervisor.StateRunning, `<vcpu>2</vcpu>`,
		`<cputune><vcpupin vcpu='0' cpuset='2'/><vcpupin vcpu='1' cpuset='3'/><emulatorpin cpuset='2-3'/></cputune>`)
	for _, tt := range []struct {
		name string
		dom  hypervisor.Domain
		want []string
	}{
		{"only the pinned guest, on its own pins", hypervisor.Domain{}, nil},
		{"no cpuset", dom(q, "q", hypervisor.StateRunning, `<vcpu>2</vcpu>`, ""),
			[]string{"host h1: domain q (" + q + ", running) may run on pCPUs 2-4 that claim boot-p of guest " + p + " and claim gone of guest " + r + " dedicate"}},
		{"paused, vCPUs pinned to a set", dom(q, "q", hypervisor.StatePaused, `<vcpu>1</vcpu>`,
			`<cputune><vcpupin vcpu='0' cpuset='1-2'/><emulatorpin cpuset='0-1'/></cputune>`),
			[]string{"host h1: domain q (" + q + ", paused) may run on pCPUs 2 that claim boot-p of guest " + p + " dedicates"}},
		{"on the shared CPUs", dom(q, "q", hypervisor.StateRunning, `<vcpu cpuset='0-1'>2</vcpu>`, ""), nil},
		{"shut off, no cpuset", dom(q, "q", hypervisor.StateShutoff, `<vcpu>2</vcpu>`, ""), nil},
	} {
		doms := []hypervisor.Domain{pinned}
		if tt.dom.UUID != "" {
			doms = append(doms, tt.dom)
		}
		if diff := cmp.Diff(tt.want, breachProblems(snap, doms)); diff != "" {
			t.Errorf("breachProblems, %s (-want +got):\n%s", tt.name, diff)
		}
	}
}

// TestCheckReadsTheHypervisors: `pinflow check` reports a guest started
// through the hypervisor without a cpuset, which runs on another guest's
// pinned pCPUs, and a host whose domains cannot be read; it counts a
// quarantine as such. --ledger-only reads no hypervisor, and passes.
func TestCheckReadsTheHypervisors(t *testing.T) {
	ctx := context.Background()
	r := testenv.StartRedis(t)
	t.Setenv("PINFLOW_REDIS_URL", r.URL())
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	led, err := ledger.New(rdb, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	drv := sim.New(rdb, sim.Options{})
	topo, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: 8, Threads: 1, Shared: numa.Range(0, 1), Dedicated: numa.Range(2, 7), MemoryMB: 16384})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.AddHost(ctx, "h1", topo); err != nil {
		t.Fatal(err)
	}
	if _, err := led.RegisterHost(ctx, "h1", topo); err != nil {
		t.Fatal(err)
	}
	const p, q, x = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002", "00000000-0000-4000-8000-000000000003"
	var pinned numa.CPUSet
	for _, c := range []struct {
		id, uuid string
		kind     ledger.ClaimKind
		vcpus    int
	}{
		{"boot-p", p, ledger.KindBoot, 2},
		{"quarantine-x", x, ledger.KindQuarantine, 1},
	} {
		req, err := numa.NewRequest(c.vcpus, 512, map[string]string{"hw:cpu_policy": "dedicated"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		cl, err := led.Claim(ctx, ledger.ClaimSpec{ID: c.id, Host: "h1", InstanceUUID: c.uuid, Kind: c.kind,
			OwnerWorkflowID: "instance-" + c.uuid, OwnerRunID: "run-1", Request: req})
		if err != nil {
			t.Fatal(err)
		}
		for i := range cl.Placement.Cells {
			pinned = pinned.Union(cl.Placement.Cells[i].PinnedPCPUs())
		}
	}
	xml := `<domain type='kvm'><name>q</name><uuid>` + q + `</uuid><memory unit='MiB'>512</memory><vcpu>2</vcpu></domain>`
	if err := drv.Define(ctx, "h1", xml); err != nil {
		t.Fatal(err)
	}
	if err := drv.Start(ctx, "h1", q); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if err := dispatch([]string{"check", "--ledger-only"}, &out); err != nil {
		t.Fatalf("check --ledger-only = %v, want no problem in the ledger:\n%s", err, out.String())
	}
	for _, want := range []string{"1 host, 2 claims (1 pending: operations in flight; 1 quarantined; 0 source holds; 0 tombstones)", "(the hypervisors were not read)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("check --ledger-only printed\n%s\nwant it to say %q", out.String(), want)
		}
	}

	out.Reset()
	err = dispatch([]string{"check"}, &out)
	want := "PROBLEM: host h1: domain q (" + q + ", running) may run on pCPUs " + pinned.String() +
		" that claim boot-p of guest " + p + " and claim quarantine-x of guest " + x + " dedicate\n"
	if err == nil || !strings.Contains(out.String(), want) {
		t.Errorf("check with q floating over the pins = %v:\n%s\nwant the problem %q", err, out.String(), want)
	}

	// A host the ledger has and the hypervisor does not know.
	if _, err := led.RegisterHost(ctx, "h2", topo); err != nil {
		t.Fatal(err)
	}
	if err := drv.Stop(ctx, "h1", q); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = dispatch([]string{"check", "--json"}, &out)
	var rep checkReport
	if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
		t.Fatalf("check --json: %v in %s", jerr, out.String())
	}
	if err == nil || len(rep.Problems) != 1 || !strings.HasPrefix(rep.Problems[0], "host h2: its domains cannot be read") || rep.Quarantined != 1 || rep.Pending != 1 {
		t.Errorf("check --json with q shut off and h2 unknown to the hypervisor = %v, %+v; want one problem naming h2, 1 pending and 1 quarantined", err, rep)
	}
}

// TestPowerProblems: a guest shut off while its record says active, or
// running while it says stopped, or with no domain where its record
// says, is a problem line naming it; one whose operation has a task under
// way, or whose domain agrees, is not.
func TestPowerProblems(t *testing.T) {
	doms := []hypervisor.Domain{
		{UUID: "u1", State: hypervisor.StateShutoff},
		{UUID: "u2", State: hypervisor.StateRunning},
		{UUID: "u3", State: hypervisor.StateShutoff},
		{UUID: "u4", State: hypervisor.StateRunning},
		{UUID: "u5", State: hypervisor.StateShutoff},
	}
	records := map[string]*ledger.Instance{
		"u1": {UUID: "u1", Name: "crashed", VMState: guest.VMActive},
		"u2": {UUID: "u2", Name: "started-by-hand", VMState: guest.VMStopped},
		"u3": {UUID: "u3", Name: "resizing", VMState: guest.VMActive, TaskState: guest.TaskResizePrep},
		"u4": {UUID: "u4", Name: "fine", VMState: guest.VMActive},
		"u6": {UUID: "u6", Name: "vanished", VMState: guest.VMActive},
	}
	got := powerProblems("h1", doms, records)
	want := []string{
		"host h1: instance vanished is recorded active there, but the host has no domain of it",
		"host h1: instance crashed is recorded active but its domain is shutoff; the audit records the state it sees",
		"host h1: instance started-by-hand is recorded stopped but its domain is running; the audit records the state it sees",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("powerProblems (-want +got):\n%s", diff)
	}
}
