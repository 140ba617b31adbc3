package testenv

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"

	"go.temporal.io/api/workflowservice/v1"
)

// TestStartTemporalAnswers: the server StartTemporal returns serves its
// namespace through the client it hands out.
func TestStartTemporalAnswers(t *testing.T) {
	ts := StartTemporal(t)
	resp, err := ts.Client.WorkflowService().DescribeNamespace(context.Background(),
		&workflowservice.DescribeNamespaceRequest{Namespace: ts.Namespace})
	if err != nil {
		t.Fatalf("DescribeNamespace(%s) = %v", ts.Namespace, err)
	}
	if got := resp.GetNamespaceInfo().GetName(); got != "default" {
		t.Errorf("namespace = %q, want default", got)
	}
}

// TestDevServerOnATakenPortExits: a server whose port another process
// took is reported as exited, which StartTemporal retries on another
// port, rather than awaited until the start timeout.
func TestDevServerOnATakenPortExits(t *testing.T) {
	cli := TemporalCLI(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	srv, err := startDevServer(cli, filepath.Join(t.TempDir(), "temporal.log"), l.Addr().(*net.TCPAddr).Port, temporalConfig{})
	if err == nil {
		srv.stop()
		t.Fatalf("a dev server on the taken port %s started", l.Addr())
	}
	if !errors.Is(err, errExited) {
		t.Errorf("dev server on a taken port: %v; want it reported as exited", err)
	}
	t.Logf("dev server on a taken port: %v", err)
}
