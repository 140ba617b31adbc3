package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/workflows"
)

// confirmWindowFlag adds --confirm-window.
func confirmWindowFlag(fs *pflag.FlagSet) *time.Duration {
	return fs.Duration("confirm-window", workflows.DefaultConfirmWindow,
		"how long VERIFY_RESIZE waits for a confirm or revert before confirming by itself; 0 waits for an operator however long")
}

// windowInput turns the flag into the client's ConfirmWindow.
func windowInput(d time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("--confirm-window %s: allowed are 0 (no auto-confirm) or a positive duration: %w", d, errUsage)
	case d == 0:
		return client.NoAutoConfirm, nil
	}
	return d, nil
}

func resizeCommand() *cobra.Command {
	c := guestCommand("resize GUEST", "resize a guest to another flavor, then confirm or revert",
		`Resize a guest to the flavor its flags give; a flag left out keeps the guest's
value, and --spec or --image-prop given replace all of its specs or
properties. The resize claims the new placement while the guest's own claim
becomes a source hold, moves the guest (onto the same host when it can hold
both), and waits in VERIFY_RESIZE with both placements held. 'pinflow resize
confirm UUID' then frees the hold; 'pinflow resize revert UUID' puts the guest
back on the same source pCPUs. The confirm window (--confirm-window, default
1h) bounds that wait: when it passes with no decision the resize confirms by
itself, and 0 waits for an operator however long. Cancelling it there
reverts.`)
	c.AddCommand(resizeDecisionCommand(workflows.DecisionConfirm, "keep a resized guest where it runs and free its source hold"),
		resizeDecisionCommand(workflows.DecisionRevert, "take a resized guest back to its source pCPUs"))
	fs := c.Flags()
	vcpus := fs.Int("vcpus", 0, "vCPUs (default: as now)")
	memory := fs.Int64("memory-mb", 0, "memory, MiB (default: as now)")
	specs, props := keyValues{}, keyValues{}
	fs.Var(specs, "spec", "the new flavor's extra spec KEY=VALUE (repeatable; given, they replace the guest's)")
	fs.Var(props, "image-prop", "an image property KEY=VALUE (repeatable; given, they replace the guest's)")
	host := fs.String("host", "", "destination host (default: pinflow chooses, the guest's own host included)")
	window := confirmWindowFlag(fs)
	c.RunE = guestOp(fs, func(a *app, api *client.Client, ref string) (*client.Operation, error) {
		w, err := windowInput(*window)
		if err != nil {
			return nil, err
		}
		if *vcpus < 0 || *memory < 0 {
			return nil, fmt.Errorf("resize %s: --vcpus %d --memory-mb %d: allowed are whole numbers from 1, or the flag left out to keep the guest's: %w", ref, *vcpus, *memory, errUsage)
		}
		return api.Resize(a.ctx, ref, client.ResizeRequest{VCPUs: *vcpus, MemoryMB: *memory, ExtraSpecs: specs, ImageProps: props, Host: *host, ConfirmWindow: w})
	})
	return c
}

func resizeDecisionCommand(decision, short string) *cobra.Command {
	c := guestCommand(decision+" GUEST", short, "")
	of := addOpFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		return withClient(func(a *app, api *client.Client) error {
			decide := api.ConfirmResize
			if decision == workflows.DecisionRevert {
				decide = api.RevertResize
			}
			op, err := decide(a.ctx, args[0])
			if err != nil {
				return err
			}
			if *of.wait {
				return followOp(a, c.OutOrStdout(), *of.json, op, op.Wait)
			}
			if *of.json {
				return writeJSON(c.OutOrStdout(), map[string]string{"uuid": op.UUID, "workflow_id": op.WorkflowID, "run_id": op.RunID, "decision": decision})
			}
			fmt.Fprintf(c.OutOrStdout(), "resize %s of %s accepted: workflow %s run %s\n", decision, op.UUID, op.WorkflowID, op.RunID)
			return nil
		})
	}
	return c
}

func evacuateCommand() *cobra.Command {
	c := guestCommand("evacuate GUEST", "rebuild a guest of a fenced host on another host",
		`Rebuild a guest whose host an operator fenced ('pinflow host down --fence') on
another host, from its record's domain XML; its claim on the dead host
becomes a tombstone that 'pinflow host up' clears.`)
	dest := c.Flags().String("host", "", "host to rebuild on (default: pinflow chooses)")
	c.RunE = guestOp(c.Flags(), func(a *app, api *client.Client, ref string) (*client.Operation, error) {
		return api.Evacuate(a.ctx, ref, *dest)
	})
	return c
}
