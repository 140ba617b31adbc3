// Package health serves a worker's liveness and readiness over HTTP:
// /livez answers while the process runs, /readyz only while every
// dependency check passes (Redis PING, Temporal's health check), so an
// orchestrator stops routing to, or restarts, a worker that lost one.
package health

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/client"
)

// CheckTimeout bounds each check of one /readyz request.
const CheckTimeout = 3 * time.Second

// Check is one dependency's readiness check.
type Check struct {
	// Name is how /readyz reports it: redis, temporal.
	Name string
	// Endpoint is where the dependency is, without credentials.
	Endpoint string
	Run      func(ctx context.Context) error
}

// Redis checks the ledger's Redis with a PING.
func Redis(rdb redis.UniversalClient, endpoint string) Check {
	return Check{Name: "redis", Endpoint: endpoint, Run: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }}
}

// Temporal checks the Temporal frontend with its gRPC health check.
func Temporal(tc client.Client, endpoint string) Check {
	return Check{Name: "temporal", Endpoint: endpoint, Run: func(ctx context.Context) error {
		_, err := tc.CheckHealth(ctx, &client.CheckHealthRequest{})
		return err
	}}
}

// Handler serves /livez, /readyz and, when metrics is not nil, /metrics.
// /readyz runs the checks concurrently and answers 200 with one "ok" line
// per check, or 503 naming each failing check, its endpoint and error.
func Handler(checks []Check, metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		lines, ok := run(r.Context(), checks)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprint(w, strings.Join(lines, "\n")+"\n")
	})
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	return mux
}

// run runs the checks concurrently and returns a line per check, in the
// checks' order, and whether all passed.
func run(ctx context.Context, checks []Check) ([]string, bool) {
	lines := make([]string, len(checks))
	oks := make([]bool, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, CheckTimeout)
			defer cancel()
			if err := c.Run(cctx); err != nil {
				lines[i] = fmt.Sprintf("%s %s: %s", c.Name, c.Endpoint, strings.ReplaceAll(err.Error(), "\n", " "))
				return
			}
			lines[i], oks[i] = fmt.Sprintf("%s %s: ok", c.Name, c.Endpoint), true
		})
	}
	wg.Wait()
	for _, ok := range oks {
		if !ok {
			return lines, false
		}
	}
	return lines, true
}

// Serve serves h on addr until ctx ends, then shuts the server down. It
// returns once the listener is open, so a bad address is reported at
// start; errors after that go to errf.
func Serve(ctx context.Context, addr string, h http.Handler, errf func(error)) error {
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	ln, err := listen(addr)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			errf(fmt.Errorf("health: serve %s: %w", addr, err))
		}
	}()
	return nil
}

// listen opens addr, naming it in the error.
func listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health: listen on %s: %w", addr, err)
	}
	return ln, nil
}
