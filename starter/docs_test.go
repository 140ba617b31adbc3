package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/internal/testenv"
)

// TestCLIReferenceInDocs: docs/cli.md is what the command tree
// generates, so the reference says what the commands do.
func TestCLIReferenceInDocs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(t), "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := run("docs", "--markdown")
	if err != nil {
		t.Fatalf("pinflow docs --markdown = %v", err)
	}
	if got != string(doc) {
		line := firstDifference(string(doc), got)
		t.Errorf("docs/cli.md differs from the command tree at line %d: regenerate it with '%s'", line, regenerate)
	}
}

// TestCLIReferenceCoversEveryCommand: every command a user can type has
// its section, with each of its flags.
func TestCLIReferenceCoversEveryCommand(t *testing.T) {
	var b bytes.Buffer
	if err := writeReference(&b, newRoot()); err != nil {
		t.Fatal(err)
	}
	ref := b.String()
	for _, c := range allCommands() {
		if !visible(c) || !c.HasParent() {
			continue
		}
		if !strings.Contains(ref, "\n## "+c.CommandPath()+"\n") {
			t.Errorf("writeReference: no section for %q", c.CommandPath())
		}
	}
	for _, want := range []string{"| 2 |", "| 1 |", "| 130 |", "--redis-url"} {
		if !strings.Contains(ref, want) {
			t.Errorf("writeReference: no %q in the header", want)
		}
	}
	if strings.Contains(ref, "## pinflow docs") {
		t.Errorf("writeReference: documents its own hidden command")
	}
}

// TestDocsCommandRefusesOtherForms: the generator prints Markdown only.
func TestDocsCommandRefusesOtherForms(t *testing.T) {
	for _, args := range [][]string{{"docs"}, {"docs", "--markdown=false"}, {"docs", "--markdown", "x"}} {
		_, err := run(args...)
		refusedAsUsage(t, args, err, "docs")
	}
}

// firstDifference is the 1-based number of the first line where a and b
// differ.
func firstDifference(a, b string) int {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}
