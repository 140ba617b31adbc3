package telemetry

import (
	"fmt"
	"time"
)

// Exporter names accepted by PINFLOW_OTEL_TRACES and PINFLOW_OTEL_METRICS.
const (
	ExporterNone       = "none"
	ExporterOTLP       = "otlp"
	ExporterStdout     = "stdout"
	ExporterPrometheus = "prometheus"
)

// Config chooses the exporters. Its envconfig tags are read under the
// caller's prefix (PINFLOW_OTEL_TRACES, ...). Everything is off by default.
type Config struct {
	// Traces is the trace exporter: otlp (gRPC to OTEL_ENDPOINT), stdout
	// or none.
	Traces string `envconfig:"OTEL_TRACES" default:"none"`
	// Metrics is the metric exporter: prometheus (scraped from the
	// worker's METRICS_ADDR or HEALTH_ADDR), otlp, stdout or none.
	Metrics string `envconfig:"OTEL_METRICS" default:"none"`
	// OTLPEndpoint is the OTLP gRPC collector's host:port.
	OTLPEndpoint string `envconfig:"OTEL_ENDPOINT" default:"127.0.0.1:4317"`
	// Insecure sends OTLP without TLS, for a collector on the same host or
	// pod.
	Insecure bool `envconfig:"OTEL_INSECURE"`
	// SampleRatio is the share of new traces recorded, 0 to 1; a trace
	// started by a caller that sampled it is always recorded.
	SampleRatio float64 `envconfig:"OTEL_SAMPLE_RATIO" default:"1"`
	// MetricsInterval is how often otlp and stdout metrics are exported.
	MetricsInterval time.Duration `envconfig:"OTEL_METRICS_INTERVAL" default:"30s"`
	// MetricsAddr is a host:port where the worker serves /metrics for
	// Prometheus; empty serves it on HEALTH_ADDR instead.
	MetricsAddr string `envconfig:"METRICS_ADDR"`
}

// Check says what is wrong with c, naming the variable and what is allowed.
func (c Config) Check(prefix string) error {
	switch c.Traces {
	case ExporterNone, ExporterOTLP, ExporterStdout:
	default:
		return fmt.Errorf("telemetry: %s_OTEL_TRACES %q: allowed are otlp, stdout or none", prefix, c.Traces)
	}
	switch c.Metrics {
	case ExporterNone, ExporterOTLP, ExporterStdout, ExporterPrometheus:
	default:
		return fmt.Errorf("telemetry: %s_OTEL_METRICS %q: allowed are prometheus, otlp, stdout or none", prefix, c.Metrics)
	}
	if c.SampleRatio < 0 || c.SampleRatio > 1 {
		return fmt.Errorf("telemetry: %s_OTEL_SAMPLE_RATIO %g: allowed is 0 to 1", prefix, c.SampleRatio)
	}
	if (c.Traces == ExporterOTLP || c.Metrics == ExporterOTLP) && c.OTLPEndpoint == "" {
		return fmt.Errorf("telemetry: %s_OTEL_ENDPOINT is empty: otlp needs the collector's host:port", prefix)
	}
	if c.Metrics != ExporterNone && c.Metrics != ExporterPrometheus && c.MetricsInterval <= 0 {
		return fmt.Errorf("telemetry: %s_OTEL_METRICS_INTERVAL %s: must be positive", prefix, c.MetricsInterval)
	}
	return nil
}
