package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/audit"
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
// claim again). The release runs on the worker, which asks the hypervisor
// and refuses while a domain still runs on those pCPUs; any other kind of
// claim is refused too.
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
		c, err := a.client()
		if err != nil {
			return err
		}
		id := workflows.QuarantineReleaseWorkflowID(*host, pos[0])
		in := audit.ReleaseQuarantineInput{Host: *host, ClaimID: pos[0]}
		run, err := startWorkflow(a, c, id, "", opPlan{op: workflows.OpUnquarantine, wf: workflows.ReleaseQuarantine, input: in,
			summary: "release quarantine " + pos[0] + " on " + *host, source: *host}, "")
		switch {
		case alreadyRunning(err):
			return fmt.Errorf("quarantine release: claim %s on %s is being released already (workflow %s)", pos[0], *host, id)
		case err != nil:
			return fmt.Errorf("quarantine release: %w", err)
		}
		var res audit.ReleasedQuarantine
		if err := run.Get(a.ctx, &res); err != nil {
			return fmt.Errorf("quarantine release: %s", rootMessage(err))
		}
		fmt.Fprintf(stdout, "quarantine %s on %s released: pCPUs %s are free\n", res.ClaimID, res.Host, res.CPUs)
		return nil
	})
}
