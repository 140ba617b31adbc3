package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/ledger"
)

// completionTimeout bounds a completion's look-up in the ledger: the
// shell waits for it, and no suggestion is better than a hung prompt.
const completionTimeout = time.Second

// fromLedger completes with what list reads from the ledger, and with
// nothing, silently, when no ledger answers in time.
func fromLedger(list func(a *app, led *ledger.Ledger, typed string) ([]cobra.Completion, error)) cobra.CompletionFunc {
	return func(c *cobra.Command, _ []string, typed string) ([]cobra.Completion, cobra.ShellCompDirective) {
		setConnectionEnv(c.Flags())
		ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
		defer cancel()
		var out []cobra.Completion
		a, err := newApp(ctx)
		if err == nil {
			defer a.close()
			var led *ledger.Ledger
			if led, err = a.ledger(); err == nil {
				out, err = list(a, led, typed)
			}
		}
		if err != nil {
			out = nil
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

var (
	completeHosts = fromLedger(func(a *app, led *ledger.Ledger, _ string) ([]cobra.Completion, error) {
		return sortedHosts(a, led)
	})
	completeGuests = fromLedger(guestCompletions)
	// completeGroups offers the server groups by name.
	completeGroups = fromLedger(func(a *app, led *ledger.Ledger, _ string) ([]cobra.Completion, error) {
		gs, err := led.Groups(a.ctx)
		var out []cobra.Completion
		for _, g := range gs {
			out = append(out, cobra.CompletionWithDesc(g.Name, string(g.Policy)))
		}
		return out, err
	})
	hostNames  = firstArg(completeHosts)
	guestUUIDs = firstArg(completeGuests)
	groupNames = firstArg(completeGroups)
)

// guestCompletions offers each guest by its UUID and by its name, when
// that is unique (a shared name names no guest), each with what the other
// and its host are. The shell matches what was typed against the words,
// so both are offered as far as they match it.
func guestCompletions(a *app, led *ledger.Ledger, typed string) ([]cobra.Completion, error) {
	insts, err := led.Instances(a.ctx)
	names := map[string]int{}
	for _, in := range insts {
		names[in.Name]++
	}
	var byUUID, byName []cobra.Completion
	for _, in := range insts {
		if strings.HasPrefix(in.UUID, typed) {
			byUUID = append(byUUID, cobra.CompletionWithDesc(in.UUID, in.Name+" on "+orDash(in.Host)))
		}
		if names[in.Name] == 1 && strings.HasPrefix(in.Name, typed) {
			byName = append(byName, cobra.CompletionWithDesc(in.Name, in.UUID+" on "+orDash(in.Host)))
		}
	}
	return append(byUUID, byName...), err
}

// firstArg completes a command's one positional argument with f, and
// nothing after it.
func firstArg(f cobra.CompletionFunc) cobra.CompletionFunc {
	return func(c *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return f(c, args, toComplete)
	}
}

// flagCompletions complete the flags of every command by name; the
// others complete file names.
var flagCompletions = map[string]cobra.CompletionFunc{
	"host":   completeHosts,
	"dest":   completeHosts,
	"guest":  completeGuests,
	"group":  completeGroups,
	"output": fixed([]string{"json", "table"}),
	"policy": fixed(api.DrainPolicies),
	"state":  fixed(append(words(guest.VMStates()), words(guest.TaskStates())...)),
	"op":     fixed(sim.Ops()),
	"at":     fixed(sim.Gates()),
}

// commandFlagCompletions complete a flag of one command whose name
// means something else elsewhere, by the command's path.
var commandFlagCompletions = map[string]map[string]cobra.CompletionFunc{
	"group create": {"policy": fixed([]ledger.GroupPolicy{ledger.PolicyAffinity, ledger.PolicyAntiAffinity,
		ledger.PolicySoftAffinity, ledger.PolicySoftAntiAffinity})},
}

// addCompletions registers the completions of c's flags.
func addCompletions(c *cobra.Command) {
	for name, f := range flagCompletions {
		if own, ok := commandFlagCompletions[pathOf(c)][name]; ok {
			f = own
		}
		if c.Flags().Lookup(name) != nil {
			if err := c.RegisterFlagCompletionFunc(name, f); err != nil {
				panic(err)
			}
		}
	}
}

func fixed[T ~string](values []T) cobra.CompletionFunc {
	return cobra.FixedCompletions(words(values), cobra.ShellCompDirectiveNoFileComp)
}

func words[T ~string](values []T) []cobra.Completion {
	out := make([]cobra.Completion, 0, len(values))
	for _, v := range values {
		if v != "" {
			out = append(out, string(v))
		}
	}
	return out
}
