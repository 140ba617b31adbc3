package client_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/operatorservice/v1"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/config"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/numa"
)

// TestExample runs the package's example against a real Redis, a real
// Temporal dev server and a pinflow worker on simulated hosts.
func TestExample(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis, Temporal and a worker")
	}
	rds := testenv.StartRedis(t)
	tmp := testenv.StartTemporal(t)
	env := map[string]string{
		"PINFLOW_REDIS_URL":           rds.URL(),
		"PINFLOW_TEMPORAL_ADDRESS":    tmp.Address,
		"PINFLOW_TEMPORAL_NAMESPACE":  tmp.Namespace,
		"PINFLOW_TEMPORAL_TASK_QUEUE": "example",
		"PINFLOW_RECONCILE_SCHEDULE":  "off",
		"PINFLOW_DRIVER":              config.DriverSim,
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	// Generous: the worker is built with -race first.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	led, rdb, err := cfg.Redis(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	drv, err := cfg.Simulator(rdb)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		host, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: 4, Threads: 1, MemoryMB: 8192})
		if err != nil {
			t.Fatal(err)
		}
		if err := drv.AddHost(ctx, name, host); err != nil {
			t.Fatal(err)
		}
		if _, err := led.RegisterHost(ctx, name, host); err != nil {
			t.Fatal(err)
		}
	}
	// Before any worker has registered pinflow's search attributes, which
	// every start carries, a start says what to do.
	c, err := cfg.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.DisableHost(ctx, "a", "maintenance"); err == nil || !strings.Contains(err.Error(), "start a pinflow worker on it first") {
		t.Errorf("DisableHost before any worker ran: %v, want the search attributes missing and what to do", err)
	}
	c.Close()
	startWorker(t)
	// The worker registers pinflow's search attributes, which a start
	// carries, as it starts.
	waitSearchAttributes(t, ctx, tmp)

	var out bytes.Buffer
	if err := bootAndMigrate(ctx, cfg, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if got != "web-1 booted on a, now runs on b pinned to 2 pCPUs\n" && got != "web-1 booted on b, now runs on a pinned to 2 pCPUs\n" {
		t.Errorf("the example printed %q, want web-1 moved between a and b with its 2 pCPUs", got)
	}
}

// waitSearchAttributes waits until a worker has registered pinflow's
// search attributes, which every start carries, or ctx ends.
func waitSearchAttributes(t *testing.T, ctx context.Context, tmp *testenv.Temporal) {
	t.Helper()
	for {
		sa, err := tmp.Client.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: tmp.Namespace})
		if err == nil && sa.GetCustomAttributes()[api.AttrInstance.GetName()] != 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the worker registered no search attributes: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startWorker builds the worker and runs it with the test's environment
// until the test ends.
func startWorker(t *testing.T) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pinflow-worker")
	build := exec.Command("go", "build", "-race", "-o", bin, "./worker")
	build.Dir = testenv.ModuleRoot(t)
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./worker: %v\n%s", err, b)
	}
	w := exec.Command(bin)
	var log bytes.Buffer
	w.Stdout, w.Stderr = &log, &log
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.Process.Kill()
		_ = w.Wait()
		if t.Failed() {
			t.Logf("worker log:\n%s", strings.TrimSpace(log.String()))
		}
	})
}
