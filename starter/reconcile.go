package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
)

func reconcileCommand() *cobra.Command {
	c := &cobra.Command{Use: "reconcile", Short: "audit the ledger against Temporal and the hypervisors now", Args: noArgs,
		Long: `Run the ledger audit the schedule runs every minute, now: each claim is checked
against its owner's workflow and the hypervisors; claims whose owners have
been closed for the grace are freed unless a domain of their instance uses
their pCPUs, interrupted moves are settled forwards, and pCPUs a running
domain uses that no claim explains are quarantined. A guest that may run on
another guest's pinned pCPUs (no cpuset, or one over pinnable pCPUs) is
reported as floats-on-pinned, never repaired: move or resize it. --dry-run
only reports.`}
	hosts := c.Flags().StringArray("host", nil, "a `NAME` of a host to audit (repeatable; default: every registered host)")
	dryRun := c.Flags().Bool("dry-run", false, "decide and report, but free nothing")
	grace := c.Flags().String("grace", "", "judge only claims older than this, e.g. 0, 30s, 2m (default: the workers' PINFLOW_RECONCILE_GRACE)")
	of := addOpFlags(c.Flags())
	c.RunE = func(c *cobra.Command, _ []string) error { return reconcile(*hosts, dryRun, grace, of, c.OutOrStdout()) }
	return c
}

func reconcile(hosts []string, dryRun *bool, grace *string, of opFlags, stdout io.Writer) error {
	in := api.ReconcileInput{Hosts: hosts, DryRun: *dryRun}
	if *grace != "" {
		d, err := time.ParseDuration(*grace)
		if err != nil || d < 0 {
			return fmt.Errorf("reconcile: --grace %q: give a duration of 0 or more, such as 0, 30s or 2m: %w", *grace, errUsage)
		}
		in.Grace = &d
	}
	return withClient(func(a *app, pf *client.Client) error {
		in.Concurrency = a.cfg.Reconcile.Concurrency
		run, err := pf.Reconcile(a.ctx, in)
		if err != nil {
			return err
		}
		if !*of.wait {
			if *of.json {
				return writeJSON(stdout, map[string]string{"workflow_id": run.WorkflowID, "run_id": run.RunID, "operation": string(api.OpReconcile)})
			}
			fmt.Fprintf(stdout, "reconcile started: workflow %s run %s; 'pinflow reconcile --wait' prints what it finds\n", run.WorkflowID, run.RunID)
			return nil
		}
		pr := newProgressPrinter(os.Stderr)
		res, err := run.Wait(a.ctx, func(st api.Status) {
			pr.show(fmt.Sprintf("reconcile: %s %d%%: %s", st.Phase, st.Progress, st.Detail))
		})
		pr.end()
		if err != nil {
			return err
		}
		if *of.json {
			return writeJSON(stdout, res)
		}
		fmt.Fprint(stdout, api.ReconcileReport(res))
		return nil
	})
}
