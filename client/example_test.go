package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"

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

