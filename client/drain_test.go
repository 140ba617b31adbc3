package client

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// ledgerOnly is a client of a fresh ledger with hosts up, a and b, and
// down, no Temporal: every refusal tested here comes before a workflow
// would start.
func ledgerOnly(t *testing.T) *Client {
	t.Helper()
	ctx := context.Background()
	r := testenv.StartRedis(t)
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
	for _, h := range []string{"a", "b", "down"} {
		if _, err := led.RegisterHost(ctx, h, topo); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := led.SetHostDown(ctx, "down", "PSU failed"); err != nil {
		t.Fatal(err)
	}
	return New(led, nil, "q")
}

// TestHostRequestsRefused: drains, undrains, plans, audits and releases
// refuse bad input (ErrInvalid), unknown hosts (ErrUnknownHost) and hosts
// in the wrong state with one line, before anything starts.
func TestHostRequestsRefused(t *testing.T) {
	c := ledgerOnly(t)
	ctx := context.Background()
	negative := -time.Second
	for _, tc := range []struct {
		name string
		do   func() error
		is   error // nil: no mark
		want string
	}{
		{"a bad host name", func() error { _, err := c.Drain(ctx, api.DrainInput{Host: "a/b"}); return err }, ErrInvalid, "host drain: "},
		{"too many moves at once", func() error { _, err := c.Drain(ctx, api.DrainInput{Host: "a", Parallel: 65}); return err },
			ErrInvalid, "host drain a: drain parallel 65: it must be 1 to 64"},
		{"a bad policy", func() error { _, err := c.Drain(ctx, api.DrainInput{Host: "a", Policy: "fast"}); return err },
			ErrInvalid, `drain policy "fast": policies are live, cold and live-then-cold`},
		{"an unknown host", func() error { _, err := c.Drain(ctx, api.DrainInput{Host: "nowhere"}); return err },
			ErrUnknownHost, `unknown host "nowhere"; registered hosts are a, b, down`},
		{"a drain of a down host", func() error { _, err := c.Drain(ctx, api.DrainInput{Host: "down"}); return err },
			ErrState, "host drain down: the host is down; a drain moves guests off a running host (evacuate a fenced one)"},
		{"an undrain of a down host", func() error { _, err := c.Undrain(ctx, "down"); return err },
			ErrState, "host undrain down: the host is down; a host marked down is undrained once it is back up"},
		{"a plan of an unknown host", func() error { _, err := c.PlanDrain(ctx, "nowhere", ""); return err }, ErrUnknownHost, `unknown host "nowhere"`},
		{"a drain status of an unknown host", func() error { _, err := c.DrainStatus(ctx, "nowhere"); return err }, ErrUnknownHost, `unknown host "nowhere"`},
		{"a pause of an unknown host", func() error { _, err := c.PauseDrain(ctx, "nowhere"); return err }, ErrUnknownHost, `unknown host "nowhere"`},
		{"an audit of an unknown host", func() error {
			_, err := c.Reconcile(ctx, api.ReconcileInput{Hosts: []string{"a", "nowhere"}})
			return err
		},
			ErrUnknownHost, `reconcile: unknown host "nowhere"`},
		{"a negative grace", func() error { _, err := c.Reconcile(ctx, api.ReconcileInput{Grace: &negative}); return err },
			ErrInvalid, "reconcile: grace -1s: give a duration of 0 or more"},
		{"a recovery of a bad host name", func() error { _, err := c.Recover(ctx, api.RecoverInput{Hosts: []string{""}}); return err },
			ErrInvalid, "recover: "},
		{"a release of no claim", func() error { _, err := c.ReleaseQuarantine(ctx, "a", ""); return err },
			ErrInvalid, "quarantine release: an empty claim id"},
	} {
		err := tc.do()
		switch {
		case err == nil:
			t.Errorf("%s: accepted, want it refused with %q", tc.name, tc.want)
		case !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n"):
			t.Errorf("%s: %q, want one line with %q", tc.name, err, tc.want)
		case tc.is != nil && !errors.Is(err, tc.is):
			t.Errorf("%s: %q does not wrap %v", tc.name, err, tc.is)
		}
	}
}

// TestPlanDrainOfAnEmptyHost: the plan of a host without guests is
// complete and moves nothing.
func TestPlanDrainOfAnEmptyHost(t *testing.T) {
	plan, err := ledgerOnly(t).PlanDrain(context.Background(), "a", "")
	if err != nil || !plan.Complete() || len(plan.Moves) != 0 || plan.Source != "a" {
		t.Errorf("PlanDrain(a) = %+v, %v; want a complete plan of a that moves nothing", plan, err)
	}
}

// TestDrainStateJSON: a drain's state carries the drain's own status at
// its top level, so a reader of the running drain's status reads an
// ended one the same way, with how it ended beside it.
func TestDrainStateJSON(t *testing.T) {
	st := DrainState{DrainStatus: api.DrainStatus{Host: "a", Moving: 1, Guests: []api.DrainGuest{{UUID: "u", State: api.GuestFailed, Error: "its move to b failed: injected fault"}}},
		WorkflowID: "drain-a", RunID: "r", Status: "failed", Reason: "the drain of a cannot complete"}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"host", "moving", "guests", "paused", "status", "reason", "workflow_id", "moved", "failed"} {
		if _, ok := got[k]; !ok {
			t.Errorf("DrainState as JSON lacks %q: %s", k, b)
		}
	}
	var back api.DrainStatus
	if err := json.Unmarshal(b, &back); err != nil || back.Moving != 1 || len(back.Guests) != 1 || back.Guests[0].Error != st.Guests[0].Error {
		t.Errorf("DrainState %s read as a DrainStatus = %+v, %v", b, back, err)
	}
	if st.Running() || st.Completed() {
		t.Errorf("a failed drain's state says running %v, completed %v", st.Running(), st.Completed())
	}
}
