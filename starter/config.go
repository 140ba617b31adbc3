package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/config"
)

func configCommand() *cobra.Command {
	c := &cobra.Command{Use: "config", Short: "print every PINFLOW_* variable with its default and meaning", Args: noArgs}
	markdown := c.Flags().Bool("markdown", false, "print a Markdown table")
	c.RunE = func(c *cobra.Command, _ []string) error { return printConfig(*markdown, c.OutOrStdout()) }
	return c
}

// printConfig prints the configuration reference, generated from the
// config package's fields and their doc comments. It reads no
// environment, so it never prints a value, secret or not.
func printConfig(markdown bool, stdout io.Writer) error {
	return config.WriteReference(stdout, markdown)
}
