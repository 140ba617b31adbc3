package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// docsCommand prints the CLI reference, docs/cli.md, from the command
// tree itself, so the reference cannot say what the commands do not.
func docsCommand() *cobra.Command {
	c := &cobra.Command{
		Use:    "docs --markdown",
		Short:  "print the command reference (docs/cli.md)",
		Args:   noArgs,
		Hidden: true,
	}
	markdown := c.Flags().Bool("markdown", false, "print Markdown (the only form)")
	required(c, "markdown")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if !*markdown {
			return fmt.Errorf("docs: --markdown=false: Markdown is the only form: %w", errUsage)
		}
		return writeReference(c.OutOrStdout(), c.Root())
	}
	return c
}

// regenerate is the command that writes docs/cli.md; its test names it.
const regenerate = "go run ./starter docs --markdown > docs/cli.md"

// exitCodes is the convention every command keeps.
const exitCodes = `## Exit status

| Status | Meaning |
|---|---|
| 0 | done: the command did what it was asked, and a followed operation (` + "`--wait`" + `, ` + "`follow`" + `) completed or reached the operator's next decision (VERIFY_RESIZE) |
| 1 | refused or failed: an operation pinflow or the ledger refused (no host fits, another operation on the guest is open, a rule of its group), a step that failed, a drain that failed or was cancelled, a check or audit that found a problem, a service that does not answer |
| 2 | usage error or bad input, and nothing changed: an unknown command or flag, a wrong count of arguments, a required flag left out, a bad flag value, a flag that takes one value given twice, ` + "`--json`" + ` with ` + "`--output`" + `, a misspelt or conflicting spec, an unknown or ambiguous guest or host name |
| 130 | interrupted: Ctrl-C stopped the following, not the operation; ` + "`pinflow follow GUEST`" + ` picks it up again |

Every error is one line on standard error, starting with ` + "`pinflow:`" + `.
`

// writeReference writes the Markdown reference of root's command tree:
// each visible command's use line, help, flags with their defaults, and
// the exit-status convention.
func writeReference(w io.Writer, root *cobra.Command) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# pinflow command reference\n\n")
	fmt.Fprintf(&b, "<!-- Generated from the command tree by `%s`;\n", regenerate)
	fmt.Fprintf(&b, "     starter/docs_test.go fails when this file differs. Do not edit it by hand. -->\n\n")
	fmt.Fprintf(&b, "%s\n\n", root.Long)
	fmt.Fprintf(&b, "Every command takes `-h` or `--help` (as does `pinflow help COMMAND...`), which prints\n")
	fmt.Fprintf(&b, "what this page says of it. [The operator's guide](guide.md) tells which command to use when.\n\n")
	b.WriteString(exitCodes)
	fmt.Fprintf(&b, "\n## Flags of every command\n\n")
	writeFlags(&b, root.PersistentFlags())
	fmt.Fprintf(&b, "`--version` prints pinflow's version.\n\n")

	fmt.Fprintf(&b, "## Commands\n\n")
	groups := append(root.Groups(), &cobra.Group{ID: "", Title: "Other commands:"})
	for _, g := range groups {
		fmt.Fprintf(&b, "%s\n\n", g.Title)
		walk(root, func(c *cobra.Command) {
			if c == root || !visible(c) || topOf(c).GroupID != g.ID {
				return
			}
			indent := strings.Repeat("  ", strings.Count(pathOf(c), " "))
			fmt.Fprintf(&b, "%s- [%s](#%s): %s\n", indent, pathOf(c), anchor(c.CommandPath()), c.Short)
		})
		b.WriteString("\n")
	}
	walk(root, func(c *cobra.Command) {
		if c == root || !visible(c) {
			return
		}
		writeCommand(&b, c)
	})
	_, err := w.Write(bytes.TrimRight(b.Bytes(), "\n"))
	if err == nil {
		_, err = io.WriteString(w, "\n")
	}
	return err
}

// visible says whether c and every command above it are shown to users.
func visible(c *cobra.Command) bool {
	for ; c != nil; c = c.Parent() {
		if c.Hidden {
			return false
		}
	}
	return true
}

// topOf is the command under the root that c belongs to.
func topOf(c *cobra.Command) *cobra.Command {
	for c.HasParent() && c.Parent().HasParent() {
		c = c.Parent()
	}
	return c
}

// anchor is the fragment GitHub gives a heading of text s.
func anchor(s string) string {
	return strings.ReplaceAll(strings.ToLower(s), " ", "-")
}

func writeCommand(b *bytes.Buffer, c *cobra.Command) {
	fmt.Fprintf(b, "## %s\n\n", c.CommandPath())
	fmt.Fprintf(b, "%s.\n\n", upperFirst(strings.TrimSuffix(c.Short, ".")))
	fmt.Fprintf(b, "```text\n%s\n", c.UseLine())
	for _, a := range c.Aliases {
		fmt.Fprintf(b, "%s (alias)\n", strings.Replace(c.UseLine(), c.Name(), a, 1))
	}
	b.WriteString("```\n\n")
	// The help is laid out for a terminal, as --help prints it.
	if c.Long != "" {
		fmt.Fprintf(b, "```text\n%s\n```\n\n", strings.TrimSpace(c.Long))
	}
	if c.Example != "" {
		fmt.Fprintf(b, "Examples:\n\n```text\n%s\n```\n\n", strings.TrimRight(c.Example, "\n"))
	}
	if c.HasAvailableLocalFlags() {
		writeFlags(b, c.LocalFlags())
	}
	var subs []string
	for _, s := range c.Commands() {
		if s.IsAvailableCommand() {
			subs = append(subs, fmt.Sprintf("[%s](#%s)", s.Name(), anchor(s.CommandPath())))
		}
	}
	if len(subs) > 0 {
		fmt.Fprintf(b, "Subcommands: %s.\n\n", strings.Join(subs, ", "))
	}
}

// writeFlags writes a table of the visible flags of fs, in name order.
func writeFlags(b *bytes.Buffer, fs *pflag.FlagSet) {
	var rows []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Name == "help" || f.Name == "version" {
			return
		}
		name := "`--" + f.Name
		if f.Shorthand != "" {
			name = "`-" + f.Shorthand + "`, " + name
		}
		varname, usage := pflag.UnquoteUsage(f)
		if varname != "" && varname != "bool" {
			name += " " + varname
		}
		name += "`"
		rows = append(rows, fmt.Sprintf("| %s | %s | %s |", cell(name), cell(defaultOf(f)), cell(usage)))
	})
	if len(rows) == 0 {
		return
	}
	b.WriteString("| Flag | Default | Meaning |\n|---|---|---|\n")
	for _, r := range rows {
		b.WriteString(r + "\n")
	}
	b.WriteString("\n")
}

// defaultOf is f's default as a user would type it; none for a zero
// value that means "not given".
func defaultOf(f *pflag.Flag) string {
	switch f.DefValue {
	case "", "[]", "false":
		return ""
	}
	if f.Value.Type() == "string" {
		return "`" + fmt.Sprintf("%q", f.DefValue) + "`"
	}
	return "`" + f.DefValue + "`"
}

// cell makes s safe inside a Markdown table cell: pipes escaped, one line.
func cell(s string) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		lines = append(lines, strings.TrimSpace(sc.Text()))
	}
	return strings.ReplaceAll(strings.Join(lines, " "), "|", `\|`)
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
