//go:build uicheck

package e2e

import (
	"context"
	"fmt"
	"html"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
)

// TestWebUI runs a live migration through the CLI on a dev stack whose
// Temporal serves its Web UI, then opens the UI in headless Chromium: the
// workflow list filtered by pinflow's search attributes, and the run's
// search attributes and summary. It checks the rendered pages show the
// workflow id, its search attributes and the migration's summary and
// phase, and saves screenshots
// into PINFLOW_UI_CHECK_DIR (a new temporary directory when unset), which
// it prints. Run it with `make ui-check`.
func TestWebUI(t *testing.T) {
	chromium := testenv.RequireProgram(t, "chromium")
	cli, worker := binaries(t)
	redis := testenv.StartRedis(t)
	temporal := testenv.StartTemporal(t, testenv.WithUI())
	s := &stack{t: t, cli: cli, worker: worker, temporal: temporal, tc: temporal.Client, redisConfig: ledger.Config{URL: redis.URL()}}
	s.env = append(os.Environ(),
		"PINFLOW_REDIS_URL="+redis.URL(),
		"PINFLOW_TEMPORAL_ADDRESS="+temporal.Address,
		"PINFLOW_TEMPORAL_NAMESPACE="+temporal.Namespace,
		"PINFLOW_TEMPORAL_TASK_QUEUE=ui-check",
		"PINFLOW_RECONCILE_INTERVAL=0",
		"PINFLOW_DRIVER=sim",
	)
	s.startWorker()
	t.Cleanup(func() {
		for _, w := range s.workers {
			if w.ProcessState == nil {
				_ = w.Process.Signal(syscall.SIGTERM)
				_ = w.Wait()
			}
		}
	})

	// Host changes are workflows that carry pinflow's search attributes,
	// which the worker registers as it starts.
	s.waitSearchAttributes()
	s.ok("host", "add", "compute-1", "--cells", "2", "--cores", "4", "--memory-mb", "8192")
	s.ok("host", "add", "compute-2", "--cells", "2", "--cores", "4", "--memory-mb", "8192")
	uuid := s.boot("db-primary", "compute-1", 4)
	s.ok("migrate", uuid, "--dest", "compute-2", "--wait")
	id := guest.InstanceWorkflowID(uuid)
	// A drain shows each guest's move in its current details.
	cache := s.boot("cache-1", "compute-1", 2)
	s.ok("host", "drain", "compute-1", "--wait")
	drainID := api.DrainWorkflowID("compute-1")
	// An audit run, which the operators' view leaves out.
	s.ok("reconcile", "--wait")

	// Visibility is eventually consistent: wait until the list the UI
	// shows has the completed migration.
	query := fmt.Sprintf("PinflowInstance = %q AND PinflowOperation = %q", uuid, api.OpLiveMigration)
	var runID string
	s.eventually("the migration in visibility", time.Minute, func() bool {
		resp, err := temporal.Client.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{Namespace: temporal.Namespace, Query: query})
		if err != nil || len(resp.GetExecutions()) == 0 {
			return false
		}
		e := resp.GetExecutions()[0]
		runID = e.GetExecution().GetRunId()
		return e.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED
	})

	var auditID string
	s.eventually("the audit in visibility", time.Minute, func() bool {
		q := fmt.Sprintf("PinflowOperation = %q", api.OpReconcile)
		resp, err := temporal.Client.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{Namespace: temporal.Namespace, Query: q})
		if err != nil || len(resp.GetExecutions()) == 0 {
			return false
		}
		auditID = resp.GetExecutions()[0].GetExecution().GetWorkflowId()
		return true
	})

	var drainRun string
	s.eventually("the drain in visibility", time.Minute, func() bool {
		d, err := temporal.Client.DescribeWorkflowExecution(context.Background(), drainID, "")
		if err != nil {
			return false
		}
		drainRun = d.GetWorkflowExecutionInfo().GetExecution().GetRunId()
		return d.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED
	})

	dir := os.Getenv("PINFLOW_UI_CHECK_DIR")
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "pinflow-ui-check-"); err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("UI check screenshots in %s", dir)
	fmt.Printf("ui-check: screenshots in %s\n", dir)

	base := fmt.Sprintf("http://127.0.0.1:%d/namespaces/%s", temporal.UIPort, temporal.Namespace)
	run := base + "/workflows/" + url.PathEscape(id) + "/" + runID
	summary := "live-migrate db-primary from compute-1 to compute-2"
	pages := []struct {
		name, url string
		want      []string
		lacks     string
	}{
		// The list the UI shows for a visibility query on pinflow's search
		// attributes: this migration only.
		{name: "ui-list", url: base + "/workflows?query=" + url.QueryEscape(query), want: []string{id, runID, "PinflowInstance"}},
		// The operators' view: the migration and the drain, not the audit.
		{name: "ui-operators", url: base + "/workflows?query=" + url.QueryEscape(api.OperatorsView), want: []string{id, drainID}, lacks: auditID},
		// The run's search attributes: instance, operation, hosts, phase.
		{name: "ui-migration", url: run + "/search-attributes", want: []string{id, "PinflowInstance", uuid, "PinflowOperation", "live-migration",
			"PinflowSourceHost", "compute-1", "PinflowDestHost", "compute-2", "PinflowPhase", "completed"}},
		// The static summary and the last current details.
		{name: "ui-summary", url: run + "/user-metadata", want: []string{id, summary, "completed"}},
		// A drain's details: a row per guest with where it went.
		{name: "ui-drain", url: base + "/workflows/" + url.PathEscape(drainID) + "/" + drainRun + "/user-metadata",
			want: []string{"drain host compute-1", cache, "cache-1", "moved", "compute-2"}},
	}
	for _, p := range pages {
		dom := render(t, chromium, p.url, filepath.Join(dir, p.name+".png"))
		if err := os.WriteFile(filepath.Join(dir, p.name+".html"), []byte(dom), 0o644); err != nil {
			t.Fatal(err)
		}
		text := dom + "\n" + strings.Join(markdownFrames(dom), "\n")
		for _, w := range p.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s (%s): the rendered page lacks %q; see %s", p.name, p.url, w, filepath.Join(dir, p.name+".html"))
			}
		}
		if p.lacks != "" && strings.Contains(text, p.lacks) {
			t.Errorf("%s (%s): the rendered page shows %q; see %s", p.name, p.url, p.lacks, filepath.Join(dir, p.name+".html"))
		}
	}
}

// render loads url in a fresh headless Chromium twice: once for its DOM
// once scripts have run, once for a screenshot into png.
func render(t *testing.T, chromium, url, png string) string {
	t.Helper()
	flags := func(profile string) []string {
		return []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--disable-dev-shm-usage", "--hide-scrollbars", "--user-data-dir=" + profile,
			"--window-size=1400,1000", "--virtual-time-budget=15000"}
	}
	run := func(extra ...string) []byte {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, chromium, append(append(flags(t.TempDir()), extra...), url)...)
		out, err := cmd.Output()
		if err != nil {
			var stderr string
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("chromium %s: %v\n%s", url, err, stderr)
		}
		return out
	}
	dom := run("--dump-dom")
	run("--screenshot=" + png)
	if st, err := os.Stat(png); err != nil || st.Size() == 0 {
		t.Fatalf("chromium wrote no screenshot to %s: %v", png, err)
	}
	return string(dom)
}

// frameSrc matches the UI's markdown frames: summaries and details are
// rendered by /render?content=MARKDOWN in an iframe, outside the DOM.
var frameSrc = regexp.MustCompile(`<iframe[^>]* src="(/render\?[^"]*)"`)

// markdownFrames returns the markdown each of dom's render frames shows.
func markdownFrames(dom string) []string {
	var out []string
	for _, m := range frameSrc.FindAllStringSubmatch(dom, -1) {
		u, err := url.Parse(html.UnescapeString(m[1]))
		if err != nil {
			continue
		}
		out = append(out, u.Query().Get("content"))
	}
	return out
}
