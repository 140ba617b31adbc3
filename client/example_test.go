package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/config"
	"github.com/pinflow/pinflow/guest"
)

// bootAndMigrate is a control plane's use of pinflow: it boots a pinned
// guest, live-migrates it to a host pinflow chooses, and says where the
// guest runs.
func bootAndMigrate(ctx context.Context, cfg *config.Config, out io.Writer) error {
	c, err := cfg.Client(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	flavor := guest.Flavor{VCPUs: 2, MemoryMB: 1024, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
	op, err := c.Boot(ctx, client.BootRequest{Name: "web-1", Flavor: flavor})
	if err != nil {
		return err
	}
	booted, err := op.Wait(ctx, nil)
	if err != nil {
		return err
	}
	if op, err = c.Migrate(ctx, "web-1", client.MigrateRequest{}); err != nil {
		return err
	}
	moved, err := op.Wait(ctx, func(p client.Progress) { fmt.Fprintln(os.Stderr, p.Phase) })
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "web-1 booted on %s, now runs on %s pinned to %d pCPUs\n", booted.Host, moved.Host, client.PinnedPCPUs(moved.Placement).Len())
	return nil
}

func Example() {
	cfg, err := config.Load() // the PINFLOW_* variables
	if err != nil {
		log.Fatal(err)
	}
	if err := bootAndMigrate(context.Background(), cfg, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// dial connects as the PINFLOW_* variables say.
func dial(ctx context.Context) *client.Client {
	cfg, err := config.Load()
	if err != nil {
		log.Fatal(err)
	}
	c, err := cfg.Client(ctx)
	if err != nil {
		log.Fatal(err)
	}
	return c
}

// Boot a guest of two dedicated vCPUs in an anti-affinity group, and tell
// the refusals a control plane handles apart.
func ExampleClient_Boot() {
	ctx := context.Background()
	c := dial(ctx)
	defer c.Close()
	flavor := guest.Flavor{VCPUs: 2, MemoryMB: 2048, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
	op, err := c.Boot(ctx, client.BootRequest{Name: "db-1", Flavor: flavor, Group: "db"})
	if err != nil {
		log.Fatal(err) // ErrInvalid, ErrUnknownGroup, ErrGroupRule...
	}
	out, err := op.Wait(ctx, nil)
	var none *client.NoHostError
	switch {
	case errors.As(err, &none):
		for _, h := range none.Hosts {
			fmt.Printf("%s: %s\n", h.Host, h.Reason)
		}
		return
	case err != nil:
		log.Fatal(err)
	}
	fmt.Printf("%s runs on %s, pCPUs %s\n", out.UUID, out.Host, out.PCPUs)
}

// Live-migrate a guest to a host pinflow chooses, printing its progress,
// and retry later when another operation holds it.
func ExampleClient_Migrate() {
	ctx := context.Background()
	c := dial(ctx)
	defer c.Close()
	op, err := c.Migrate(ctx, "db-1", client.MigrateRequest{})
	var busy *client.BusyError
	if errors.As(err, &busy) {
		fmt.Printf("busy with a %s (workflow %s); later\n", busy.Operation, busy.WorkflowID)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	out, err := op.Wait(ctx, func(p client.Progress) {
		if p.Migrated >= 0 {
			fmt.Printf("%s: %d%% copied\n", p.Phase, p.Migrated)
		}
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("now on %s\n", out.Host)
}

// Drain a host for maintenance and say which guests stayed.
func ExampleClient_Drain() {
	ctx := context.Background()
	c := dial(ctx)
	defer c.Close()
	run, err := c.Drain(ctx, api.DrainInput{Host: "h1", Reason: "firmware"})
	if err != nil {
		log.Fatal(err)
	}
	res, err := run.Wait(ctx, func(st api.DrainStatus) { fmt.Printf("%d moving\n", st.Moving) })
	if err != nil {
		log.Fatal(err)
	}
	for _, g := range res.Guests {
		if g.State == api.GuestFailed {
			fmt.Printf("%s stays: %s\n", g.UUID, g.Error)
		}
	}
}

// Follow the operation running on a guest for at most a minute: when the
// minute ends first, the operation goes on, and a later Follow finds it.
func ExampleClient_Follow() {
	ctx := context.Background()
	c := dial(ctx)
	defer c.Close()
	op, err := c.Follow(ctx, "db-1")
	if err != nil {
		log.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := op.WaitEnd(wctx, nil)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Printf("%s still running; follow it again later\n", op.Kind)
	case errors.Is(err, client.ErrHostDown):
		fmt.Println("its host went down:", err)
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Printf("%s ended; the guest is on %s\n", op.Kind, out.Host)
	}
}

// List the last ten operations on a guest, newest first.
func ExampleClient_History() {
	ctx := context.Background()
	c := dial(ctx)
	defer c.Close()
	runs, err := c.History(ctx, client.HistoryFilter{UUID: "db-1", Limit: 10})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range runs {
		fmt.Printf("%s %s %s %s\n", r.Start.Format(time.RFC3339), r.Operation, r.Status, r.Reason)
	}
}
