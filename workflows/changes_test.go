package workflows

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestChangeIDs holds the workflows to docs/versioning.md: every
// workflow.GetVersion call names a change id declared in changes.go,
// every change id there is used, and the CHANGELOG names each, so that
// a release says which changes it adds.
func TestChangeIDs(t *testing.T) {
	fset := token.NewFileSet()
	declared := map[string]string{} // constant -> change id
	used := map[string]bool{}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				if name != "changes.go" {
					return true
				}
				for i, id := range n.Names {
					v, _ := strconv.Unquote(n.Values[i].(*ast.BasicLit).Value)
					declared[id.Name] = v
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "GetVersion" || len(n.Args) < 2 {
					return true
				}
				id, ok := n.Args[1].(*ast.Ident)
				if !ok {
					t.Errorf("%s: GetVersion with change id %s; name a constant of changes.go", fset.Position(n.Pos()), exprText(n.Args[1]))
					return true
				}
				used[id.Name] = true
			}
			return true
		})
	}
	changelog, err := os.ReadFile(filepath.Join("..", "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range slices.Sorted(maps.Keys(used)) {
		if _, ok := declared[c]; !ok {
			t.Errorf("GetVersion change id %s is not declared in changes.go", c)
		}
	}
	for c, id := range declared {
		if !used[c] {
			t.Errorf("change id %s (%q) is declared in changes.go but no GetVersion uses it; retire it there", c, id)
		}
		if !strings.Contains(string(changelog), "`"+id+"`") {
			t.Errorf("change id %q is not named in CHANGELOG.md; the release that adds it lists it", id)
		}
	}
	if len(declared) == 0 {
		t.Fatal("changes.go declares no change id; the test reads nothing")
	}
}

func exprText(e ast.Expr) string {
	if lit, ok := e.(*ast.BasicLit); ok {
		return lit.Value
	}
	return "an expression"
}
