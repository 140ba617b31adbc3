package config

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kelseyhightower/envconfig"
)

// TestReferenceMatchesEnvconfig: the reference lists exactly the
// variables envconfig reads.
func TestReferenceMatchesEnvconfig(t *testing.T) {
	var buf bytes.Buffer
	tmpl := "{{range .}}{{usage_key .}}\n{{end}}"
	if err := envconfig.Usagef(Prefix, &Config{}, &buf, tmpl); err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var got []string
	for _, v := range Reference() {
		got = append(got, v.Name)
	}
	sort.Strings(want)
	sort.Strings(got)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Reference() =\n%s\nenvconfig reads\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestReferenceDefaultsAreLoaded: the defaults the reference shows are
// what Load reads with no variable set, and setting every variable to
// its shown default loads the same configuration.
func TestReferenceDefaultsAreLoaded(t *testing.T) {
	vars := Reference()
	for _, v := range vars {
		t.Setenv(v.Name, "")
		os.Unsetenv(v.Name)
	}
	unset, err := Load()
	if err != nil {
		t.Fatalf("Load() with no variable set: %v", err)
	}
	for _, v := range vars {
		if v.Default != "" {
			t.Setenv(v.Name, v.Default)
		}
	}
	set, err := Load()
	if err != nil {
		t.Fatalf("Load() with every variable set to its default: %v", err)
	}
	if diff := cmp.Diff(unset, set, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Resolve" }, cmp.Ignore())); diff != "" {
		t.Errorf("Load() with no variable set and with every variable at its Reference default differ (-unset +set):\n%s", diff)
	}
}

// TestReferenceDescribesEveryVariable: every variable has its field's
// doc comment.
func TestReferenceDescribesEveryVariable(t *testing.T) {
	for _, v := range Reference() {
		if v.Description == "" {
			t.Errorf("%s has no description: give its field a doc comment and run go generate ./config", v.Name)
		}
	}
}

// TestReferenceGenerated: reference_gen.go is what go generate writes
// from the current sources.
func TestReferenceGenerated(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go run; skipped with -short")
	}
	out := filepath.Join(t.TempDir(), "reference_gen.go")
	cmd := exec.Command("go", "run", "./internal/refgen", "-o", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./internal/refgen: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile("reference_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, have) {
		t.Errorf("reference_gen.go is stale: run go generate ./config")
	}
}

// TestReferenceInDocs: docs/operations.md carries the generated reference
// between its markers.
func TestReferenceInDocs(t *testing.T) {
	const begin, end = "<!-- pinflow config --markdown: begin -->\n", "<!-- pinflow config --markdown: end -->"
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("docs/operations.md lacks the markers %q and %q", begin, end)
	}
	var want bytes.Buffer
	if err := WriteReference(&want, true); err != nil {
		t.Fatal(err)
	}
	if got := s[i+len(begin) : j]; got != want.String() {
		t.Errorf("docs/operations.md's configuration reference is stale: replace it with the output of 'pinflow config --markdown'")
	}
}

// TestWriteReference: both formats name every variable once, and secrets
// are marked.
func TestWriteReference(t *testing.T) {
	tests := []struct {
		name     string
		markdown bool
	}{{"text", false}, {"markdown", true}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteReference(&buf, tt.markdown); err != nil {
				t.Fatal(err)
			}
			for _, v := range Reference() {
				if n := strings.Count(buf.String(), v.Name+" "); v.Name != "" && n == 0 && !strings.Contains(buf.String(), "`"+v.Name+"`") {
					t.Errorf("WriteReference(markdown=%v) lacks %s", tt.markdown, v.Name)
				}
			}
			for _, secret := range []string{"PINFLOW_REDIS_PASSWORD", "PINFLOW_TEMPORAL_API_KEY"} {
				line := ""
				for _, l := range strings.Split(buf.String(), "\n") {
					if strings.Contains(l, secret) {
						line = l
					}
				}
				if !strings.Contains(line, "Secret: never logged.") {
					t.Errorf("WriteReference(markdown=%v): %s line %q does not say it is secret", tt.markdown, secret, line)
				}
			}
		})
	}
}
