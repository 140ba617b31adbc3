package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	tclient "go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/drain"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/workflows"
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
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error { return hostPlanDrain(args[0], asJSON, c.OutOrStdout()) }
	return c
}

func hostPlanDrain(host string, asJSON *bool, stdout io.Writer) error {
	return withApp(func(a *app) error {
		led, _, err := hostStatus(a, host)
		if err != nil {
			return err
		}
		plan, err := (&activities.Activities{Ledger: led}).PlanDrain(a.ctx, activities.PlanDrainInput{Host: host})
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
			return fmt.Errorf("host plan-drain %s: %w: %d guests fit nowhere, %d claims block it", host, errIncomplete, len(plan.Unplaceable), len(plan.Blocked))
		}
		return nil
	})
}

// renderPlan prints a drain plan for people.
func renderPlan(w io.Writer, p *drain.Plan) {
	fmt.Fprintf(w, "drain of %s: %d guests move, %d fit nowhere, %d claims block it\n", p.Source, len(p.Moves), len(p.Unplaceable), len(p.Blocked))
	for _, m := range p.Moves {
		fmt.Fprintf(w, "  %s (%s) -> %s: %s\n", m.UUID, m.Name, m.Target, m.Placement.String())
	}
	for _, u := range p.Unplaceable {
		fmt.Fprintf(w, "  %s (%s) fits nowhere: %s\n", u.UUID, u.Name, u.Reason)
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
		hostDrainControlCommand("status", "show a running drain's progress, guest by guest"))
	fs := c.Flags()
	dryRun := fs.Bool("dry-run", false, "print the plan and change nothing (as host plan-drain)")
	policy := fs.String("policy", string(workflows.DrainLive), "how each guest moves: live, cold or live-then-cold")
	parallel := fs.Int("parallel", workflows.DefaultDrainParallel, "moves running at once off the host")
	perTarget := fs.Int("per-target", workflows.DefaultDrainPerTarget, "moves running at once onto one target")
	attempts := fs.Int("attempts", workflows.DefaultDrainAttempts, "targets tried per guest before it is left on the host")
	reason := fs.String("reason", "", "why, for the host's record (one line)")
	settle := fs.Duration("settle", workflows.DefaultDrainSettle,
		"how long operations in flight on the host may block the plan before the drain gives up, changing nothing")
	of := addOpFlags(fs)
	c.RunE = func(c *cobra.Command, args []string) error {
		return hostDrain(args[0], workflows.DrainInput{Host: args[0], Reason: *reason, Policy: workflows.DrainPolicy(*policy),
			Parallel: *parallel, PerTarget: *perTarget, Attempts: *attempts, Settle: *settle}, *dryRun, of, c.OutOrStdout())
	}
	return c
}

func hostDrain(host string, in workflows.DrainInput, dryRun bool, of opFlags, stdout io.Writer) error {
	if err := in.Check(); err != nil {
		return fmt.Errorf("host drain %s: %v: %w", host, err, errUsage)
	}
	if dryRun {
		return hostPlanDrain(host, of.json, stdout)
	}
	return withApp(func(a *app) error {
		_, st, err := hostStatus(a, host)
		if err != nil {
			return err
		}
		if st.State != ledger.HostUp && st.State != ledger.HostDisabled {
			return fmt.Errorf("host drain %s: the host is %s; a drain moves guests off a running host (evacuate a fenced one)", host, st.State)
		}
		c, err := a.client()
		if err != nil {
			return err
		}
		id := workflows.DrainWorkflowID(host)
		run, err := startWorkflow(a, c, id, "", opPlan{op: workflows.OpDrain, wf: workflows.Drain, input: in, summary: "drain host " + host, source: host}, "")
		switch {
		case alreadyRunning(err):
			return fmt.Errorf("host drain %s: the host is being drained already (workflow %s); 'pinflow host drain status %s' follows it", host, id, host)
		case err != nil:
			return fmt.Errorf("host drain %s: %w", host, err)
		}
		if !*of.wait {
			return hostOpStarted(stdout, *of.json, host, "drain of "+host, run)
		}
		return followDrain(a, c, stdout, *of.json, run, host)
	})
}

// followDrain prints the drain's progress line whenever it changes, then
// its result; guests left on the host make the exit non-zero.
func followDrain(a *app, c tclient.Client, stdout io.Writer, asJSON bool, run tclient.WorkflowRun, host string) error {
	done := make(chan error, 1)
	var res workflows.DrainResult
	go func() { done <- run.Get(a.ctx, &res) }()
	last, seen := "", map[string]string{}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("host drain %s failed: %s", host, client.RootMessage(err))
			}
			if asJSON {
				if err := writeJSON(stdout, res); err != nil {
					return err
				}
			} else {
				for i := range res.Guests {
					fmt.Fprintln(stdout, guestLine(host, &res.Guests[i]))
				}
				fmt.Fprintf(stdout, "drain of %s: %d guests moved, %d left; the host stays disabled until 'pinflow host enable %s'\n", host, res.Moved, res.Failed, host)
			}
			if res.Failed > 0 {
				return fmt.Errorf("host drain %s: %w: %d guests left on the host", host, errIncomplete, res.Failed)
			}
			return nil
		case <-tick.C:
			if asJSON {
				continue
			}
			st, err := drainStatus(a, c, host)
			if err != nil {
				continue
			}
			if line := drainLine(&st); line != last {
				fmt.Fprintln(os.Stderr, line)
				last = line
			}
			// Each guest's step as it happens.
			for i := range st.Guests {
				g := &st.Guests[i]
				if line := guestLine(host, g); seen[g.UUID] != line {
					fmt.Fprintln(os.Stderr, line)
					seen[g.UUID] = line
				}
			}
		}
	}
}

func drainStatus(a *app, c tclient.Client, host string) (workflows.DrainStatus, error) {
	var st workflows.DrainStatus
	v, err := c.QueryWorkflow(a.ctx, workflows.DrainWorkflowID(host), "", workflows.DrainStatusQuery)
	if err != nil {
		return st, err
	}
	return st, v.Get(&st)
}

// drainLine is one line of a drain's progress.
func drainLine(st *workflows.DrainStatus) string {
	return "drain of " + st.Host + ": " + st.Summary()
}

// guestLine is one guest of a drain, as --wait and status print it.
func guestLine(host string, g *workflows.DrainGuest) string {
	line := fmt.Sprintf("  %s (%s) %s", g.UUID, g.Name, g.State)
	switch g.State {
	case workflows.GuestMoved:
		line += " to " + g.Target
	case workflows.GuestFailed:
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

// hostDrainControl pauses, resumes, cancels or shows a running drain.
func hostDrainControl(verb, host string, asJSON *bool, stdout io.Writer) error {
	return withApp(func(a *app) error {
		if err := checkHost(a, host); err != nil {
			return err
		}
		c, err := a.client()
		if err != nil {
			return err
		}
		id := workflows.DrainWorkflowID(host)
		d, err := c.DescribeWorkflow(a.ctx, id, "")
		var nf *serviceerror.NotFound
		if errors.As(err, &nf) || err == nil && d.Status != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			return fmt.Errorf("host drain %s %s: no drain of %s is running", verb, host, host)
		}
		if err != nil {
			return fmt.Errorf("host drain %s %s: %w", verb, host, err)
		}
		st, err := drainStatus(a, c, host)
		if err != nil {
			return fmt.Errorf("host drain %s %s: %w", verb, host, err)
		}
		switch verb {
		case "pause", "resume":
			name := workflows.DrainPauseUpdate
			if verb == "resume" {
				name = workflows.DrainResumeUpdate
			}
			_, err = update(a, c, id, name)
			switch {
			case errors.As(err, &nf):
				return fmt.Errorf("host drain %s %s: no drain of %s is running", verb, host, host)
			case err != nil:
				return fmt.Errorf("host drain %s %s: %s", verb, host, client.RootMessage(err))
			}
			// The drain took it: its status says so now.
			if after, err := drainStatus(a, c, host); err == nil {
				st = after
			}
		case "cancel":
			if err := c.CancelWorkflow(a.ctx, id, ""); err != nil {
				return fmt.Errorf("host drain %s %s: %w", verb, host, err)
			}
		}
		if *asJSON {
			return writeJSON(stdout, st)
		}
		switch verb {
		case "status":
			fmt.Fprintln(stdout, drainLine(&st))
			for i := range st.Guests {
				fmt.Fprintln(stdout, guestLine(host, &st.Guests[i]))
			}
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

func hostUndrainCommand() *cobra.Command {
	c := hostCommandOf("undrain NAME", "enable a drained host and move its last drain's guests back",
		`Enable a host its last drain left disabled and live-migrate back, each under
its own instance workflow id, every guest that drain moved and that still
runs where the drain put it.`)
	of := addOpFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error { return hostUndrain(args[0], of, c.OutOrStdout()) }
	return c
}

// hostUndrain enables a drained host and live-migrates back, each under
// its own instance workflow id, every guest its last drain moved that is
// still where the drain put it.
func hostUndrain(host string, of opFlags, stdout io.Writer) error {
	return withApp(func(a *app) error {
		led, st, err := hostStatus(a, host)
		if err != nil {
			return err
		}
		if st.State != ledger.HostUp && st.State != ledger.HostDisabled {
			return fmt.Errorf("host undrain %s: the host is %s; bring it back with 'pinflow host up %s --wait' first", host, st.State, host)
		}
		c, err := a.client()
		if err != nil {
			return err
		}
		id := workflows.DrainWorkflowID(host)
		d, err := c.DescribeWorkflow(a.ctx, id, "")
		var nf *serviceerror.NotFound
		switch {
		case errors.As(err, &nf):
			return fmt.Errorf("host undrain %s: the host was never drained (or its drain is past the namespace's retention)", host)
		case err != nil:
			return fmt.Errorf("host undrain %s: %w", host, err)
		case d.Status == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING:
			return fmt.Errorf("host undrain %s: the host is being drained; 'pinflow host drain cancel %s' first", host, host)
		}
		var res workflows.DrainResult
		if err := c.GetWorkflow(a.ctx, id, "").Get(a.ctx, &res); err != nil {
			return fmt.Errorf("host undrain %s: its last drain did not complete (%s), so pinflow does not know what it moved; move guests back one by one", host, client.RootMessage(err))
		}
		if _, err := led.SetHostEnabled(a.ctx, host); err != nil {
			return err
		}
		type back struct {
			UUID  string `json:"uuid"`
			From  string `json:"from"`
			Error string `json:"error,omitempty"`
			Done  bool   `json:"done,omitempty"`
		}
		var out []back
		api, err := a.api()
		if err != nil {
			return err
		}
		var ops []*client.Operation
		var idx []int
		for _, g := range res.Guests {
			if g.State != workflows.GuestMoved {
				continue
			}
			inst, err := led.Instance(a.ctx, g.UUID)
			if err != nil || inst.Host != g.Target {
				continue // gone, or moved again since
			}
			op, err := api.Migrate(a.ctx, g.UUID, client.MigrateRequest{Dest: host})
			out = append(out, back{UUID: g.UUID, From: g.Target})
			if err != nil {
				out[len(out)-1].Error = err.Error()
				continue
			}
			ops, idx = append(ops, op), append(idx, len(out)-1)
		}
		failed := 0
		for i, op := range ops {
			if !*of.wait {
				break
			}
			if _, err := op.Wait(a.ctx, nil); err != nil {
				out[idx[i]].Error = client.RootMessage(err)
				continue
			}
			out[idx[i]].Done = true
		}
		for _, b := range out {
			if b.Error != "" {
				failed++
			}
		}
		if *of.json {
			if err := writeJSON(stdout, out); err != nil {
				return err
			}
		} else {
			for _, b := range out {
				switch {
				case b.Error != "":
					fmt.Fprintf(stdout, "%s: not moved back from %s: %s\n", b.UUID, b.From, b.Error)
				case b.Done:
					fmt.Fprintf(stdout, "%s: moved back from %s\n", b.UUID, b.From)
				default:
					fmt.Fprintf(stdout, "%s: moving back from %s (workflow %s)\n", b.UUID, b.From, guest.InstanceWorkflowID(b.UUID))
				}
			}
			fmt.Fprintf(stdout, "host %s is enabled; %d guests of its last drain moving back, %d failed\n", host, len(out), failed)
		}
		if failed > 0 {
			return fmt.Errorf("host undrain %s: %d of %d moves back failed", host, failed, len(out))
		}
		return nil
	})
}
