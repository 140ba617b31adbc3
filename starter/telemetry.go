package main

import (
	"context"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
)

// invoked is the command path dispatch ran ("migrate", "host add"); it
// names the command's root span.
var invoked string

// startTelemetry sets up the configured exporters and opens the command's
// root span, the parent of the Temporal start span and so of the whole
// operation's trace.
func (a *app) startTelemetry() error {
	tel, err := a.cfg.Telemetry(a.ctx, "pinflow", os.Stderr)
	if err != nil {
		return err
	}
	a.tel = tel
	a.ctx, a.span = tel.Start(a.ctx, "pinflow "+invoked, attribute.String("pinflow.command", invoked))
	return nil
}

// endTelemetry ends the root span, recording err, and flushes the
// exporters, bounded so that a dead collector cannot hold up the exit.
func (a *app) endTelemetry(err error) {
	if a.tel == nil {
		return
	}
	if err != nil {
		a.span.RecordError(err)
		a.span.SetStatus(codes.Error, err.Error())
	}
	a.span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A flush failure must not change the command's result; the exporter
	// has reported it through OpenTelemetry's error handler.
	_ = a.tel.Shutdown(ctx)
}
