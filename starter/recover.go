package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
)

func recoverCommand() *cobra.Command {
	c := &cobra.Command{Use: "recover", Short: "rebuild hosts' ledgers from their hypervisors after Redis lost data", Args: noArgs,
		Long: `Rebuild a host's ledger after Redis lost data, from the domains its hypervisor
runs and the instance records: register a lost topology again, restore the
resident claims the records agree with, and quarantine pCPUs no record
explains until 'pinflow quarantine release'. It only adds claims, never frees
one. A host that is fine is reported so, and changes nothing.`}
	hosts := c.Flags().StringArray("host", nil,
		"a `NAME` of a host to recover (repeatable; default: every registered host); a host whose ledger keys are all gone must be named")
	dryRun := c.Flags().Bool("dry-run", false, "say what would be restored and quarantined, change nothing")
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, _ []string) error { return recoverHosts(*hosts, dryRun, asJSON, c.OutOrStdout()) }
	return c
}

func recoverHosts(hosts []string, dryRun, asJSON *bool, stdout io.Writer) error {
	return withClient(func(a *app, pf *client.Client) error {
		res, err := pf.Recover(a.ctx, api.RecoverInput{Hosts: hosts, DryRun: *dryRun})
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, res)
		}
		fmt.Fprint(stdout, api.RecoverReport(res))
		for _, h := range res.Hosts {
			if h.Changed() || len(h.Unresolved) > 0 {
				return nil
			}
		}
		fmt.Fprintf(stdout, "%s fine: every running domain agrees with its claims; nothing changed\n", hostWord(*res))
		return nil
	})
}

func hostWord(res api.RecoverResult) string {
	if len(res.Hosts) == 1 {
		return "host " + res.Hosts[0].Host + " is"
	}
	return fmt.Sprintf("all %d hosts are", len(res.Hosts))
}

func quarantineCommand() *cobra.Command {
	release := &cobra.Command{Use: "release --host NAME CLAIM", Short: "hand back quarantined pCPUs an operator has checked",
		Long: `Release a quarantine claim: an operator's decision that the pCPUs it held are
free. The release runs on a worker, which asks the hypervisor and refuses,
naming the domain, while a running or paused domain uses any of them.`,
		Args: takes(cobra.ExactArgs(1), "one quarantine CLAIM id")}
	host := release.Flags().String("host", "", "the host the quarantine is on")
	required(release, "host")
	release.RunE = func(c *cobra.Command, args []string) error { return quarantine(host, args, c.OutOrStdout()) }
	return group("quarantine", "release quarantined pCPUs", release)
}

// quarantine releases a quarantine claim: an operator's decision that the
// pCPUs it held are free (the domain that used them is gone or has a
// claim again). The release runs on the worker, which asks the hypervisor
// and refuses while a domain still runs on those pCPUs; any other kind of
// claim is refused too.
func quarantine(host *string, pos []string, stdout io.Writer) error {
	return withClient(func(a *app, pf *client.Client) error {
		res, err := pf.ReleaseQuarantine(a.ctx, *host, pos[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "quarantine %s on %s released: pCPUs %s are free\n", res.ClaimID, res.Host, res.CPUs)
		return nil
	})
}
