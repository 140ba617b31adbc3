package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/ledger"
)

func groupCommand() *cobra.Command {
	return group("group", "server groups: affinity and anti-affinity rules every claim keeps",
		groupCreateCommand(), groupListCommand(), groupShowCommand(), groupDeleteCommand())
}

var groupArg = takes(cobra.ExactArgs(1), "one group NAME")

func groupCreateCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "create NAME --policy POLICY",
		Short: "make a server group",
		Long: `Make a server group, whose members 'boot --group NAME' makes for life.

  affinity            every member on one host, the host of the first member's claim
  anti-affinity       at most --max-per-host members (default 1) on any host
  soft-affinity       members together where a host takes them, apart otherwise
  soft-anti-affinity  members apart where hosts take them, together otherwise

The hard rules are part of every claim's atomic step in the ledger: no race of
boots, moves, drains and evacuations can break them, and a host named for a
member that would break one is refused. The soft ones are the host choice's
preferences, given way to when no host keeps them.

--max-unavailable N is the group's disruption budget: at most N members move
(live or cold migration, resize, a drain's moves) at once; a move past it
waits for a slot, saying for which members. An evacuation is not held back
(its guest is down already) but counts.`,
		Args: groupArg,
	}
	fs := c.Flags()
	policy := fs.String("policy", "", "affinity, anti-affinity, soft-affinity or soft-anti-affinity")
	maxPerHost := fs.Int("max-per-host", 0, "anti-affinity: the most members one host may hold (default 1)")
	maxUnavailable := fs.Int("max-unavailable", 0, "the most members that may be moving at once, across every drain and operator move (default: no budget)")
	required(c, "policy")
	c.RunE = func(c *cobra.Command, args []string) error {
		p, err := ledger.ParseGroupPolicy(*policy)
		if err != nil {
			return fmt.Errorf("group create %s: --policy %q: allowed are affinity, anti-affinity, soft-affinity and soft-anti-affinity: %w", args[0], *policy, errUsage)
		}
		if fs.Changed("max-per-host") && *maxPerHost < 1 {
			return fmt.Errorf("group create %s: --max-per-host %d: allowed are whole numbers from 1: %w", args[0], *maxPerHost, errUsage)
		}
		if fs.Changed("max-per-host") && p != ledger.PolicyAntiAffinity {
			return fmt.Errorf("group create %s: --max-per-host is for anti-affinity groups, not %s: %w", args[0], p, errUsage)
		}
		if fs.Changed("max-unavailable") && *maxUnavailable < 1 {
			return fmt.Errorf("group create %s: --max-unavailable %d: allowed are whole numbers from 1: %w", args[0], *maxUnavailable, errUsage)
		}
		g := ledger.Group{Name: args[0], Policy: p, MaxPerHost: *maxPerHost, MaxUnavailable: *maxUnavailable}
		return withApp(func(a *app) error {
			pf, err := a.ledgerClient()
			if err != nil {
				return err
			}
			if err := pf.CreateGroup(a.ctx, g); err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "group %s created: %s\n", g.Name, ruleText(g))
			return nil
		})
	}
	return c
}

func groupListCommand() *cobra.Command {
	c := &cobra.Command{Use: "list", Short: "list the server groups with their members' hosts", Args: noArgs}
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, _ []string) error {
		return withApp(func(a *app) error {
			pf, err := a.ledgerClient()
			if err != nil {
				return err
			}
			gs, err := pf.Groups(a.ctx)
			if err != nil {
				return err
			}
			stdout := c.OutOrStdout()
			if *asJSON {
				return writeJSON(stdout, gs)
			}
			if len(gs) == 0 {
				fmt.Fprintln(stdout, "no server groups")
				return nil
			}
			w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tPOLICY\tMEMBERS\tHOSTS\tRULE")
			for _, g := range gs {
				fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", g.Name, ruleText(g.Group), len(g.Members), len(g.OnHosts), holdsText(&g))
			}
			return w.Flush()
		})
	}
	return c
}

func groupShowCommand() *cobra.Command {
	c := &cobra.Command{Use: "show NAME", Short: "show a server group: its rule, members, their hosts, and whether the rule holds", Args: groupArg, ValidArgsFunction: groupNames}
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		return withApp(func(a *app) error {
			pf, err := a.ledgerClient()
			if err != nil {
				return err
			}
			g, err := pf.Group(a.ctx, args[0])
			if err != nil {
				return err
			}
			return writeGroup(c.OutOrStdout(), g, *asJSON)
		})
	}
	return c
}

func writeGroup(stdout io.Writer, g *client.GroupView, asJSON bool) error {
	if asJSON {
		return writeJSON(stdout, g)
	}
	fmt.Fprintf(stdout, "group %s: %s\n", g.Name, ruleText(g.Group))
	if g.Policy == ledger.PolicyAffinity && g.Host != "" {
		fmt.Fprintf(stdout, "host: %s\n", g.Host)
	}
	fmt.Fprintf(stdout, "rule: %s\n", holdsText(g))
	for _, r := range g.AtRisk {
		fmt.Fprintf(stdout, "  at risk: %s\n", r)
	}
	if g.MaxUnavailable > 0 {
		fmt.Fprintf(stdout, "moving: %d of %d (%s)\n", len(g.Moving), g.MaxUnavailable, orDash(strings.Join(memberNames(g, g.Moving), ", ")))
	}
	for _, b := range g.Broken {
		fmt.Fprintf(stdout, "  %s\n", b)
	}
	if len(g.Guests) == 0 {
		fmt.Fprintln(stdout, "no members")
		return nil
	}
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "UUID\tNAME\tHOST\tVM_STATE")
	for _, m := range g.Guests {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", m.UUID, orDash(m.Name), orDash(m.Host), m.VMState)
	}
	return w.Flush()
}

// memberNames names the members uuids lists, by name where they have one.
func memberNames(g *client.GroupView, uuids []string) []string {
	names := make([]string, len(uuids))
	for i, u := range uuids {
		names[i] = u
		for _, m := range g.Guests {
			if m.UUID == u && m.Name != "" {
				names[i] = m.Name
			}
		}
	}
	return names
}

func groupDeleteCommand() *cobra.Command {
	c := &cobra.Command{Use: "delete NAME", Short: "delete a server group that has no members", Args: groupArg, ValidArgsFunction: groupNames}
	c.RunE = func(c *cobra.Command, args []string) error {
		return withApp(func(a *app) error {
			pf, err := a.ledgerClient()
			if err != nil {
				return err
			}
			if err := pf.DeleteGroup(a.ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "group %s deleted\n", args[0])
			return nil
		})
	}
	return c
}

// ruleText says a group's rule and budget in a few words.
func ruleText(g ledger.Group) string {
	s := string(g.Policy)
	if g.Policy == ledger.PolicyAntiAffinity {
		s = fmt.Sprintf("%s, at most %d per host", g.Policy, max(g.MaxPerHost, 1))
	}
	if g.MaxUnavailable > 0 {
		s += fmt.Sprintf(", at most %d moving at once", g.MaxUnavailable)
	}
	return s
}

func holdsText(g *client.GroupView) string {
	if g.Holds {
		return "holds"
	}
	if g.Policy.Hard() {
		return "BROKEN"
	}
	return "given way"
}
