package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	tclient "go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/workflows"
)

func reconcileCommand() *cobra.Command {
	c := &cobra.Command{Use: "reconcile", Short: "audit the ledger against Temporal and the hypervisors now", Args: noArgs,
		Long: `Run the ledger audit the schedule runs every minute, now: each claim is checked
against its owner's workflow and the hypervisors; claims whose owners have
been closed for the grace are freed unless a domain of their instance uses
their pCPUs, interrupted moves are settled forwards, and pCPUs a running
domain uses that no claim explains are quarantined. --dry-run only reports.`}
	hosts := c.Flags().StringArray("host", nil, "a `NAME` of a host to audit (repeatable; default: every registered host)")
	dryRun := c.Flags().Bool("dry-run", false, "decide and report, but free nothing")
	grace := c.Flags().String("grace", "", "judge only claims older than this, e.g. 0, 30s, 2m (default: the workers' PINFLOW_RECONCILE_GRACE)")
	of := addOpFlags(c.Flags())
	c.RunE = func(c *cobra.Command, _ []string) error { return reconcile(*hosts, dryRun, grace, of, c.OutOrStdout()) }
	return c
}

func reconcile(hosts []string, dryRun *bool, grace *string, of opFlags, stdout io.Writer) error {
	in := workflows.ReconcileInput{Hosts: hosts, DryRun: *dryRun}
	if *grace != "" {
		d, err := time.ParseDuration(*grace)
		if err != nil || d < 0 {
			return fmt.Errorf("reconcile: --grace %q: give a duration of 0 or more, such as 0, 30s or 2m: %w", *grace, errUsage)
		}
		in.Grace = &d
	}
	return withApp(func(a *app) error {
		for _, h := range hosts {
			if err := checkHost(a, h); err != nil {
				return fmt.Errorf("reconcile: %w", err)
			}
		}
		c, err := a.client()
		if err != nil {
			return err
		}
		in.Concurrency = a.cfg.Reconcile.Concurrency
		id := reconcileWorkflowID(time.Now())
		summary := "ledger audit of every host"
		if len(hosts) > 0 {
			summary = "ledger audit of " + strings.Join(hosts, ", ")
		}
		if *dryRun {
			summary += " (dry run)"
		}
		run, err := c.ExecuteWorkflow(a.ctx, tclient.StartWorkflowOptions{
			ID:                    id,
			TaskQueue:             a.cfg.TaskQueue,
			TypedSearchAttributes: temporal.NewSearchAttributes(workflows.StartAttributes(workflows.OpReconcile, "")...),
			StaticSummary:         summary,
		}, workflows.Reconcile, in)
		if err != nil {
			return fmt.Errorf("reconcile: %w", err)
		}
		if !*of.wait {
			if *of.json {
				return writeJSON(stdout, map[string]string{"workflow_id": id, "run_id": run.GetRunID(), "operation": string(workflows.OpReconcile)})
			}
			fmt.Fprintf(stdout, "reconcile started: workflow %s run %s; 'pinflow reconcile --wait' prints what it finds\n", id, run.GetRunID())
			return nil
		}
		res, err := followReconcile(a, c, run)
		if err != nil {
			return fmt.Errorf("reconcile %s failed: %s", id, client.RootMessage(err))
		}
		if *of.json {
			return writeJSON(stdout, res)
		}
		fmt.Fprint(stdout, workflows.ReconcileReport(res))
		return nil
	})
}

// reconcileWorkflowID names an audit run started now: its time, and a
// random suffix so two started in one millisecond do not collide.
func reconcileWorkflowID(now time.Time) string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return fmt.Sprintf("%s-%s-%s", workflows.ReconcileWorkflowIDPrefix, now.UTC().Format("20060102T150405.000Z"), hex.EncodeToString(b))
}

// followReconcile prints the audit's progress to stderr while it runs and
// returns its result.
func followReconcile(a *app, c tclient.Client, run tclient.WorkflowRun) (*workflows.ReconcileResult, error) {
	var res workflows.ReconcileResult
	err := waitShowingProgress(a.ctx, run, &res, func() string {
		st, ok := queryStatus(a.ctx, c, run)
		if !ok {
			return ""
		}
		return fmt.Sprintf("reconcile: %s %d%%: %s", st.Phase, st.Progress, st.Detail)
	})
	if err != nil {
		return nil, err
	}
	return &res, nil
}
