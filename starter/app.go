package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	tclient "go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/config"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/telemetry"
)

// app holds the connections a command needs, opened on first use from the
// PINFLOW_* environment, so that offline commands need none.
type app struct {
	ctx      context.Context
	cfg      *config.Config
	led      *ledger.Ledger
	rdb      redis.UniversalClient
	temporal tclient.Client
	tel      *telemetry.Telemetry
	span     trace.Span
}

// newApp reads the configuration; connections open when asked for.
func newApp(ctx context.Context) (*app, error) {
	cfg, err := config.Load()
	if err != nil {
		return nil, err
	}
	return &app{ctx: ctx, cfg: cfg}, nil
}

// outageWait is how long a command waits out a Redis that restarts or
// fails over before it says so: longer than a restart, short enough for
// an operator to wait.
const outageWait = 30 * time.Second

func (a *app) ledger() (*ledger.Ledger, error) {
	if a.led == nil {
		a.cfg.OutageWait = outageWait
		led, rdb, err := a.cfg.Redis(a.ctx)
		if err != nil {
			return nil, err
		}
		// Completion reads the ledger without starting telemetry.
		if a.tel != nil {
			if err := a.tel.InstrumentRedis(rdb); err != nil {
				_ = rdb.Close()
				return nil, err
			}
		}
		a.led, a.rdb = led, rdb
	}
	return a.led, nil
}

// client connects to Temporal once the ledger is open, and binds the
// ledger to the namespace's id there: a ledger that serves another
// namespace, or the same name on another cluster, is refused before any
// workflow starts.
func (a *app) client() (tclient.Client, error) {
	if a.temporal == nil {
		led, err := a.ledger()
		if err != nil {
			return nil, err
		}
		c, err := a.cfg.Dial(a.ctx, nil, config.WithTelemetry(a.tel))
		if err != nil {
			return nil, err
		}
		if err := a.cfg.BindCluster(a.ctx, led, c); err != nil {
			c.Close()
			return nil, err
		}
		a.temporal = c
	}
	return a.temporal, nil
}

// api is the client of pinflow's API on the app's connections.
func (a *app) api() (*client.Client, error) {
	c, err := a.client()
	if err != nil {
		return nil, err
	}
	pf := a.newClient(a.led, c)
	pf.Notify = func(note string) { fmt.Fprintln(os.Stderr, "pinflow: note: "+note) }
	return pf, nil
}

// newClient is an API client of the ledger and the Temporal client tc (nil
// for commands that need no Temporal), with the configured PCI aliases.
func (a *app) newClient(led *ledger.Ledger, tc tclient.Client) *client.Client {
	pf := client.New(led, tc, a.cfg.TaskQueue)
	// config.Load refused aliases that do not parse.
	aliases, _ := a.cfg.PCIAliases()
	pf.SetPCIAliases(aliases)
	return pf
}

// ledgerClient is a client that answers from the ledger alone, for
// commands that need no Temporal.
func (a *app) ledgerClient() (*client.Client, error) {
	led, err := a.ledger()
	if err != nil {
		return nil, err
	}
	return a.newClient(led, nil), nil
}

func (a *app) close() {
	if a.temporal != nil {
		a.temporal.Close()
	}
	if a.rdb != nil {
		a.rdb.Close()
	}
}

// withApp runs f with an app and closes it afterwards.
func withApp(f func(a *app) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 24*time.Hour)
	defer cancel()
	a, err := newApp(ctx)
	if err != nil {
		return err
	}
	defer a.close()
	if err := a.startTelemetry(); err != nil {
		return err
	}
	err = f(a)
	a.endTelemetry(err)
	return err
}

// withClient runs f with an app and its API client.
func withClient(f func(a *app, pf *client.Client) error) error {
	return withApp(func(a *app) error {
		pf, err := a.api()
		if err != nil {
			return err
		}
		return f(a, pf)
	})
}

// keyValues parses repeated KEY=VALUE flags.
type keyValues map[string]string

func (kv keyValues) String() string {
	if len(kv) == 0 {
		return "" // no "(default map[])" in the help
	}
	return fmt.Sprint(map[string]string(kv))
}

func (kv keyValues) Type() string { return "KEY=VALUE" }

func (kv keyValues) Set(s string) error {
	for i := 0; i < len(s); i++ {
		if s[i] == '=' {
			if i == 0 {
				break
			}
			// A key given twice would silently keep the last value.
			if v, ok := kv[s[:i]]; ok {
				return fmt.Errorf("%s given twice (as %s=%s too); a key takes one value", s[:i], s[:i], v)
			}
			kv[s[:i]] = s[i+1:]
			return nil
		}
	}
	return fmt.Errorf("%q is not KEY=VALUE", s)
}
