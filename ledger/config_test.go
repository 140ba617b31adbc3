package ledger

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kelseyhightower/envconfig"

	"github.com/pinflow/pinflow/internal/testenv"
)

func TestConfigFromEnvironment(t *testing.T) {
	t.Setenv("PINFLOW_REDIS_ADDRS", "10.0.0.1:7000,10.0.0.2:7000")
	t.Setenv("PINFLOW_REDIS_USERNAME", "pinflow")
	t.Setenv("PINFLOW_REDIS_PASSWORD", "s3cret")
	t.Setenv("PINFLOW_REDIS_TLS", "true")
	t.Setenv("PINFLOW_REDIS_TLS_CA", "/etc/pinflow/ca.pem")
	t.Setenv("PINFLOW_REDIS_WAIT_REPLICAS", "1")
	t.Setenv("PINFLOW_REDIS_WAIT_LOCAL", "true")
	var got Config
	if err := envconfig.Process("pinflow", &got); err != nil {
		t.Fatalf("envconfig.Process: %v", err)
	}
	want := Config{Addrs: []string{"10.0.0.1:7000", "10.0.0.2:7000"}, Username: "pinflow", Password: "s3cret",
		TLS: true, TLSCA: "/etc/pinflow/ca.pem", WaitReplicas: 1, WaitLocal: true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Config from PINFLOW_REDIS_* (-want +got):\n%s", diff)
	}
	if e := got.Endpoint(); e != "cluster 10.0.0.1:7000,10.0.0.2:7000" {
		t.Errorf("Endpoint() = %q, want the cluster addresses", e)
	}
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestNewClientErrors(t *testing.T) {
	ctx := context.Background()
	dead := closedPort(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		in   string // the error names this
	}{
		{"nothing listening", Config{URL: "redis://:hunter2@" + dead + "/0", DialTimeout: time.Second}, "the ledger's Redis at redis://" + dead + "/0: cannot connect"},
		{"nothing listening on the cluster", Config{Addrs: []string{dead}, Password: "hunter2", DialTimeout: time.Second}, "the ledger's Redis at cluster " + dead + ": cannot connect"},
		{"both url and addrs", Config{URL: "redis://" + dead, Addrs: []string{dead}}, "set REDIS_URL for one server or REDIS_ADDRS for a cluster"},
		{"bad scheme", Config{URL: "http://u:hunter2@" + dead}, "invalid URL scheme: http"},
		{"unparsable url", Config{URL: "redis://u:hunter2@host:port:x"}, "the ledger's Redis: REDIS_URL is not a redis://, rediss:// or unix:// URL"},
		{"bad addr", Config{Addrs: []string{"nohostport"}}, `REDIS_ADDRS entry "nohostport" is not host:port`},
		{"missing CA file", Config{URL: "redis://" + dead, TLSCA: "/nonexistent/ca.pem"}, "REDIS_TLS_CA /nonexistent/ca.pem: no such file or directory"},
		{"cert without key", Config{URL: "redis://" + dead, TLSCert: "/nonexistent/cert.pem"}, `REDIS_TLS_CERT "/nonexistent/cert.pem" and REDIS_TLS_KEY "": a client certificate and its key must be set together`},
	} {
		_, err := tc.cfg.NewClient(ctx)
		if err == nil {
			t.Errorf("NewClient(%s) succeeded, want an error", tc.name)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.in) || strings.Contains(msg, "hunter2") || strings.Contains(msg, "\n") {
			t.Errorf("NewClient(%s) error = %q, want one line naming %q and no password", tc.name, msg, tc.in)
		}
	}
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t, testenv.RedisConfigLines("requirepass hunter2"))
	if _, _, err := Open(ctx, Config{URL: srv.URL()}); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("Open without the password: error = %v, want an authentication error without the password", err)
	}
	_, _, err := Open(ctx, Config{URL: srv.URL(), Password: "wrong"})
	if err == nil || strings.Contains(err.Error(), "wrong") {
		t.Errorf("Open with a wrong password: error = %v, want an error without the password", err)
	}
	l, rdb, err := Open(ctx, Config{URL: srv.URL(), Password: "hunter2", KeyPrefix: "other"})
	if err != nil {
		t.Fatalf("Open(%s): %v", srv.URL(), err)
	}
	defer rdb.Close()
	register(t, l, "h1", testHost(1, 2))
	if n, err := rdb.Exists(ctx, "other:host:{h1}:topo").Result(); err != nil || n != 1 {
		t.Errorf("topology key under prefix other: exists = %d, %v; want 1", n, err)
	}
	if _, err := New(rdb, Options{KeyPrefix: "a{b}"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("New(prefix a{b}) error = %v, want ErrInvalid", err)
	}
}
