package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	enumspb "go.temporal.io/api/enums/v1"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/numa"
)

// opFlags are the flags every operation takes.
type opFlags struct {
	wait, json *bool
}

func addOpFlags(fs *pflag.FlagSet) opFlags {
	return opFlags{
		wait: fs.Bool("wait", false, "follow the operation until it ends; the exit status is its result"),
		json: outputFlags(fs),
	}
}

func bootCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "boot --name NAME --vcpus N --memory-mb N",
		Short: "boot a new guest, pinned as its flavor asks",
		Long: `Boot a guest of the flavor --vcpus, --memory-mb and --spec give, with the image
properties --image-prop gives; both are validated as Nova's API does before
anything starts. PCI devices come from the flavor's pci_passthrough:alias
(--spec pci_passthrough:alias=NAME:COUNT, with the aliases PINFLOW_PCI_ALIAS
defines) and from SR-IOV ports: --port name=NAME,physnet=NET,vnic=direct takes
a VF on physical network NET (vnic direct-physical a whole PF; normal ports
take none), placed on the guest's NUMA node as its policy asks (policy=
required, legacy, preferred or socket). Without --host pinflow chooses the host, and tries the next
one (up to three) when another operation took the room first. --group makes the
guest a member of a server group for life: every claim of it, on every move,
keeps the group's rule. The boot runs as workflow instance-<uuid>.`,
		Args: noArgs,
	}
	fs := c.Flags()
	name := fs.String("name", "", "guest name")
	host := fs.String("host", "", "host to boot on (default: pinflow chooses)")
	group := fs.String("group", "", "server group the guest joins for life ('pinflow group create')")
	vcpus := fs.Int("vcpus", 0, "vCPUs")
	memory := fs.Int64("memory-mb", 0, "memory, MiB")
	specs, props := keyValues{}, keyValues{}
	fs.Var(specs, "spec", "a flavor extra spec (repeatable), e.g. hw:cpu_policy=dedicated")
	fs.Var(props, "image-prop", "an image property (repeatable), e.g. hw_mem_page_size=2048")
	var ports []numa.Port
	fs.Var(portFlags{&ports}, "port", "a network port (repeatable), also taking policy= and trusted=")
	of := addOpFlags(fs)
	required(c, "name", "vcpus", "memory-mb")
	c.RunE = func(c *cobra.Command, _ []string) error {
		flavor := guest.Flavor{VCPUs: *vcpus, MemoryMB: *memory, ExtraSpecs: specs, ImageProps: props, Ports: ports}
		if *vcpus <= 0 || *memory <= 0 {
			return fmt.Errorf("boot %s: --vcpus %d --memory-mb %d: allowed are whole numbers from 1: %w", *name, *vcpus, *memory, errUsage)
		}
		if err := checkFlavorFlags("boot "+*name, c.Flags(), *vcpus, *memory); err != nil {
			return err
		}
		if _, err := flavor.Request(); err != nil {
			return fmt.Errorf("boot %s: %w", *name, err)
		}
		return withClient(func(a *app, pf *client.Client) error {
			op, err := pf.Boot(a.ctx, client.BootRequest{Name: *name, Flavor: flavor, Host: *host, Group: *group})
			if err != nil {
				return err
			}
			return started(a, c.OutOrStdout(), of, op)
		})
	}
	return c
}

// guestCommand is a command that runs an operation on the existing guest
// its one argument names.
func guestCommand(use, short, long string) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Long: long, Args: guestArg, ValidArgsFunction: guestUUIDs}
}

// guestOp runs an operation on the guest the command's argument names:
// start starts it, and --wait follows it.
func guestOp(fs *pflag.FlagSet, start func(a *app, pf *client.Client, ref string) (*client.Operation, error)) func(*cobra.Command, []string) error {
	of := addOpFlags(fs)
	return func(c *cobra.Command, args []string) error {
		return withClient(func(a *app, pf *client.Client) error {
			op, err := start(a, pf, args[0])
			if err != nil {
				return err
			}
			return started(a, c.OutOrStdout(), of, op)
		})
	}
}

func migrateCommand() *cobra.Command {
	c := guestCommand("migrate GUEST", "live-migrate a guest, or cold-migrate it",
		`Live-migrate a guest to --dest, or to a host pinflow chooses. --cold powers
the guest off, moves it and starts it there: a resize to the same flavor,
which waits in VERIFY_RESIZE for 'pinflow resize confirm|revert' as a resize
does (see --confirm-window). --cold-fallback live-migrates, and cold-migrates
only when the hypervisor cannot live-migrate the guest.`)
	fs := c.Flags()
	dest := fs.String("dest", "", "destination host (default: pinflow chooses)")
	cold := fs.Bool("cold", false, "cold-migrate: power the guest off, move it, start it, then confirm or revert (resize confirm|revert)")
	fallback := fs.Bool("cold-fallback", false, "live-migrate, and cold-migrate instead if the hypervisor cannot live-migrate the guest")
	window := confirmWindowFlag(fs)
	c.PreRunE = func(_ *cobra.Command, args []string) error {
		switch {
		case *cold && *fallback:
			return fmt.Errorf("migrate %s: --cold and --cold-fallback exclude each other: %w", args[0], errUsage)
		case fs.Changed("confirm-window") && !*cold && !*fallback:
			return fmt.Errorf("migrate %s: --confirm-window is for a cold migration (--cold or --cold-fallback); a live migration has no confirm step: %w",
				args[0], errUsage)
		}
		return nil
	}
	c.RunE = guestOp(fs, func(a *app, pf *client.Client, ref string) (*client.Operation, error) {
		return pf.Migrate(a.ctx, ref, client.MigrateRequest{Dest: *dest, Cold: *cold, ColdFallback: *fallback, ConfirmWindow: time.Duration(*window)})
	})
	return c
}

func shelveCommand() *cobra.Command {
	c := guestCommand("shelve GUEST --offload", "shelve a guest and offload it from its host",
		`Shut the guest down cleanly (PINFLOW_SHUTDOWN_TIMEOUT), then offload it: its
pCPUs are freed and 'pinflow unshelve' brings it back onto a host.`)
	fs := c.Flags()
	offload := fs.Bool("offload", false, "offload the guest from its host (required: pinflow always offloads)")
	c.RunE = guestOp(fs, func(a *app, pf *client.Client, ref string) (*client.Operation, error) {
		if !*offload {
			return nil, fmt.Errorf("shelve %s: pinflow shelves by offloading; add --offload: %w", ref, errUsage)
		}
		return pf.Shelve(a.ctx, ref)
	})
	return c
}

func unshelveCommand() *cobra.Command {
	c := guestCommand("unshelve GUEST", "bring a shelved guest back onto a host", "")
	fs := c.Flags()
	host := fs.String("host", "", "host to unshelve on (default: pinflow chooses)")
	c.RunE = guestOp(fs, func(a *app, pf *client.Client, ref string) (*client.Operation, error) {
		return pf.Unshelve(a.ctx, ref, *host)
	})
	return c
}

func repinCommand() *cobra.Command {
	c := guestCommand("repin GUEST", "move a running guest's pinned vCPUs to other pCPUs of its host",
		`Move a running guest's pinned vCPUs (and a reserved emulator pCPU) to other
pCPUs of its host while it runs: no migration, no restart. Each guest cell's
pinned vCPUs take the --pcpus of its host cell in ascending order; without
--pcpus they take the lowest pCPUs of their cells that are free or its own, which
packs the host's guests together and frees whole cores. Each guest cell stays
on its host cell: its memory cannot follow the pins live.`)
	fs := c.Flags()
	pcpus := fs.String("pcpus", "", "the pCPUs to pin the guest to, such as 4-7 (default: the lowest free)")
	var set numa.CPUSet
	// Checked before anything connects: bad input changes nothing.
	c.PreRunE = func(*cobra.Command, []string) (err error) {
		if set, err = numa.Parse(*pcpus); err != nil {
			return fmt.Errorf("repin: --pcpus: %w: %w", err, errUsage)
		}
		return nil
	}
	c.RunE = guestOp(fs, func(a *app, pf *client.Client, ref string) (*client.Operation, error) {
		return pf.Repin(a.ctx, ref, set)
	})
	return c
}

func deleteCommand() *cobra.Command {
	c := guestCommand("delete GUEST", "delete a guest and free its pCPUs", "")
	c.RunE = guestOp(c.Flags(), func(a *app, pf *client.Client, ref string) (*client.Operation, error) {
		return pf.Delete(a.ctx, ref)
	})
	return c
}

func cancelCommand() *cobra.Command {
	c := guestCommand("cancel GUEST", "cancel the operation running on a guest; it compensates",
		`Cancel the operation running on a guest (workflow instance-<uuid>): its steps
are compensated in reverse and it ends in phase error. A resize waiting in
VERIFY_RESIZE reverts.`)
	of := addOpFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		return withClient(func(a *app, pf *client.Client) error {
			op, err := pf.Cancel(a.ctx, args[0])
			if err != nil {
				return err
			}
			if !*of.wait {
				if *of.json {
					return writeJSON(c.OutOrStdout(), startedView(op))
				}
				fmt.Fprintf(c.OutOrStdout(), "cancellation of the %s of %s requested; it compensates and ends in phase error\n", op.Kind, op.UUID)
				return nil
			}
			err = followOp(a, c.OutOrStdout(), *of.json, op, op.WaitEnd)
			if err == nil || errors.Is(err, errInterrupted) || !endedCancelled(a, pf, op) {
				return err
			}
			// Cancelled and compensated is what the operator asked for.
			if *of.json {
				return writeJSON(c.OutOrStdout(), map[string]string{"uuid": op.UUID, "operation": string(op.Kind), "outcome": "cancelled"})
			}
			fmt.Fprintf(c.OutOrStdout(), "the %s of %s was cancelled; its steps were compensated\n", op.Kind, op.UUID)
			return nil
		})
	}
	return c
}

// endedCancelled says whether op's run ended cancelled: undone in full. A
// run whose compensation failed ends failed instead.
func endedCancelled(a *app, pf *client.Client, op *client.Operation) bool {
	d, err := pf.Temporal().DescribeWorkflow(a.ctx, op.WorkflowID, op.RunID)
	return err == nil && d.RawResponse.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_CANCELED
}

func followCommand() *cobra.Command {
	c := guestCommand("follow GUEST", "follow the last operation on a guest again, to its end",
		`Follow the operation running on a guest until it ends, as --wait does, through
VERIFY_RESIZE: a resize waiting there is followed until a confirm, a revert
or its confirm window ends it. An operation that ended already is reported
as it ended. The exit status is its result.`)
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error {
		return withClient(func(a *app, pf *client.Client) error {
			op, err := pf.Follow(a.ctx, args[0])
			if err != nil {
				return err
			}
			return followOp(a, c.OutOrStdout(), *asJSON, op, op.WaitEnd)
		})
	}
	return c
}

// started reports an operation that started and, with --wait, follows it
// to the operator's next decision.
func started(a *app, stdout io.Writer, of opFlags, op *client.Operation) error {
	if *of.wait {
		return followOp(a, stdout, *of.json, op, op.Wait)
	}
	if *of.json {
		return writeJSON(stdout, startedView(op))
	}
	fmt.Fprintf(stdout, "%s %s started: workflow %s run %s\n", op.Kind, op.UUID, op.WorkflowID, op.RunID)
	return nil
}

func startedView(op *client.Operation) map[string]string {
	return map[string]string{"uuid": op.UUID, "workflow_id": op.WorkflowID, "run_id": op.RunID, "operation": string(op.Kind)}
}

// errInterrupted ends a command whose following an interrupt stopped;
// the operation goes on (exit 130, as a shell reports an interrupt).
var errInterrupted = errors.New("interrupted")

// followOp follows op with wait, printing its progress to stderr, and
// says where the guest is: at its end, or awaiting a confirm or revert.
// An interrupt stops the following, not the operation.
func followOp(a *app, stdout io.Writer, asJSON bool, op *client.Operation,
	wait func(context.Context, func(client.Progress)) (*client.Outcome, error)) error {
	ctx, stop := signal.NotifyContext(a.ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	pr := newProgressPrinter(os.Stderr)
	out, err := wait(ctx, func(p client.Progress) { pr.show(progressLine(op, p)) })
	pr.end()
	if err != nil && ctx.Err() != nil && a.ctx.Err() == nil {
		return fmt.Errorf("stopped following; the %s of %s continues ('pinflow cancel %s' stops it, 'pinflow follow %s' follows it again): %w",
			op.Kind, op.UUID, op.UUID, op.UUID, errInterrupted)
	}
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(stdout, out)
	}
	fmt.Fprintln(stdout, outcomeLine(out))
	return nil
}

// outcomeLine says in one line where an operation left the guest.
func outcomeLine(out *client.Outcome) string {
	where := "it runs on no host"
	if out.Host != "" {
		where = "it runs on " + out.Host
		if out.PCPUs != "" {
			where += ", pinned to pCPUs " + out.PCPUs
		}
	}
	if out.AwaitingDecision() {
		line := fmt.Sprintf("%s %s awaits confirmation (VERIFY_RESIZE): %s, and its source on %s is held; 'pinflow resize confirm %s' keeps it there, 'pinflow resize revert %s' takes it back",
			out.Operation, out.UUID, where, out.Source, out.UUID, out.UUID)
		if !out.ConfirmBy.IsZero() {
			line += fmt.Sprintf("; it confirms by itself at %s ('pinflow follow %s' waits for that)", out.ConfirmBy.Local().Format(time.RFC3339), out.UUID)
		}
		return line
	}
	var res struct {
		Outcome string `json:"outcome"`
	}
	_ = json.Unmarshal(out.Result, &res)
	verb := "completed"
	if res.Outcome != "" {
		verb = res.Outcome
	}
	switch {
	case out.Operation == api.OpDelete:
		return fmt.Sprintf("%s %s completed: the guest is gone", out.Operation, out.UUID)
	case out.Host == "":
		return fmt.Sprintf("%s %s %s: %s (vm_state %s)", out.Operation, out.UUID, verb, where, out.VMState)
	}
	return fmt.Sprintf("%s %s %s: %s", out.Operation, out.UUID, verb, where)
}

// progressLine is an operation's progress as the follower shows it.
func progressLine(op *client.Operation, p client.Progress) string {
	line := fmt.Sprintf("%s %s: %s %d%%", op.Kind, shortID(op.UUID), p.Phase, p.Progress)
	if p.Source != "" || p.Dest != "" {
		line += fmt.Sprintf(" [%s -> %s]", orDash(p.Source), orDash(p.Dest))
	}
	if p.Migrated >= 0 {
		line += fmt.Sprintf(" migrated %d%%", p.Migrated)
	}
	return line
}

// progressPrinter shows progress lines on w: rewritten in place on a
// terminal, a line each otherwise; a line like the last is not repeated.
type progressPrinter struct {
	w    *os.File
	tty  bool
	last string
}

func newProgressPrinter(w *os.File) *progressPrinter {
	return &progressPrinter{w: w, tty: isTerminal(w)}
}

func (p *progressPrinter) show(line string) {
	if line == "" || line == p.last {
		return
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
	p.last = line
}

func (p *progressPrinter) end() {
	if p.tty && p.last != "" {
		fmt.Fprintln(p.w)
	}
}

// guestView is a guest as `show --json` prints it.
type guestView struct {
	UUID      string  `json:"uuid"`
	Name      string  `json:"name"`
	Host      *string `json:"host"`
	VMState   string  `json:"vm_state"`
	TaskState *string `json:"task_state"`
	Flavor    any     `json:"flavor"`
	Placement any     `json:"placement"`
	ClaimID   string  `json:"claim_id,omitempty"`
	// Group is the guest's server group.
	Group string `json:"group,omitempty"`
	// Resize is where a resize in VERIFY_RESIZE (or an interrupted one)
	// comes from; no domain XML.
	Resize  *resizeView `json:"resize,omitempty"`
	Updated string      `json:"updated_at"`
	// LastOperation is the newest operation on the guest, with why it
	// failed when it did.
	LastOperation *client.Record `json:"last_operation,omitempty"`
}

type resizeView struct {
	SourceHost    string `json:"source_host"`
	SourceClaimID string `json:"source_claim_id"`
	OldFlavor     any    `json:"old_flavor"`
	Cold          bool   `json:"cold,omitempty"`
}

func showCommand() *cobra.Command {
	c := guestCommand("show GUEST", "show a guest: host, states, flavor, pinned pCPUs and its last operation", "")
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error { return show(args[0], asJSON, c.OutOrStdout()) }
	return c
}

func show(ref string, asJSON *bool, stdout io.Writer) error {
	return withClient(func(a *app, pf *client.Client) error {
		inst, err := pf.Instance(a.ctx, ref)
		if err != nil {
			return err
		}
		last, err := pf.LastOperation(a.ctx, inst.UUID)
		if err != nil {
			return err
		}
		v := guestView{UUID: inst.UUID, Name: inst.Name, VMState: string(inst.VMState), Flavor: inst.Request,
			ClaimID: inst.ClaimID, Group: inst.Group, Updated: inst.UpdatedAt.Format(time.RFC3339), LastOperation: last}
		if inst.Host != "" {
			v.Host = &inst.Host
		}
		if inst.TaskState != "" {
			ts := string(inst.TaskState)
			v.TaskState = &ts
		}
		if inst.Placement != nil {
			v.Placement = inst.Placement
		}
		if r := inst.Resize; r != nil {
			v.Resize = &resizeView{SourceHost: r.SourceHost, SourceClaimID: r.SourceClaimID, OldFlavor: r.OldFlavor, Cold: r.Cold}
		}
		if *asJSON {
			return writeJSON(stdout, v)
		}
		host, task, pins := "-", "-", "none"
		if v.Host != nil {
			host = *v.Host
		}
		if v.TaskState != nil {
			task = *v.TaskState
		}
		if inst.Placement != nil {
			pins = inst.Placement.String()
		}
		fmt.Fprintf(stdout, "%s  %s\n  host %s  vm_state %s  task_state %s\n  %d vCPUs, %d MiB%s\n  placement: %s\n",
			inst.UUID, inst.Name, host, inst.VMState, task, inst.Request.VCPUs, inst.Request.MemoryMB, client.SpecList(inst.Request.ExtraSpecs, inst.Request.ImageProps), pins)
		if line := devicesLine(inst.Request, inst.Placement); line != "" {
			fmt.Fprintf(stdout, "  devices: %s\n", line)
		}
		if inst.Group != "" {
			fmt.Fprintf(stdout, "  server group: %s ('pinflow group show %s')\n", inst.Group, inst.Group)
		}
		if r := inst.Resize; r != nil && inst.VMState == guest.VMResized {
			fmt.Fprintf(stdout, "  VERIFY_RESIZE: from %s, whose source hold %s is kept; it was %d vCPUs, %d MiB%s; 'pinflow resize confirm|revert %s'\n",
				r.SourceHost, r.SourceClaimID, r.OldFlavor.VCPUs, r.OldFlavor.MemoryMB, client.SpecList(r.OldFlavor.ExtraSpecs, r.OldFlavor.ImageProps), inst.UUID)
		}
		if last != nil {
			fmt.Fprintf(stdout, "  last operation: %s\n", recordLine(last))
		}
		return nil
	})
}

// devicesLine names the PCI devices a guest's placement takes, each with
// the alias or port it is for: "0000:81:10.1 (port data), 0000:05:00.0
// (alias gpu)"; "" when it takes none.
func devicesLine(f guest.Flavor, p *numa.Placement) string {
	if p == nil || len(p.Devices) == 0 {
		return ""
	}
	req, err := f.Request()
	var parts []string
	for _, t := range p.Devices {
		what := fmt.Sprintf("request %d", t.Request)
		if err == nil && t.Request < len(req.PCI) {
			switch r := req.PCI[t.Request]; {
			case r.Port != "":
				what = "port " + r.Port
			case r.Alias != "":
				what = "alias " + r.Alias
			}
		}
		for _, a := range t.Addresses {
			parts = append(parts, fmt.Sprintf("%s (%s)", a, what))
		}
	}
	return strings.Join(parts, ", ")
}

// recordLine says in one line how a run of an operation went.
func recordLine(r *client.Record) string {
	line := fmt.Sprintf("%s %s, started %s", r.Operation, r.Status, r.Start.Local().Format(time.RFC3339))
	if r.Status == "running" {
		line += fmt.Sprintf(", phase %s ('pinflow follow %s' follows it)", r.Phase, r.UUID)
	}
	if r.Reason != "" {
		line += ": " + r.Reason
	}
	return line
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
