package activities_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/libvirt"
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// refusedForGood checks that err is a non-retryable application error of
// type typ whose message contains want.
func refusedForGood(t *testing.T, step string, err error, typ, want string) {
	t.Helper()
	var app *temporal.ApplicationError
	if !errors.As(err, &app) || app.Type() != typ || !app.NonRetryable() || !strings.Contains(app.Message(), want) {
		t.Errorf("%s = %v, want a non-retryable %s containing %q", step, err, typ, want)
	}
}

func topology(t *testing.T, cores int) *numa.Host {
	t.Helper()
	h, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: cores, Threads: 1, MemoryMB: 16384})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestRegisterHostRetried: making the simulated host and registering it
// succeed again after they took effect, with the same generation; a
// topology the simulator or a claim cannot take is refused for good.
func TestRegisterHostRetried(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	in := activities.HostTopology{Host: "a", Topology: topology(t, 8)}
	var gens []int64
	for range 2 {
		if err := w.Acts.AddSimulatedHost(ctx, in); err != nil {
			t.Fatalf("AddSimulatedHost(a): %v", err)
		}
		gen, err := w.Acts.RegisterHost(ctx, in)
		if err != nil {
			t.Fatalf("RegisterHost(a): %v", err)
		}
		gens = append(gens, gen)
	}
	if gens[0] != 1 || gens[1] != 1 {
		t.Errorf("RegisterHost(a) twice = generations %v, want 1 both times", gens)
	}
	if _, err := w.Driver.Capabilities(ctx, "a"); err != nil {
		t.Errorf("the simulator does not know a after AddSimulatedHost: %v", err)
	}

	u := simcloud.UUID(1)
	w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-1"})
	smaller := activities.HostTopology{Host: "a", Topology: topology(t, 1)}
	refusedForGood(t, "AddSimulatedHost(a) with another topology", w.Acts.AddSimulatedHost(ctx, smaller), api.ErrTypeRejected, "different topology")
	_, err := w.Acts.RegisterHost(ctx, smaller)
	refusedForGood(t, "RegisterHost(a) too small for its guest", err, api.ErrTypeBadState, "would not fit the new topology")
	_, err = w.Acts.RegisterHost(ctx, activities.HostTopology{Host: "a:1", Topology: topology(t, 1)})
	refusedForGood(t, "RegisterHost(a:1)", err, api.ErrTypeInvalidRequest, `host name "a:1"`)
	refusedForGood(t, "AddSimulatedHost(b) without a topology", w.Acts.AddSimulatedHost(ctx, activities.HostTopology{Host: "b"}),
		api.ErrTypeInvalidRequest, "no topology")

	// A worker that drives no simulator has no machine to make.
	w.Acts.Simulated = nil
	if err := w.Acts.AddSimulatedHost(ctx, activities.HostTopology{Host: "c", Topology: topology(t, 2)}); err != nil {
		t.Errorf("AddSimulatedHost(c) without a simulator: %v, want nil", err)
	}
}

// TestHostStateStepsRetried: each state change succeeds again after it
// took effect (a host down keeps its first token), and what the host's
// state forbids is refused for good with the ledger's words, changing
// nothing.
func TestHostStateStepsRetried(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	twice := func(step string, do func() (activities.HostStatus, error)) activities.HostStatus {
		t.Helper()
		first, err := do()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		again, err := do()
		if err != nil {
			t.Fatalf("%s again: %v", step, err)
		}
		if diff := cmp.Diff(first, again); diff != "" {
			t.Errorf("%s again changed the status (-first +again):\n%s", step, diff)
		}
		return again
	}
	st := twice("SetHostDisabled(a)", func() (activities.HostStatus, error) {
		return w.Acts.SetHostDisabled(ctx, activities.HostReasonInput{Host: "a", Reason: "bios"})
	})
	if st.State != ledger.HostDisabled || st.Reason != "bios" {
		t.Errorf("SetHostDisabled(a) = %+v, want disabled for bios", st)
	}
	if st = twice("SetHostEnabled(a)", func() (activities.HostStatus, error) {
		return w.Acts.SetHostEnabled(ctx, activities.HostInput{Host: "a"})
	}); st.State != ledger.HostUp {
		t.Errorf("SetHostEnabled(a) = %+v, want up", st)
	}
	st = twice("SetHostDown(b)", func() (activities.HostStatus, error) {
		return w.Acts.SetHostDown(ctx, activities.HostReasonInput{Host: "b", Reason: "psu"})
	})
	if st.State != ledger.HostDown || st.Token == "" {
		t.Errorf("SetHostDown(b) = %+v, want down with a token", st)
	}

	before, err := w.Ledger.HostStatus(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Acts.SetHostDisabled(ctx, activities.HostReasonInput{Host: "b", Reason: "bios"})
	refusedForGood(t, "SetHostDisabled(b) down", err, api.ErrTypeBadState, "the host is down; only an up or disabled host is disabled or enabled")
	_, err = w.Acts.SetHostEnabled(ctx, activities.HostInput{Host: "b"})
	refusedForGood(t, "SetHostEnabled(b) down", err, api.ErrTypeBadState, "the host is down")
	if after, err := w.Ledger.HostStatus(ctx, "b"); err != nil || after != before {
		t.Errorf("b after the refusals = %+v, %v; want it as before, %+v", after, err, before)
	}
	_, err = w.Acts.SetHostDisabled(ctx, activities.HostReasonInput{Host: "nowhere", Reason: "bios"})
	refusedForGood(t, "SetHostDisabled(nowhere)", err, api.ErrTypeUnknownHost, `"nowhere" is not registered`)
	_, err = w.Acts.SetHostDown(ctx, activities.HostReasonInput{Host: "a", Reason: "two\nlines"})
	refusedForGood(t, "SetHostDown(a) with a reason of two lines", err, api.ErrTypeInvalidRequest, "reasons are 1-200 printable characters")
}

// TestRemoveHostRetried: a host that holds a guest is refused for good
// and kept; an empty one is removed, and removing it again (an attempt
// whose result was lost) succeeds; the simulator keeps a machine that
// holds domains, and says so.
func TestRemoveHostRetried(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	w.AddHost(t, "a")
	w.AddHost(t, "b")
	u := simcloud.UUID(2)
	w.Boot(t, "a", u, activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "boot-2"})
	claims, err := w.Ledger.Claims(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Acts.RemoveHost(ctx, activities.HostInput{Host: "a"})
	refusedForGood(t, "RemoveHost(a) with a guest", err, api.ErrTypeBadState, "evacuate, migrate or delete its guests first")
	if after, err := w.Ledger.Claims(ctx, "a"); err != nil || !cmp.Equal(after, claims) {
		t.Errorf("a's claims after the refused removal = %+v, %v; want them as before", after, err)
	}

	for i := range 2 {
		if n, err := w.Acts.RemoveHost(ctx, activities.HostInput{Host: "b"}); err != nil || n != 0 {
			t.Errorf("RemoveHost(b) #%d = %d, %v; want 0 tombstones, nil", i+1, n, err)
		}
		if kept, err := w.Acts.RemoveSimulatedHost(ctx, activities.HostInput{Host: "b"}); err != nil || kept != "" {
			t.Errorf("RemoveSimulatedHost(b) #%d = %q, %v; want the machine gone", i+1, kept, err)
		}
	}
	if _, err := w.Ledger.HostStatus(ctx, "b"); !errors.Is(err, ledger.ErrUnknownHost) {
		t.Errorf("b after its removal: %v, want it unknown", err)
	}
	if _, err := w.Driver.Capabilities(ctx, "b"); !errors.Is(err, hypervisor.ErrUnknownHost) {
		t.Errorf("the simulator's b after its removal: %v, want it unknown", err)
	}
	kept, err := w.Acts.RemoveSimulatedHost(ctx, activities.HostInput{Host: "a"})
	if err != nil || !strings.Contains(kept, "holds 1 domains") {
		t.Errorf("RemoveSimulatedHost(a) holding A = %q, %v; want the machine kept, saying why", kept, err)
	}
}

// TestLibvirtHostSteps: a host that cannot be reached is not read and
// leaves the record of libvirt hosts as it was; recording succeeds again;
// a configuration no retry can use is refused for good.
func TestLibvirtHostSteps(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	reg := libvirt.NewRegistry(w.RDB, "test")
	w.Acts.Libvirt = libvirt.Registrar{New: func() (*libvirt.Driver, error) { return libvirt.New(libvirt.Config{Resolve: reg.Resolve}) }, Registry: reg}
	old := libvirthost.Config{URI: "qemu+tcp://a.example/system"}
	if err := reg.Put(ctx, "a", old); err != nil {
		t.Fatal(err)
	}
	unreachable := activities.LibvirtHostInput{Host: "a", Config: libvirthost.Config{URI: "qemu+tcp://127.0.0.1:1/system"}}
	_, err := w.Acts.ReadLibvirtHost(ctx, unreachable)
	var app *temporal.ApplicationError
	if err == nil || (errors.As(err, &app) && app.NonRetryable()) {
		t.Errorf("ReadLibvirtHost(a) unreachable = %v, want an error worth retrying", err)
	}
	if hc, err := reg.Resolve(ctx, "a"); err != nil || hc != old {
		t.Errorf("a's record after the failed read = %+v, %v; want %+v", hc, err, old)
	}

	moved := activities.LibvirtHostInput{Host: "a", Config: libvirthost.Config{URI: "qemu+tcp://a2.example/system", MigrateURI: "tcp://a2.example"}}
	for i := range 2 {
		if err := w.Acts.RecordLibvirtHost(ctx, moved); err != nil {
			t.Fatalf("RecordLibvirtHost(a) #%d: %v", i+1, err)
		}
	}
	if hc, err := reg.Resolve(ctx, "a"); err != nil || hc != moved.Config {
		t.Errorf("a's record = %+v, %v; want %+v", hc, err, moved.Config)
	}
	bad := activities.LibvirtHostInput{Host: "a", Config: libvirthost.Config{URI: "qemu+tcp://a.example/system", MigrateURI: "nowhere"}}
	_, err = w.Acts.ReadLibvirtHost(ctx, bad)
	refusedForGood(t, "ReadLibvirtHost(a) with a bad migrate uri", err, api.ErrTypeInvalidRequest, `migrate uri "nowhere"`)
	refusedForGood(t, "RecordLibvirtHost(a) with a bad migrate uri", w.Acts.RecordLibvirtHost(ctx, bad), api.ErrTypeInvalidRequest, `migrate uri "nowhere"`)
	if hc, err := reg.Resolve(ctx, "a"); err != nil || hc != moved.Config {
		t.Errorf("a's record after the refusals = %+v, %v; want %+v", hc, err, moved.Config)
	}
}
