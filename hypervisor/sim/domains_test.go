package sim

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/numa"
)

func TestAddHostAndCapabilities(t *testing.T) {
	e := newEnv(t, Options{})
	used := testTopo(t)
	used.Cells[0].PinnedCPUs = numa.MustParse("2")
	used.Cells[0].MemoryUsedMB = 512
	used.Cells[1].CPUUsage = 3
	// The same topology with usage is the same host: usage is not stored.
	if err := e.d.AddHost(e.ctx, "h1", used); err != nil {
		t.Fatalf("AddHost(h1) again with the same topology plus usage: %v, want nil", err)
	}
	got, err := e.d.Capabilities(e.ctx, "h1")
	if err != nil {
		t.Fatalf("Capabilities(h1): %v", err)
	}
	if diff := cmp.Diff(testTopo(t), got, cmp.Comparer(func(a, b numa.CPUSet) bool { return a.Equal(b) })); diff != "" {
		t.Errorf("Capabilities(h1) mismatch (-want +got):\n%s", diff)
	}

	other := testTopo(t)
	other.Cells[1].MemoryMB = 8192
	if err := e.d.AddHost(e.ctx, "h1", other); err == nil || !strings.Contains(err.Error(), "different topology") {
		t.Errorf("AddHost(h1) with another topology: %v, want a 'different topology' error", err)
	}
	for _, name := range []string{"", "a{b}", "-x", "has space"} {
		if err := e.d.AddHost(e.ctx, name, testTopo(t)); err == nil {
			t.Errorf("AddHost(%q): nil, want an error naming the allowed host names", name)
		}
	}
	if err := e.d.AddHost(e.ctx, "h3", &numa.Host{}); err == nil {
		t.Errorf("AddHost(h3, no cells): nil, want a validation error")
	}
	hosts, err := e.d.Hosts(e.ctx)
	if err != nil {
		t.Fatalf("Hosts: %v", err)
	}
	if diff := cmp.Diff([]string{"h1", "h2"}, hosts); diff != "" {
		t.Errorf("Hosts mismatch (-want +got):\n%s", diff)
	}
}

func TestRemoveHost(t *testing.T) {
	e := newEnv(t, Options{})
	e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.SetLatency(e.ctx, "h1", OpStart, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.d.RemoveHost(e.ctx, "h1"); err == nil || !strings.Contains(err.Error(), "holds 1 domains") {
		t.Errorf("RemoveHost(h1) holding a domain: %v, want a 'holds 1 domains' error", err)
	}
	if err := e.d.Stop(e.ctx, "h1", uuidA); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Undefine(e.ctx, "h1", uuidA); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := e.d.RemoveHost(e.ctx, "h1"); err != nil {
			t.Fatalf("RemoveHost(h1) #%d: %v, want nil", i+1, err)
		}
	}
	hosts, err := e.d.Hosts(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"h2"}, hosts); diff != "" {
		t.Errorf("Hosts after RemoveHost(h1) mismatch (-want +got):\n%s", diff)
	}
	if _, err := e.d.Capabilities(e.ctx, "h1"); !errors.Is(err, hypervisor.ErrUnknownHost) {
		t.Errorf("Capabilities(h1) after removal: %v, want ErrUnknownHost", err)
	}
	if n, err := e.rdb.Exists(e.ctx, e.d.latencyKey("h1")).Result(); err != nil || n != 0 {
		t.Errorf("latency key of removed h1: exists=%d err=%v, want gone", n, err)
	}
	// The host can come back.
	if err := e.d.AddHost(e.ctx, "h1", testTopo(t)); err != nil {
		t.Errorf("AddHost(h1) after removal: %v", err)
	}
}

func TestUnknownHost(t *testing.T) {
	e := newEnv(t, Options{})
	x := domainXML(uuidA, "a", 2, 0)
	calls := map[string]func() error{
		"Capabilities": func() error { _, err := e.d.Capabilities(e.ctx, "nope"); return err },
		"Define":       func() error { return e.d.Define(e.ctx, "nope", x) },
		"Start":        func() error { return e.d.Start(e.ctx, "nope", uuidA) },
		"Shutdown":     func() error { return e.d.Shutdown(e.ctx, "nope", uuidA) },
		"Stop":         func() error { return e.d.Stop(e.ctx, "nope", uuidA) },
		"Undefine":     func() error { return e.d.Undefine(e.ctx, "nope", uuidA) },
		"Lookup":       func() error { _, err := e.d.Lookup(e.ctx, "nope", uuidA); return err },
		"Domains":      func() error { _, err := e.d.Domains(e.ctx, "nope"); return err },
		"Prepare":      func() error { return e.d.PrepareMigration(e.ctx, "nope", uuidA, x) },
		"MigrateSrc":   func() error { return e.d.Migrate(e.ctx, migrateReq("nope", "h2", uuidA, x), nil) },
		"MigrateDst":   func() error { return e.d.Migrate(e.ctx, migrateReq("h1", "nope", uuidA, x), nil) },
		"Rollback":     func() error { return e.d.Rollback(e.ctx, "h1", "nope", uuidA) },
		"SetLatency":   func() error { return e.d.SetLatency(e.ctx, "nope", OpStart, 0) },
		"SetFault":     func() error { return e.d.SetFault(e.ctx, "nope", OpStart, Fault{Times: 1}) },
		"PowerOff":     func() error { return e.d.PowerOff(e.ctx, "nope") },
		"PowerOn":      func() error { return e.d.PowerOn(e.ctx, "nope") },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, hypervisor.ErrUnknownHost) {
			t.Errorf("%s on host nope: %v, want ErrUnknownHost", name, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), "sim: ") || !strings.Contains(err.Error(), `"nope"`) {
			t.Errorf("%s on host nope: error %q, want it to start with 'sim: ' and name the host", name, err)
		}
	}
}

func TestLifecycle(t *testing.T) {
	e := newEnv(t, Options{})
	x := domainXML(uuidA, "a", 2, 0)
	want := func(step string, state hypervisor.State, xml string) {
		t.Helper()
		got, err := e.d.Lookup(e.ctx, "h1", uuidA)
		if err != nil {
			t.Fatalf("%s: Lookup(h1, %s): %v", step, uuidA, err)
		}
		w := &hypervisor.Domain{UUID: uuidA, Name: "a", State: state, XML: xml}
		if diff := cmp.Diff(w, got); diff != "" {
			t.Fatalf("%s: Lookup(h1, %s) mismatch (-want +got):\n%s", step, uuidA, diff)
		}
	}
	steps := []struct {
		name  string
		run   func() error
		state hypervisor.State
		xml   string
		err   error
	}{
		{"define", func() error { return e.d.Define(e.ctx, "h1", x) }, hypervisor.StateShutoff, x, nil},
		{"define again", func() error { return e.d.Define(e.ctx, "h1", x) }, hypervisor.StateShutoff, x, nil},
		{"start", func() error { return e.d.Start(e.ctx, "h1", uuidA) }, hypervisor.StateRunning, x, nil},
		{"start again", func() error { return e.d.Start(e.ctx, "h1", uuidA) }, hypervisor.StateRunning, x, nil},
		{"undefine running", func() error { return e.d.Undefine(e.ctx, "h1", uuidA) }, hypervisor.StateRunning, x, hypervisor.ErrRejected},
		{"redefine running", func() error { return e.d.Define(e.ctx, "h1", domainXML(uuidA, "a", 3, 0)) }, hypervisor.StateRunning, domainXML(uuidA, "a", 3, 0), nil},
		{"stop", func() error { return e.d.Stop(e.ctx, "h1", uuidA) }, hypervisor.StateShutoff, domainXML(uuidA, "a", 3, 0), nil},
		{"stop again", func() error { return e.d.Stop(e.ctx, "h1", uuidA) }, hypervisor.StateShutoff, domainXML(uuidA, "a", 3, 0), nil},
		// Upper case without dashes names the same domain, as in libvirt.
		{"start by other uuid form", func() error { return e.d.Start(e.ctx, "h1", strings.ToUpper(strings.ReplaceAll(uuidA, "-", ""))) }, hypervisor.StateRunning, domainXML(uuidA, "a", 3, 0), nil},
		{"stop 2", func() error { return e.d.Stop(e.ctx, "h1", uuidA) }, hypervisor.StateShutoff, domainXML(uuidA, "a", 3, 0), nil},
	}
	for _, s := range steps {
		err := s.run()
		if !errors.Is(err, s.err) || (s.err == nil && err != nil) {
			t.Fatalf("%s: %v, want %v", s.name, err, s.err)
		}
		want(s.name, s.state, s.xml)
	}
	for i := range 2 {
		if err := e.d.Undefine(e.ctx, "h1", uuidA); err != nil {
			t.Fatalf("Undefine #%d: %v, want nil", i+1, err)
		}
	}
	if _, err := e.d.Lookup(e.ctx, "h1", uuidA); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Lookup after Undefine: %v, want ErrNotFound", err)
	}
	for name, err := range map[string]error{
		"Start":  e.d.Start(e.ctx, "h1", uuidA),
		"Stop":   e.d.Stop(e.ctx, "h1", uuidA),
		"Lookup": func() error { _, err := e.d.Lookup(e.ctx, "h1", "not-a-uuid"); return err }(),
	} {
		if !errors.Is(err, hypervisor.ErrNotFound) {
			t.Errorf("%s of a missing domain: %v, want ErrNotFound", name, err)
		}
	}
}

func TestDomainsList(t *testing.T) {
	e := newEnv(t, Options{})
	xb := e.running("h1", uuidB, "b", 3, 0)
	xa := domainXML(uuidA, "a", 2, 0)
	if err := e.d.Define(e.ctx, "h1", xa); err != nil {
		t.Fatal(err)
	}
	got, err := e.d.Domains(e.ctx, "h1")
	if err != nil {
		t.Fatalf("Domains(h1): %v", err)
	}
	want := []hypervisor.Domain{
		{UUID: uuidA, Name: "a", State: hypervisor.StateShutoff, XML: xa},
		{UUID: uuidB, Name: "b", State: hypervisor.StateRunning, XML: xb},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Domains(h1) mismatch (-want +got):\n%s", diff)
	}
	got, err = e.d.Domains(e.ctx, "h2")
	if err != nil || len(got) != 0 {
		t.Errorf("Domains(h2) = %v, %v; want none, nil", got, err)
	}
}

func TestDefineRejects(t *testing.T) {
	e := newEnv(t, Options{})
	tests := []struct {
		name, xml, wantIn string
	}{
		{"not xml", "<domain", "domain xml"},
		{"no uuid", "<domain><name>a</name></domain>", "<uuid>"},
		{"short uuid", "<domain><name>a</name><uuid>1234</uuid></domain>", `uuid "1234" is invalid; want 32 hex digits`},
		{"not hex", "<domain><name>a</name><uuid>zf8fad5b-d9cb-469f-a165-70867728950e</uuid></domain>", "want 32 hex digits"},
		{"no name", "<domain><uuid>" + uuidA + "</uuid></domain>", "<name>"},
	}
	for _, tt := range tests {
		err := e.d.Define(e.ctx, "h1", tt.xml)
		if !errors.Is(err, hypervisor.ErrRejected) || !strings.Contains(err.Error(), tt.wantIn) || !strings.HasPrefix(err.Error(), "sim: ") {
			t.Errorf("Define(h1, %s): %v, want ErrRejected mentioning %q", tt.name, err, tt.wantIn)
		}
	}
	if got, err := e.d.Domains(e.ctx, "h1"); err != nil || len(got) != 0 {
		t.Errorf("Domains(h1) after rejected defines = %v, %v; want none", got, err)
	}
}

func TestDomainLivesOnOneHost(t *testing.T) {
	e := newEnv(t, Options{})
	x := domainXML(uuidA, "a", 2, 0)
	if err := e.d.Define(e.ctx, "h1", x); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Define(e.ctx, "h2", x); !errors.Is(err, hypervisor.ErrRejected) || !strings.Contains(err.Error(), "defined on h1") {
		t.Fatalf("Define(h2) of a domain on h1: %v, want ErrRejected naming h1", err)
	}
	if err := e.d.Undefine(e.ctx, "h1", uuidA); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Define(e.ctx, "h2", x); err != nil {
		t.Fatalf("Define(h2) after Undefine(h1): %v, want nil", err)
	}
	// A home left behind by an interrupted undefine does not pin the
	// domain: h2 no longer has it, so h1 may take it.
	if err := e.rdb.Del(e.ctx, e.d.domKey("h2", uuidA)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Define(e.ctx, "h1", x); err != nil {
		t.Errorf("Define(h1) with a stale home on h2: %v, want nil", err)
	}
}

func TestStartChecksPlacement(t *testing.T) {
	e := newEnv(t, Options{})
	tests := []struct {
		name   string
		cpu    int
		node   int
		wantIn string
	}{
		{"cpu outside host", 12, 0, `<vcpupin vcpu='0'> cpuset "12" names cpus 12 the host does not have; its online cpus are 0-7`},
		{"node outside host", 2, 3, `<numatune><memory> nodeset "3" names NUMA nodes 3 the host does not have; its nodes are 0-1`},
	}
	for _, tt := range tests {
		if err := e.d.Define(e.ctx, "h1", domainXML(uuidA, "a", tt.cpu, tt.node)); err != nil {
			t.Fatal(err)
		}
		err := e.d.Start(e.ctx, "h1", uuidA)
		if !errors.Is(err, hypervisor.ErrRejected) || !strings.Contains(err.Error(), tt.wantIn) {
			t.Errorf("Start(h1) %s: %v, want ErrRejected containing %q", tt.name, err, tt.wantIn)
		}
		dom, err := e.d.Lookup(e.ctx, "h1", uuidA)
		if err != nil || dom.State != hypervisor.StateShutoff {
			t.Errorf("Lookup after rejected Start (%s) = %+v, %v; want shutoff", tt.name, dom, err)
		}
	}
}

// state returns the state Lookup reports for uuid on host.
func (e *env) state(host, uuid string) hypervisor.State {
	e.t.Helper()
	dom, err := e.d.Lookup(e.ctx, host, uuid)
	if err != nil {
		e.t.Fatalf("Lookup(%s, %s): %v", host, uuid, err)
	}
	return dom.State
}

// waitShutoff polls until uuid is shut off on host, for a generous while.
func (e *env) waitShutoff(host, uuid string) {
	e.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if e.state(host, uuid) == hypervisor.StateShutoff {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("domain %s on %s still %s long after its shutdown was due", uuid, host, e.state(host, uuid))
		}
	}
}

func TestShutdownWithoutLatency(t *testing.T) {
	e := newEnv(t, Options{})
	x := e.running("h1", uuidA, "a", 2, 0)
	for i := range 2 {
		if err := e.d.Shutdown(e.ctx, "h1", uuidA); err != nil {
			t.Fatalf("Shutdown #%d of a domain with no shutdown latency: %v, want nil", i+1, err)
		}
		if diff := cmp.Diff(map[string]where{"h1": {hypervisor.StateShutoff, x}}, e.placement(e.d, uuidA)); diff != "" {
			t.Errorf("after Shutdown #%d with no latency, placement mismatch (-want +got):\n%s", i+1, diff)
		}
	}
	if err := e.d.Undefine(e.ctx, "h1", uuidA); err != nil {
		t.Errorf("Undefine after Shutdown: %v, want nil", err)
	}
	for _, id := range []string{uuidA, "not-a-uuid"} {
		if err := e.d.Shutdown(e.ctx, "h1", id); !errors.Is(err, hypervisor.ErrNotFound) || !strings.HasPrefix(err.Error(), "sim: shutdown ") {
			t.Errorf("Shutdown(h1, %s) of a missing domain: %v, want a 'sim: shutdown' error wrapping ErrNotFound", id, err)
		}
	}
}

func TestShutdownTakesItsLatency(t *testing.T) {
	e := newEnv(t, Options{})
	e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.SetLatency(e.ctx, "h1", OpShutdown, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Shutdown(e.ctx, "h1", uuidA); err != nil {
		t.Fatalf("Shutdown with a 1s latency: %v, want nil", err)
	}
	// Shutdown returned before the guest powered off.
	if got := e.state("h1", uuidA); got != hypervisor.StateRunning {
		t.Fatalf("right after Shutdown with a 1s latency the domain is %s, want running", got)
	}
	// Meanwhile the guest is still running: it cannot be undefined or
	// migrated, and starting it changes nothing.
	if err := e.d.Undefine(e.ctx, "h1", uuidA); !errors.Is(err, hypervisor.ErrRejected) {
		t.Errorf("Undefine while shutting down: %v, want ErrRejected", err)
	}
	if err := e.d.Migrate(e.ctx, migrateReq("h1", "h2", uuidA, domainXML(uuidA, "a", 6, 1)), nil); !errors.Is(err, hypervisor.ErrRejected) || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("Migrate while shutting down: %v, want ErrRejected saying it is shutting down", err)
	}
	if err := e.d.Start(e.ctx, "h1", uuidA); err != nil {
		t.Errorf("Start while shutting down: %v, want nil", err)
	}
	// A second request does not postpone the first.
	if err := e.d.SetLatency(e.ctx, "h1", OpShutdown, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Shutdown(e.ctx, "h1", uuidA); err != nil {
		t.Errorf("second Shutdown while shutting down: %v, want nil", err)
	}
	e.waitShutoff("h1", uuidA)
	doms, err := e.d.Domains(e.ctx, "h1")
	if err != nil || len(doms) != 1 || doms[0].State != hypervisor.StateShutoff {
		t.Errorf("Domains(h1) after the shutdown = %+v, %v; want the domain shut off", doms, err)
	}
	// The scripts see the shutdown too: the domain starts again and stays
	// up, and once stopped it undefines.
	if err := e.d.Start(e.ctx, "h1", uuidA); err != nil {
		t.Fatalf("Start after the shutdown: %v", err)
	}
	if got := e.state("h1", uuidA); got != hypervisor.StateRunning {
		t.Errorf("after Start following a shutdown the domain is %s, want running", got)
	}
	if err := e.d.Stop(e.ctx, "h1", uuidA); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Undefine(e.ctx, "h1", uuidA); err != nil {
		t.Errorf("Undefine after the shutdown: %v, want nil", err)
	}
}

func TestShutdownUndefineSeesDueShutdown(t *testing.T) {
	e := newEnv(t, Options{})
	e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.SetLatency(e.ctx, "h1", OpShutdown, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Shutdown(e.ctx, "h1", uuidA); err != nil {
		t.Fatal(err)
	}
	// Undefine is the first call after the due time: its script, not an
	// earlier read, finds the guest shut off.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := e.d.Undefine(e.ctx, "h1", uuidA)
		if err == nil {
			break
		}
		if !errors.Is(err, hypervisor.ErrRejected) || time.Now().After(deadline) {
			t.Fatalf("Undefine after Shutdown: %v; want ErrRejected until the shutdown is due, then nil", err)
		}
	}
	if _, err := e.d.Lookup(e.ctx, "h1", uuidA); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Lookup after Undefine: %v, want ErrNotFound", err)
	}
}

func TestShutdownStopCancelsPending(t *testing.T) {
	e := newEnv(t, Options{})
	e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.SetLatency(e.ctx, "h1", OpShutdown, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Shutdown(e.ctx, "h1", uuidA); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Stop(e.ctx, "h1", uuidA); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Start(e.ctx, "h1", uuidA); err != nil {
		t.Fatal(err)
	}
	// Stop dropped the pending shutdown, so none is left to power the
	// restarted guest off.
	if n, err := e.rdb.HExists(e.ctx, e.d.domKey("h1", uuidA), "shutdown_due").Result(); err != nil || n {
		t.Errorf("after Shutdown, Stop, Start: shutdown_due present=%v (%v), want none", n, err)
	}
}

func TestShutdownIgnoredByGuest(t *testing.T) {
	e := newEnv(t, Options{})
	x := e.running("h1", uuidA, "a", 2, 0)
	if err := e.d.SetFault(e.ctx, "h1", OpShutdown, Fault{Times: 1}); err != nil {
		t.Fatal(err)
	}
	// With no latency the guest would be off at once; the fault makes it
	// ignore the request, which is still accepted.
	if err := e.d.Shutdown(e.ctx, "h1", uuidA); err != nil {
		t.Fatalf("Shutdown with a shutdown fault: %v, want nil (the request is accepted and ignored)", err)
	}
	if diff := cmp.Diff(map[string]where{"h1": {hypervisor.StateRunning, x}}, e.placement(e.d, uuidA)); diff != "" {
		t.Errorf("after an ignored Shutdown, placement mismatch (-want +got):\n%s", diff)
	}
	if err := e.d.Stop(e.ctx, "h1", uuidA); err != nil {
		t.Fatalf("Stop after an ignored Shutdown: %v", err)
	}
	if got := e.state("h1", uuidA); got != hypervisor.StateShutoff {
		t.Errorf("after Stop following an ignored Shutdown the domain is %s, want shutoff", got)
	}
}
