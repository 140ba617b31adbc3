package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/pinflow/pinflow/config"
)

func init() {
	register("config", "print every PINFLOW_* variable with its default and description: config [--markdown]", printConfig)
}

// printConfig prints the configuration reference, generated from the
// config package's fields and their doc comments. It reads no
// environment, so it never prints a value, secret or not.
func printConfig(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("config", flag.ContinueOnError)
	markdown := fs.Bool("markdown", false, "print a Markdown table")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("config takes no arguments, got %q: %w", pos, errUsage)
	}
	return config.WriteReference(stdout, *markdown)
}
