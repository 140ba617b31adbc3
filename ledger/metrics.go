package ledger

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pinflow/pinflow/numa"
)

// Metrics of the ledger, recorded through the global OpenTelemetry meter
// provider: a program that sets one (the worker, from PINFLOW_OTEL_METRICS)
// gets them, any other records nothing. Hosts are not an attribute: a
// cloud has thousands, and per-host detail is in traces and logs.
var meters = newMeters(otel.Meter("github.com/pinflow/pinflow/ledger"))

type ledgerMeters struct {
	claims    metric.Int64Counter
	claimTime metric.Float64Histogram
	conflicts metric.Int64Counter
	releases  metric.Int64Counter
}

func newMeters(m metric.Meter) ledgerMeters {
	var ms ledgerMeters
	var err error
	var errs []error
	ms.claims, err = m.Int64Counter("pinflow.ledger.claims",
		metric.WithDescription("Claim calls by outcome: ok, nofit, conflict (lost every race), invalid, down (the host is fenced or returning), error."), metric.WithUnit("{claim}"))
	errs = append(errs, err)
	ms.claimTime, err = m.Float64Histogram("pinflow.ledger.claim.duration",
		metric.WithDescription("Claim call duration, re-fits after lost races included."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1))
	errs = append(errs, err)
	ms.conflicts, err = m.Int64Counter("pinflow.ledger.claim.conflicts",
		metric.WithDescription("Claim scripts that lost a race and were retried after a re-fit, by reason: taken, gen (the topology changed), full (memory or pages)."), metric.WithUnit("{race}"))
	errs = append(errs, err)
	ms.releases, err = m.Int64Counter("pinflow.ledger.releases",
		metric.WithDescription("Release calls by operation (release, release-if-token) and whether they freed a claim."), metric.WithUnit("{release}"))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		otel.Handle(err)
	}
	return ms
}

// observeClaim records a finished Claim call that started at start.
func observeClaim(ctx context.Context, start time.Time, err error) {
	out := "ok"
	var nofit *numa.NoFitError
	switch {
	case err == nil:
	case errors.As(err, &nofit):
		out = "nofit"
	case errors.Is(err, ErrConflict):
		out = "conflict"
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrUnknownHost):
		out = "invalid"
	case errors.Is(err, ErrHostDown):
		out = "down"
	default:
		out = "error"
	}
	attrs := outcomeAttrs[out]
	meters.claims.Add(ctx, 1, attrs)
	meters.claimTime.Record(ctx, time.Since(start).Seconds(), attrs)
}

// observeLostRace records a claim script that refused for reason (its
// first reply word) and will be retried.
func observeLostRace(ctx context.Context, reason string) {
	attrs, ok := reasonAttrs[reason]
	if !ok {
		attrs = oneAttr("reason", reason)
	}
	meters.conflicts.Add(ctx, 1, attrs)
}

// observeRelease records a release call that freed a claim or not.
func observeRelease(ctx context.Context, op string, freed bool) {
	meters.releases.Add(ctx, 1, releaseAttrs[op][freed])
}

// The attribute sets are made once: building one per call costs a claim
// more than recording it.
var (
	outcomeAttrs = oneAttrs("outcome", "ok", "nofit", "conflict", "invalid", "down", "error")
	reasonAttrs  = oneAttrs("reason", "taken", "full", "gen")
	releaseAttrs = map[string]map[bool]metric.MeasurementOption{
		"release":          {true: releaseSet("release", true), false: releaseSet("release", false)},
		"release-if-token": {true: releaseSet("release-if-token", true), false: releaseSet("release-if-token", false)},
	}
)

func releaseSet(op string, freed bool) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("op", op), attribute.Bool("freed", freed)))
}

func oneAttr(key, value string) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String(key, value)))
}

func oneAttrs(key string, values ...string) map[string]metric.MeasurementOption {
	out := make(map[string]metric.MeasurementOption, len(values))
	for _, v := range values {
		out[v] = oneAttr(key, v)
	}
	return out
}
