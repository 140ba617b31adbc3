package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/placement"
)

func explainCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "explain [GUEST] [--vcpus N --memory-mb N]",
		Short: "say which hosts would take a guest, and why not the others",
		Long: `Fit a guest on every host, as a boot or a move would, and print the hosts
grouped by verdict: the ones that take it, and why each other does not
(down or disabled, no NUMA cell with enough free pCPUs, memory or huge
pages, the host over its allocation ratios, ...), with the particulars of
one host of each group. Nothing is claimed or changed.

  explain --vcpus N --memory-mb N ...   a new guest, as boot asks
  explain GUEST                          where a guest could move, or where
                                         a shelved guest could unshelve
  explain GUEST --vcpus N ...            the guest resized, as resize asks:
                                         the flags change its flavor, and its
                                         own host is a candidate`,
		Args:              takes(cobra.MaximumNArgs(1), "at most one guest"),
		ValidArgsFunction: guestUUIDs,
	}
	fs := c.Flags()
	host := fs.String("host", "", "ask about this host alone (a disabled host is a candidate when named)")
	vcpus := fs.Int("vcpus", 0, "vCPUs of a new guest, or of a guest resized")
	memory := fs.Int64("memory-mb", 0, "memory of a new guest, or of a guest resized, MiB")
	specs, props := keyValues{}, keyValues{}
	fs.Var(specs, "spec", "a flavor extra spec of a new guest, or of a guest resized (repeatable)")
	fs.Var(props, "image-prop", "an image property of a new guest, or of a guest resized (repeatable)")
	asJSON := outputFlags(fs)
	c.RunE = func(c *cobra.Command, args []string) error {
		r := client.ExplainRequest{Host: *host}
		switch {
		case len(args) == 1 && (*vcpus < 0 || *memory < 0):
			return fmt.Errorf("explain: --vcpus %d --memory-mb %d: allowed are positive numbers, or none to keep the guest's: %w", *vcpus, *memory, errUsage)
		case len(args) == 1:
			r.Guest = args[0]
			r.Flavor = guest.Flavor{VCPUs: *vcpus, MemoryMB: *memory, ExtraSpecs: specs, ImageProps: props}
		case *vcpus <= 0 || *memory <= 0:
			return fmt.Errorf("explain: --vcpus %d --memory-mb %d: name a guest, or give a flavor of at least 1 vCPU and 1 MiB: %w", *vcpus, *memory, errUsage)
		default:
			r.Flavor = guest.Flavor{VCPUs: *vcpus, MemoryMB: *memory, ExtraSpecs: specs, ImageProps: props}
			// Refused as boot refuses it, before any connection.
			if _, err := r.Flavor.Request(); err != nil {
				return fmt.Errorf("explain: %w", err)
			}
		}
		return withApp(func(a *app) error {
			pf, err := a.ledgerClient()
			if err != nil {
				return err
			}
			ex, err := pf.Explain(a.ctx, r)
			if err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(c.OutOrStdout(), ex)
			}
			renderExplanation(c.OutOrStdout(), ex)
			return nil
		})
	}
	return c
}

// renderExplanation prints the groups, a few hosts each, with the
// particulars of the first.
func renderExplanation(w io.Writer, ex *placement.Explanation) {
	if len(ex.Verdicts) == 0 {
		fmt.Fprintln(w, "no hosts; add one with: pinflow host add NAME --cells 2 --cores 4")
		return
	}
	why := map[string]placement.Verdict{}
	for _, v := range ex.Verdicts {
		if _, ok := why[v.Group]; !ok {
			why[v.Group] = v
		}
	}
	for _, g := range ex.Groups {
		hosts := g.Hosts
		more := ""
		if len(hosts) > 8 {
			hosts, more = hosts[:8], fmt.Sprintf(" and %d more", len(g.Hosts)-8)
		}
		fmt.Fprintf(w, "%s: %s: %s%s\n", g.Group, count(len(g.Hosts), "host", "hosts"), strings.Join(hosts, ", "), more)
		if v := why[g.Group]; v.Why != "" {
			fmt.Fprintf(w, "  e.g. %s: %s\n", v.Host, v.Why)
		}
	}
	if ex.Choice != "" {
		fmt.Fprintf(w, "pinflow would choose %s now\n", ex.Choice)
	} else {
		fmt.Fprintln(w, "no host takes it now")
	}
}
