package activities

import (
	"context"
	"errors"
	"reflect"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"

	"github.com/pinflow/pinflow/ledger"
)

// Observer returns a worker interceptor that makes every activity
// observable: activity.GetLogger carries, besides the workflow and
// activity ids Temporal adds, the instance, hosts and claims the activity
// works on (read from its input); each attempt's outcome is logged; and
// pinflow's activity and migration metrics are recorded through the
// global OpenTelemetry meter. Register it with worker.Options.Interceptors.
func Observer() interceptor.WorkerInterceptor { return &observer{} }

type observer struct {
	interceptor.WorkerInterceptorBase
}

func (*observer) InterceptActivity(_ context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	return &observedActivity{ActivityInboundInterceptorBase: interceptor.ActivityInboundInterceptorBase{Next: next}}
}

type observedActivity struct {
	interceptor.ActivityInboundInterceptorBase
}

func (o *observedActivity) Init(outbound interceptor.ActivityOutboundInterceptor) error {
	return o.Next.Init(&observedOutbound{ActivityOutboundInterceptorBase: interceptor.ActivityOutboundInterceptorBase{Next: outbound}})
}

// keyvalsKey holds an activity's log attributes in its context.
type keyvalsKey struct{}

type observedOutbound struct {
	interceptor.ActivityOutboundInterceptorBase
}

func (o *observedOutbound) GetLogger(ctx context.Context) log.Logger {
	l := o.Next.GetLogger(ctx)
	if kv, ok := ctx.Value(keyvalsKey{}).([]any); ok && len(kv) > 0 {
		return log.With(l, kv...)
	}
	return l
}

func (o *observedActivity) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (any, error) {
	info := activity.GetInfo(ctx)
	kv := logKeyvals(in.Args)
	ctx = context.WithValue(ctx, keyvalsKey{}, kv)
	name := info.ActivityType.Name
	if info.Attempt > 1 {
		meters.retries.Add(ctx, 1, metric.WithAttributes(attribute.String("activity", name)))
	}
	if phase := migrationPhaseAtStart(name); phase != "" {
		meters.phases.Add(ctx, 1, metric.WithAttributes(attribute.String("phase", phase)))
	}
	start := time.Now()
	res, err := o.Next.ExecuteActivity(ctx, in)
	took := time.Since(start)

	out := outcome(err)
	attrs := metric.WithAttributes(attribute.String("activity", name), attribute.String("outcome", out))
	meters.duration.Record(ctx, took.Seconds(), attrs)
	if name == "Migrate" {
		meters.migration.Record(ctx, took.Seconds(), metric.WithAttributes(attribute.String("outcome", out)))
	}
	if err == nil {
		if phase := migrationPhaseAtEnd(name, in.Args); phase != "" {
			meters.phases.Add(ctx, 1, metric.WithAttributes(attribute.String("phase", phase)))
		}
	}

	logger := activity.GetLogger(ctx)
	switch {
	case err == nil:
		// Debug: a worker runs dozens of activities a second; failures
		// and cancellations are what an operator reads.
		logger.Debug("activity done", "took", took.Round(time.Millisecond).String())
	case out == "cancelled":
		logger.Info("activity cancelled", "took", took.Round(time.Millisecond).String())
	default:
		logger.Warn("activity failed", "took", took.Round(time.Millisecond).String(), "outcome", out, "error", err)
	}
	return res, err
}

// outcome names an attempt's result for metrics: ok, cancelled, conflict
// (lost claim races), rejected (an error retrying cannot fix) or error.
func outcome(err error) string {
	var appErr *temporal.ApplicationError
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, ledger.ErrConflict):
		return "conflict"
	case errors.As(err, &appErr) && appErr.NonRetryable():
		return "rejected"
	}
	return "error"
}

// migrationPhaseAtStart is the live-migration phase an activity's start
// enters, following the workflow's phases.
func migrationPhaseAtStart(activityName string) string {
	switch activityName {
	case "UnplugDevices":
		return "unplugging"
	case "PlugDevices":
		return "plugging"
	case "PrepareMigration":
		return "preparing"
	case "Migrate":
		return "running"
	case "CommitMigration":
		return "committing"
	case "RollbackMigration":
		return "rolling-back"
	}
	return ""
}

// migrationPhaseAtEnd is the live-migration phase an activity's success
// enters: a destination claim accepts the migration, a commit completes it.
func migrationPhaseAtEnd(activityName string, args []any) string {
	switch activityName {
	case "Claim":
		if len(args) == 1 {
			if in, ok := args[0].(ClaimInput); ok && in.Kind == ledger.KindMigrationDest {
				return "accepted"
			}
		}
	case "CommitMigration":
		return "completed"
	case "RollbackMigration":
		return "rolled-back"
	}
	return ""
}

// logFields maps input field names to log attribute names. Reading them
// by name keeps every activity input, present and future, covered.
var logFields = []struct{ field, key string }{
	{"UUID", "instance"},
	{"Host", "host"},
	{"Source", "source_host"},
	{"Dest", "dest_host"},
	{"ClaimID", "claim"},
	{"SourceClaimID", "source_claim"},
	{"DestClaimID", "dest_claim"},
	{"OnlyClaimID", "claim"},
}

// logKeyvals returns the instance, hosts and claims an activity's input
// names, as log key-value pairs. A bare string argument is an instance
// uuid (LoadInstance, DeleteInstance).
func logKeyvals(args []any) []any {
	var kv []any
	for _, arg := range args {
		if s, ok := arg.(string); ok && s != "" {
			kv = append(kv, "instance", s)
			continue
		}
		v := reflect.ValueOf(arg)
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			continue
		}
		seen := map[string]bool{}
		for _, f := range logFields {
			fv := v.FieldByName(f.field)
			if !fv.IsValid() || fv.Kind() != reflect.String || fv.String() == "" || seen[f.key] {
				continue
			}
			seen[f.key] = true
			kv = append(kv, f.key, fv.String())
		}
	}
	return kv
}

// meters are the activity instruments, made on the global meter provider
// (the worker sets it from PINFLOW_OTEL_METRICS; until then they record
// nothing).
var meters = newMeters(otel.Meter("github.com/pinflow/pinflow/activities"))

type activityMeters struct {
	retries   metric.Int64Counter
	phases    metric.Int64Counter
	duration  metric.Float64Histogram
	migration metric.Float64Histogram
}

func newMeters(m metric.Meter) activityMeters {
	var ms activityMeters
	var errs []error
	var err error
	ms.retries, err = m.Int64Counter("pinflow.activity.retries",
		metric.WithDescription("Activity attempts after the first, by activity type."), metric.WithUnit("{attempt}"))
	errs = append(errs, err)
	ms.phases, err = m.Int64Counter("pinflow.migration.phases",
		metric.WithDescription("Live-migration phases entered, as the activities see them."), metric.WithUnit("{phase}"))
	errs = append(errs, err)
	ms.duration, err = m.Float64Histogram("pinflow.activity.duration",
		metric.WithDescription("Activity attempt duration, by activity type and outcome."), metric.WithUnit("s"))
	errs = append(errs, err)
	ms.migration, err = m.Float64Histogram("pinflow.migration.duration",
		metric.WithDescription("Duration of the hypervisor's live migration (the Migrate activity), by outcome."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		otel.Handle(err)
	}
	return ms
}
