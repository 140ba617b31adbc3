// Package telemetry sets up pinflow's OpenTelemetry traces and metrics:
// the exporters chosen by configuration (OTLP over gRPC, a Prometheus
// scrape handler, stdout, or none), Temporal's tracing interceptor and
// metrics handler, go-redis instrumentation, and spans around hypervisor
// driver calls. One operation is one trace: the CLI's span is the parent
// of the workflow's, which is the parent of each activity's, which is the
// parent of the Redis commands and driver calls that activity makes.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
	"go.temporal.io/sdk/interceptor"

	"github.com/pinflow/pinflow/hypervisor"
)

// ScopeName is the instrumentation scope of pinflow's own spans.
const ScopeName = "github.com/pinflow/pinflow"

// Propagator carries trace context and baggage across Temporal headers.
var Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Options say which program is set up.
type Options struct {
	// Service is the service.name resource attribute: pinflow-worker or
	// pinflow.
	Service string
	// Prefix names the configuration variables in errors (PINFLOW).
	Prefix string
	// Stdout receives the stdout exporters' output; os.Stdout when nil. The
	// CLI passes os.Stderr so that exported spans never mix with --json.
	Stdout io.Writer
}

// Telemetry holds the providers and what they instrument. A nil
// provider means that signal is off, and the matching instrumentation is
// not installed at all.
type Telemetry struct {
	tp       trace.TracerProvider
	mp       metric.MeterProvider
	tracer   interceptor.Interceptor
	prom     http.Handler
	shutdown []func(context.Context) error
}

// Setup builds the exporters cfg chooses, installs them as the global
// OpenTelemetry providers (the ledger and activities record their
// metrics through the global meter) and returns what instruments the
// Temporal client, Redis and the driver. Call Shutdown before exiting so
// that buffered spans and metrics are flushed.
func Setup(ctx context.Context, cfg Config, opts Options) (*Telemetry, error) {
	if err := cfg.Check(opts.Prefix); err != nil {
		return nil, err
	}
	out := opts.Stdout
	if out == nil {
		out = os.Stdout
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost(),
		resource.WithAttributes(attribute.String("service.name", opts.Service)))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	var (
		tp       *sdktrace.TracerProvider
		mp       *sdkmetric.MeterProvider
		prom     http.Handler
		shutdown []func(context.Context) error
	)
	fail := func(err error) (*Telemetry, error) {
		for _, f := range shutdown {
			_ = f(context.Background())
		}
		return nil, err
	}
	if cfg.Traces != ExporterNone {
		var exp sdktrace.SpanExporter
		switch cfg.Traces {
		case ExporterOTLP:
			o := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(cfg.OTLPEndpoint)}
			if cfg.Insecure {
				o = append(o, otlptracegrpc.WithInsecure())
			}
			exp, err = otlptracegrpc.New(ctx, o...)
		case ExporterStdout:
			exp, err = stdouttrace.New(stdouttrace.WithWriter(out))
		}
		if err != nil {
			return fail(fmt.Errorf("telemetry: %s trace exporter to %s: %w", cfg.Traces, cfg.OTLPEndpoint, err))
		}
		tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))))
		shutdown = append(shutdown, tp.Shutdown)
	}
	if cfg.Metrics != ExporterNone {
		var reader sdkmetric.Reader
		switch cfg.Metrics {
		case ExporterPrometheus:
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			reader, err = otelprom.New(otelprom.WithRegisterer(reg))
			prom = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
		case ExporterOTLP:
			o := []otlpmetricgrpc.Option{otlpmetricgrpc.WithEndpoint(cfg.OTLPEndpoint)}
			if cfg.Insecure {
				o = append(o, otlpmetricgrpc.WithInsecure())
			}
			var exp sdkmetric.Exporter
			if exp, err = otlpmetricgrpc.New(ctx, o...); err == nil {
				reader = sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(cfg.MetricsInterval))
			}
		case ExporterStdout:
			var exp sdkmetric.Exporter
			if exp, err = stdoutmetric.New(stdoutmetric.WithWriter(out)); err == nil {
				reader = sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(cfg.MetricsInterval))
			}
		}
		if err != nil {
			return fail(fmt.Errorf("telemetry: %s metric exporter: %w", cfg.Metrics, err))
		}
		mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithResource(res))
		shutdown = append(shutdown, mp.Shutdown)
	}
	var t *Telemetry
	switch {
	case tp != nil && mp != nil:
		t, err = New(tp, mp)
	case tp != nil:
		t, err = New(tp, nil)
	case mp != nil:
		t, err = New(nil, mp)
	default:
		t, err = New(nil, nil)
	}
	if err != nil {
		return fail(err)
	}
	t.prom, t.shutdown = prom, shutdown
	if tp != nil {
		otel.SetTracerProvider(tp)
		otel.SetTextMapPropagator(Propagator)
	}
	if mp != nil {
		otel.SetMeterProvider(mp)
	}
	return t, nil
}

// New returns Telemetry on the given providers, either of which may be
// nil (that signal off). It installs nothing globally and exports nothing
// itself: tests pass in-memory providers.
func New(tp trace.TracerProvider, mp metric.MeterProvider) (*Telemetry, error) {
	t := &Telemetry{tp: tp, mp: mp}
	if tp != nil {
		ic, err := temporalotel.NewTracingInterceptor(temporalotel.TracerOptions{
			Tracer:            tp.Tracer("go.temporal.io/sdk"),
			TextMapPropagator: Propagator,
			// The CLI polls the status query while it follows an
			// operation; a span per poll would bury the operation's own.
			DisableQueryTracing: true,
		})
		if err != nil {
			return nil, fmt.Errorf("telemetry: temporal tracing interceptor: %w", err)
		}
		t.tracer = ic
	}
	return t, nil
}

// Tracing says whether traces are recorded.
func (t *Telemetry) Tracing() bool { return t.tp != nil }

// ClientOptions adds Temporal's tracing interceptor and metrics handler to
// o, for the signals that are on. A worker made from the client inherits
// the interceptor, so workflows and activities are traced too.
func (t *Telemetry) ClientOptions(o *client.Options) {
	if t.tracer != nil {
		o.Interceptors = append(o.Interceptors, t.tracer)
	}
	if t.mp != nil {
		o.MetricsHandler = temporalotel.NewMetricsHandler(temporalotel.MetricsHandlerOptions{
			Meter:                t.mp.Meter("go.temporal.io/sdk"),
			UseMonotonicCounters: true,
			OnError:              otel.Handle,
		})
	}
}

// InstrumentRedis traces rdb's commands (without their arguments, which
// hold claim tokens) and records its pool and latency metrics.
func (t *Telemetry) InstrumentRedis(rdb redis.UniversalClient) error {
	var errs []error
	if t.tp != nil {
		errs = append(errs, redisotel.InstrumentTracing(rdb, redisotel.WithTracerProvider(t.tp), redisotel.WithDBStatement(false)))
	}
	if t.mp != nil {
		errs = append(errs, redisotel.InstrumentMetrics(rdb, redisotel.WithMeterProvider(t.mp)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("telemetry: instrument redis: %w", err)
	}
	return nil
}

// Driver returns d with a span around every call when traces are on, and
// d itself otherwise.
func (t *Telemetry) Driver(d hypervisor.Driver) hypervisor.Driver {
	if t.tp == nil {
		return d
	}
	return &TracedDriver{Next: d, Tracer: t.tp.Tracer(ScopeName + "/hypervisor")}
}

// Start starts a span named name under ctx's span; with traces off it
// returns ctx and a span that records nothing.
func (t *Telemetry) Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if t.tp == nil {
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.tp.Tracer(ScopeName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// MetricsHandler serves /metrics for Prometheus; nil unless the metrics
// exporter is prometheus.
func (t *Telemetry) MetricsHandler() http.Handler { return t.prom }

// Shutdown flushes and stops the exporters.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdown[i](ctx))
	}
	t.shutdown = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("telemetry: shutdown: %w", err)
	}
	return nil
}
