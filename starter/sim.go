package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pinflow/pinflow/config"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/sim"
)

func simCommand() *cobra.Command {
	return group("sim", "set the simulated hypervisor's latencies, faults, power and gates",
		simLatencyCommand(), simFaultCommand(), simPowerCommand(), simGateCommand(), simShowCommand())
}

// simMaxSeconds bounds a latency: longer ones are typos, and a
// time.Duration holds at most about 292 years.
const simMaxSeconds = 86400

// withSim connects to the Redis of the PINFLOW_* configuration, runs f
// on the simulator set up from it, and closes the connection afterwards.
func withSim(f func(ctx context.Context, d *sim.Driver) error) error {
	ctx := context.Background()
	cfg, err := config.Load()
	if err != nil {
		return err
	}
	rdb, err := cfg.RedisConfig.NewClient(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	d, err := cfg.Simulator(rdb)
	if err != nil {
		return err
	}
	return f(ctx, d)
}

// simOpNames lists the simulated operations for people.
func simOpNames() string {
	names := make([]string, 0, len(sim.Ops()))
	for _, op := range sim.Ops() {
		n := string(op)
		if op == sim.OpStart {
			n += " (or spawn)"
		}
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}

// simParseOp reads --op for command cmd.
func simParseOp(cmd, s string) (sim.Op, error) {
	if s == "" {
		return "", fmt.Errorf("%s: --op is required; allowed: %s: %w", cmd, simOpNames(), errUsage)
	}
	op, err := sim.ParseOp(s)
	if err != nil {
		return "", fmt.Errorf("%s: --op %s: %w", cmd, strings.TrimPrefix(err.Error(), "sim: "), errUsage)
	}
	return op, nil
}

// simSetFlags returns the names of the flags given on the command line.
func simSetFlags(fs *pflag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { set[f.Name] = true })
	return set
}

// simWhere names a host for messages: "on h1", or "on every host".
func simWhere(host string) string {
	if host == "" {
		return "on every host"
	}
	return "on " + host
}

func simLatencyCommand() *cobra.Command {
	const cmd = "sim latency"
	c := &cobra.Command{Use: "latency --op OP --seconds S | --clear", Short: "set how long a simulated operation takes", Args: noArgs,
		Long: `Set the latency of a simulated operation on every host, or on --host; for
migrate it is the whole migration. --clear removes it, so the configured
one (PINFLOW_SIM_LATENCY) applies.`}
	fs := c.Flags()
	opName := fs.String("op", "", "operation: "+simOpNames())
	seconds := fs.Float64("seconds", 0, "latency in seconds; for migrate, the whole migration")
	host := fs.String("host", "", "only this host (default: every host)")
	unset := fs.Bool("clear", false, "remove the latency set here, so the configured one applies")
	asJSON := outputFlags(fs)
	c.RunE = func(c *cobra.Command, _ []string) error {
		stdout := c.OutOrStdout()
		op, err := simParseOp(cmd, *opName)
		if err != nil {
			return err
		}
		set := simSetFlags(fs)
		switch {
		case *unset && set["seconds"]:
			return fmt.Errorf("%s: give --seconds S or --clear, not both: %w", cmd, errUsage)
		case !*unset && !set["seconds"]:
			return fmt.Errorf("%s: --seconds is required (or --clear): %w", cmd, errUsage)
		case math.IsNaN(*seconds) || *seconds < 0 || *seconds > simMaxSeconds:
			return fmt.Errorf("%s: --seconds %s: must be between 0 and %d: %w",
				cmd, strconv.FormatFloat(*seconds, 'g', -1, 64), simMaxSeconds, errUsage)
		}
		latency := time.Duration(*seconds * float64(time.Second))

		err = withSim(func(ctx context.Context, d *sim.Driver) error {
			if *unset {
				return d.ClearLatency(ctx, *host, op)
			}
			return d.SetLatency(ctx, *host, op, latency)
		})
		if err != nil {
			return err
		}
		if *asJSON {
			out := struct {
				Host    string   `json:"host,omitempty"`
				Op      sim.Op   `json:"op"`
				Seconds *float64 `json:"seconds"`
			}{Host: *host, Op: op}
			if !*unset {
				s := latency.Seconds()
				out.Seconds = &s
			}
			return writeJSON(stdout, out)
		}
		if *unset {
			_, err = fmt.Fprintf(stdout, "%s latency %s cleared; the configured one applies\n", op, simWhere(*host))
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s latency %s set to %s\n", op, simWhere(*host), latency)
		return err
	}
	return c
}

func simFaultCommand() *cobra.Command {
	const cmd = "sim fault"
	c := &cobra.Command{Use: "fault --host NAME --op OP --times N [--rate R] | --clear", Short: "make a simulated operation fail", Args: noArgs,
		Long: `Make the next --times calls of an operation on a host fail, then each call
with probability --rate. --clear removes the fault, so the configured rate
(PINFLOW_SIM_FAIL_RATES) applies.`}
	fs := c.Flags()
	host := fs.String("host", "", "the host whose operation fails (for migrate: the source; prepare: the destination)")
	opName := fs.String("op", "", "operation: "+simOpNames())
	times := fs.Int("times", 0, "the next N calls fail")
	rate := fs.Float64("rate", 0, "then each call fails with this probability, 0..1")
	unset := fs.Bool("clear", false, "remove the fault set here, so the configured rate applies")
	asJSON := outputFlags(fs)
	required(c, "host")
	c.RunE = func(c *cobra.Command, _ []string) error {
		stdout := c.OutOrStdout()
		op, err := simParseOp(cmd, *opName)
		if err != nil {
			return err
		}
		set := simSetFlags(fs)
		switch {
		case *unset && (set["times"] || set["rate"]):
			return fmt.Errorf("%s: give --times/--rate or --clear, not both: %w", cmd, errUsage)
		case !*unset && !set["times"] && !set["rate"]:
			return fmt.Errorf("%s: --times N (and/or --rate R) is required (or --clear): %w", cmd, errUsage)
		case *times < 0:
			return fmt.Errorf("%s: --times %d: must be 0 or more: %w", cmd, *times, errUsage)
		case !(*rate >= 0 && *rate <= 1):
			return fmt.Errorf("%s: --rate %s: must be between 0 and 1: %w", cmd, strconv.FormatFloat(*rate, 'g', -1, 64), errUsage)
		}
		f := sim.Fault{Times: *times, Rate: *rate}

		err = withSim(func(ctx context.Context, d *sim.Driver) error {
			if *unset {
				return d.ClearFault(ctx, *host, op)
			}
			return d.SetFault(ctx, *host, op, f)
		})
		if err != nil {
			return err
		}
		if *asJSON {
			out := struct {
				Host  string     `json:"host"`
				Op    sim.Op     `json:"op"`
				Fault *sim.Fault `json:"fault"`
			}{Host: *host, Op: op}
			if !*unset {
				out.Fault = &f
			}
			return writeJSON(stdout, out)
		}
		switch {
		case *unset:
			_, err = fmt.Fprintf(stdout, "%s fault on %s cleared; the configured rate applies\n", op, *host)
		case f == sim.Fault{}:
			_, err = fmt.Fprintf(stdout, "%s on %s will not fail\n", op, *host)
		default:
			_, err = fmt.Fprintf(stdout, "%s on %s: %s\n", op, *host, simDescribeFault(f))
		}
		return err
	}
	return c
}

func simPowerCommand() *cobra.Command {
	const cmd = "sim power"
	c := &cobra.Command{Use: "power --host NAME --off|--on", Short: "power a simulated host off, as a crash would, or back on", Args: noArgs,
		Long: `--off powers a simulated host off as a crash would: its guests stop, and calls
to it fail until --on, after which its guests stay shut off.`}
	fs := c.Flags()
	host := fs.String("host", "", "the host to power off or on")
	off := fs.Bool("off", false, "power the host off, as a crash would: its guests stop, and calls to it fail until --on")
	on := fs.Bool("on", false, "power the host back on; its guests stay shut off")
	asJSON := outputFlags(fs)
	required(c, "host")
	c.RunE = func(c *cobra.Command, _ []string) error {
		stdout := c.OutOrStdout()
		if *off == *on {
			return fmt.Errorf("%s: give exactly one of --off or --on: %w", cmd, errUsage)
		}

		err := withSim(func(ctx context.Context, d *sim.Driver) error {
			if *off {
				return d.PowerOff(ctx, *host)
			}
			return d.PowerOn(ctx, *host)
		})
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, struct {
				Host       string `json:"host"`
				PoweredOff bool   `json:"powered_off"`
			}{*host, *off})
		}
		if *off {
			_, err = fmt.Fprintf(stdout, "%s is powered off; its guests are shut off, and calls to it fail until sim power --host %s --on\n", *host, *host)
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s is powered on; its guests stay shut off\n", *host)
		return err
	}
	return c
}

// simGateWait bounds how long sim gate --wait-* waits: the calls of a
// test arrive in seconds, and one that never does is a hang to report.
const simGateWait = 3 * time.Minute

func simGateCommand() *cobra.Command {
	const cmd = "sim gate"
	c := &cobra.Command{Use: "gate --at GATE --hold|--release|--wait-arrived N|--wait-cancelled N", Short: "hold simulated calls at a gate, release them, or wait for them", Args: noArgs,
		Long: `Hold the next simulated calls at a gate until released, so that a test
interrupts an operation exactly there: before an operation, or inside a live
migration before its copy starts (copy), before its switchover (switchover)
or past it (switched).
--wait-arrived and --wait-cancelled wait, up to 3 minutes, until that many
calls arrived at the held gate or were cancelled there.`}
	fs := c.Flags()
	at := fs.String("at", "", "the gate: define, start, shutdown, stop, undefine, detach (a device unplugged), prepare, migrate, copy (a migration begun, before its copy starts), switchover (a migration's copy done, before its point of no return), switched (past it), attach (a device plugged in) or repin (a guest's pins changed in place)")
	guest := fs.String("guest", "", "only the calls on this guest's domain (default: every guest's)")
	hold := fs.Bool("hold", false, "hold the next calls at the gate, and count them afresh")
	release := fs.Bool("release", false, "let the held calls go on, and the next ones pass")
	arrived := fs.Int("wait-arrived", 0, "wait until N calls have arrived at the gate since it was held")
	cancelled := fs.Int("wait-cancelled", 0, "wait until N held calls have been cancelled there")
	asJSON := outputFlags(fs)
	required(c, "at")
	c.RunE = func(c *cobra.Command, _ []string) error {
		stdout := c.OutOrStdout()
		gate, err := sim.ParseGate(*at)
		if err != nil {
			return fmt.Errorf("%s: --at %s: %w", cmd, strings.TrimPrefix(err.Error(), "sim: "), errUsage)
		}
		if *guest != "" {
			id, err := hypervisor.ParseUUID(*guest)
			if err != nil {
				return fmt.Errorf("%s: --guest %q: not a UUID: %w", cmd, *guest, errUsage)
			}
			*guest = id.String()
		}
		set := simSetFlags(fs)
		given := 0
		for _, f := range []string{"hold", "release", "wait-arrived", "wait-cancelled"} {
			if set[f] {
				given++
			}
		}
		switch {
		case given != 1:
			return fmt.Errorf("%s: give exactly one of --hold, --release, --wait-arrived N or --wait-cancelled N: %w", cmd, errUsage)
		case set["wait-arrived"] && *arrived < 1, set["wait-cancelled"] && *cancelled < 1:
			return fmt.Errorf("%s: the count to wait for must be 1 or more: %w", cmd, errUsage)
		}

		var st sim.GateState
		err = withSim(func(ctx context.Context, d *sim.Driver) (err error) {
			switch {
			case *hold:
				err = d.HoldGate(ctx, gate, *guest)
			case *release:
				err = d.ReleaseGate(ctx, gate, *guest)
			default:
				wctx, cancel := context.WithTimeout(ctx, simGateWait)
				defer cancel()
				st, err = d.AwaitGate(wctx, gate, *guest, func(st sim.GateState) bool {
					return st.Arrived >= *arrived && st.Cancelled >= *cancelled
				})
				return err
			}
			if err != nil {
				return err
			}
			st, err = d.GateState(ctx, gate, *guest)
			return err
		})
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, st)
		}
		state := "open"
		if st.Held {
			state = "held"
		}
		_, err = fmt.Fprintf(stdout, "gate %s is %s: %d calls arrived while held, %d cancelled there\n", gate, state, st.Arrived, st.Cancelled)
		return err
	}
	return c
}

// simDescribeFault says what a fault does, in words.
func simDescribeFault(f sim.Fault) string {
	var parts []string
	if f.Times > 0 {
		parts = append(parts, fmt.Sprintf("the next %d calls fail", f.Times))
	}
	if f.Rate > 0 {
		lead := "each call fails"
		if f.Times > 0 {
			lead = "then each call fails"
		}
		parts = append(parts, fmt.Sprintf("%s with probability %s", lead, strconv.FormatFloat(f.Rate, 'g', -1, 64)))
	}
	if len(parts) == 0 {
		return "no failures"
	}
	return strings.Join(parts, ", ")
}

// simSettingsView is `sim show --json`: latencies in seconds.
type simSettingsView struct {
	Defaults     map[sim.Op]float64         `json:"defaults"`
	DefaultRates map[sim.Op]float64         `json:"default_rates"`
	Latency      map[sim.Op]float64         `json:"latency"`
	Hosts        map[string]simHostSettings `json:"hosts"`
	// PoweredOff lists the hosts that are powered off, sorted.
	PoweredOff []string `json:"powered_off"`
}

type simHostSettings struct {
	Latency map[sim.Op]float64   `json:"latency"`
	Faults  map[sim.Op]sim.Fault `json:"faults"`
}

func simSeconds(m map[sim.Op]time.Duration) map[sim.Op]float64 {
	out := make(map[sim.Op]float64, len(m))
	for op, l := range m {
		out[op] = l.Seconds()
	}
	return out
}

func simShowCommand() *cobra.Command {
	c := &cobra.Command{Use: "show", Short: "show the simulator's latencies, faults and powered-off hosts", Args: noArgs}
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, _ []string) error {
		stdout := c.OutOrStdout()
		var s *sim.Settings
		err := withSim(func(ctx context.Context, d *sim.Driver) (err error) {
			s, err = d.Settings(ctx)
			return err
		})
		if err != nil {
			return err
		}
		hosts := make([]string, 0, len(s.Hosts))
		for h := range s.Hosts {
			hosts = append(hosts, h)
		}
		sort.Strings(hosts)
		off := []string{}
		for _, h := range hosts {
			if s.Hosts[h].PoweredOff {
				off = append(off, h)
			}
		}
		if *asJSON {
			v := simSettingsView{Defaults: simSeconds(s.Defaults), DefaultRates: s.DefaultRates,
				Latency: simSeconds(s.Latency), Hosts: map[string]simHostSettings{}, PoweredOff: off}
			for _, h := range hosts {
				v.Hosts[h] = simHostSettings{Latency: simSeconds(s.Hosts[h].Latency), Faults: s.Hosts[h].Faults}
			}
			return writeJSON(stdout, v)
		}

		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprint(tw, "LATENCY")
		for _, op := range sim.Ops() {
			fmt.Fprintf(tw, "\t%s", op)
		}
		fmt.Fprintln(tw)
		row := func(name string, m map[sim.Op]time.Duration) {
			fmt.Fprint(tw, name)
			for _, op := range sim.Ops() {
				if l, ok := m[op]; ok {
					fmt.Fprintf(tw, "\t%s", l)
				} else {
					fmt.Fprint(tw, "\t-")
				}
			}
			fmt.Fprintln(tw)
		}
		row("configured", s.Defaults)
		row("every host", s.Latency)
		for _, h := range hosts {
			if len(s.Hosts[h].Latency) > 0 {
				row(h, s.Hosts[h].Latency)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}

		var faults []string
		for _, op := range sim.Ops() {
			if r, ok := s.DefaultRates[op]; ok {
				faults = append(faults, fmt.Sprintf("  every host (configured) %s: %s", op, simDescribeFault(sim.Fault{Rate: r})))
			}
		}
		for _, h := range hosts {
			for _, op := range sim.Ops() {
				if f, ok := s.Hosts[h].Faults[op]; ok {
					faults = append(faults, fmt.Sprintf("  %s %s: %s", h, op, simDescribeFault(f)))
				}
			}
		}
		if len(faults) == 0 {
			fmt.Fprintln(stdout, "FAULTS none")
		} else {
			fmt.Fprintln(stdout, "FAULTS\n"+strings.Join(faults, "\n"))
		}
		if len(off) == 0 {
			_, err = fmt.Fprintln(stdout, "POWERED OFF none")
			return err
		}
		_, err = fmt.Fprintln(stdout, "POWERED OFF "+strings.Join(off, ", "))
		return err
	}
	return c
}
