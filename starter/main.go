// Command pinflow starts and inspects pinflow's workflows and runs its
// offline tools (NUMA fitting, domain XML patching).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"
)

// command is one `pinflow ...` subcommand.
type command struct {
	summary string
	run     func(args []string, stdout io.Writer) error
}

// commands maps a command path ("numa fit") to its implementation.
var commands = map[string]command{}

func register(path, summary string, run func(args []string, stdout io.Writer) error) {
	commands[path] = command{summary: summary, run: run}
}

// errUsage marks an error whose message is the whole story (exit 2).
var errUsage = errors.New("usage")

// quietRedis drops go-redis's own log lines; its errors reach the
// commands, which report them once.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func main() {
	redis.SetLogger(quietRedis{})
	if err := dispatch(os.Args[1:], os.Stdout); err != nil {
		// errUsage only sets the exit status; the message says the rest.
		msg := strings.TrimSuffix(strings.TrimPrefix(err.Error(), "pinflow: "), ": "+errUsage.Error())
		fmt.Fprintln(os.Stderr, "pinflow: "+msg)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func dispatch(args []string, stdout io.Writer) error {
	// Longest command path first: "host add" before "host".
	for n := min(len(args), 3); n > 0; n-- {
		path := strings.Join(args[:n], " ")
		if cmd, ok := commands[path]; ok {
			invoked = path
			return cmd.run(args[n:], stdout)
		}
	}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printUsage(stdout)
		return nil
	}
	return fmt.Errorf("unknown command %q; run 'pinflow help' for the list: %w", strings.Join(args, " "), errUsage)
}

func printUsage(w io.Writer) {
	paths := make([]string, 0, len(commands))
	for p := range commands {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	fmt.Fprintln(w, "usage: pinflow COMMAND [ARGS]")
	fmt.Fprintln(w)
	for _, p := range paths {
		fmt.Fprintf(w, "  %-22s %s\n", p, commands[p].summary)
	}
}

// parseFlags parses flags that may come before, between or after
// positional arguments, and returns the positional ones.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, fmt.Errorf("%s: %v: %w", fs.Name(), err, errUsage)
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, checkNameFlags(fs)
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}
