package audit

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric instruments on the global meter provider: a no-op until the
// process installs one, and bound to it when it does.
var (
	metricsOnce sync.Once
	metKept     metric.Int64Counter
	metFreed    metric.Int64Counter
	metDrift    metric.Int64Counter
	metDuration metric.Float64Histogram
)

func instruments() {
	m := otel.Meter("github.com/pinflow/pinflow/audit")
	// Instrument creation fails only on invalid names, which these are not;
	// the returned instruments are then no-ops, never nil.
	metKept, _ = m.Int64Counter("pinflow.reconcile.claims.kept", metric.WithDescription("Claims the audit kept, by reason."))
	metFreed, _ = m.Int64Counter("pinflow.reconcile.claims.freed", metric.WithDescription("Claims the audit freed, by reason."))
	metDrift, _ = m.Int64Counter("pinflow.reconcile.drift", metric.WithDescription("Differences found between the ledger and the hypervisor, by kind."))
	metDuration, _ = m.Float64Histogram("pinflow.reconcile.host.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of one host's audit."))
}

// record adds a host audit's counts to the metrics.
func record(ctx context.Context, h *HostAudit) {
	metricsOnce.Do(instruments)
	// No host attribute: a cloud's hosts would multiply every series.
	dry := attribute.Bool("dry_run", h.DryRun)
	for _, c := range h.Tally.Kept {
		metKept.Add(ctx, int64(c.Count), metric.WithAttributes(attribute.String("reason", c.Reason)))
	}
	for _, c := range h.Tally.Freed {
		metFreed.Add(ctx, int64(c.Count), metric.WithAttributes(dry, attribute.String("reason", c.Reason)))
	}
	for _, c := range h.Tally.Drift {
		metDrift.Add(ctx, int64(c.Count), metric.WithAttributes(attribute.String("kind", c.Reason)))
	}
	metDuration.Record(ctx, h.Duration.Seconds())
}
