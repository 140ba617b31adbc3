package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/defrag"
	"github.com/pinflow/pinflow/guest"
)

// errNoRoom: the flavor does not fit the host even after the plan; the
// plan was printed.
var errNoRoom = errors.New("no defragmentation makes room for the flavor")

func hostPlanDefragCommand() *cobra.Command {
	c := hostCommandOf("plan-defrag NAME", "plan the re-pins that free whole cores of a host; changes nothing",
		`Plan the defragmentation of a host. With a flavor (--vcpus, --memory-mb,
--spec and --image-prop, as boot takes them) it finds the fewest re-pins of
running guests after which the flavor fits on the host, and, only where no
re-pin can make the room, the live migrations of the fewest guests to other
hosts first. Without a flavor it finds the re-pins that leave the most whole
cores free. A re-pin keeps each guest cell on its host cell, with its memory
and pages; guests of thread policy isolate hold whole cores wherever they are
and stay. Each re-pin is printed as the 'pinflow repin --pcpus' that makes it.
It changes nothing, and exits 1 when the flavor does not fit even after the
plan.`)
	flavor := flavorFlags(c.Flags())
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		f, err := flavor.parse("host plan-defrag "+args[0], c.Flags())
		if err != nil {
			return err
		}
		return hostPlanDefrag(args[0], f, asJSON, c.OutOrStdout())
	}
	return c
}

// flavorFlag holds the flags of a flavor a command may be given.
type flavorFlag struct {
	vcpus         *int
	memory        *int64
	specs, images keyValues
}

// flavorFlags adds the flavor flags boot takes, all optional.
func flavorFlags(fs *pflag.FlagSet) *flavorFlag {
	f := &flavorFlag{vcpus: fs.Int("vcpus", 0, "the flavor's vCPUs (default: no flavor)"),
		memory: fs.Int64("memory-mb", 0, "the flavor's memory, MiB"), specs: keyValues{}, images: keyValues{}}
	fs.Var(f.specs, "spec", "a flavor extra spec (repeatable), e.g. hw:cpu_policy=dedicated")
	fs.Var(f.images, "image-prop", "an image property (repeatable)")
	return f
}

// parse is the flavor the flags give, nil when none is; one line naming
// a bad value.
func (f *flavorFlag) parse(op string, fs *pflag.FlagSet) (*guest.Flavor, error) {
	if !fs.Changed("vcpus") {
		for _, name := range []string{"memory-mb", "spec", "image-prop"} {
			if fs.Changed(name) {
				return nil, fmt.Errorf("%s: --%s without --vcpus: a flavor needs --vcpus and --memory-mb: %w", op, name, errUsage)
			}
		}
		return nil, nil
	}
	if !fs.Changed("memory-mb") {
		return nil, fmt.Errorf("%s: --vcpus %d without --memory-mb: a flavor needs both: %w", op, *f.vcpus, errUsage)
	}
	if err := checkFlavorFlags(op, fs, *f.vcpus, *f.memory); err != nil {
		return nil, err
	}
	flavor := &guest.Flavor{VCPUs: *f.vcpus, MemoryMB: *f.memory, ExtraSpecs: f.specs, ImageProps: f.images}
	if _, err := flavor.Request(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return flavor, nil
}

// renderDefrag prints a defragmentation plan for people.
func renderDefrag(w io.Writer, p *defrag.Plan) {
	goal := "whole cores"
	if p.For != "" {
		goal = p.For
	}
	fmt.Fprintf(w, "defrag of %s for %s: %s, %s\n", p.Host, goal,
		count(len(p.Repins), "re-pin", "re-pins"), count(len(p.Migrations), "migration", "migrations"))
	for i, b := range p.Before {
		a := p.After[i]
		fmt.Fprintf(w, "  cell %d: %d of %d cores free, %d pCPUs -> %d cores free, %d pCPUs\n", b.Cell, b.FreeCores, b.Cores, b.FreePCPUs, a.FreeCores, a.FreePCPUs)
	}
	for _, m := range p.Migrations {
		fmt.Fprintf(w, "  migrate %s (%s) -> %s: %s\n", m.UUID, m.Name, m.Target, m.Placement.String())
	}
	for _, r := range p.Repins {
		fmt.Fprintf(w, "  re-pin %s (%s) from %s: pinflow repin %s --pcpus %s\n", r.UUID, r.Name, r.From, r.UUID, r.To)
	}
	for _, u := range p.Unplaceable {
		fmt.Fprintf(w, "  %s (%s) must migrate and fits nowhere: %s\n", u.UUID, u.Name, u.Reason)
	}
	switch {
	case p.For == "":
	case p.Fits:
		fmt.Fprintf(w, "  then it fits: %s\n", p.Placement.String())
	default:
		fmt.Fprintf(w, "  it does not fit: %s\n", p.Reason)
	}
}

func hostDefragCommand() *cobra.Command {
	c := hostCommandOf("defrag NAME", "re-pin a host's guests in place so a flavor fits or whole cores are free",
		`Defragment a host: carry out the plan 'pinflow host plan-defrag' prints, as
workflow defrag-NAME. Its live migrations run first, as a drain's moves do:
each target reserved, at most --parallel at once, a failed one planned again
elsewhere. Then its re-pins run one after another, each as the guest's own
'pinflow repin' workflow. A flavor the plan makes no room for is refused,
changing nothing. A failed step leaves the steps after it untried. The host
stays up: a boot that takes the pCPUs of a re-pin meanwhile makes it fail.`)
	c.AddCommand(hostDefragControlCommand("pause", "hold the next step of a running defrag"),
		hostDefragControlCommand("resume", "let a paused defrag go on"),
		hostDefragControlCommand("cancel", "cancel a defrag: its running step rolls back or ends what it began"),
		hostDefragStatusCommand())
	fs := c.Flags()
	flavor := flavorFlags(fs)
	parallel := fs.Int("parallel", api.DefaultDrainParallel, "migrations running at once off the host")
	dryRun := fs.Bool("dry-run", false, "print the plan and change nothing (as host plan-defrag)")
	of := addOpFlags(fs)
	c.RunE = func(c *cobra.Command, args []string) error {
		host := args[0]
		f, err := flavor.parse("host defrag "+host, c.Flags())
		if err != nil {
			return err
		}
		in := api.DefragInput{Host: host, Flavor: f, Parallel: *parallel}
		if err := in.Check(); err != nil {
			return fmt.Errorf("host defrag %s: %v: %w", host, err, errUsage)
		}
		if *dryRun {
			return hostPlanDefrag(host, f, of.json, c.OutOrStdout())
		}
		return withClient(func(a *app, pf *client.Client) error {
			run, err := pf.Defrag(a.ctx, in)
			if err != nil {
				return err
			}
			if !*of.wait {
				if *of.json {
					return writeJSON(c.OutOrStdout(), map[string]string{"host": host, "workflow_id": run.WorkflowID, "run_id": run.RunID})
				}
				fmt.Fprintf(c.OutOrStdout(), "defrag of %s started: workflow %s run %s\n", host, run.WorkflowID, run.RunID)
				return nil
			}
			return followDefrag(a, c.OutOrStdout(), *of.json, run)
		})
	}
	return c
}

// followDefrag prints the defrag's progress whenever it changes, then
// each step's end; a step that failed makes the exit non-zero.
func followDefrag(a *app, stdout io.Writer, asJSON bool, run *client.DefragRun) error {
	var progress func(api.DefragStatus)
	if !asJSON {
		last := ""
		progress = func(st api.DefragStatus) {
			if line := "defrag of " + st.Host + ": " + st.Summary(); line != last {
				fmt.Fprintln(os.Stderr, line)
				last = line
			}
		}
	}
	res, err := run.Wait(a.ctx, progress)
	if err != nil {
		return err
	}
	if asJSON {
		err = writeJSON(stdout, res)
	} else {
		renderDefragSteps(stdout, &res.DefragStatus)
		fmt.Fprintf(stdout, "defrag of %s: %s\n", run.Host, res.Summary())
	}
	if err == nil && res.Failed > 0 {
		err = fmt.Errorf("host defrag %s: %w: %s failed or not tried", run.Host, errIncomplete, count(res.Failed, "step", "steps"))
	}
	return err
}

// renderDefragSteps prints each step of a defrag and where it stands.
func renderDefragSteps(w io.Writer, st *api.DefragStatus) {
	for i := range st.Migrations {
		fmt.Fprintln(w, guestLine(st.Host, &st.Migrations[i]))
	}
	for _, r := range st.Repins {
		line := fmt.Sprintf("  %s (%s) re-pin %s -> %s: %s", r.UUID, r.Name, r.From, r.To, r.State)
		if r.Error != "" {
			line += ": " + r.Error
		}
		fmt.Fprintln(w, line)
	}
}

func hostDefragControlCommand(verb, short string) *cobra.Command {
	c := hostCommandOf(verb+" NAME", short, "")
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		return withClient(func(a *app, pf *client.Client) error {
			st, err := pf.ControlDefrag(a.ctx, args[0], verb)
			if err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(c.OutOrStdout(), st)
			}
			fmt.Fprintf(c.OutOrStdout(), "defrag of %s: %s\n", args[0], st.Summary())
			return nil
		})
	}
	return c
}

func hostDefragStatusCommand() *cobra.Command {
	c := hostCommandOf("status NAME", "show a defrag's steps while it runs, or how the last one ended",
		`Show the host's defrag step by step while it runs, or, once it has ended,
each step's end (exit 1 when one failed, or the defrag failed or was
cancelled, with why).`)
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		return withClient(func(a *app, pf *client.Client) error {
			run, err := pf.FollowDefrag(a.ctx, args[0])
			if err != nil {
				return err
			}
			if st, err := run.Status(a.ctx); err == nil && !st.Done {
				if *asJSON {
					return writeJSON(c.OutOrStdout(), st)
				}
				fmt.Fprintf(c.OutOrStdout(), "defrag of %s: %s\n", args[0], st.Summary())
				renderDefragSteps(c.OutOrStdout(), &st)
				return nil
			}
			return followDefrag(a, c.OutOrStdout(), *asJSON, run)
		})
	}
	return c
}

// hostPlanDefrag prints the host's defrag plan for f (nil for whole
// cores); a flavor it makes no room for exits 1.
func hostPlanDefrag(host string, f *guest.Flavor, asJSON *bool, stdout io.Writer) error {
	return withApp(func(a *app) error {
		pf, err := a.ledgerClient()
		if err != nil {
			return err
		}
		plan, err := pf.PlanDefrag(a.ctx, host, f)
		if err != nil {
			return err
		}
		if *asJSON {
			err = writeJSON(stdout, plan)
		} else {
			renderDefrag(stdout, &plan)
		}
		if err == nil && f != nil && !plan.Fits {
			err = fmt.Errorf("host plan-defrag %s: %w: %s", host, errNoRoom, plan.Reason)
		}
		return err
	})
}
