package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/internal/testenv"
)

// TestReadmeCommandsParse: every pinflow command the README and the
// operator's guide show names a command that exists, with flags it takes,
// values they accept and the arguments it wants; nothing runs.
func TestReadmeCommandsParse(t *testing.T) {
	for _, doc := range []struct {
		path string
		// least is how many command lines the file shows at least, so
		// that a change to its blocks' form cannot make the test vacuous.
		least int
		// tour names the commands the file must show.
		tour []string
	}{
		{"README.md", 12, []string{"boot", "list", "show", "migrate", "resize", "resize confirm", "shelve", "unshelve",
			"host drain", "group create", "explain", "ops", "check", "reconcile"}},
		{"docs/guide.md", 60, nil},
	} {
		data, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(t), filepath.FromSlash(doc.path)))
		if err != nil {
			t.Fatal(err)
		}
		cmds := readmeCommands(string(data))
		if len(cmds) < doc.least {
			t.Errorf("found %d pinflow commands in %s, want at least %d", len(cmds), doc.path, doc.least)
		}
		shown := map[string]bool{}
		for _, args := range cmds {
			path := commandPath(args)
			shown[path] = true
			root := newRoot()
			walk(root, func(c *cobra.Command) {
				onlyOnce(c.Flags())
				onlyOnce(c.PersistentFlags())
				if c.RunE != nil {
					c.RunE = func(*cobra.Command, []string) error { return nil }
				}
			})
			root.SetArgs(args)
			root.SetOut(&bytes.Buffer{})
			if err := root.Execute(); err != nil {
				t.Errorf("%s: pinflow %s: %v", doc.path, strings.Join(args, " "), err)
			}
		}
		for _, want := range doc.tour {
			if !shown[want] {
				t.Errorf("%s shows no 'pinflow %s' command", doc.path, want)
			}
		}
	}
}

// commandPath is the command args name, without pinflow: the words
// before the first flag or argument that names no subcommand.
func commandPath(args []string) string {
	c, _, err := newRoot().Find(args)
	if err != nil {
		return ""
	}
	return pathOf(c)
}

// readmeCommands reads the pinflow command lines of the README's shell
// blocks: comments and a trailing & dropped, continued lines joined,
// "a|b" alternatives taking the first, "[x]" optional parts kept.
func readmeCommands(md string) [][]string {
	var out [][]string
	inShell := false
	var pending string
	for _, line := range strings.Split(md, "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			inShell = true
			continue
		case strings.HasPrefix(line, "```"):
			inShell = false
			continue
		case !inShell:
			continue
		}
		line = pending + line
		pending = ""
		if strings.HasSuffix(line, `\`) {
			pending = strings.TrimSuffix(line, `\`)
			continue
		}
		if i := strings.Index(line, "  #"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSuffix(strings.TrimSpace(line), "&")
		if strings.HasPrefix(line, "source <(pinflow") {
			line = strings.TrimSuffix(strings.TrimPrefix(line, "source <("), ")")
		}
		if !strings.HasPrefix(line, "pinflow ") {
			continue
		}
		var args []string
		for _, w := range shellWords(strings.TrimPrefix(line, "pinflow ")) {
			w = strings.Trim(w, "[]")
			if alt, _, ok := strings.Cut(w, "|"); ok && !strings.HasPrefix(w, "-") {
				w = alt
			}
			if w != "" {
				args = append(args, w)
			}
		}
		out = append(out, args)
	}
	return out
}

// shellWords splits s into words as a shell does for plain and quoted
// words.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}
