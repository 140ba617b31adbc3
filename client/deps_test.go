package client_test

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/internal/testenv"
)

// TestDependencies: a program that uses the client links neither the
// worker, its workflows and activities, its hypervisor drivers, its
// telemetry nor its configuration: it speaks to the workflows through
// package api.
// A failure names the chain of imports that pulls one in.
func TestDependencies(t *testing.T) {
	const module = "github.com/pinflow/pinflow/"
	forbidden := []string{"worker", "workflows", "activities", "hypervisor/libvirt", "hypervisor/sim", "telemetry", "config"}
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Imports", "./client")
	cmd.Dir = testenv.ModuleRoot(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./client: %v\n%s", err, stderr.String())
	}
	imports := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		imports[p.ImportPath] = p.Imports
	}
	// The first chain from the client to each package, breadth first.
	from := map[string]string{module + "client": ""}
	queue := []string{module + "client"}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, q := range imports[p] {
			if _, seen := from[q]; !seen {
				from[q] = p
				queue = append(queue, q)
			}
		}
	}
	for _, f := range forbidden {
		if _, ok := from[module+f]; !ok {
			continue
		}
		var chain []string
		for p := module + f; p != ""; p = from[p] {
			chain = append([]string{strings.TrimPrefix(p, module)}, chain...)
		}
		t.Errorf("the client depends on %s: %s", f, strings.Join(chain, " -> "))
	}
}
