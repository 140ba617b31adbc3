package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/workflows"
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
anything starts. Without --host pinflow chooses the host, and tries the next
one (up to three) when another operation took the room first. The boot runs
as workflow instance-<uuid>.`,
		Args: noArgs,
	}
	fs := c.Flags()
	name := fs.String("name", "", "guest name")
	host := fs.String("host", "", "host to boot on (default: pinflow chooses)")
	vcpus := fs.Int("vcpus", 0, "vCPUs")
	memory := fs.Int64("memory-mb", 0, "memory, MiB")
	specs, props := keyValues{}, keyValues{}
	fs.Var(specs, "spec", "a flavor extra spec (repeatable), e.g. hw:cpu_policy=dedicated")
	fs.Var(props, "image-prop", "an image property (repeatable), e.g. hw_mem_page_size=2048")
	of := addOpFlags(fs)
	required(c, "name", "vcpus", "memory-mb")
	c.RunE = func(c *cobra.Command, _ []string) error {
		stdout := c.OutOrStdout()
		flavor := guest.Flavor{VCPUs: *vcpus, MemoryMB: *memory, ExtraSpecs: specs, ImageProps: props}
		if _, err := flavor.Request(); err != nil {
			return fmt.Errorf("boot %s: %w", *name, err)
		}
		return withApp(func(a *app) error {
			if *host != "" {
				if err := checkTarget(a, *host); err != nil {
					return err
				}
			}
			id := uuid.NewString()
			in := workflows.BootInput{UUID: id, Name: *name, Flavor: flavor, Host: *host}
			summary := fmt.Sprintf("boot %s (%d vCPUs, %d MiB)", *name, *vcpus, *memory)
			return runOp(a, stdout, of, id, opPlan{op: workflows.OpBoot, wf: workflows.Boot, input: in, summary: summary, dest: *host})
		})
	}
	return c
}

// opPlan is what an operation on an existing guest starts: its workflow
// input, the summary shown in the Web UI, and its hosts.
type opPlan struct {
	input        any
	summary      string
	source, dest string
	// op and wf are the operation and its workflow; a plan that leaves wf
	// unset runs the command's own (migrate --cold sets a Resize).
	op workflows.Operation
	wf any
}

// guestCommand is a command that runs an operation on the existing guest
// its one argument names.
func guestCommand(use, short, long string) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Long: long, Args: uuidArg, ValidArgsFunction: guestUUIDs}
}

// guestOp runs an operation on an existing guest: it loads the guest's
// record, and lets plan refuse the operation or say what to start.
func guestOp(fs *pflag.FlagSet, op workflows.Operation, wf any,
	plan func(a *app, inst *ledger.Instance) (opPlan, error)) func(*cobra.Command, []string) error {
	of := addOpFlags(fs)
	return func(c *cobra.Command, args []string) error {
		uuid, stdout := args[0], c.OutOrStdout()
		return withApp(func(a *app) error {
			inst, err := instance(a, uuid)
			if err != nil {
				return err
			}
			p, err := plan(a, inst)
			if err != nil {
				return err
			}
			if p.wf == nil {
				p.op, p.wf = op, wf
			}
			return runOp(a, stdout, of, uuid, p)
		})
	}
}

func migrateCommand() *cobra.Command {
	c := guestCommand("migrate UUID", "live-migrate a guest, or cold-migrate it",
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
	c.RunE = guestOp(fs, workflows.OpLiveMigration, workflows.LiveMigration,
		func(a *app, inst *ledger.Instance) (opPlan, error) {
			if *cold {
				if *fallback {
					return opPlan{}, fmt.Errorf("migrate %s: --cold and --cold-fallback exclude each other: %w", inst.UUID, errUsage)
				}
				return coldMigrate(a, inst, *dest, *window)
			}
			w, err := windowInput(*window)
			if err != nil {
				return opPlan{}, err
			}
			if err := activities.InfoOf(inst).CanLiveMigrate(); err != nil {
				return opPlan{}, refused(err)
			}
			if *dest != "" {
				if err := checkTarget(a, *dest); err != nil {
					return opPlan{}, err
				}
				if *dest == inst.Host {
					return opPlan{}, fmt.Errorf("migrate %s: it already runs on %s; choose another --dest", inst.UUID, *dest)
				}
			}
			summary := fmt.Sprintf("live-migrate %s from %s to %s", inst.Name, inst.Host, orChosen(*dest))
			in := workflows.LiveMigrationInput{UUID: inst.UUID, Dest: *dest}
			if *fallback {
				in.ColdFallback, in.ConfirmWindow = true, w
				summary += " (cold if it cannot be live)"
			}
			return opPlan{input: in, summary: summary, source: inst.Host, dest: *dest}, nil
		})
	return c
}

func shelveCommand() *cobra.Command {
	c := guestCommand("shelve UUID --offload", "shelve a guest and offload it from its host",
		`Shut the guest down cleanly (PINFLOW_SHUTDOWN_TIMEOUT), then offload it: its
pCPUs are freed and 'pinflow unshelve' brings it back onto a host.`)
	fs := c.Flags()
	offload := fs.Bool("offload", false, "offload the guest from its host (required: pinflow always offloads)")
	c.RunE = guestOp(fs, workflows.OpShelveOffload, workflows.ShelveOffload,
		func(a *app, inst *ledger.Instance) (opPlan, error) {
			if !*offload {
				return opPlan{}, fmt.Errorf("shelve %s: pinflow shelves by offloading; add --offload: %w", inst.UUID, errUsage)
			}
			if err := activities.InfoOf(inst).CanShelve(); err != nil {
				return opPlan{}, refused(err)
			}
			summary := fmt.Sprintf("shelve and offload %s from %s", inst.Name, inst.Host)
			return opPlan{input: workflows.ShelveOffloadInput{UUID: inst.UUID}, summary: summary, source: inst.Host}, nil
		})
	return c
}

func unshelveCommand() *cobra.Command {
	c := guestCommand("unshelve UUID", "bring a shelved guest back onto a host", "")
	fs := c.Flags()
	host := fs.String("host", "", "host to unshelve on (default: pinflow chooses)")
	c.RunE = guestOp(fs, workflows.OpUnshelve, workflows.Unshelve,
		func(a *app, inst *ledger.Instance) (opPlan, error) {
			if err := activities.InfoOf(inst).CanUnshelve(); err != nil {
				return opPlan{}, refused(err)
			}
			if *host != "" {
				if err := checkTarget(a, *host); err != nil {
					return opPlan{}, err
				}
			}
			summary := fmt.Sprintf("unshelve %s onto %s", inst.Name, orChosen(*host))
			return opPlan{input: workflows.UnshelveInput{UUID: inst.UUID, Host: *host}, summary: summary, dest: *host}, nil
		})
	return c
}

func deleteCommand() *cobra.Command {
	c := guestCommand("delete UUID", "delete a guest and free its pCPUs", "")
	c.RunE = guestOp(c.Flags(), workflows.OpDelete, workflows.Delete,
		func(a *app, inst *ledger.Instance) (opPlan, error) {
			return opPlan{input: workflows.DeleteInput{UUID: inst.UUID}, summary: "delete " + inst.Name, source: inst.Host}, nil
		})
	return c
}

func cancelCommand() *cobra.Command {
	c := guestCommand("cancel UUID", "cancel the operation running on a guest; it compensates",
		`Cancel the workflow instance-<uuid>: its steps are compensated in reverse and
it ends in phase error. A resize waiting in VERIFY_RESIZE reverts.`)
	c.RunE = func(c *cobra.Command, args []string) error { return cancelOp(args[0], c.OutOrStdout()) }
	return c
}

func cancelOp(uuid string, stdout io.Writer) error {
	return withApp(func(a *app) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		id := guest.InstanceWorkflowID(uuid)
		// A cancel of an operation that ended is accepted by Temporal and
		// does nothing: refuse it instead of saying it was requested.
		d, err := c.DescribeWorkflow(a.ctx, id, "")
		var nf *serviceerror.NotFound
		switch {
		case errors.As(err, &nf):
			return fmt.Errorf("cancel %s: no operation is running on it", uuid)
		case err != nil:
			return fmt.Errorf("cancel %s: %w", uuid, err)
		case d.Status != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING:
			return fmt.Errorf("cancel %s: no operation is running on it (the last one, %s, is %s)", uuid,
				d.WorkflowType.Name, strings.ToLower(strings.TrimPrefix(d.Status.String(), "WORKFLOW_EXECUTION_STATUS_")))
		}
		if err := c.CancelWorkflow(a.ctx, id, ""); err != nil {
			if errors.As(err, &nf) {
				return fmt.Errorf("cancel %s: no operation is running on it", uuid)
			}
			return fmt.Errorf("cancel %s: %w", uuid, err)
		}
		fmt.Fprintf(stdout, "cancellation of %s requested; it compensates and ends in phase error\n", guest.InstanceWorkflowID(uuid))
		return nil
	})
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
	// Resize is where a resize in VERIFY_RESIZE (or an interrupted one)
	// comes from; no domain XML.
	Resize  *resizeView `json:"resize,omitempty"`
	Updated string      `json:"updated_at"`
}

type resizeView struct {
	SourceHost    string `json:"source_host"`
	SourceClaimID string `json:"source_claim_id"`
	OldFlavor     any    `json:"old_flavor"`
	Cold          bool   `json:"cold,omitempty"`
}

func showCommand() *cobra.Command {
	c := guestCommand("show UUID", "show a guest: host, states, flavor and pinned pCPUs", "")
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error { return show(args[0], asJSON, c.OutOrStdout()) }
	return c
}

func show(uuid string, asJSON *bool, stdout io.Writer) error {
	return withApp(func(a *app) error {
		inst, err := instance(a, uuid)
		if err != nil {
			return err
		}
		v := guestView{UUID: inst.UUID, Name: inst.Name, VMState: string(inst.VMState), Flavor: inst.Request,
			ClaimID: inst.ClaimID, Updated: inst.UpdatedAt.Format(time.RFC3339)}
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
			inst.UUID, inst.Name, host, inst.VMState, task, inst.Request.VCPUs, inst.Request.MemoryMB, specList(inst.Request.ExtraSpecs, inst.Request.ImageProps), pins)
		if r := inst.Resize; r != nil && inst.VMState == guest.VMResized {
			fmt.Fprintf(stdout, "  VERIFY_RESIZE: from %s, whose source hold %s is kept; it was %d vCPUs, %d MiB%s; 'pinflow resize confirm|revert %s'\n",
				r.SourceHost, r.SourceClaimID, r.OldFlavor.VCPUs, r.OldFlavor.MemoryMB, specList(r.OldFlavor.ExtraSpecs, r.OldFlavor.ImageProps), inst.UUID)
		}
		return nil
	})
}

// specList renders extra specs and image properties as " KEY=VALUE ...".
func specList(specs, props map[string]string) string {
	var parts []string
	for _, m := range []map[string]string{specs, props} {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			parts = append(parts, k+"="+m[k])
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return ", " + strings.Join(parts, " ")
}

func orChosen(host string) string {
	if host == "" {
		return "a host pinflow chooses"
	}
	return host
}

func instance(a *app, uuid string) (*ledger.Instance, error) {
	led, err := a.ledger()
	if err != nil {
		return nil, err
	}
	inst, err := led.Instance(a.ctx, uuid)
	if errors.Is(err, ledger.ErrUnknownInstance) {
		return nil, fmt.Errorf("unknown instance %q; 'pinflow list' shows the guests", uuid)
	}
	return inst, err
}

// refused turns an activity's application error into a plain CLI error.
func refused(err error) error {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		return errors.New(appErr.Message())
	}
	return err
}

func checkHost(a *app, host string) error {
	led, err := a.ledger()
	if err != nil {
		return err
	}
	hosts, err := sortedHosts(a, led)
	if err != nil {
		return err
	}
	for _, h := range hosts {
		if h == host {
			return nil
		}
	}
	return fmt.Errorf("unknown host %q; registered hosts are %s", host, strings.Join(hosts, ", "))
}

// checkTarget refuses a host that is unknown or takes no guests now. A
// disabled host takes the guests an operator sends it by name.
func checkTarget(a *app, host string) error {
	_, st, err := hostStatus(a, host)
	if err != nil {
		return err
	}
	if st.State == ledger.HostDisabled {
		fmt.Fprintf(os.Stderr, "pinflow: note: host %s is disabled (%s); it takes this guest because it was named\n", host, st.Reason)
		return nil
	}
	if st.State != ledger.HostUp {
		return fmt.Errorf("host %s is %s (%s) and takes no guests; choose another, or bring it back with 'pinflow host up %s'", host, st.State, st.Reason, host)
	}
	return nil
}

// runOp starts the operation p plans under the guest's workflow id and,
// with --wait, follows it to the end.
func runOp(a *app, stdout io.Writer, of opFlags, uuid string, p opPlan) error {
	run, err := startOp(a, uuid, p.op, p.wf, p)
	if err != nil {
		return err
	}
	id := run.GetID()
	if !*of.wait {
		if *of.json {
			return writeJSON(stdout, map[string]string{"uuid": uuid, "workflow_id": id, "run_id": run.GetRunID(), "operation": string(p.op)})
		}
		fmt.Fprintf(stdout, "%s %s started: workflow %s run %s\n", p.op, uuid, id, run.GetRunID())
		return nil
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	return follow(a, c, stdout, of, run, uuid, p.op)
}

// startOp starts the operation p plans under the guest's workflow id.
func startOp(a *app, uuid string, op workflows.Operation, wf any, p opPlan) (client.WorkflowRun, error) {
	c, err := a.client()
	if err != nil {
		return nil, err
	}
	p.op, p.wf = op, wf
	run, err := startWorkflow(a, c, guest.InstanceWorkflowID(uuid), uuid, p, fmt.Sprintf("instance `%s`, operation **%s**", uuid, op))
	if alreadyRunning(err) {
		return nil, busy(a, c, uuid)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", op, uuid, err)
	}
	return run, nil
}

// startWorkflow starts p's workflow under id, for the guest uuid (empty
// for an operation on a whole host), with its hosts as search attributes
// and details for the Web UI. An id runs one workflow at a time: while one
// runs, the start fails and alreadyRunning says so.
func startWorkflow(a *app, c client.Client, id, uuid string, p opPlan, details string) (client.WorkflowRun, error) {
	attrs := workflows.StartAttributes(p.op, uuid)
	if p.source != "" {
		attrs = append(attrs, workflows.AttrSourceHost.ValueSet(p.source))
	}
	if p.dest != "" {
		attrs = append(attrs, workflows.AttrDestHost.ValueSet(p.dest))
	}
	return c.ExecuteWorkflow(a.ctx, client.StartWorkflowOptions{
		ID:                                       id,
		TaskQueue:                                a.cfg.TaskQueue,
		WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowIDReusePolicy:                    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		TypedSearchAttributes:                    temporal.NewSearchAttributes(attrs...),
		StaticSummary:                            p.summary,
		StaticDetails:                            details,
	}, p.wf, p.input)
}

// update runs the Update name with args on the workflow id's running run
// and waits until the workflow has completed it. A refusal of its
// validator is the error, which rootMessage says in one line.
func update(a *app, c client.Client, id, name string, args ...any) (client.WorkflowUpdateHandle, error) {
	h, err := c.UpdateWorkflow(a.ctx, client.UpdateWorkflowOptions{WorkflowID: id, UpdateName: name,
		Args: args, WaitForStage: client.WorkflowUpdateStageCompleted})
	if err == nil {
		err = h.Get(a.ctx, nil)
	}
	return h, err
}

// alreadyRunning says whether a start failed because a workflow runs under
// its id already.
func alreadyRunning(err error) bool {
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	return errors.As(err, &started)
}

// busy explains that another operation holds the guest's workflow id.
func busy(a *app, c client.Client, uuid string) error {
	id := guest.InstanceWorkflowID(uuid)
	what := "another operation"
	if d, err := c.DescribeWorkflow(a.ctx, id, ""); err == nil {
		what = "a " + d.WorkflowType.Name
	}
	return fmt.Errorf("instance %s is busy: %s is running as workflow %s; wait for it or cancel it with 'pinflow cancel %s'", uuid, what, id, uuid)
}

// follow prints a progress line while the operation runs and returns its
// outcome: nil when it completed, its error otherwise.
func follow(a *app, c client.Client, stdout io.Writer, of opFlags, run client.WorkflowRun, uuid string, op workflows.Operation) error {
	var result any
	err := waitShowingProgress(a.ctx, run, &result, func() string { return progressLine(a.ctx, c, run, op, uuid) })
	if err != nil {
		return fmt.Errorf("%s %s failed: %s", op, uuid, rootMessage(err))
	}
	if *of.json {
		return writeJSON(stdout, result)
	}
	fmt.Fprintf(stdout, "%s %s completed\n", op, uuid)
	return nil
}

// waitShowingProgress waits for run's result into result and meanwhile
// prints line() to stderr whenever it changes: rewritten in place on a
// terminal, a line each otherwise. An empty line is not shown.
func waitShowingProgress(ctx context.Context, run client.WorkflowRun, result any, line func() string) error {
	done := make(chan error, 1)
	go func() { done <- run.Get(ctx, result) }()
	tty := isTerminal(os.Stderr)
	last := ""
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if tty && last != "" {
				fmt.Fprintln(os.Stderr)
			}
			return err
		case <-tick.C:
			l := line()
			if l == "" || l == last {
				continue
			}
			if tty {
				fmt.Fprintf(os.Stderr, "\r\033[K%s", l)
			} else {
				fmt.Fprintln(os.Stderr, l)
			}
			last = l
		}
	}
}

// queryStatus asks a running operation for its status.
func queryStatus(ctx context.Context, c client.Client, run client.WorkflowRun) (workflows.Status, bool) {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var st workflows.Status
	v, err := c.QueryWorkflow(qctx, run.GetID(), run.GetRunID(), workflows.StatusQuery)
	if err != nil || v.Get(&st) != nil {
		return st, false
	}
	return st, true
}

// progressLine reads the operation's status query and, while it
// migrates, the migration's heartbeat progress.
func progressLine(ctx context.Context, c client.Client, run client.WorkflowRun, op workflows.Operation, uuid string) string {
	st, ok := queryStatus(ctx, c, run)
	if !ok {
		return ""
	}
	line := fmt.Sprintf("%s %s: %s %d%%", op, shortID(uuid), st.Phase, st.Progress)
	if st.Source != "" || st.Dest != "" {
		line += fmt.Sprintf(" [%s -> %s]", orDash(st.Source), orDash(st.Dest))
	}
	if st.Phase == workflows.PhaseRunning {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if d, err := c.DescribeWorkflow(qctx, run.GetID(), run.GetRunID()); err == nil {
			for _, pa := range d.RawResponse.GetPendingActivities() {
				var p hypervisor.Progress
				if pa.GetHeartbeatDetails() != nil && converter.GetDefaultDataConverter().FromPayloads(pa.GetHeartbeatDetails(), &p) == nil {
					line += fmt.Sprintf(" migrated %d%%", p.Percent)
				}
			}
		}
	}
	return line
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// rootMessage is the innermost application error's message: what went
// wrong, without the workflow and activity wrappers around it.
func rootMessage(err error) string {
	var canceled *temporal.CanceledError
	if errors.As(err, &canceled) {
		return "cancelled; its steps were compensated"
	}
	msg := err.Error()
	for e := err; e != nil; e = errors.Unwrap(e) {
		if appErr, ok := e.(*temporal.ApplicationError); ok {
			msg = appErr.Message()
		}
	}
	return msg
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
