package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/client"
)

func opsCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "ops [GUEST]",
		Short: "list the operations that ran, newest first, with how each ended and why",
		Long: `List the operations on a guest, on a host (--host: as source or destination,
and every change of the host itself, a removed host's too), or on every
guest, newest first, with their status and, for those that did not
complete, why in one line. The list comes from Temporal's visibility,
which may lag a second behind; the audit's runs show with --audits.`,
		Args:              takes(cobra.MaximumNArgs(1), "at most one guest"),
		ValidArgsFunction: guestUUIDs,
	}
	host := c.Flags().String("host", "", "only the operations with this host as source or destination")
	audits := c.Flags().Bool("audits", false, "list the audit's own runs (reconcile, settle) too")
	limit := c.Flags().Int("limit", 20, "at most this many operations, 1 to 1000")
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		if *limit < 1 || *limit > 1000 {
			return fmt.Errorf("ops: --limit %d: allowed are 1 to 1000: %w", *limit, errUsage)
		}
		f := client.HistoryFilter{Host: *host, Audits: *audits, Limit: *limit}
		if len(args) == 1 {
			f.UUID = args[0]
		}
		return withClient(func(a *app, pf *client.Client) error {
			recs, err := pf.History(a.ctx, f)
			if err != nil {
				return err
			}
			// A removed host keeps its history; a host with neither a
			// registration nor a history is refused as unknown.
			if *host != "" && len(recs) == 0 {
				if _, err := pf.HostStatus(a.ctx, *host); err != nil {
					return err
				}
			}
			if *asJSON {
				if recs == nil {
					recs = []client.Record{}
				}
				return writeJSON(c.OutOrStdout(), recs)
			}
			return renderHistory(c.OutOrStdout(), recs)
		})
	}
	return c
}

// renderHistory prints runs as a table, each reason on its row.
func renderHistory(w io.Writer, recs []client.Record) error {
	if len(recs) == 0 {
		fmt.Fprintln(w, "no operations")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STARTED\tOPERATION\tGUEST\tFROM\tTO\tSTATUS\tTOOK\tREASON")
	for _, r := range recs {
		took := "-"
		if !r.Close.IsZero() {
			took = r.Close.Sub(r.Start).Round(100 * time.Millisecond).String()
		}
		status := r.Status
		if r.Status == "running" {
			status += " (" + string(r.Phase) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Start.Local().Format(time.DateTime), r.Operation, orDash(shortID(r.UUID)),
			orDash(r.Source), orDash(r.Dest), status, took, orDash(r.Reason))
	}
	return tw.Flush()
}
