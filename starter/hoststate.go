package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	tclient "go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
)

func hostRemoveCommand() *cobra.Command {
	c := hostCommandOf("remove NAME", "remove a host that holds no guest",
		`Remove a host that holds no guest. A fenced host that never returns goes with
the tombstones of the guests evacuated from it.`)
	c.RunE = func(c *cobra.Command, args []string) error { return hostRemove(args[0], c.OutOrStdout()) }
	return c
}

func hostRemove(host string, stdout io.Writer) error {
	return withClient(func(a *app, pf *client.Client) error {
		res, err := pf.RemoveHost(a.ctx, host)
		if err != nil {
			return err
		}
		if res.Kept != "" {
			// The ledger has let the host go; the simulated machine
			// keeps its leftovers, as a dead machine would.
			fmt.Fprintf(stdout, "the simulator keeps host %s: %s\n", host, res.Kept)
		}
		fmt.Fprintf(stdout, "host %s removed, with %d tombstones of guests evacuated from it\n", host, res.Tombstones)
		return nil
	})
}

// hostOpStarted says that run, the operation on a whole host that what
// names, has started; a command without --wait ends with it.
func hostOpStarted(stdout io.Writer, asJSON bool, host, what string, run tclient.WorkflowRun) error {
	if asJSON {
		return writeJSON(stdout, map[string]string{"host": host, "workflow_id": run.GetID(), "run_id": run.GetRunID()})
	}
	fmt.Fprintf(stdout, "%s started: workflow %s run %s\n", what, run.GetID(), run.GetRunID())
	return nil
}

func hostDownCommand() *cobra.Command {
	c := hostCommandOf("down NAME --fence --reason TEXT", "record that a dead host is fenced, so its guests may be evacuated",
		`Record an operator's statement that a host is fenced: powered off, or cut off
from its guests' storage and network. A down host takes no claims, and only
its guests may be evacuated ('pinflow host evacuate'); pinflow never
evacuates a host that may still run its guests. With --auto-evacuate,
every audit of the host (the schedule's, or 'pinflow reconcile') starts an
evacuation of each guest still there, until the host returns. 'pinflow
host up' brings it back.`)
	fence := c.Flags().Bool("fence", false, "state that the host is fenced: powered off or cut off from its guests' storage and network (required)")
	reason := c.Flags().String("reason", "", "why, for the record (required)")
	auto := c.Flags().Bool("auto-evacuate", false, "have every audit evacuate the host's guests until it returns")
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		return hostDown(args[0], fence, reason, *auto, asJSON, c.OutOrStdout())
	}
	return c
}

func hostDown(host string, fence *bool, reason *string, auto bool, asJSON *bool, stdout io.Writer) error {
	if !*fence {
		return fmt.Errorf("host down %s: add --fence once the host is powered off or cut off; pinflow never evacuates a host that may still run its guests: %w", host, errUsage)
	}
	if strings.TrimSpace(*reason) == "" {
		return fmt.Errorf("host down %s: --reason is required (what happened, for the record): %w", host, errUsage)
	}
	return withClient(func(a *app, pf *client.Client) error {
		st, err := pf.DownHost(a.ctx, host, *reason, auto)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, st)
		}
		if st.AutoEvacuate {
			fmt.Fprintf(stdout, "host %s is down (fenced, token %s): it takes no guests; every audit evacuates its guests until it returns\n", host, st.Token)
			return nil
		}
		fmt.Fprintf(stdout, "host %s is down (fenced, token %s): it takes no guests; evacuate its guests with 'pinflow host evacuate %s'\n", host, st.Token, host)
		return nil
	})
}

func hostDisableCommand() *cobra.Command {
	c := hostCommandOf("disable NAME --reason TEXT", "keep new guests off a host for maintenance",
		`Disable a host for maintenance: its guests stay, pinflow no longer chooses it
for new guests, and it takes only operations that name it. 'pinflow host
enable' ends it.`)
	reason := c.Flags().String("reason", "", "why, for the record: one line of up to 200 characters (required)")
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		return hostDisable(args[0], reason, asJSON, c.OutOrStdout())
	}
	return c
}

func hostDisable(host string, reason *string, asJSON *bool, stdout io.Writer) error {
	if strings.TrimSpace(*reason) == "" {
		return fmt.Errorf("host disable %s: --reason is required (why no new guests should land there, for the record): %w", host, errUsage)
	}
	return withClient(func(a *app, pf *client.Client) error {
		st, err := pf.DisableHost(a.ctx, host, *reason)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, st)
		}
		fmt.Fprintf(stdout, "host %s is disabled (%s): its guests stay; new guests land there only when an operation names it; 'pinflow host enable %s' ends it\n",
			host, st.Reason, host)
		return nil
	})
}

func hostEnableCommand() *cobra.Command {
	c := hostCommandOf("enable NAME", "let pinflow choose a disabled host for new guests again", "")
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error { return hostEnable(args[0], asJSON, c.OutOrStdout()) }
	return c
}

func hostEnable(host string, asJSON *bool, stdout io.Writer) error {
	return withClient(func(a *app, pf *client.Client) error {
		// Read first only to say whether there was anything to enable.
		was, err := pf.HostStatus(a.ctx, host)
		if err != nil {
			return err
		}
		st, err := pf.EnableHost(a.ctx, host)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, st)
		}
		if was.State == ledger.HostUp {
			fmt.Fprintf(stdout, "host %s is up (it was not disabled)\n", host)
			return nil
		}
		fmt.Fprintf(stdout, "host %s is up: pinflow chooses it for new guests again\n", host)
		return nil
	})
}

func hostUpCommand() *cobra.Command {
	c := hostCommandOf("up NAME", "bring a fenced host back once its leftovers are destroyed",
		`Bring back a host marked down: destroy the leftovers of the guests evacuated
from it and clear their tombstones, then let it take guests again. It
refuses while operations on its guests run.`)
	of := addOpFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error { return hostUp(args[0], of, c.OutOrStdout()) }
	return c
}

func hostUp(host string, of opFlags, stdout io.Writer) error {
	return withClient(func(a *app, pf *client.Client) error {
		run, err := pf.UpHost(a.ctx, host)
		if err != nil {
			return err
		}
		if !*of.wait {
			return hostOpStarted(stdout, *of.json, host, "host up "+host, pf.Temporal().GetWorkflow(a.ctx, run.WorkflowID, run.RunID))
		}
		res, err := run.Wait(a.ctx)
		if err != nil {
			return err
		}
		// The host's guests that were not evacuated run again: say which
		// group rules they break beside members moved elsewhere.
		rules, err := pf.GroupRulesOn(a.ctx, host)
		if err != nil {
			return err
		}
		if *of.json {
			return writeJSON(stdout, struct {
				*api.HostUpResult
				GroupRules []string `json:"group_rules,omitempty"`
			}{res, rules})
		}
		fmt.Fprintf(stdout, "host %s is up: %d leftover guests destroyed and their tombstones cleared\n", host, len(res.Leftovers))
		for _, r := range rules {
			fmt.Fprintln(stdout, "  RULE BROKEN: "+r)
		}
		return nil
	})
}

func hostEvacuateCommand() *cobra.Command {
	c := hostCommandOf("evacuate NAME", "evacuate every guest of a fenced host",
		`Start an evacuation of every guest of a host fenced with 'pinflow host down
--fence', each under its own instance workflow id; see 'pinflow evacuate'.
A guest no host can take now (a full cloud, a server group's rule) stays
on the host, listed with the reason. --retry has every audit (the
schedule's, or 'pinflow reconcile') evacuate the guests still there, so
they are rebuilt once a host can take them; --retry=false stops that, and
the host's return ends it.`)
	of := addOpFlags(c.Flags())
	retry := c.Flags().Bool("retry", false, "have every audit evacuate the guests still on the host, until it returns")
	c.RunE = func(c *cobra.Command, args []string) error {
		var auto *bool
		if c.Flags().Changed("retry") {
			auto = retry
		}
		return hostEvacuate(args[0], auto, of, c.OutOrStdout())
	}
	return c
}

// hostEvacuate starts an evacuation of every guest whose record names the
// fenced host, each under its own instance workflow id, after turning
// the host's automatic evacuation on or off when auto says.
func hostEvacuate(host string, auto *bool, of opFlags, stdout io.Writer) error {
	return withClient(func(a *app, pf *client.Client) error {
		if auto != nil {
			if _, err := pf.AutoEvacuateHost(a.ctx, host, *auto); err != nil {
				return err
			}
			if !*of.json {
				if *auto {
					fmt.Fprintf(stdout, "every audit evacuates the guests still on %s until it returns\n", host)
				} else {
					fmt.Fprintf(stdout, "audits no longer evacuate the guests of %s\n", host)
				}
			}
		}
		evacuations, err := pf.EvacuateHost(a.ctx, host)
		if err != nil {
			return err
		}
		type started struct {
			UUID  string `json:"uuid"`
			RunID string `json:"run_id,omitempty"`
			Host  string `json:"host,omitempty"`
			Error string `json:"error,omitempty"`
		}
		out := make([]started, len(evacuations))
		failed := 0
		for i, e := range evacuations {
			out[i].UUID = e.UUID
			if e.Err != nil {
				failed++
				out[i].Error = e.Err.Error()
				continue
			}
			out[i].RunID = e.Op.RunID
		}
		if *of.wait {
			// Every evacuation runs under its own instance id; wait for
			// each and say how it ended.
			for i, e := range evacuations {
				if e.Op == nil {
					continue
				}
				res, err := e.Op.Wait(a.ctx, nil)
				if err != nil {
					failed++
					out[i].Error = client.RootMessage(err)
					continue
				}
				out[i].Host = res.Host
			}
		}
		if *of.json {
			if err := writeJSON(stdout, out); err != nil {
				return err
			}
		} else {
			for _, s := range out {
				switch {
				case s.Error != "":
					fmt.Fprintf(stdout, "%s: failed: %s\n", s.UUID, s.Error)
				case s.Host != "":
					fmt.Fprintf(stdout, "%s: evacuated to %s\n", s.UUID, s.Host)
				default:
					fmt.Fprintf(stdout, "%s: evacuation started as workflow %s\n", s.UUID, guest.InstanceWorkflowID(s.UUID))
				}
			}
			fmt.Fprintf(stdout, "%d evacuations of guests of %s, %d failed\n", len(out), host, failed)
		}
		if failed > 0 {
			return fmt.Errorf("host evacuate %s: %d of %d evacuations failed", host, failed, len(out))
		}
		return nil
	})
}
