package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/config"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// stack is Redis, a Temporal dev server and a pinflow worker on simulated
// hosts, for a client to work against.
type stack struct {
	cfg *config.Config
	led *ledger.Ledger
}

// startStack starts a stack whose hosts each have 4 pinnable cores.
func startStack(t *testing.T, ctx context.Context, hosts ...string) *stack {
	t.Helper()
	rds := testenv.StartRedis(t)
	tmp := testenv.StartTemporal(t)
	for k, v := range map[string]string{
		"PINFLOW_REDIS_URL":           rds.URL(),
		"PINFLOW_TEMPORAL_ADDRESS":    tmp.Address,
		"PINFLOW_TEMPORAL_NAMESPACE":  tmp.Namespace,
		"PINFLOW_TEMPORAL_TASK_QUEUE": "errors",
		"PINFLOW_RECONCILE_SCHEDULE":  "off",
		"PINFLOW_DRIVER":              config.DriverSim,
	} {
		t.Setenv(k, v)
	}
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	led, rdb, err := cfg.Redis(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	drv, err := cfg.Simulator(rdb)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range hosts {
		host, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: 4, Threads: 1, MemoryMB: 8192})
		if err != nil {
			t.Fatal(err)
		}
		if err := drv.AddHost(ctx, name, host); err != nil {
			t.Fatal(err)
		}
		if _, err := led.RegisterHost(ctx, name, host); err != nil {
			t.Fatal(err)
		}
	}
	startWorker(t)
	waitSearchAttributes(t, ctx, tmp)
	return &stack{cfg: cfg, led: led}
}

// pinned is a flavor of n dedicated vCPUs.
func pinned(n int) guest.Flavor {
	return guest.Flavor{VCPUs: n, MemoryMB: 512, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
}

// TestErrors: each kind of refusal and failure, through the client against
// real servers, matches its error with errors.Is and errors.As, and a
// wait the caller's deadline cuts is that deadline, not a failure.
func TestErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis, Temporal and a worker")
	}
	// Generous: the worker is built with -race first.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s := startStack(t, ctx, "a", "b", "c")
	c, err := s.cfg.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := s.led.SetHostDown(ctx, "c", "psu"); err != nil {
		t.Fatal(err)
	}
	boot := func(t *testing.T, r client.BootRequest) *client.Outcome {
		t.Helper()
		op, err := c.Boot(ctx, r)
		if err != nil {
			t.Fatalf("Boot(%s): %v", r.Name, err)
		}
		out, err := op.Wait(ctx, nil)
		if err != nil {
			t.Fatalf("Boot(%s): Wait: %v", r.Name, err)
		}
		return out
	}

	t.Run("refusals", func(t *testing.T) {
		misspelt := pinned(1)
		misspelt.ExtraSpecs["hw:cpu_polcy"] = "dedicated"
		for _, tt := range []struct {
			name string
			do   func() error
			is   error
			says string
		}{
			{"misspelt spec", func() error {
				_, err := c.Boot(ctx, client.BootRequest{Name: "x", Flavor: misspelt})
				return err
			}, client.ErrInvalid, "hw:cpu_polcy"},
			{"unknown guest", func() error { _, err := c.Migrate(ctx, "nosuch", client.MigrateRequest{}); return err },
				client.ErrUnknownGuest, `"nosuch"`},
			{"unknown host", func() error {
				_, err := c.Boot(ctx, client.BootRequest{Name: "x", Flavor: pinned(1), Host: "nosuch"})
				return err
			}, client.ErrUnknownHost, `"nosuch"`},
			{"unknown group", func() error {
				_, err := c.Boot(ctx, client.BootRequest{Name: "x", Flavor: pinned(1), Group: "nosuch"})
				return err
			}, client.ErrUnknownGroup, `"nosuch"`},
			{"host down", func() error {
				_, err := c.Boot(ctx, client.BootRequest{Name: "x", Flavor: pinned(1), Host: "c"})
				return err
			}, client.ErrHostDown, "host c is down"},
		} {
			err := tt.do()
			if !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("%s: %v, want an error matching %q that names %s", tt.name, err, tt.is, tt.says)
			}
			if err != nil && strings.Contains(err.Error(), "pinflow ") {
				t.Errorf("%s: %q speaks of the CLI", tt.name, err)
			}
		}
	})

	t.Run("group rule", func(t *testing.T) {
		if err := c.CreateGroup(ctx, ledger.Group{Name: "quorum", Policy: ledger.PolicyAntiAffinity}); err != nil {
			t.Fatal(err)
		}
		boot(t, client.BootRequest{Name: "q1", Flavor: pinned(1), Group: "quorum", Host: "a"})
		// Refused before anything starts: the named host holds a member.
		_, err := c.Boot(ctx, client.BootRequest{Name: "q2", Flavor: pinned(1), Group: "quorum", Host: "a"})
		var rule *client.GroupRuleError
		if !errors.Is(err, client.ErrGroupRule) || !errors.As(err, &rule) || rule.Host != "a" {
			t.Errorf("Boot q2 on a beside q1: %v, want a *GroupRuleError on host a", err)
		}
		// Failed on the workers: no host up keeps the rule.
		boot(t, client.BootRequest{Name: "q2", Flavor: pinned(1), Group: "quorum", Host: "b"})
		op, err := c.Boot(ctx, client.BootRequest{Name: "q3", Flavor: pinned(1), Group: "quorum"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = op.Wait(ctx, nil)
		var failed *client.OperationError
		if !errors.Is(err, client.ErrGroupRule) || !errors.As(err, &failed) || failed.Operation != api.OpBoot {
			t.Errorf("Boot q3 with every up host holding a member: %v, want a boot failed on the group rule", err)
		}
	})

	t.Run("no host", func(t *testing.T) {
		op, err := c.Boot(ctx, client.BootRequest{Name: "huge", Flavor: pinned(8)})
		if err != nil {
			t.Fatal(err)
		}
		_, err = op.Wait(ctx, nil)
		var none *client.NoHostError
		if !errors.Is(err, client.ErrNoHost) || !errors.As(err, &none) {
			t.Fatalf("Boot of 8 pinned vCPUs on 4-core hosts: %v, want a *NoHostError", err)
		}
		got := map[string]string{}
		for _, h := range none.Hosts {
			got[h.Host] = h.Reason
		}
		for _, h := range []string{"a", "b", "c"} {
			if got[h] == "" {
				t.Errorf("NoHostError.Hosts = %+v, want a reason for host %s", none.Hosts, h)
			}
		}
	})

	t.Run("busy and a wait cut short", func(t *testing.T) {
		boot(t, client.BootRequest{Name: "web", Flavor: pinned(1), Host: "a"})
		// A cold migration holds the guest in VERIFY_RESIZE until it is
		// confirmed: a gate for both cases.
		op, err := c.Migrate(ctx, "web", client.MigrateRequest{Cold: true, Dest: "b", ConfirmWindow: client.NoAutoConfirm})
		if err != nil {
			t.Fatal(err)
		}
		if out, err := op.Wait(ctx, nil); err != nil || !out.AwaitingDecision() {
			t.Fatalf("cold migration: %+v, %v; want it awaiting a decision", out, err)
		}
		_, err = c.Delete(ctx, "web")
		var busy *client.BusyError
		if !errors.Is(err, client.ErrBusy) || !errors.As(err, &busy) || busy.UUID != op.UUID || busy.Operation != api.OpColdMigration {
			t.Errorf("Delete of a guest in VERIFY_RESIZE: %v, want a *BusyError naming its cold migration", err)
		}

		short, stop := context.WithTimeout(ctx, 2*time.Second)
		_, err = op.WaitEnd(short, nil)
		stop()
		var failed *client.OperationError
		if !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &failed) || !strings.Contains(err.Error(), "not waited out") {
			t.Fatalf("WaitEnd cut by its deadline: %v, want context.DeadlineExceeded, not waited out", err)
		}
		if _, err := c.ConfirmResize(ctx, "web"); err != nil {
			t.Fatal(err)
		}
		out, err := op.WaitEnd(ctx, nil)
		if err != nil || out.Host != "b" {
			t.Errorf("WaitEnd after the confirm: %+v, %v; want the guest on b", out, err)
		}
	})
}

// TestRootMessageOfFailure: the one line of an operation's failure is its reason,
// whether the error is the client's or Temporal's.
func TestRootMessageOfFailure(t *testing.T) {
	line := "prepare the destination b failed: injected fault"
	failed := temporal.NewApplicationErrorWithOptions(line, "OperationFailed", temporal.ApplicationErrorOptions{
		NonRetryable: true, Details: []any{api.Failure{Step: "prepare the destination b", Reason: "injected fault"}}})
	for _, err := range []error{failed, fmt.Errorf("evacuate: %w", client.RunFailedForTest(failed))} {
		if got := client.RootMessage(err); got != line {
			t.Errorf("RootMessage(%v) = %q, want %q", err, got, line)
		}
	}
}
