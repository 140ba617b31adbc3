package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/workflows"
)

func init() {
	register("recover", "rebuild hosts' ledgers from their hypervisors after Redis lost data: recover [--host H]... [--dry-run] [--json]", recoverHosts)
	register("quarantine", "release a quarantine an operator has resolved: quarantine release --host H CLAIM", quarantine)
}

func recoverHosts(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("recover", flag.ContinueOnError)
	var hosts hostsFlag
	fs.Var(&hosts, "host", "a host to recover (repeatable; default: every registered host); a host whose ledger keys are all gone must be named")
	dryRun := fs.Bool("dry-run", false, "say what would be restored and quarantined, change nothing")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("recover takes no positional arguments, got %q: %w", strings.Join(pos, " "), errUsage)
	}
	return withApp(func(a *app) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		in := workflows.RecoverInput{Hosts: hosts, DryRun: *dryRun}
		id := fmt.Sprintf("recover-%s", time.Now().UTC().Format("20060102T150405.000Z"))
		run, err := c.ExecuteWorkflow(a.ctx, client.StartWorkflowOptions{
			ID: id, TaskQueue: a.cfg.TaskQueue,
			TypedSearchAttributes: temporal.NewSearchAttributes(workflows.StartAttributes(workflows.OpRecover, "")...),
			StaticSummary:         "ledger recovery from the hypervisors",
		}, workflows.Recover, in)
		if err != nil {
			return fmt.Errorf("recover: %w", err)
		}
		var res workflows.RecoverResult
		if err := run.Get(a.ctx, &res); err != nil {
			return fmt.Errorf("recover failed: %s", rootMessage(err))
		}
		if *asJSON {
			if err := writeJSON(stdout, res); err != nil {
				return err
			}
		} else {
			fmt.Fprint(stdout, workflows.RecoverReport(&res))
		}
		for _, h := range res.Hosts {
			if h.Changed() || len(h.Unresolved) > 0 {
				return nil
			}
		}
		return fmt.Errorf("recover: %s fine: every running domain agrees with its claims; nothing changed", hostWord(res))
	})
}

func hostWord(res workflows.RecoverResult) string {
	if len(res.Hosts) == 1 {
		return "host " + res.Hosts[0].Host + " is"
	}
	return fmt.Sprintf("all %d hosts are", len(res.Hosts))
}

// quarantine releases a quarantine claim: an operator's decision that the
// pCPUs it held are free (the domain that used them is gone or has a
// claim again). Any other kind of claim is refused.
func quarantine(args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "release" {
		return fmt.Errorf("quarantine: give release --host H CLAIM: %w", errUsage)
	}
	fs := flag.NewFlagSet("quarantine release", flag.ContinueOnError)
	host := fs.String("host", "", "the host the quarantine is on")
	pos, err := parseFlags(fs, args[1:])
	if err != nil {
		return err
	}
	if *host == "" || len(pos) != 1 {
		return fmt.Errorf("quarantine release: give --host H and one claim id: %w", errUsage)
	}
	return withApp(func(a *app) error {
		led, err := a.ledger()
		if err != nil {
			return err
		}
		cl, err := led.GetClaim(a.ctx, *host, pos[0])
		if errors.Is(err, ledger.ErrUnknownClaim) {
			return fmt.Errorf("quarantine release: host %s has no claim %q", *host, pos[0])
		}
		if err != nil {
			return err
		}
		if cl.Kind != ledger.KindQuarantine {
			return fmt.Errorf("quarantine release: claim %s on %s is a %s claim, not a quarantine; only quarantines are released by hand", cl.ID, *host, cl.Kind)
		}
		ok, err := led.ReleaseIfUnchanged(a.ctx, *host, cl.ID, cl.Token, cl.State)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("quarantine release: claim %s on %s changed meanwhile; look again", cl.ID, *host)
		}
		fmt.Fprintf(stdout, "quarantine %s on %s released: pCPUs %s are free\n", cl.ID, *host, claimCPUList(cl))
		return nil
	})
}

func claimCPUList(c *ledger.Claim) string {
	var s numa.CPUSet
	for _, u := range c.Usage {
		s = s.Union(u.PinnedCPUs)
	}
	return s.String()
}
