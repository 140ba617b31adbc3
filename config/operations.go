package config

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/telemetry"
)

// TelemetryConfig chooses the OpenTelemetry exporters.
type TelemetryConfig = telemetry.Config

// Operations is how pinflow's programs are operated: telemetry, the
// worker's health endpoint, and logging.
type Operations struct {
	TelemetryConfig
	// HealthAddr is a host:port where the worker serves /livez, /readyz
	// (Redis PING and Temporal health check) and, with prometheus metrics,
	// /metrics; empty serves nothing.
	HealthAddr string `envconfig:"HEALTH_ADDR"`
	// LogFormat is text or json.
	LogFormat string `envconfig:"LOG_FORMAT" default:"text"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `envconfig:"LOG_LEVEL" default:"info"`
}

var logLevels = map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}

// check says what is wrong with the operations settings.
func (o Operations) check() error {
	if err := o.TelemetryConfig.Check(Prefix); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if o.LogFormat != "text" && o.LogFormat != "json" {
		return fmt.Errorf("config: %s_LOG_FORMAT %q: allowed are text or json", Prefix, o.LogFormat)
	}
	if _, ok := logLevels[o.LogLevel]; !ok {
		return fmt.Errorf("config: %s_LOG_LEVEL %q: allowed are debug, info, warn or error", Prefix, o.LogLevel)
	}
	if o.Metrics == telemetry.ExporterPrometheus && o.MetricsAddr == "" && o.HealthAddr == "" {
		return fmt.Errorf("config: %s_OTEL_METRICS prometheus needs %s_METRICS_ADDR or %s_HEALTH_ADDR to serve /metrics on", Prefix, Prefix, Prefix)
	}
	return nil
}

// Logger is the structured logger the configuration asks for, on
// standard error.
func (o Operations) Logger() *slog.Logger {
	opts := &slog.HandlerOptions{Level: logLevels[o.LogLevel]}
	if o.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// Telemetry sets up the configured exporters for the program service,
// the stdout exporters writing to stdout (see telemetry.Setup).
func (o Operations) Telemetry(ctx context.Context, service string, stdout io.Writer) (*telemetry.Telemetry, error) {
	return telemetry.Setup(ctx, o.TelemetryConfig, telemetry.Options{Service: service, Prefix: Prefix, Stdout: stdout})
}

// WithTelemetry is a Dial option that adds t's tracing interceptor and
// metrics handler to the Temporal client.
func WithTelemetry(t *telemetry.Telemetry) func(*client.Options) {
	return t.ClientOptions
}
