package workflows

import (
	"strings"
	"testing"

	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

func oneCell(t *testing.T) *numa.Host {
	t.Helper()
	h, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: 4, Threads: 1, MemoryMB: 8192})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestHostAdd(t *testing.T) {
	t.Run("simulated", func(t *testing.T) {
		h := newHarness(t)
		h.on("sim", a.AddSimulatedHost, nil)
		h.on("register", a.RegisterHost, int64(1), nil)
		h.env.ExecuteWorkflow(HostAdd, api.HostAddInput{Host: "a", Topology: oneCell(t)})
		var res api.HostAddResult
		if err := h.env.GetWorkflowResult(&res); err != nil || res.Generation != 1 || res.Topology == nil {
			t.Fatalf("HostAdd = %+v, %v; want generation 1 with the topology", res, err)
		}
		if got, want := h.sequence(), "sim,register"; got != want {
			t.Errorf("HostAdd steps = %s, want %s", got, want)
		}
	})
	t.Run("libvirt", func(t *testing.T) {
		h := newHarness(t)
		limits := &numa.Limits{CPUAllocationRatio: 2, RAMAllocationRatio: 1}
		h.on("read", a.ReadLibvirtHost, oneCell(t), nil)
		h.on("register", a.RegisterHost, int64(3), nil)
		h.on("record", a.RecordLibvirtHost, nil)
		h.env.ExecuteWorkflow(HostAdd, api.HostAddInput{Host: "a", Libvirt: &libvirthost.Config{URI: "qemu+tcp://a/system"}, Limits: limits})
		var res api.HostAddResult
		if err := h.env.GetWorkflowResult(&res); err != nil || res.Generation != 3 || res.Topology.Limits == nil || *res.Topology.Limits != *limits {
			t.Fatalf("HostAdd = %+v, %v; want generation 3 with the limits given", res, err)
		}
		if got, want := h.sequence(), "read,register,record"; got != want {
			t.Errorf("HostAdd steps = %s, want %s", got, want)
		}
	})
	// A host that cannot be read or registered is not recorded.
	t.Run("libvirt host not registered", func(t *testing.T) {
		h := newHarness(t)
		h.on("read", a.ReadLibvirtHost, oneCell(t), nil)
		h.on("register", a.RegisterHost, int64(0), failed("claim boot-1 would not fit the new topology", api.ErrTypeBadState))
		h.env.ExecuteWorkflow(HostAdd, api.HostAddInput{Host: "a", Libvirt: &libvirthost.Config{URI: "qemu+tcp://a/system"}})
		if err := h.env.GetWorkflowError(); err == nil || !strings.Contains(err.Error(), "would not fit") {
			t.Fatalf("HostAdd error = %v, want the ledger's refusal", err)
		}
		if got, want := h.sequence(), "read,register"; got != want {
			t.Errorf("HostAdd steps = %s, want %s", got, want)
		}
	})
	for name, in := range map[string]api.HostAddInput{
		"neither":           {Host: "a"},
		"both":              {Host: "a", Topology: oneCell(t), Libvirt: &libvirthost.Config{URI: "qemu+tcp://a/system"}},
		"limits beside one": {Host: "a", Topology: oneCell(t), Limits: &numa.Limits{CPUAllocationRatio: 1, RAMAllocationRatio: 1}},
	} {
		t.Run("refuses "+name, func(t *testing.T) {
			h := newHarness(t)
			h.env.ExecuteWorkflow(HostAdd, in)
			if err := h.env.GetWorkflowError(); !isType(err, api.ErrTypeInvalidRequest) {
				t.Fatalf("HostAdd(%s) error = %v, want an invalid request", name, err)
			}
			if got := h.sequence(); got != "" {
				t.Errorf("HostAdd(%s) ran %s, want no step", name, got)
			}
		})
	}
}

func TestHostStateChanges(t *testing.T) {
	for _, tt := range []struct {
		wf   func(ctx workflow.Context, in api.HostStateInput) (*activities.HostStatus, error)
		name string
		step any
		want ledger.HostState
	}{
		{HostDisable, "disable", a.SetHostDisabled, ledger.HostDisabled},
		{HostEnable, "enable", a.SetHostEnabled, ledger.HostUp},
		{HostDown, "down", a.SetHostDown, ledger.HostDown},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.on(tt.name, tt.step, activities.HostStatus{Host: "a", State: tt.want, Reason: "psu"}, nil)
			h.env.ExecuteWorkflow(tt.wf, api.HostStateInput{Host: "a", Reason: "psu"})
			var st activities.HostStatus
			if err := h.env.GetWorkflowResult(&st); err != nil || st.State != tt.want {
				t.Fatalf("Host %s = %+v, %v; want the host %s", tt.name, st, err, tt.want)
			}
			if got := h.sequence(); got != tt.name {
				t.Errorf("Host %s steps = %s, want %s", tt.name, got, tt.name)
			}
		})
	}
	t.Run("refused", func(t *testing.T) {
		h := newHarness(t)
		const why = "the host is down; only an up or disabled host is disabled or enabled"
		h.on("disable", a.SetHostDisabled, activities.HostStatus{}, failed(why, api.ErrTypeBadState))
		h.env.ExecuteWorkflow(HostDisable, api.HostStateInput{Host: "a", Reason: "bios"})
		if err := h.env.GetWorkflowError(); err == nil || !strings.Contains(err.Error(), why) {
			t.Fatalf("HostDisable error = %v, want %q", err, why)
		}
	})
}

func TestHostRemove(t *testing.T) {
	t.Run("removed", func(t *testing.T) {
		h := newHarness(t)
		h.on("state", a.LoadHostStatus, activities.HostStatus{Host: "a", State: ledger.HostDown}, nil)
		h.on("remove", a.RemoveHost, 2, nil)
		h.on("sim", a.RemoveSimulatedHost, "sim: remove host a: it holds 1 domains", nil)
		h.env.ExecuteWorkflow(HostRemove, api.HostRemoveInput{Host: "a"})
		var res api.HostRemoveResult
		if err := h.env.GetWorkflowResult(&res); err != nil || res.Tombstones != 2 || !strings.Contains(res.Kept, "holds 1 domains") {
			t.Fatalf("HostRemove = %+v, %v; want 2 tombstones and the simulator's machine kept", res, err)
		}
		if got, want := h.sequence(), "state,remove,sim"; got != want {
			t.Errorf("HostRemove steps = %s, want %s", got, want)
		}
	})
	t.Run("unknown host", func(t *testing.T) {
		h := newHarness(t)
		h.on("state", a.LoadHostStatus, activities.HostStatus{}, failed(`unknown host: "a" is not registered`, api.ErrTypeUnknownHost))
		h.env.ExecuteWorkflow(HostRemove, api.HostRemoveInput{Host: "a"})
		if err := h.env.GetWorkflowError(); !isType(err, api.ErrTypeUnknownHost) {
			t.Fatalf("HostRemove error = %v, want an unknown host", err)
		}
		if got := h.sequence(); got != "state" {
			t.Errorf("HostRemove steps = %s, want state alone", got)
		}
	})
	t.Run("holds a guest", func(t *testing.T) {
		h := newHarness(t)
		const why = "its claim boot-1 is committed; evacuate, migrate or delete its guests first"
		h.on("state", a.LoadHostStatus, activities.HostStatus{Host: "a", State: ledger.HostUp}, nil)
		h.on("remove", a.RemoveHost, 0, failed(why, api.ErrTypeBadState))
		h.env.ExecuteWorkflow(HostRemove, api.HostRemoveInput{Host: "a"})
		if err := h.env.GetWorkflowError(); err == nil || !strings.Contains(err.Error(), why) {
			t.Fatalf("HostRemove error = %v, want %q", err, why)
		}
		if got := h.sequence(); got != "state,remove" {
			t.Errorf("HostRemove steps = %s, want state,remove", got)
		}
	})
}
