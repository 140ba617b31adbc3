package testenv

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
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

// TemporalOption changes how StartTemporal runs the server.
type TemporalOption func(*testsuite.DevServerOptions)

// WithUI serves the Web UI on a free port.
func WithUI() TemporalOption {
	return func(o *testsuite.DevServerOptions) { o.EnableUI = true }
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
func StartTemporal(t testing.TB, opts ...TemporalOption) *Temporal {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	o := testsuite.DevServerOptions{
		ExistingPath: TemporalCLI(t),
		ClientOptions: &client.Options{HostPort: fmt.Sprintf("127.0.0.1:%d", port), Namespace: "default",
			Logger: tlog.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))},
		LogLevel: "error",
		Stdout:   io.Discard,
		Stderr:   io.Discard,
	}
	for _, opt := range opts {
		opt(&o)
	}
	uiPort := 0
	if o.EnableUI {
		if uiPort, err = freePort(); err != nil {
			t.Fatal(err)
		}
		o.UIPort = fmt.Sprint(uiPort)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := testsuite.StartDevServer(ctx, o)
	if err != nil {
		t.Fatalf("testenv: start the Temporal dev server: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Logf("testenv: stop the Temporal dev server: %v", err)
		}
	})
	return &Temporal{Address: srv.FrontendHostPort(), Namespace: "default", UIPort: uiPort, Client: srv.Client()}
}
