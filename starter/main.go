// Command pinflow starts and inspects pinflow's workflows and runs its
// offline tools (NUMA fitting, domain XML patching).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime/debug"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/config"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// errUsage marks an error whose message is the whole story (exit 2).
var errUsage = errors.New("usage")

// quietRedis drops go-redis's own log lines; its errors reach the
// commands, which report them once.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func main() {
	err := dispatch(os.Args[1:], os.Stdout)
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "pinflow: "+operatorLine(err))
	os.Exit(exitCode(err))
}

// The exit statuses 'pinflow help' states.
const (
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130
)

// badInput marks the errors of a command line that cannot work as typed:
// a bad value, a contradiction, a name of nothing there.
var badInput = []error{errUsage, client.ErrInvalid, client.ErrUnknownGuest, client.ErrUnknownHost, client.ErrUnknownGroup,
	ledger.ErrUnknownHost, ledger.ErrUnknownInstance, ledger.ErrUnknownGroup}

// refusals mark the errors of an operation the state of a guest, host or
// group refused; like badInput's, their words end a message only to be
// matched.
var refusals = []error{client.ErrState, client.ErrHostDown, client.ErrBusy, client.ErrGroupRule}

// exitCode is the exit status of a command that ended in err: 2 for bad
// input, 130 for an interrupt, 1 for an operation refused or failed.
func exitCode(err error) int {
	var invalid *numa.InvalidRequestError
	var failed *client.OperationError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errInterrupted):
		return exitInterrupted
	case errors.As(err, &failed):
		// An operation that failed on the workers, whatever its kind.
		return exitFailed
	case errors.As(err, &invalid):
		return exitUsage
	}
	for _, mark := range badInput {
		if errors.Is(err, mark) {
			return exitUsage
		}
	}
	return exitFailed
}

// packagePrefix matches the Go package names that lead the errors of
// pinflow's libraries, where a message or a wrapped cause starts: the
// operator reads what went wrong, not where in the code.
// Nested prefixes ("ledger: claim C on H: numa: no fit: ") go together.
var packagePrefix = regexp.MustCompile(`(^|: )(?:(?:numa: invalid request|numa|ledger: claim \S+ on \S+|ledger|placement|guestxml|xmlpatch): )+`)

// operatorLine is err as the operator reads it: without the marks that
// only set the exit status and without package prefixes. A message that
// merely ends in a mark's words (a failure whose reason is "unknown
// host") keeps them.
func operatorLine(err error) string {
	msg := strings.TrimPrefix(err.Error(), "pinflow: ")
	for _, mark := range append(append([]error{errInterrupted}, badInput...), refusals...) {
		if errors.Is(err, mark) {
			msg = strings.TrimSuffix(msg, ": "+mark.Error())
		}
	}
	return packagePrefix.ReplaceAllString(msg, "$1")
}

// dispatch runs the command args name, printing to stdout.
func dispatch(args []string, stdout io.Writer) error {
	redis.SetLogger(quietRedis{})
	root := newRoot()
	// Completion parses the flags twice, which would look like repeats.
	if len(args) == 0 || !strings.HasPrefix(args[0], cobra.ShellCompRequestCmd) {
		walk(root, func(c *cobra.Command) {
			onlyOnce(c.Flags())
			onlyOnce(c.PersistentFlags())
		})
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	return root.Execute()
}

// newRoot builds the command tree; each call gives fresh flag values.
func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "pinflow",
		Short: "move CPU-pinned guests between hypervisor hosts",
		Long: `pinflow moves CPU-pinned, NUMA-placed guests between hypervisor hosts as
durable Temporal workflows, with every pinned pCPU owned by one claim in a
per-host Redis ledger. Connections come from the PINFLOW_* variables
('pinflow config' lists them); the connection flags override three of them.

Exit status: 0 when the command did what it says; 2 when the command line
cannot work as typed (a bad flag value, a misspelt extra spec, the name of
no guest, host, group or PCI alias), and nothing changed; 1 when an
operation was refused or failed (a busy guest, no host that fits, a server
group's rule, a workflow that failed); 130 when an interrupt stopped the
following of an operation, which goes on.`,
		Version:           buildVersion(),
		Args:              subcommand,
		RunE:              showHelp,
		PersistentPreRunE: prepare,
		SilenceErrors:     true,
		SilenceUsage:      true,
	}
	for _, f := range connectionFlags {
		root.PersistentFlags().String(f.name, "", f.usage+" (overrides "+f.env+")")
	}
	root.AddGroup(
		&cobra.Group{ID: "guests", Title: "Guests:"},
		&cobra.Group{ID: "hosts", Title: "Hosts:"},
		&cobra.Group{ID: "audit", Title: "Audit and ledger:"},
		&cobra.Group{ID: "dev", Title: "Developer tools:"},
	)
	grouped := map[string][]*cobra.Command{
		"guests": {bootCommand(), migrateCommand(), resizeCommand(), repinCommand(), shelveCommand(), unshelveCommand(),
			evacuateCommand(), deleteCommand(), cancelCommand(), followCommand(), showCommand(), opsCommand(), listCommand(), explainCommand(),
			groupCommand()},
		"hosts": {hostCommand()},
		"audit": {reconcileCommand(), recoverCommand(), quarantineCommand(), checkCommand()},
		"dev":   {numaCommand(), xmlCommand(), simCommand(), configCommand()},
	}
	for id, cmds := range grouped {
		for _, c := range cmds {
			c.GroupID = id
			root.AddCommand(c)
		}
	}
	root.AddCommand(docsCommand())
	root.InitDefaultHelpCmd()
	for _, c := range root.Commands() {
		if c.Name() == "help" {
			c.Args = helpTopic
		}
	}
	root.SetFlagErrorFunc(flagError)
	// Long flag descriptions wrap instead of running off the terminal.
	root.SetUsageTemplate(strings.ReplaceAll(root.UsageTemplate(), ".FlagUsages", ".FlagUsagesWrapped 100"))
	walk(root, addCompletions)
	return root
}

// walk calls f on c and every command under it.
func walk(c *cobra.Command, f func(*cobra.Command)) {
	f(c)
	for _, sub := range c.Commands() {
		walk(sub, f)
	}
}

// group makes a command that holds subcommands; alone it prints its help.
func group(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{Use: use, Short: short, Args: subcommand, RunE: showHelp}
	c.AddCommand(subs...)
	return c
}

func showHelp(c *cobra.Command, _ []string) error { return c.Help() }

// subcommand refuses an argument of a command that only holds
// subcommands: it names no command there.
func subcommand(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return unknownCommand(c, args[0])
}

// helpTopic refuses `pinflow help X` for an X that is no command.
func helpTopic(c *cobra.Command, args []string) error {
	cmd, rest, err := c.Root().Find(args)
	switch {
	case err != nil:
		return fmt.Errorf("help: %v: %w", err, errUsage)
	case len(rest) > 0:
		return unknownCommand(cmd, rest[0])
	}
	return nil
}

// unknownCommand names the bad command and the ones c has.
func unknownCommand(c *cobra.Command, name string) error {
	var names []string
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() {
			names = append(names, sub.Name())
		}
	}
	msg := fmt.Sprintf("unknown command %q", strings.TrimPrefix(c.CommandPath()+" "+name, c.Root().Name()+" "))
	if len(names) == 0 {
		return fmt.Errorf("%s; %s has no subcommands: %w", msg, c.CommandPath(), errUsage)
	}
	c.SuggestionsMinimumDistance = 2 // cobra's default, which it sets only on its own path
	if s := c.SuggestionsFor(name); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return fmt.Errorf("%s; allowed are %s: %w", msg, strings.Join(names, ", "), errUsage)
}

// pathOf is the command path without "pinflow", as messages name it.
func pathOf(c *cobra.Command) string {
	return strings.TrimPrefix(c.CommandPath(), c.Root().Name()+" ")
}

// takes declares a command's positional arguments with a cobra check;
// a wrong count is a usage error saying what the command takes.
func takes(check cobra.PositionalArgs, what string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if check(c, args) == nil {
			return nil
		}
		got := fmt.Sprint(len(args))
		if len(args) > 0 {
			got += ": " + strings.TrimSuffix(strings.TrimPrefix(fmt.Sprintf("%q", args), "["), "]")
		}
		return fmt.Errorf("%s takes %s, got %s: %w", pathOf(c), what, got, errUsage)
	}
}

var (
	noArgs   = takes(cobra.NoArgs, "no positional arguments")
	guestArg = takes(cobra.ExactArgs(1), "one guest (its UUID, a unique UUID prefix or its unique name)")
)

// hostArg takes one host NAME and checks it with the ledger's rules.
func hostArg(c *cobra.Command, args []string) error {
	if err := takes(cobra.ExactArgs(1), "one host NAME")(c, args); err != nil {
		return err
	}
	return checkHostArg(pathOf(c), args[0])
}

// prepare runs before every command: it names the command for
// telemetry, lets the connection flags override the environment, and
// refuses missing required flags and bad names before anything starts.
func prepare(c *cobra.Command, _ []string) error {
	invoked = pathOf(c)
	setConnectionEnv(c.Flags())
	var missing []string
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if _, ok := f.Annotations[cobra.BashCompOneRequiredFlag]; ok && !f.Changed {
			missing = append(missing, "--"+f.Name)
		}
	})
	switch len(missing) {
	case 0:
	case 1:
		return fmt.Errorf("%s: %s is required: %w", invoked, missing[0], errUsage)
	default:
		return fmt.Errorf("%s: %s and %s are required: %w", invoked, strings.Join(missing[:len(missing)-1], ", "), missing[len(missing)-1], errUsage)
	}
	if c.Flags().Changed("json") && c.Flags().Changed("output") {
		return fmt.Errorf("%s: --json is --output json; give one of them: %w", invoked, errUsage)
	}
	return checkNameFlags(invoked, c.Flags())
}

// required marks flags a command cannot run without.
func required(c *cobra.Command, names ...string) {
	for _, n := range names {
		if err := c.MarkFlagRequired(n); err != nil {
			panic(err)
		}
		c.Flags().Lookup(n).Usage += " (required)"
	}
}

// connectionFlags override the variables config.Load reads.
var connectionFlags = []struct{ name, env, usage string }{
	{"temporal-address", config.Prefix + "_TEMPORAL_ADDRESS", "Temporal frontend host:port, or several comma-separated"},
	{"namespace", config.Prefix + "_TEMPORAL_NAMESPACE", "Temporal namespace"},
	// A password in a flag shows in the process list; the variable keeps it out.
	{"redis-url", config.Prefix + "_REDIS_URL", "Redis of the ledger: redis://, rediss:// or unix:// URL"},
}

// setConnectionEnv sets the variable of each connection flag given, so
// that every later config.Load sees it.
func setConnectionEnv(fs *pflag.FlagSet) {
	for _, cf := range connectionFlags {
		if f := fs.Lookup(cf.name); f != nil && f.Changed {
			os.Setenv(cf.env, f.Value.String())
		}
	}
}

// flagError turns pflag's errors into one line naming the flag, the bad
// value and what is allowed (exit 2).
func flagError(c *cobra.Command, err error) error {
	var invalid *pflag.InvalidValueError
	var unknown *pflag.NotExistError
	var missing *pflag.ValueRequiredError
	switch {
	case errors.As(err, &invalid):
		f := invalid.GetFlag()
		why := invalid.Unwrap().Error()
		if allowed, ok := allowedValues[f.Value.Type()]; ok && !errors.Is(invalid, errTwice) {
			why = allowed
		}
		err = fmt.Errorf("--%s %q: %s", f.Name, invalid.GetValue(), why)
	case errors.As(err, &unknown) && c.HasAvailableSubCommands() && c.Flags().NArg() > 0:
		// "pinflow bot --name x": the word before the flag names no command.
		return unknownCommand(c, c.Flags().Arg(0))
	case errors.As(err, &unknown):
		err = fmt.Errorf("%v; '%s --help' lists the flags", err, c.CommandPath())
	case errors.As(err, &missing):
		err = fmt.Errorf("--%s needs a value", missing.GetFlag().Name)
	}
	return fmt.Errorf("%s: %w: %w", pathOf(c), err, errUsage)
}

// allowedValues says what pflag's own flag types take.
var allowedValues = map[string]string{
	"bool":     "allowed are true and false",
	"int":      "allowed are whole numbers",
	"int64":    "allowed are whole numbers",
	"float64":  "allowed are numbers",
	"duration": "allowed are durations such as 0, 90s, 2m or 1h30m",
}

// onlyOnce makes every flag of fs that takes one value refuse a second:
// the last one silently winning hides a typo in a script. A switch given
// twice says the same thing twice, and only refuses a contradiction.
func onlyOnce(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		switch f.Value.(type) {
		case pflag.SliceValue, keyValues: // repeatable
		case onceValue: // a persistent flag seen before
		default:
			f.Value = onceValue{Value: f.Value, flag: f}
		}
	})
}

var errTwice = errors.New("given twice; it takes one value")

type onceValue struct {
	pflag.Value
	flag *pflag.Flag
}

func (v onceValue) Set(s string) error {
	if v.flag.Changed && (v.Type() != "bool" || s != v.String()) {
		return errTwice
	}
	return v.Value.Set(s)
}

// outputFlags adds --output json|table and --json, its shorthand; the
// result says whether to print JSON.
func outputFlags(fs *pflag.FlagSet) *bool {
	asJSON := new(bool)
	fs.VarP((*outputFormat)(asJSON), "output", "o", "print json or a table for people")
	fs.BoolVar(asJSON, "json", false, "print JSON (--output json)")
	return asJSON
}

type outputFormat bool

func (o *outputFormat) Type() string { return "json|table" }

func (o *outputFormat) String() string {
	if *o {
		return "json"
	}
	return "table"
}

func (o *outputFormat) Set(s string) error {
	switch s {
	case "json", "table":
		*o = s == "json"
		return nil
	}
	return errors.New("allowed are json and table")
}

// version is the release, set at build time by the Makefile with
// -ldflags "-X main.version=$(git describe --tags --always --dirty)".
var version string

// buildVersion is what --version prints.
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return versionOf("", version, nil)
	}
	return versionOf(info.Main.Version, version, info.Settings)
}

// versionOf picks the version to print: the module's when it is a
// release (go install ...@v1.2.0), else the one set at build time (a
// clone built with make), else "(devel)" with the VCS revision the build
// recorded.
func versionOf(module, stamped string, settings []debug.BuildSetting) string {
	if module != "" && module != "(devel)" {
		return module
	}
	if stamped != "" {
		return stamped
	}
	v := "(devel)"
	for _, s := range settings {
		if s.Key == "vcs.revision" {
			v += " " + s.Value
		}
	}
	return v
}
