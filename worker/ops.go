package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/config"
	"github.com/pinflow/pinflow/health"
	"github.com/pinflow/pinflow/telemetry"
)

// startTelemetry sets up the configured exporters; the returned function
// flushes them, bounded so that a dead collector cannot hold up a stop.
func startTelemetry(ctx context.Context, cfg *config.Config, logger *slog.Logger) (*telemetry.Telemetry, func(), error) {
	tel, err := cfg.Telemetry(ctx, "pinflow-worker", os.Stdout)
	if err != nil {
		return nil, nil, err
	}
	return tel, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			logger.Warn("telemetry not flushed", "error", err)
		}
	}, nil
}

// serveOps serves /livez, /readyz and /metrics on PINFLOW_HEALTH_ADDR,
// and /metrics alone on PINFLOW_METRICS_ADDR, until ctx ends.
func serveOps(ctx context.Context, cfg *config.Config, tel *telemetry.Telemetry, rdb redis.UniversalClient, tc client.Client, logger *slog.Logger) error {
	logErr := func(err error) { logger.Error("ops endpoint failed", "error", err) }
	metrics := tel.MetricsHandler()
	if cfg.MetricsAddr != "" && metrics != nil {
		if err := health.Serve(ctx, cfg.MetricsAddr, health.Handler(nil, metrics), logErr); err != nil {
			return err
		}
		metrics = nil
	}
	if cfg.HealthAddr == "" {
		return nil
	}
	checks := []health.Check{health.Redis(rdb, cfg.RedisConfig.Endpoint()), health.Temporal(tc, cfg.Address)}
	return health.Serve(ctx, cfg.HealthAddr, health.Handler(checks, metrics), logErr)
}

// redisLogs passes go-redis's own log lines (a pool's dial retries) to the
// worker's logger at debug level: the error they end in reaches the worker
// and is reported once, with the endpoint.
type redisLogs struct{ logger *slog.Logger }

func (r redisLogs) Printf(ctx context.Context, format string, v ...any) {
	r.logger.DebugContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)), "component", "go-redis")
}
