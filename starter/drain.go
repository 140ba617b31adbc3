package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/drain"
	"github.com/pinflow/pinflow/guest"
)

// errIncomplete: the plan leaves guests without a target, or claims
// block the drain; the plan was printed.
var errIncomplete = errors.New("the drain cannot complete")

func hostPlanDrainCommand() *cobra.Command {
	c := hostCommandOf("plan-drain NAME", "plan where each guest of a host would go; changes nothing",
		`Plan where every guest of a host would go, NUMA-cell exact, as 'pinflow host
drain' would, and report the guests that fit nowhere and the claims of
operations in flight that block the drain. It changes nothing, and exits 1
when the drain could not complete.`)
	policy := policyFlag(c.Flags())
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		if err := (api.DrainInput{Host: args[0], Policy: api.DrainPolicy(*policy)}).WithDefaults().Check(); err != nil {
			return fmt.Errorf("host plan-drain %s: %v: %w", args[0], err, errUsage)
		}
		return hostPlanDrain(args[0], api.DrainPolicy(*policy), asJSON, c.OutOrStdout())
	}
	return c
}

// policyFlag adds --policy, how a drain moves each guest.
func policyFlag(fs *pflag.FlagSet) *string {
	return fs.String("policy", string(api.DrainLive),
		"how each guest moves: live, cold or live-then-cold (live, then cold for a guest whose devices cannot be unplugged)")
}

func hostPlanDrain(host string, policy api.DrainPolicy, asJSON *bool, stdout io.Writer) error {
	return withApp(func(a *app) error {
		pf, err := a.ledgerClient()
		if err != nil {
			return err
		}
		plan, err := pf.PlanDrain(a.ctx, host, policy)
		if err != nil {
			return err
		}
		if *asJSON {
			if err := writeJSON(stdout, plan); err != nil {
				return err
			}
		} else {
			renderPlan(stdout, &plan)
		}
		if !plan.Complete() {
			return fmt.Errorf("host plan-drain %s: %w: %d fitting nowhere, %d not movable live, %s blocking it",
				host, errIncomplete, len(plan.Unplaceable), len(plan.NotLive), count(len(plan.Blocked), "claim", "claims"))
		}
		return nil
	})
}

// renderPlan prints a drain plan for people.
func renderPlan(w io.Writer, p *drain.Plan) {
	fmt.Fprintf(w, "drain of %s: %s to move, %d fitting nowhere, %d not movable live, %s blocking it\n",
		p.Source, count(len(p.Moves), "guest", "guests"), len(p.Unplaceable), len(p.NotLive), count(len(p.Blocked), "claim", "claims"))
	for _, m := range p.Moves {
		fmt.Fprintf(w, "  %s (%s) -> %s: %s\n", m.UUID, m.Name, m.Target, m.Placement.String())
	}
	for _, u := range p.Unplaceable {
		fmt.Fprintf(w, "  %s (%s) fits nowhere: %s\n", u.UUID, u.Name, u.Reason)
	}
	for _, n := range p.NotLive {
		fmt.Fprintf(w, "  %s (%s) cannot move live: %s\n", n.UUID, n.Name, n.Reason)
	}
	for _, b := range p.Blocked {
		fmt.Fprintf(w, "  %s (%s) blocks the drain: %s\n", b.UUID, b.Name, b.Reason)
	}
}

func hostDrainCommand() *cobra.Command {
	c := hostCommandOf("drain NAME", "empty a host: plan, disable it, reserve targets, move the guests",
		`Empty a host for maintenance. The drain first plans every guest onto the other
up hosts (NUMA-cell exact, hardest first) and refuses, changing nothing, when
a guest fits nowhere. Claims of operations still in flight on the host (a
migration onto it, a resize awaiting its confirmation) block the plan: the
drain plans again every 3 s until they end, and gives up, changing nothing,
when they still block it once --settle has passed. It then disables the host,
reserves each guest's planned placement, which boots started meanwhile
cannot take, and moves the guests as child workflows under their own
instance ids, at most --parallel at once and --per-target onto one host. A
failed move is planned again without the targets it failed on, up to
--attempts targets. The host stays disabled; 'pinflow host undrain' enables
it and moves the guests back.`)
	c.AddCommand(hostDrainControlCommand("pause", "stop starting new moves of a running drain"),
		hostDrainControlCommand("resume", "start new moves of a paused drain again"),
		hostDrainControlCommand("cancel", "cancel a drain: running moves roll back, reservations are freed"),
		hostDrainStatusCommand())
	fs := c.Flags()
	dryRun := fs.Bool("dry-run", false, "print the plan and change nothing (as host plan-drain)")
	policy := policyFlag(fs)
	parallel := fs.Int("parallel", api.DefaultDrainParallel, "moves running at once off the host")
	perTarget := fs.Int("per-target", api.DefaultDrainPerTarget, "moves running at once onto one target")
	attempts := fs.Int("attempts", api.DefaultDrainAttempts, "targets tried per guest before it is left on the host")
	reason := fs.String("reason", "", "why, for the host's record (one line)")
	settle := fs.Duration("settle", api.DefaultDrainSettle,
		"how long operations in flight on the host may block the plan before the drain gives up, changing nothing")
	of := addOpFlags(fs)
	c.RunE = func(c *cobra.Command, args []string) error {
		return hostDrain(args[0], api.DrainInput{Host: args[0], Reason: *reason, Policy: api.DrainPolicy(*policy),
			Parallel: *parallel, PerTarget: *perTarget, Attempts: *attempts, Settle: *settle}, *dryRun, of, c.OutOrStdout())
	}
	return c
}

func hostDrain(host string, in api.DrainInput, dryRun bool, of opFlags, stdout io.Writer) error {
	// Every limit comes from a flag: a zero is given, not left out.
	if err := in.Check(); err != nil {
		return fmt.Errorf("host drain %s: %v: %w", host, err, errUsage)
	}
	if dryRun {
		return hostPlanDrain(host, in.Policy, of.json, stdout)
	}
	return withClient(func(a *app, pf *client.Client) error {
		run, err := pf.Drain(a.ctx, in)
		if err != nil {
			return err
		}
		if !*of.wait {
			if *of.json {
				return writeJSON(stdout, map[string]string{"host": host, "workflow_id": run.WorkflowID, "run_id": run.RunID})
			}
			fmt.Fprintf(stdout, "drain of %s started: workflow %s run %s\n", host, run.WorkflowID, run.RunID)
			return nil
		}
		return followDrain(a, stdout, *of.json, run)
	})
}

// followDrain prints the drain's progress line whenever it changes, and
// each guest's step as it happens, then its result; guests left on the
// host make the exit non-zero.
func followDrain(a *app, stdout io.Writer, asJSON bool, run *client.DrainRun) error {
	host := run.Host
	var progress func(api.DrainStatus)
	if !asJSON {
		last, seen := "", map[string]string{}
		progress = func(st api.DrainStatus) {
			if line := drainLine(&st); line != last {
				fmt.Fprintln(os.Stderr, line)
				last = line
			}
			for i := range st.Guests {
				g := &st.Guests[i]
				if line := guestLine(host, g); seen[g.UUID] != line {
					fmt.Fprintln(os.Stderr, line)
					seen[g.UUID] = line
				}
			}
		}
	}
	res, err := run.Wait(a.ctx, progress)
	if err != nil {
		return err
	}
	if asJSON {
		if err := writeJSON(stdout, res); err != nil {
			return err
		}
	} else {
		for i := range res.Guests {
			fmt.Fprintln(stdout, guestLine(host, &res.Guests[i]))
		}
		fmt.Fprintf(stdout, "drain of %s: %s moved, %d left; the host stays disabled until 'pinflow host enable %s' (or 'pinflow host undrain %s', which also moves its guests back)\n",
			host, count(res.Moved, "guest", "guests"), res.Failed, host, host)
	}
	if res.Failed > 0 {
		return fmt.Errorf("host drain %s: %w: %s left on the host", host, errIncomplete, count(res.Failed, "guest", "guests"))
	}
	return nil
}

// drainLine is one line of a drain's progress.
func drainLine(st *api.DrainStatus) string {
	return "drain of " + st.Host + ": " + st.Summary()
}

// guestLine is one guest of a drain, as --wait and status print it.
func guestLine(host string, g *api.DrainGuest) string {
	line := fmt.Sprintf("  %s (%s) %s", g.UUID, g.Name, g.State)
	switch g.State {
	case api.GuestMoved:
		line += " to " + g.Target
	case api.GuestFailed:
		line += ", left on " + host
	default:
		if g.Target != "" {
			line += ", target " + g.Target
		}
	}
	if g.Attempts > 0 {
		line += fmt.Sprintf(", %d failed attempts", g.Attempts)
	}
	if g.Error != "" {
		line += ": " + g.Error
	}
	if g.Waiting != "" {
		line += "; waiting for " + g.Waiting
	}
	return line
}

func hostDrainControlCommand(verb, short string) *cobra.Command {
	c := hostCommandOf(verb+" NAME", short, "")
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		return hostDrainControl(verb, args[0], asJSON, c.OutOrStdout())
	}
	return c
}

func hostDrainStatusCommand() *cobra.Command {
	c := hostCommandOf("status NAME", "show a drain's progress guest by guest, or how the last one ended",
		`Show the host's drain guest by guest while it runs. Once it has ended, show
how: a completed drain's guests, each moved or left on the host with its
reason (exit 0); or the guests of a drain that failed or was cancelled as
they were when it ended, and why it ended (exit 1).`)
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error { return hostDrainStatus(args[0], asJSON, c.OutOrStdout()) }
	return c
}

// hostDrainControl pauses, resumes or cancels a running drain.
func hostDrainControl(verb, host string, asJSON *bool, stdout io.Writer) error {
	return withClient(func(a *app, pf *client.Client) error {
		control := pf.CancelDrain
		switch verb {
		case "pause":
			control = pf.PauseDrain
		case "resume":
			control = pf.ResumeDrain
		}
		st, err := control(a.ctx, host)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, st)
		}
		switch verb {
		case "cancel":
			fmt.Fprintf(stdout, "drain of %s cancelled: running moves roll back, reservations are released; the host stays disabled\n", host)
		case "pause":
			fmt.Fprintf(stdout, "drain of %s paused: running moves finish, no new one starts until 'pinflow host drain resume %s'\n", host, host)
		case "resume":
			fmt.Fprintf(stdout, "drain of %s resumed: new moves start again\n", host)
		}
		return nil
	})
}

// hostDrainStatus shows the host's last drain: guest by guest while it
// runs and once it completed (exit 0); why it failed or was cancelled
// otherwise (exit 1).
func hostDrainStatus(host string, asJSON *bool, stdout io.Writer) error {
	return withClient(func(a *app, pf *client.Client) error {
		st, err := pf.DrainStatus(a.ctx, host)
		if err != nil {
			return err
		}
		ended := fmt.Errorf("host drain status %s: the last drain of %s %s at %s: %s", host, host, endedHow(st.Status), st.Close.Local().Format(time.RFC3339), st.Reason)
		if *asJSON {
			if err := writeJSON(stdout, st); err != nil {
				return err
			}
		} else {
			switch {
			case st.Running():
				fmt.Fprintln(stdout, drainLine(&st.DrainStatus))
			case st.Completed():
				fmt.Fprintf(stdout, "drain of %s completed at %s: %d of %d guests moved, %d left on %s\n",
					host, st.Close.Local().Format(time.RFC3339), st.Moved, len(st.Guests), st.Failed, host)
			case len(st.Guests) > 0:
				fmt.Fprintf(stdout, "drain of %s %s at %s: %d of %d guests moved before it ended\n",
					host, endedHow(st.Status), st.Close.Local().Format(time.RFC3339), st.Moved, len(st.Guests))
			}
			for i := range st.Guests {
				fmt.Fprintln(stdout, guestLine(host, &st.Guests[i]))
			}
		}
		if !st.Running() && !st.Completed() {
			return ended
		}
		return nil
	})
}

// endedHow says how a run that did not complete ended, from its status.
func endedHow(status string) string {
	switch status {
	case "canceled":
		return "was cancelled"
	case "terminated":
		return "was terminated"
	case "timed_out":
		return "timed out"
	}
	return status
}

func hostUndrainCommand() *cobra.Command {
	c := hostCommandOf("undrain NAME", "enable a drained host and move its last drain's guests back",
		`Enable a host its last drain left disabled and live-migrate back, each under
its own instance workflow id, every guest that drain moved and that still
runs where the drain put it. A drain that failed or was cancelled counts
too: the guests it moved before it ended go back.`)
	of := addOpFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error { return hostUndrain(args[0], of, c.OutOrStdout()) }
	return c
}

// hostUndrain enables a drained host and live-migrates back, each under
// its own instance workflow id, every guest its last drain moved that is
// still where the drain put it.
func hostUndrain(host string, of opFlags, stdout io.Writer) error {
	return withClient(func(a *app, pf *client.Client) error {
		u, err := pf.Undrain(a.ctx, host)
		if err != nil {
			return err
		}
		if *of.wait {
			if err := u.Wait(a.ctx); err != nil {
				return err
			}
		}
		failed := u.Failed()
		if *of.json {
			if err := writeJSON(stdout, u.Moves); err != nil {
				return err
			}
		} else {
			for _, b := range u.Moves {
				switch {
				case b.Error != "":
					fmt.Fprintf(stdout, "%s: not moved back from %s: %s\n", b.UUID, b.From, b.Error)
				case b.Done:
					fmt.Fprintf(stdout, "%s: moved back from %s\n", b.UUID, b.From)
				default:
					fmt.Fprintf(stdout, "%s: moving back from %s (workflow %s)\n", b.UUID, b.From, guest.InstanceWorkflowID(b.UUID))
				}
			}
			fmt.Fprintf(stdout, "host %s is enabled; %d guests of its last drain moving back, %d failed\n", host, len(u.Moves), failed)
		}
		if failed > 0 {
			return fmt.Errorf("host undrain %s: %d of %d moves back failed", host, failed, len(u.Moves))
		}
		return nil
	})
}
