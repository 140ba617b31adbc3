package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
)

// confirmWindowFlag adds --confirm-window: left out, the default window.
func confirmWindowFlag(fs *pflag.FlagSet) *confirmWindow {
	w := new(confirmWindow)
	fs.Var(w, "confirm-window", fmt.Sprintf("how long VERIFY_RESIZE waits for a confirm or revert before confirming by itself "+
		"(default %s); never waits for an operator however long", api.DefaultConfirmWindow))
	return w
}

// confirmWindow is client.MigrateRequest's ConfirmWindow as a flag: 0
// (the flag left out) is the default window, "never" is
// client.NoAutoConfirm. A typed 0 is refused: it once meant "never".
type confirmWindow time.Duration

func (w *confirmWindow) Type() string { return "DURATION|never" }

func (w *confirmWindow) String() string {
	switch d := time.Duration(*w); d {
	case 0:
		return ""
	case client.NoAutoConfirm:
		return "never"
	default:
		return d.String()
	}
}

func (w *confirmWindow) Set(s string) error {
	if s == "never" {
		*w = confirmWindow(client.NoAutoConfirm)
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return fmt.Errorf("allowed are a positive duration such as 90s or 2h, never for no automatic confirm, or the flag left out for %s", api.DefaultConfirmWindow)
	}
	*w = confirmWindow(d)
	return nil
}

// minMemoryMB is the least memory a guest boots or is resized to: QEMU's
// own default guest memory (-m 128M); firmware and a kernel fail to boot
// in much less, and a smaller value is more likely a unit mistake.
const minMemoryMB = 128

// checkFlavorFlags refuses a --vcpus or --memory-mb given but below the
// least a guest takes; left out, they are 0 and keep the guest's value.
func checkFlavorFlags(op string, fs *pflag.FlagSet, vcpus int, memory int64) error {
	if fs.Changed("vcpus") && vcpus < 1 {
		return fmt.Errorf("%s: --vcpus %d: allowed are whole numbers from 1, or the flag left out to keep the guest's: %w", op, vcpus, errUsage)
	}
	if fs.Changed("memory-mb") && memory < minMemoryMB {
		return fmt.Errorf("%s: --memory-mb %d: allowed are %d MiB (QEMU's default guest memory) or more: %w", op, memory, minMemoryMB, errUsage)
	}
	return nil
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
itself, and never waits for an operator however long. Cancelling it there
reverts.`)
	c.AddCommand(resizeDecisionCommand(api.DecisionConfirm, "keep a resized guest where it runs and free its source hold"),
		resizeDecisionCommand(api.DecisionRevert, "take a resized guest back to its source pCPUs"))
	fs := c.Flags()
	vcpus := fs.Int("vcpus", 0, "vCPUs (default: as now)")
	memory := fs.Int64("memory-mb", 0, "memory, MiB (default: as now)")
	specs, props := keyValues{}, keyValues{}
	fs.Var(specs, "spec", "the new flavor's extra spec KEY=VALUE (repeatable; given, they replace the guest's)")
	fs.Var(props, "image-prop", "an image property KEY=VALUE (repeatable; given, they replace the guest's)")
	host := fs.String("host", "", "destination host (default: pinflow chooses, the guest's own host included)")
	window := confirmWindowFlag(fs)
	c.PreRunE = func(c *cobra.Command, args []string) error {
		return checkFlavorFlags("resize "+args[0], c.Flags(), *vcpus, *memory)
	}
	c.RunE = guestOp(fs, func(a *app, pf *client.Client, ref string) (*client.Operation, error) {
		return pf.Resize(a.ctx, ref, client.ResizeRequest{VCPUs: *vcpus, MemoryMB: *memory, ExtraSpecs: specs, ImageProps: props, Host: *host,
			ConfirmWindow: time.Duration(*window)})
	})
	return c
}

func resizeDecisionCommand(decision, short string) *cobra.Command {
	c := guestCommand(decision+" GUEST", short, "")
	of := addOpFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		return withClient(func(a *app, pf *client.Client) error {
			decide := pf.ConfirmResize
			if decision == api.DecisionRevert {
				decide = pf.RevertResize
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
	c.RunE = guestOp(c.Flags(), func(a *app, pf *client.Client, ref string) (*client.Operation, error) {
		return pf.Evacuate(a.ctx, ref, *dest)
	})
	return c
}
