package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.temporal.io/api/serviceerror"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/workflows"
)

// confirmWindowFlag adds --confirm-window.
func confirmWindowFlag(fs *pflag.FlagSet) *time.Duration {
	return fs.Duration("confirm-window", workflows.DefaultConfirmWindow,
		"how long VERIFY_RESIZE waits for a confirm or revert before confirming by itself; 0 waits for an operator however long")
}

// windowInput turns the flag into the workflow's ConfirmWindow.
func windowInput(d time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("--confirm-window %s: allowed are 0 (no auto-confirm) or a positive duration: %w", d, errUsage)
	case d == 0:
		return -1, nil
	}
	return d, nil
}

func resizeCommand() *cobra.Command {
	c := guestCommand("resize UUID", "resize a guest to another flavor, then confirm or revert",
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
	c.RunE = guestOp(fs, workflows.OpResize, workflows.Resize,
		func(a *app, inst *ledger.Instance) (opPlan, error) {
			if err := activities.InfoOf(inst).CanResize(); err != nil {
				return opPlan{}, refused(err)
			}
			w, err := windowInput(*window)
			if err != nil {
				return opPlan{}, err
			}
			flavor := inst.Request
			if *vcpus != 0 {
				flavor.VCPUs = *vcpus
			}
			if *memory != 0 {
				flavor.MemoryMB = *memory
			}
			if len(specs) > 0 {
				flavor.ExtraSpecs = specs
			}
			if len(props) > 0 {
				flavor.ImageProps = props
			}
			if flavor.VCPUs == inst.Request.VCPUs && flavor.MemoryMB == inst.Request.MemoryMB &&
				maps.Equal(flavor.ExtraSpecs, inst.Request.ExtraSpecs) && maps.Equal(flavor.ImageProps, inst.Request.ImageProps) {
				return opPlan{}, fmt.Errorf("resize %s: that is its current flavor (%d vCPUs, %d MiB%s); give another --vcpus, --memory-mb, --spec or --image-prop",
					inst.UUID, inst.Request.VCPUs, inst.Request.MemoryMB, specList(inst.Request.ExtraSpecs, inst.Request.ImageProps))
			}
			if _, err := flavor.Request(); err != nil {
				return opPlan{}, fmt.Errorf("resize %s: %w", inst.UUID, err)
			}
			if *host != "" {
				if err := checkTarget(a, *host); err != nil {
					return opPlan{}, err
				}
			}
			summary := fmt.Sprintf("resize %s to %d vCPUs, %d MiB on %s", inst.Name, flavor.VCPUs, flavor.MemoryMB, orChosen(*host))
			in := workflows.ResizeInput{UUID: inst.UUID, Flavor: &flavor, Dest: *host, ConfirmWindow: w}
			return opPlan{input: in, summary: summary, source: inst.Host, dest: *host}, nil
		})
	return c
}

// coldMigrate plans `migrate --cold`: a resize to the guest's own flavor
// on another host.
func coldMigrate(a *app, inst *ledger.Instance, dest string, window time.Duration) (opPlan, error) {
	if err := activities.InfoOf(inst).CanResize(); err != nil {
		return opPlan{}, refused(err)
	}
	w, err := windowInput(window)
	if err != nil {
		return opPlan{}, err
	}
	if dest != "" {
		if err := checkTarget(a, dest); err != nil {
			return opPlan{}, err
		}
		if dest == inst.Host {
			return opPlan{}, fmt.Errorf("migrate %s: it already runs on %s; choose another --dest", inst.UUID, dest)
		}
	}
	summary := fmt.Sprintf("cold-migrate %s from %s to %s", inst.Name, inst.Host, orChosen(dest))
	in := workflows.ResizeInput{UUID: inst.UUID, Dest: dest, ConfirmWindow: w}
	return opPlan{input: in, summary: summary, source: inst.Host, dest: dest, op: workflows.OpColdMigration, wf: workflows.Resize}, nil
}

func resizeDecisionCommand(decision, short string) *cobra.Command {
	c := guestCommand(decision+" UUID", short, "")
	of := addOpFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		return resizeDecision(args[0], of, c.OutOrStdout(), decision)
	}
	return c
}

// resizeDecision confirms or reverts the resize waiting in VERIFY_RESIZE.
func resizeDecision(uuid string, of opFlags, stdout io.Writer, decision string) error {
	return withApp(func(a *app) error {
		inst, err := instance(a, uuid)
		if err != nil {
			return err
		}
		c, err := a.client()
		if err != nil {
			return err
		}
		id := guest.InstanceWorkflowID(uuid)
		h, err := update(a, c, id, workflows.ResizeDecisionUpdate, decision)
		var nf *serviceerror.NotFound
		switch {
		case errors.As(err, &nf):
			return fmt.Errorf("resize %s %s: it has no resize awaiting confirmation (vm_state %s, no operation running)", decision, uuid, inst.VMState)
		case err != nil:
			return fmt.Errorf("resize %s %s: %s", decision, uuid, rootMessage(err))
		}
		run := c.GetWorkflow(a.ctx, id, h.RunID())
		if !*of.wait {
			if *of.json {
				return writeJSON(stdout, map[string]string{"uuid": uuid, "workflow_id": id, "run_id": run.GetRunID(), "decision": decision})
			}
			fmt.Fprintf(stdout, "resize %s of %s accepted: workflow %s run %s\n", decision, uuid, id, run.GetRunID())
			return nil
		}
		return follow(a, c, stdout, of, run, uuid, workflows.OpResize)
	})
}

func evacuateCommand() *cobra.Command {
	c := guestCommand("evacuate UUID", "rebuild a guest of a fenced host on another host",
		`Rebuild a guest whose host an operator fenced ('pinflow host down --fence') on
another host, from its record's domain XML; its claim on the dead host
becomes a tombstone that 'pinflow host up' clears.`)
	dest := c.Flags().String("host", "", "host to rebuild on (default: pinflow chooses)")
	c.RunE = guestOp(c.Flags(), workflows.OpEvacuation, workflows.Evacuate,
		func(a *app, inst *ledger.Instance) (opPlan, error) {
			return evacuationPlan(a, inst, *dest)
		})
	return c
}

// evacuationPlan refuses an evacuation the guest's host state forbids.
func evacuationPlan(a *app, inst *ledger.Instance, dest string) (opPlan, error) {
	if err := activities.InfoOf(inst).CanEvacuate(); err != nil {
		return opPlan{}, refused(err)
	}
	led, err := a.ledger()
	if err != nil {
		return opPlan{}, err
	}
	st, err := led.HostStatus(a.ctx, inst.Host)
	if err != nil {
		return opPlan{}, err
	}
	if st.State != ledger.HostDown {
		return opPlan{}, fmt.Errorf("evacuate %s: its host %s is %s; pinflow evacuates only from a host fenced with 'pinflow host down %s --fence'",
			inst.UUID, inst.Host, st.State, inst.Host)
	}
	if dest != "" {
		if err := checkTarget(a, dest); err != nil {
			return opPlan{}, err
		}
		if dest == inst.Host {
			return opPlan{}, fmt.Errorf("evacuate %s: --host %s is the fenced host itself; choose another", inst.UUID, dest)
		}
	}
	summary := fmt.Sprintf("evacuate %s from %s to %s", inst.Name, inst.Host, orChosen(dest))
	return opPlan{input: workflows.EvacuateInput{UUID: inst.UUID, Dest: dest}, summary: summary, source: inst.Host, dest: dest}, nil
}
