package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// run runs pinflow with args in this process and returns its output.
func run(args ...string) (string, error) {
	var out bytes.Buffer
	err := dispatch(args, &out)
	return out.String(), err
}

// allCommands lists every command of the tree but cobra's hidden
// completion requests.
func allCommands() []*cobra.Command {
	var cmds []*cobra.Command
	walk(newRoot(), func(c *cobra.Command) {
		if !c.Hidden {
			cmds = append(cmds, c)
		}
	})
	return cmds
}

func argsOf(c *cobra.Command) []string {
	return strings.Fields(strings.TrimPrefix(c.CommandPath(), "pinflow"))
}

// refusedAsUsage checks that err is a usage error (exit 2) of one line
// containing each of want.
func refusedAsUsage(t *testing.T, args []string, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, errUsage) {
		t.Errorf("pinflow %s = %v, want a usage error (exit 2)", strings.Join(args, " "), err)
		return
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("pinflow %s: error %q, want one line", strings.Join(args, " "), err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("pinflow %s: error %q, want it to name %q", strings.Join(args, " "), err, w)
		}
	}
}

// TestHelpOfEveryCommand: --help, -h and `pinflow help X` succeed for every
// command and show each of its flags; a group alone prints its help.
func TestHelpOfEveryCommand(t *testing.T) {
	for _, c := range allCommands() {
		path := argsOf(c)
		if len(c.Short) == 0 || len(c.Short) >= 80 {
			t.Errorf("pinflow %s: summary %q, want one of under 80 characters", c.CommandPath(), c.Short)
		}
		for _, args := range [][]string{append(path, "--help"), append(path, "-h"), append([]string{"help"}, path...)} {
			out, err := run(args...)
			if err != nil {
				t.Errorf("pinflow %s = %v, want its help", strings.Join(args, " "), err)
				continue
			}
			if !strings.Contains(out, "Usage:") {
				t.Errorf("pinflow %s printed no usage:\n%s", strings.Join(args, " "), out)
			}
			c.Flags().VisitAll(func(f *pflag.Flag) {
				if !strings.Contains(out, "--"+f.Name+" ") {
					t.Errorf("pinflow %s does not show --%s:\n%s", strings.Join(args, " "), f.Name, out)
				}
			})
			for _, line := range strings.Split(out, "\n") {
				if len(line) > 100 {
					t.Errorf("pinflow %s: line of %d characters, want at most 100: %q", strings.Join(args, " "), len(line), line)
				}
			}
			for _, sub := range c.Commands() {
				if sub.IsAvailableCommand() && !strings.Contains(out, "\n  "+sub.Name()+" ") {
					t.Errorf("pinflow %s does not list its command %s:\n%s", strings.Join(args, " "), sub.Name(), out)
				}
			}
		}
	}
	for _, group := range [][]string{{"host"}, {"sim"}, {"xml"}, {"numa"}, {"quarantine"}, {}} {
		out, err := run(group...)
		if err != nil || !strings.Contains(out, "Usage:") || !strings.Contains(out, "Flags:") {
			t.Errorf("pinflow %s = %v, want its help:\n%s", strings.Join(group, " "), err, out)
		}
	}
	if out, _ := run(); !strings.Contains(out, "Guests:") || !strings.Contains(out, "Developer tools:") {
		t.Errorf("pinflow's help does not show its command groups:\n%s", out)
	}
}

// TestUsageErrors: unknown commands and flags, a single-value flag given
// twice and a bad --output are refused with one line (exit 2), before any
// connection is made.
func TestUsageErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"nope"}, []string{`unknown command "nope"`, "boot", "host"}},
		{[]string{"host", "nope"}, []string{`unknown command "host nope"`, "add", "drain"}},
		{[]string{"hots"}, []string{"did you mean host or ops?"}},
		{[]string{"help", "nope"}, []string{`unknown command "nope"`}},
		{[]string{"help", "host", "nope"}, []string{`unknown command "host nope"`}},
		{[]string{"list", "--output", "xml"}, []string{`--output "xml"`, "json and table"}},
		{[]string{"list", "a"}, []string{"list takes no positional arguments", `"a"`}},
		{[]string{"migrate"}, []string{"migrate takes one guest (its UUID, a unique UUID prefix or its unique name), got 0"}},
		{[]string{"host", "drain", "--settle", "soon", "a"}, []string{`--settle "soon"`, "durations"}},
		{[]string{"boot", "--vcpus", "1"}, []string{"--memory-mb and --name are required"}},
		{[]string{"migrate", "u", "--dest", ""}, []string{"--dest is empty"}},
		{[]string{"boot", "--name", "x", "--vcpus", "1", "--memory-mb", "512", "--group", ""}, []string{"--group is empty; give a name, or leave --group out"}},
		{[]string{"boot", "--name", "x", "--vcpus", "1", "--memory-mb", "512", "--group", "a b"}, []string{"--group"}},
		{[]string{"resize", "u", "--vcpus", "0"}, []string{"--vcpus 0: allowed are whole numbers from 1, or the flag left out"}},
		{[]string{"boot", "--name", "x", "--vcpus", "1", "--memory-mb", "4"}, []string{"--memory-mb 4: allowed are 128 MiB"}},
		{[]string{"resize", "u", "--memory-mb", "127"}, []string{"--memory-mb 127: allowed are 128 MiB"}},
		{[]string{"boot", "--name", "x", "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated", "--spec", "hw:cpu_policy=shared"},
			[]string{`--spec "hw:cpu_policy=shared": hw:cpu_policy given twice`}},
		{[]string{"resize", "u", "--vcpus", "2", "--confirm-window", "0"}, []string{`--confirm-window "0"`, "never for no automatic confirm"}},
		{[]string{"migrate", "u", "--confirm-window", "2h"}, []string{"--confirm-window is for a cold migration", "a live migration has no confirm step"}},
	} {
		_, err := run(tt.args...)
		refusedAsUsage(t, tt.args, err, tt.want...)
	}
	for _, c := range allCommands() {
		if !c.Runnable() {
			continue
		}
		args := append(argsOf(c), "--no-such-flag")
		_, err := run(args...)
		refusedAsUsage(t, args, err, "unknown flag: --no-such-flag")
		// Every flag that takes one value, the root's included.
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			switch f.Value.(type) {
			case pflag.SliceValue, keyValues, portFlags:
				return
			}
			first, second := f.DefValue, f.DefValue
			switch {
			case f.Value.Type() == "bool":
				first, second = "true", "false"
			case f.Value.Type() == "DURATION|never":
				first, second = "never", "never"
			case first == "":
				first, second = "x", "x"
			}
			args := append(argsOf(c), "--"+f.Name+"="+first, "--"+f.Name+"="+second)
			_, err := run(args...)
			refusedAsUsage(t, args, err, "--"+f.Name+" ", "given twice")
		})
	}
}

// TestRepeatableFlags: --spec, --image-prop and a list's --host are taken
// as often as given, and a switch given twice is taken once; these
// commands get past their flags to the ledger.
func TestRepeatableFlags(t *testing.T) {
	t.Setenv("PINFLOW_REDIS_URL", "redis://127.0.0.1:1/0")
	for _, args := range [][]string{
		{"boot", "--name", "x", "--vcpus", "2", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated", "--spec", "hw:mem_page_size=large",
			"--image-prop", "hw_mem_page_size=2048", "--image-prop", "hw_cpu_thread_policy=prefer"},
		{"reconcile", "--host", "a", "--host", "b"},
		{"recover", "--host", "a", "--host", "b", "--dry-run"},
		{"list", "--json", "--json"},
	} {
		_, err := run(args...)
		if err == nil || errors.Is(err, errUsage) || !strings.Contains(err.Error(), "127.0.0.1:1") {
			t.Errorf("pinflow %s = %v, want it to reach the ledger at 127.0.0.1:1", strings.Join(args, " "), err)
		}
	}
}

// TestConnectionFlags: --redis-url overrides PINFLOW_REDIS_URL.
func TestConnectionFlags(t *testing.T) {
	t.Setenv("PINFLOW_REDIS_URL", "redis://127.0.0.1:2/0")
	_, err := run("--redis-url", "redis://127.0.0.1:1/0", "host", "list")
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1:") {
		t.Errorf("pinflow --redis-url redis://127.0.0.1:1/0 host list = %v, want it to reach 127.0.0.1:1", err)
	}
}

func TestVersionAndCompletionScripts(t *testing.T) {
	if out, err := run("--version"); err != nil || !strings.HasPrefix(out, "pinflow version ") || len(strings.TrimSpace(out)) <= len("pinflow version") {
		t.Errorf("pinflow --version = %q, %v; want a version", out, err)
	}
	for shell, want := range map[string]string{"bash": "bash completion", "zsh": "#compdef pinflow", "fish": "complete -c pinflow"} {
		if out, err := run("completion", shell); err != nil || !strings.Contains(out, want) {
			t.Errorf("pinflow completion %s = %v, want a script containing %q; got %.200s", shell, err, want, out)
		}
	}
}

// TestCompletionFromLedger: host names and guest UUIDs complete from the
// ledger, and nothing, silently, when no ledger answers.
func TestCompletionFromLedger(t *testing.T) {
	ctx := context.Background()
	r := testenv.StartRedis(t)
	t.Setenv("PINFLOW_REDIS_URL", r.URL())
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	led, err := ledger.New(rdb, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	spec := numa.HostSpec{Cells: []numa.CellSpec{{ID: 0, CPUs: []int{0, 1, 2, 3}, MemoryMB: 4096}}}
	topo, err := spec.Host(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"h1", "h2"} {
		if _, err := led.RegisterHost(ctx, h, topo); err != nil {
			t.Fatal(err)
		}
	}
	if err := led.CreateGroup(ctx, ledger.Group{Name: "g1", Policy: ledger.PolicyAffinity}); err != nil {
		t.Fatal(err)
	}
	const id = "0f8fad5b-d9cb-469f-a165-70867728950e"
	if _, err := led.CreateInstance(ctx, id, "db", guest.Flavor{VCPUs: 1, MemoryMB: 512}, guest.VMBuilding, "test"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"host", "show", ""}, []string{"h1", "h2"}},
		{[]string{"migrate", "x", "--dest", "h"}, []string{"h1", "h2"}},
		{[]string{"list", "--host", ""}, []string{"h1", "h2"}},
		{[]string{"show", ""}, []string{id + "\tdb on -", "db\t" + id + " on -"}},
		{[]string{"host", "drain", "--policy", ""}, []string{"live", "cold", "live-then-cold"}},
		{[]string{"show", id, ""}, nil},
		{[]string{"follow", "0f8"}, []string{id + "\tdb on -"}},
		{[]string{"ops", ""}, []string{id + "\tdb on -", "db\t" + id + " on -"}},
		{[]string{"ops", "--host", ""}, []string{"h1", "h2"}},
		{[]string{"explain", "db"}, []string{"db\t" + id + " on -"}},
		{[]string{"explain", "--host", "h"}, []string{"h1", "h2"}},
		{[]string{"host", "drain", "status", ""}, []string{"h1", "h2"}},
		{[]string{"host", "undrain", ""}, []string{"h1", "h2"}},
		{[]string{"host", "remove", ""}, []string{"h1", "h2"}},
		{[]string{"resize", "--output", ""}, []string{"json", "table"}},
		{[]string{"migrate", "d"}, []string{"db\t" + id + " on -"}},
		{[]string{"host", "drain", "h"}, []string{"h1", "h2"}},
		{[]string{"host", "plan-drain", "h"}, []string{"h1", "h2"}},
		{[]string{"boot", "--group", ""}, []string{"g1\taffinity"}},
		{[]string{"group", "show", ""}, []string{"g1\taffinity"}},
		{[]string{"group", "create", "x", "--policy", ""}, []string{"affinity", "anti-affinity", "soft-affinity", "soft-anti-affinity"}},
		{[]string{"quarantine", "release", "--host", ""}, []string{"h1", "h2"}},
	} {
		out, err := run(append([]string{cobra.ShellCompRequestCmd}, tt.args...)...)
		got := strings.Split(strings.TrimSpace(out), "\n")
		got = got[:len(got)-1] // the directive
		if err != nil || strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("completion of pinflow %q = %q, %v; want %q", tt.args, got, err, tt.want)
		}
	}
	t.Setenv("PINFLOW_REDIS_URL", "redis://127.0.0.1:1/0")
	out, err := run(cobra.ShellCompRequestCmd, "host", "show", "")
	if err != nil || strings.TrimSpace(out) != ":4" {
		t.Errorf("completion with no ledger = %q, %v; want no candidates and no error", out, err)
	}
}

// TestExitStatus: a command line that cannot work as typed exits 2
// whichever command finds it, the root's help states the convention, and
// a word before a flag that names no command is refused as a command.
func TestExitStatus(t *testing.T) {
	t.Setenv("PINFLOW_REDIS_URL", "redis://127.0.0.1:1/0")
	boot := []string{"boot", "--name", "x", "--vcpus", "2", "--memory-mb", "512"}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{append(boot, "--spec", "hw:cpu_polcy=dedicated"), "did you mean hw:cpu_policy"},
		{[]string{"explain", "--vcpus", "2", "--memory-mb", "512", "--spec", "hw:cpu_polcy=dedicated"}, "did you mean hw:cpu_policy"},
		{[]string{"host", "add", "x", "--cells", "1", "--cores", "4", "--dedicated", "2-20"}, "cpus 4-20 are not on the host (it has 0-3)"},
		{[]string{"host", "add", "x", "--memory-mb", "64G"}, `--memory-mb "64G"`},
		{[]string{"bot", "--name", "x"}, `unknown command "bot"; did you mean boot`},
		{[]string{"--nope"}, "unknown flag: --nope; 'pinflow --help' lists the flags"},
	} {
		_, err := run(tt.args...)
		if code := exitCode(err); code != exitUsage {
			t.Errorf("pinflow %s: exit %d (%v), want %d", strings.Join(tt.args, " "), code, err, exitUsage)
		}
		if line := operatorLine(err); !strings.Contains(line, tt.want) || strings.Contains(line, "numa:") || strings.Contains(line, "pinflow pinflow") {
			t.Errorf("pinflow %s: line %q, want it to contain %q and no package prefix", strings.Join(tt.args, " "), line, tt.want)
		}
	}
	if out, _ := run("help"); !strings.Contains(out, "Exit status: 0") || !strings.Contains(out, "130") {
		t.Errorf("pinflow help does not state the exit statuses:\n%s", out)
	}
	for _, tt := range []struct {
		err  error
		code int
		line string
	}{
		{fmt.Errorf("boot x: %w", &numa.InvalidRequestError{Message: "bad"}), exitUsage, "boot x: bad"},
		{fmt.Errorf("migrate u: %w", client.ErrUnknownGuest), exitUsage, "migrate u"},
		{fmt.Errorf("stopped: %w", errInterrupted), exitInterrupted, "stopped"},
		{errors.New("migrate u failed: ledger: claim c-1 on d: host d would break the affinity of group g"), exitFailed,
			"migrate u failed: host d would break the affinity of group g"},
		{errors.New("ledger: host e holds claims"), exitFailed, "host e holds claims"},
		{errors.New("boot u failed: ledger: claim c-1 on b: numa: no fit: needs 8 free pCPUs"), exitFailed, "boot u failed: no fit: needs 8 free pCPUs"},
	} {
		if code, line := exitCode(tt.err), operatorLine(tt.err); code != tt.code || line != tt.line {
			t.Errorf("exitCode, operatorLine(%q) = %d, %q; want %d, %q", tt.err, code, line, tt.code, tt.line)
		}
	}
}

// TestConfirmWindowFlag: left out, --confirm-window is the client's zero
// value (the default window); never is NoAutoConfirm.
func TestConfirmWindowFlag(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want time.Duration
	}{
		{nil, 0},
		{[]string{"--confirm-window", "never"}, client.NoAutoConfirm},
		{[]string{"--confirm-window", "90s"}, 90 * time.Second},
	} {
		fs := pflag.NewFlagSet("resize", pflag.ContinueOnError)
		w := confirmWindowFlag(fs)
		if err := fs.Parse(tt.args); err != nil || time.Duration(*w) != tt.want {
			t.Errorf("--confirm-window from %q = %v, %v; want %v", tt.args, time.Duration(*w), err, tt.want)
		}
	}
}

// TestVersionOf: a release's module version wins, then the version make
// stamps from git describe, then "(devel)" with the revision.
func TestVersionOf(t *testing.T) {
	rev := []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}}
	for _, tt := range []struct {
		module, stamped string
		want            string
	}{
		{"v1.2.0", "v1.1.0-3-gabc", "v1.2.0"},
		{"(devel)", "v1.1.0-3-gabc123", "v1.1.0-3-gabc123"},
		{"", "abc123-dirty", "abc123-dirty"},
		{"(devel)", "", "(devel) abc123"},
	} {
		if got := versionOf(tt.module, tt.stamped, rev); got != tt.want {
			t.Errorf("versionOf(%q, %q) = %q, want %q", tt.module, tt.stamped, got, tt.want)
		}
	}
}

// TestVersionFromMake: make stamps main.version from git describe, and
// the binary prints it.
func TestVersionFromMake(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the CLI")
	}
	root := testenv.ModuleRoot(t)
	cmd := exec.Command("make", "-n", "build", "VERSION=v9.8.7-1-gfeed")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "-X main.version=v9.8.7-1-gfeed") {
		t.Fatalf("make -n build = %v, want a go build stamping main.version:\n%s", err, out)
	}
	bin := filepath.Join(t.TempDir(), "pinflow")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7-1-gfeed", "-o", bin, ".")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	if b, err := exec.Command(bin, "--version").Output(); err != nil || strings.TrimSpace(string(b)) != "pinflow version v9.8.7-1-gfeed" {
		t.Errorf("pinflow --version = %q, %v; want pinflow version v9.8.7-1-gfeed", b, err)
	}
}
