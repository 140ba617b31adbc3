package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pinflow/pinflow/internal/testenv"
)

// workerSecret is the credential the tests give the worker; nothing it
// prints may contain it.
const workerSecret = "pf-w0rker-s3cret-71c2"

// TestWorkerOps starts a worker whose Redis needs a password, with JSON
// logs, Prometheus metrics and the health endpoint on: its startup line
// names the endpoints without the password, /readyz checks Redis and
// Temporal, /metrics serves Temporal's and pinflow's metrics.
func TestWorkerOps(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts Redis, Temporal and a worker; skipped with -short")
	}
	cli, worker := binaries(t)
	redis := testenv.StartRedis(t, testenv.RedisConfigLines("requirepass "+workerSecret))
	temporal := testenv.StartTemporal(t)
	healthAddr := freeAddr(t)
	env := append(os.Environ(),
		"PINFLOW_REDIS_URL=redis://:"+workerSecret+"@"+redis.Addr+"/0",
		"PINFLOW_TEMPORAL_ADDRESS="+temporal.Address,
		"PINFLOW_TEMPORAL_TASK_QUEUE=ops",
		"PINFLOW_RECONCILE_INTERVAL=0",
		"PINFLOW_LOG_FORMAT=json",
		"PINFLOW_OTEL_METRICS=prometheus",
		"PINFLOW_HEALTH_ADDR="+healthAddr,
	)
	cmd := exec.Command(worker)
	cmd.Env = env
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if strings.Contains(out.String(), workerSecret) {
			t.Errorf("the worker's output contains the Redis password:\n%s", out.String())
		}
	}()

	body := waitHTTP(t, "http://"+healthAddr+"/readyz", http.StatusOK)
	for _, want := range []string{"redis redis://" + redis.Addr + "/0: ok", "temporal " + temporal.Address + ": ok"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz = %q, want a line %q", body, want)
		}
	}
	if body := waitHTTP(t, "http://"+healthAddr+"/livez", http.StatusOK); strings.TrimSpace(body) != "ok" {
		t.Errorf("/livez = %q, want ok", body)
	}
	metrics := waitHTTP(t, "http://"+healthAddr+"/metrics", http.StatusOK)
	for _, want := range []string{"temporal_", "go_goroutines"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %q", want)
		}
	}
	// An audit reports how long it took and how many hosts it covered.
	audit := exec.Command(cli, "reconcile", "--wait")
	audit.Env = env
	if b, err := audit.CombinedOutput(); err != nil {
		t.Fatalf("pinflow reconcile --wait: %v\n%s", err, b)
	}
	metrics = waitHTTP(t, "http://"+healthAddr+"/metrics", http.StatusOK)
	for _, want := range []string{"pinflow_reconcile_duration", "pinflow_reconcile_hosts", "pinflow_reconcile_completed_time"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics after an audit has no %q", want)
		}
	}
	start := ""
	for deadline := time.Now().Add(30 * time.Second); start == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.Contains(line, `"msg":"pinflow worker starting"`) {
				start = line
			}
		}
	}
	if start == "" {
		t.Fatalf("no JSON startup line in the worker's output:\n%s", out.String())
	}
	for _, want := range []string{`"redis":"redis://` + redis.Addr + `/0"`, `"temporal":"` + temporal.Address + `"`, `"metrics":"prometheus"`} {
		if !strings.Contains(start, want) {
			t.Errorf("startup line %s lacks %s", start, want)
		}
	}
}

// TestWorkerBadCredentials: a worker given a wrong Redis password, or an
// API key (so TLS) for a plain Temporal, exits non-zero with one line
// naming the endpoint, and never prints the secret.
func TestWorkerBadCredentials(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts Redis, Temporal and a worker; skipped with -short")
	}
	_, worker := binaries(t)
	redis := testenv.StartRedis(t, testenv.RedisConfigLines("requirepass right-"+workerSecret))
	temporal := testenv.StartTemporal(t)
	tests := []struct {
		name string
		env  []string
		want []string
	}{
		{"wrong Redis password", []string{"PINFLOW_REDIS_URL=redis://" + redis.Addr + "/0", "PINFLOW_REDIS_PASSWORD=" + workerSecret},
			[]string{"the ledger's Redis at redis://" + redis.Addr + "/0: cannot connect", "WRONGPASS"}},
		{"API key on a plain Temporal", []string{"PINFLOW_REDIS_URL=redis://" + redis.Addr + "/0", "PINFLOW_REDIS_PASSWORD=right-" + workerSecret,
			"PINFLOW_TEMPORAL_API_KEY=" + workerSecret}, []string{"temporal " + temporal.Address, "cannot connect", "tls"}},
		{"bad exporter", []string{"PINFLOW_OTEL_TRACES=jaeger"}, []string{"PINFLOW_OTEL_TRACES", "otlp, stdout or none"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, worker)
			cmd.Env = append(os.Environ(), append([]string{"PINFLOW_TEMPORAL_ADDRESS=" + temporal.Address,
				"PINFLOW_TEMPORAL_TASK_QUEUE=bad", "PINFLOW_RECONCILE_INTERVAL=0"}, tt.env...)...)
			b, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("worker started; want it to exit with an error:\n%s", b)
			}
			out := strings.TrimSpace(string(b))
			if strings.Contains(out, workerSecret) {
				t.Errorf("the worker's output contains the secret:\n%s", out)
			}
			if strings.Count(out, "\n") != 0 {
				t.Errorf("the worker printed %d lines, want one:\n%s", strings.Count(out, "\n")+1, out)
			}
			for _, w := range append([]string{"pinflow-worker: "}, tt.want...) {
				if !strings.Contains(out, w) {
					t.Errorf("worker error %q does not contain %q", out, w)
				}
			}
		})
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitHTTP polls url until it answers status, and returns the body.
func waitHTTP(t *testing.T, url string, status int) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	last := ""
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == status {
				return string(b)
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("GET %s: want %d, last answer: %s", url, status, last)
	return ""
}

// syncBuffer is a bytes.Buffer safe for a process's output and a reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
