package testenv

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
)

// Temporal is a Temporal CLI dev server on loopback.
type Temporal struct {
	// Address is the frontend's host:port.
	Address   string
	Namespace string
	// UIPort is the Web UI's port on 127.0.0.1, 0 when the UI is off.
	UIPort int
	// Client is connected to Address and Namespace.
	Client client.Client
}

// How long a dev server may take to answer, and how many servers one
// StartTemporal tries.
const (
	temporalStartTimeout  = time.Minute
	temporalStartAttempts = 3
)

type temporalConfig struct {
	ui bool
}

// TemporalOption changes how StartTemporal runs the server.
type TemporalOption func(*temporalConfig)

// WithUI serves the Web UI on a free port.
func WithUI() TemporalOption {
	return func(c *temporalConfig) { c.ui = true }
}

// ModuleRoot returns the directory of the project's go.mod, found by
// walking up from the test's working directory.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("testenv: no go.mod above %s", dir)
		}
		dir = parent
	}
}

// TemporalCLI returns the Temporal CLI: `temporal` on PATH, or the one
// deploy/deps.sh builds into the project's bin/.
func TemporalCLI(t testing.TB) string {
	t.Helper()
	if path, err := exec.LookPath("temporal"); err == nil {
		return path
	}
	local := filepath.Join(ModuleRoot(t), "bin", "temporal")
	if _, err := os.Stat(local); err == nil {
		return local
	}
	return RequireProgram(t, "temporal")
}

// StartTemporal starts a Temporal dev server (in-memory, headless unless
// WithUI) on a free loopback port and stops it when the test ends.
//
// A port found free can be taken before the server binds it, by another
// test's server or an outgoing connection, and the dev server picks more
// ports for its inner services. A server that exits while starting, or
// does not answer in time, is stopped, its log tail goes to the test's
// output, and another starts on other ports.
func StartTemporal(t testing.TB, opts ...TemporalOption) *Temporal {
	t.Helper()
	var cfg temporalConfig
	for _, opt := range opts {
		opt(&cfg)
	}
	cli, dir := TemporalCLI(t), t.TempDir()
	var lastErr error
	for attempt := 1; attempt <= temporalStartAttempts; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		srv, err := startDevServer(cli, filepath.Join(dir, fmt.Sprintf("temporal-%d.log", attempt)), port, cfg)
		if err == nil {
			t.Cleanup(srv.stop)
			return &srv.Temporal
		}
		lastErr = err
		t.Logf("testenv: Temporal dev server, attempt %d of %d: %v", attempt, temporalStartAttempts, err)
	}
	t.Fatalf("testenv: start the Temporal dev server: %v", lastErr)
	return nil
}

// devServer is one `temporal server start-dev` process.
type devServer struct {
	Temporal
	server *server
}

func startDevServer(cli, logPath string, port int, cfg temporalConfig) (*devServer, error) {
	srv := &devServer{Temporal: Temporal{Address: fmt.Sprintf("127.0.0.1:%d", port), Namespace: "default"}}
	args := []string{"server", "start-dev", "--ip", "127.0.0.1", "--port", strconv.Itoa(port),
		"--namespace", srv.Namespace, "--log-level", "error",
		"--dynamic-config-value", "frontend.enableServerVersionCheck=false",
		// The history shard reads its new tasks at most 20 times a second
		// by default, so every workflow and activity task waited up to
		// 50 ms before any worker could take it (docs/benchmarks.md).
		"--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000"}
	if cfg.ui {
		var err error
		if srv.UIPort, err = freePort(); err != nil {
			return nil, err
		}
		args = append(args, "--ui-port", strconv.Itoa(srv.UIPort))
	} else {
		args = append(args, "--headless")
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(cli, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	logger := tlog.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	dial := func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Client, err = client.DialContext(ctx, client.Options{HostPort: srv.Address, Namespace: srv.Namespace, Logger: logger})
		return err
	}
	if srv.server, err = startServer(cmd, "the Temporal dev server on "+srv.Address, logPath,
		temporalStartTimeout, 100*time.Millisecond, dial); err != nil {
		return nil, err
	}
	return srv, nil
}

// stop closes the client and stops the server.
func (s *devServer) stop() {
	s.Client.Close()
	s.server.stop(syscall.SIGTERM)
}
