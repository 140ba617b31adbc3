package sim

import (
	"errors"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/numa"
)

// TestRepin: a running guest takes new pins in place and keeps running; a
// re-pin no running guest can take, or to pCPUs the host lacks, changes
// nothing; a call held at the repin gate has changed nothing yet.
func TestRepin(t *testing.T) {
	e := newEnv(t, Options{})
	was := e.running("h1", uuidA, "a", 2, 0)
	used := func() numa.CPUSet {
		t.Helper()
		dom, err := e.d.Lookup(e.ctx, "h1", uuidA)
		if err != nil {
			t.Fatal(err)
		}
		if dom.State != hypervisor.StateRunning {
			t.Fatalf("domain is %s after a re-pin, want running", dom.State)
		}
		cpus, err := hypervisor.UsedCPUs(*dom)
		if err != nil {
			t.Fatal(err)
		}
		return cpus
	}

	for _, bad := range []struct{ name, def, want string }{
		{"memory to another node", domainXML(uuidA, "a", 3, 1), "cannot change the host NUMA nodes"},
		{"a pCPU the host lacks", domainXML(uuidA, "a", 9, 0), "names cpus 9 the host does not have"},
		{"another domain", domainXML(uuidB, "b", 3, 0), "is of domain b"},
	} {
		err := e.d.Repin(e.ctx, "h1", uuidA, bad.def)
		if err == nil || !errors.Is(err, hypervisor.ErrRejected) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Repin to %s = %v; want ErrRejected saying %q", bad.name, err, bad.want)
		}
		if got := used(); !got.Equal(numa.MustParse("2")) {
			t.Errorf("after the refused re-pin to %s the guest uses pCPUs %s, want 2 as before", bad.name, got)
		}
	}

	if err := e.d.HoldGate(e.ctx, GateRepin, ""); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	def := domainXML(uuidA, "a", 3, 0)
	go func() { done <- e.d.Repin(e.ctx, "h1", uuidA, def) }()
	e.await(GateRepin, "the re-pin", func(st GateState) bool { return st.Arrived == 1 })
	if got := used(); !got.Equal(numa.MustParse("2")) {
		t.Errorf("a re-pin held at its gate left the guest on pCPUs %s, want 2 as before", got)
	}
	if err := e.d.ReleaseGate(e.ctx, GateRepin, ""); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Repin to pCPU 3: %v", err)
	}
	if got := used(); !got.Equal(numa.MustParse("3")) {
		t.Errorf("after the re-pin the guest uses pCPUs %s, want 3", got)
	}
	if err := e.d.Repin(e.ctx, "h1", uuidA, def); err != nil {
		t.Errorf("Repin again to the same pins: %v", err)
	}
	if was == def {
		t.Fatal("the test re-pins to the definition it started with")
	}
}
