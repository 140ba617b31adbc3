package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/workflows"
)

// completionTimeout bounds a completion's look-up in the ledger: the
// shell waits for it, and no suggestion is better than a hung prompt.
const completionTimeout = time.Second

// fromLedger completes with what list reads from the ledger, and with
// nothing, silently, when no ledger answers in time.
func fromLedger(list func(a *app, led *ledger.Ledger) ([]cobra.Completion, error)) cobra.CompletionFunc {
	return func(c *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		setConnectionEnv(c.Flags())
		ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
		defer cancel()
		var out []cobra.Completion
		a, err := newApp(ctx)
		if err == nil {
			defer a.close()
			var led *ledger.Ledger
			if led, err = a.ledger(); err == nil {
				out, err = list(a, led)
			}
		}
		if err != nil {
			out = nil
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

var (
	completeHosts = fromLedger(sortedHosts)
	// completeGuests offers each guest's UUID with its name and host.
	completeGuests = fromLedger(func(a *app, led *ledger.Ledger) ([]cobra.Completion, error) {
		insts, err := led.Instances(a.ctx)
		var out []cobra.Completion
		for _, in := range insts {
			out = append(out, cobra.CompletionWithDesc(in.UUID, in.Name+" on "+orDash(in.Host)))
		}
		return out, err
	})
	hostNames  = firstArg(completeHosts)
	guestUUIDs = firstArg(completeGuests)
)

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
	"output": fixed([]string{"json", "table"}),
	"policy": fixed(workflows.DrainPolicies),
	"state":  fixed(append(words(guest.VMStates()), words(guest.TaskStates())...)),
	"op":     fixed(sim.Ops()),
	"at":     fixed(sim.Gates()),
}

// addCompletions registers the completions of c's flags.
func addCompletions(c *cobra.Command) {
	for name, f := range flagCompletions {
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
