package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	tclient "go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/config"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/workflows"
)

func hostRemoveCommand() *cobra.Command {
	c := hostCommandOf("remove NAME", "remove a host that holds no guest",
		`Remove a host that holds no guest. A fenced host that never returns goes with
the tombstones of the guests evacuated from it.`)
	c.RunE = func(c *cobra.Command, args []string) error { return hostRemove(args[0], c.OutOrStdout()) }
	return c
}

func hostRemove(host string, stdout io.Writer) error {
	return withApp(func(a *app) error {
		if err := checkHost(a, host); err != nil {
			return err
		}
		led, err := a.ledger()
		if err != nil {
			return err
		}
		n, err := led.RemoveHost(a.ctx, host)
		if err != nil {
			return err
		}
		if a.cfg.Driver == config.DriverSim {
			drv, err := a.cfg.Simulator(a.rdb)
			if err != nil {
				return err
			}
			if err := drv.RemoveHost(a.ctx, host); err != nil {
				// The ledger has let the host go; the simulated machine
				// keeps its leftovers, as a dead machine would.
				fmt.Fprintf(stdout, "the simulator keeps host %s: %v\n", host, err)
			}
		}
		fmt.Fprintf(stdout, "host %s removed, with %d tombstones of guests evacuated from it\n", host, n)
		return nil
	})
}

// hostWorkflowID is the workflow id of operations on a whole host.
func hostWorkflowID(host string) string { return "host-" + host }

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
evacuates a host that may still run its guests. 'pinflow host up' brings it
back.`)
	fence := c.Flags().Bool("fence", false, "state that the host is fenced: powered off or cut off from its guests' storage and network (required)")
	reason := c.Flags().String("reason", "", "why, for the record (required)")
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		return hostDown(args[0], fence, reason, asJSON, c.OutOrStdout())
	}
	return c
}

func hostDown(host string, fence *bool, reason *string, asJSON *bool, stdout io.Writer) error {
	if !*fence {
		return fmt.Errorf("host down %s: add --fence once the host is powered off or cut off; pinflow never evacuates a host that may still run its guests: %w", host, errUsage)
	}
	if strings.TrimSpace(*reason) == "" {
		return fmt.Errorf("host down %s: --reason is required (what happened, for the record): %w", host, errUsage)
	}
	return withApp(func(a *app) error {
		if err := checkHost(a, host); err != nil {
			return err
		}
		led, err := a.ledger()
		if err != nil {
			return err
		}
		st, err := led.SetHostDown(a.ctx, host, *reason)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, st)
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
	return withApp(func(a *app) error {
		led, st, err := hostStatus(a, host)
		if err != nil {
			return err
		}
		if st.State != ledger.HostUp && st.State != ledger.HostDisabled {
			return fmt.Errorf("host disable %s: the host is %s; only an up host is disabled: bring it back with 'pinflow host up %s --wait' first", host, st.State, host)
		}
		if st, err = led.SetHostDisabled(a.ctx, host, *reason); err != nil {
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
	return withApp(func(a *app) error {
		led, st, err := hostStatus(a, host)
		if err != nil {
			return err
		}
		if st.State != ledger.HostUp && st.State != ledger.HostDisabled {
			return fmt.Errorf("host enable %s: the host is %s, not disabled; bring it back with 'pinflow host up %s --wait'", host, st.State, host)
		}
		was := st.State
		if st, err = led.SetHostEnabled(a.ctx, host); err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, st)
		}
		if was == ledger.HostUp {
			fmt.Fprintf(stdout, "host %s is up (it was not disabled)\n", host)
			return nil
		}
		fmt.Fprintf(stdout, "host %s is up: pinflow chooses it for new guests again\n", host)
		return nil
	})
}

// hostStatus checks that host is registered and returns the ledger and
// the host's state.
func hostStatus(a *app, host string) (*ledger.Ledger, ledger.HostStatus, error) {
	if err := checkHost(a, host); err != nil {
		return nil, ledger.HostStatus{}, err
	}
	led, err := a.ledger()
	if err != nil {
		return nil, ledger.HostStatus{}, err
	}
	st, err := led.HostStatus(a.ctx, host)
	return led, st, err
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
	return withApp(func(a *app) error {
		_, st, err := hostStatus(a, host)
		if err != nil {
			return err
		}
		if st.State == ledger.HostUp {
			return fmt.Errorf("host up %s: the host is up already; host up brings back a host marked down with 'pinflow host down'", host)
		}
		if st.State == ledger.HostDisabled {
			return fmt.Errorf("host up %s: the host is disabled, not down; 'pinflow host enable %s' lets pinflow choose it again", host, host)
		}
		c, err := a.client()
		if err != nil {
			return err
		}
		id := hostWorkflowID(host)
		run, err := startWorkflow(a, c, id, "", opPlan{op: workflows.OpHostUp, wf: workflows.HostUp, input: workflows.HostUpInput{Host: host},
			summary: "bring host " + host + " back", source: host}, "")
		switch {
		case alreadyRunning(err):
			return fmt.Errorf("host up %s: it is coming back already (workflow %s)", host, id)
		case err != nil:
			return fmt.Errorf("host up %s: %w", host, err)
		}
		if !*of.wait {
			return hostOpStarted(stdout, *of.json, host, "host up "+host, run)
		}
		var res workflows.HostUpResult
		if err := run.Get(a.ctx, &res); err != nil {
			return fmt.Errorf("host up %s failed: %s", host, client.RootMessage(err))
		}
		if *of.json {
			return writeJSON(stdout, res)
		}
		fmt.Fprintf(stdout, "host %s is up: %d leftover guests destroyed and their tombstones cleared\n", host, len(res.Leftovers))
		return nil
	})
}

func hostEvacuateCommand() *cobra.Command {
	c := hostCommandOf("evacuate NAME", "evacuate every guest of a fenced host",
		`Start an evacuation of every guest of a host fenced with 'pinflow host down
--fence', each under its own instance workflow id; see 'pinflow evacuate'.`)
	of := addOpFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error { return hostEvacuate(args[0], of, c.OutOrStdout()) }
	return c
}

// hostEvacuate starts an evacuation of every guest whose record names the
// fenced host, each under its own instance workflow id.
func hostEvacuate(host string, of opFlags, stdout io.Writer) error {
	asJSON := of.json
	return withApp(func(a *app) error {
		led, st, err := hostStatus(a, host)
		if err != nil {
			return err
		}
		if st.State != ledger.HostDown {
			return fmt.Errorf("host evacuate %s: the host is %s; pinflow evacuates only from a host fenced with 'pinflow host down %s --fence'", host, st.State, host)
		}
		claims, err := led.Claims(a.ctx, host)
		if err != nil {
			return err
		}
		type started struct {
			UUID  string `json:"uuid"`
			RunID string `json:"run_id,omitempty"`
			Host  string `json:"host,omitempty"`
			Error string `json:"error,omitempty"`
		}
		var out []started
		api, err := a.api()
		if err != nil {
			return err
		}
		var ops []*client.Operation
		var opOf []int // ops[i] is the evacuation of out[opOf[i]]
		failed := 0
		for _, cl := range claims {
			inst, err := led.Instance(a.ctx, cl.InstanceUUID)
			if err != nil || inst.Host != host || inst.ClaimID != cl.ID {
				continue // not a guest that lives here
			}
			op, err := api.Evacuate(a.ctx, inst.UUID, "")
			if err != nil {
				failed++
				out = append(out, started{UUID: inst.UUID, Error: err.Error()})
				continue
			}
			out = append(out, started{UUID: inst.UUID, RunID: op.RunID})
			ops, opOf = append(ops, op), append(opOf, len(out)-1)
		}
		if *of.wait {
			// Every evacuation runs under its own instance id; wait for
			// each and say how it ended.
			for i, op := range ops {
				res, err := op.Wait(a.ctx, nil)
				if err != nil {
					failed++
					out[opOf[i]].Error = client.RootMessage(err)
					continue
				}
				out[opOf[i]].Host = res.Host
			}
		}
		if *asJSON {
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
