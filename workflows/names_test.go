package workflows

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/internal/testenv"
)

// TestWorkflowNames: the worker registers each workflow function under
// its function's name, which running histories hold as their workflow
// type and callers start it by (api.Workflow*). Every function of All
// has its name in package api, and every name there has a function.
func TestWorkflowNames(t *testing.T) {
	declared := apiWorkflowNames(t)
	registered := map[string]bool{}
	for _, fn := range All() {
		name := registeredName(fn)
		registered[name] = true
		if _, ok := declared[name]; !ok {
			t.Errorf("workflow function %s is registered as %q, which package api does not declare", name, name)
		}
	}
	for name, constant := range declared {
		if !registered[name] {
			t.Errorf("api.%s = %q names no workflow function of All()", constant, name)
		}
		if constant != "Workflow"+name {
			t.Errorf("api.%s = %q; want it named Workflow%s", constant, name, name)
		}
	}
}

// registeredName is the workflow type the SDK registers fn under: the
// function's name without its package.
func registeredName(fn any) string {
	full := runtime.FuncForPC(reflect.ValueOf(fn).Pointer()).Name()
	return strings.TrimSuffix(full[strings.LastIndex(full, ".")+1:], "-fm")
}

// apiWorkflowNames reads package api's Workflow* constants: workflow
// type to constant name.
func apiWorkflowNames(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(testenv.ModuleRoot(t), "api", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "Workflow") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					out[v] = n.Name
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("package api declares no Workflow* constants")
	}
	return out
}
