package telemetry

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/numa"
)

// Span attributes of driver calls.
const (
	AttrHost     = attribute.Key("pinflow.host")
	AttrDest     = attribute.Key("pinflow.dest_host")
	AttrInstance = attribute.Key("pinflow.instance")
)

// TracedDriver is a hypervisor.Driver that wraps every call of Next in a
// span named "hypervisor.<Method>" with the host and instance as
// attributes, so a slow or failing hypervisor shows in the operation's
// trace.
type TracedDriver struct {
	Next   hypervisor.Driver
	Tracer trace.Tracer
}

var _ hypervisor.Driver = (*TracedDriver)(nil)

func (d *TracedDriver) start(ctx context.Context, method string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return d.Tracer.Start(ctx, "hypervisor."+method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// end records err on the span; ErrNotFound is an answer, not a failure.
func end(span trace.Span, err error) {
	if err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Capabilities implements hypervisor.Driver.
func (d *TracedDriver) Capabilities(ctx context.Context, host string) (*numa.Host, error) {
	ctx, span := d.start(ctx, "Capabilities", AttrHost.String(host))
	h, err := d.Next.Capabilities(ctx, host)
	end(span, err)
	return h, err
}

// Define implements hypervisor.Driver.
func (d *TracedDriver) Define(ctx context.Context, host, xml string) error {
	ctx, span := d.start(ctx, "Define", AttrHost.String(host))
	err := d.Next.Define(ctx, host, xml)
	end(span, err)
	return err
}

// Start implements hypervisor.Driver.
func (d *TracedDriver) Start(ctx context.Context, host, uuid string) error {
	ctx, span := d.start(ctx, "Start", AttrHost.String(host), AttrInstance.String(uuid))
	err := d.Next.Start(ctx, host, uuid)
	end(span, err)
	return err
}

// Stop implements hypervisor.Driver.
func (d *TracedDriver) Stop(ctx context.Context, host, uuid string) error {
	ctx, span := d.start(ctx, "Stop", AttrHost.String(host), AttrInstance.String(uuid))
	err := d.Next.Stop(ctx, host, uuid)
	end(span, err)
	return err
}

// Shutdown implements hypervisor.Driver.
func (d *TracedDriver) Shutdown(ctx context.Context, host, uuid string) error {
	ctx, span := d.start(ctx, "Shutdown", AttrHost.String(host), AttrInstance.String(uuid))
	err := d.Next.Shutdown(ctx, host, uuid)
	end(span, err)
	return err
}

// Undefine implements hypervisor.Driver.
func (d *TracedDriver) Undefine(ctx context.Context, host, uuid string) error {
	ctx, span := d.start(ctx, "Undefine", AttrHost.String(host), AttrInstance.String(uuid))
	err := d.Next.Undefine(ctx, host, uuid)
	end(span, err)
	return err
}

// Lookup implements hypervisor.Driver.
func (d *TracedDriver) Lookup(ctx context.Context, host, uuid string) (*hypervisor.Domain, error) {
	ctx, span := d.start(ctx, "Lookup", AttrHost.String(host), AttrInstance.String(uuid))
	dom, err := d.Next.Lookup(ctx, host, uuid)
	end(span, err)
	return dom, err
}

// Domains implements hypervisor.Driver.
func (d *TracedDriver) Domains(ctx context.Context, host string) ([]hypervisor.Domain, error) {
	ctx, span := d.start(ctx, "Domains", AttrHost.String(host))
	doms, err := d.Next.Domains(ctx, host)
	span.SetAttributes(attribute.Int("pinflow.domains", len(doms)))
	end(span, err)
	return doms, err
}

// PrepareMigration implements hypervisor.Driver.
func (d *TracedDriver) PrepareMigration(ctx context.Context, dst, uuid, destXML string) error {
	ctx, span := d.start(ctx, "PrepareMigration", AttrDest.String(dst), AttrInstance.String(uuid))
	err := d.Next.PrepareMigration(ctx, dst, uuid, destXML)
	end(span, err)
	return err
}

// Migrate implements hypervisor.Driver. Progress reports become span
// events when the phase changes, not on every report.
func (d *TracedDriver) Migrate(ctx context.Context, req hypervisor.MigrateRequest, progress func(hypervisor.Progress)) error {
	ctx, span := d.start(ctx, "Migrate", AttrHost.String(req.Source), AttrDest.String(req.Dest), AttrInstance.String(req.UUID))
	var (
		mu    sync.Mutex
		phase string
	)
	err := d.Next.Migrate(ctx, req, func(p hypervisor.Progress) {
		mu.Lock()
		if p.Phase != phase {
			phase = p.Phase
			span.AddEvent("migration phase", trace.WithAttributes(attribute.String("phase", p.Phase), attribute.Int("percent", p.Percent)))
		}
		mu.Unlock()
		progress(p)
	})
	end(span, err)
	return err
}

// Rollback implements hypervisor.Driver.
func (d *TracedDriver) Rollback(ctx context.Context, src, dst, uuid string) error {
	ctx, span := d.start(ctx, "Rollback", AttrHost.String(src), AttrDest.String(dst), AttrInstance.String(uuid))
	err := d.Next.Rollback(ctx, src, dst, uuid)
	end(span, err)
	return err
}

// DetachDevices implements hypervisor.Driver.
func (d *TracedDriver) DetachDevices(ctx context.Context, host, uuid string, aliases []string) error {
	ctx, span := d.start(ctx, "DetachDevices", AttrHost.String(host), AttrInstance.String(uuid), attribute.StringSlice("pinflow.devices", aliases))
	err := d.Next.DetachDevices(ctx, host, uuid, aliases)
	end(span, err)
	return err
}

// AttachDevices implements hypervisor.Driver.
func (d *TracedDriver) AttachDevices(ctx context.Context, host, uuid string, elements []string) error {
	ctx, span := d.start(ctx, "AttachDevices", AttrHost.String(host), AttrInstance.String(uuid), attribute.Int("pinflow.devices", len(elements)))
	err := d.Next.AttachDevices(ctx, host, uuid, elements)
	end(span, err)
	return err
}

// Repin implements hypervisor.Driver.
func (d *TracedDriver) Repin(ctx context.Context, host, uuid, def string) error {
	ctx, span := d.start(ctx, "Repin", AttrHost.String(host), AttrInstance.String(uuid))
	err := d.Next.Repin(ctx, host, uuid, def)
	end(span, err)
	return err
}
