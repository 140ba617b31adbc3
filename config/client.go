package config

import (
	"context"

	tclient "go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/client"
)

// Client opens the ledger and Temporal that c names, binds the ledger to
// the namespace (a ledger that serves another namespace, or the same name
// on another cluster, is refused before anything starts), and makes a
// client of pinflow's API on them with the configured PCI aliases; its
// Close closes both. extra options go to the Temporal client.
func (c *Config) Client(ctx context.Context, extra ...func(*tclient.Options)) (*client.Client, error) {
	led, rdb, err := c.Redis(ctx)
	if err != nil {
		return nil, err
	}
	tc, err := c.Dial(ctx, nil, extra...)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	if err := c.BindCluster(ctx, led, tc); err != nil {
		tc.Close()
		_ = rdb.Close()
		return nil, err
	}
	api := client.New(led, tc, c.TaskQueue)
	api.CloseWith(tc.Close, func() { _ = rdb.Close() })
	// Load refused aliases that do not parse.
	aliases, _ := c.PCIAliases()
	api.SetPCIAliases(aliases)
	return api, nil
}
