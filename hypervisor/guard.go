package hypervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pinflow/pinflow/numa"
)

// Every call that changes a domain acts for a claim, and only while the
// operation that holds the claim still holds it: the step fences on the
// claim right before the call (the ledger's Fence or FenceTeardown) and
// makes the call with the fence's deadline. WithFence marks such a call's
// context, and Guarded refuses one that is not marked, so a step that
// forgot its fence fails at once, in every test, instead of acting after
// its operation ended.

type fenceKey struct{}

// WithFence marks ctx as that of a call made for claim (host/id) after it
// passed the claim's fence; ctx must end when the fence's lease does.
func WithFence(ctx context.Context, claim string) context.Context {
	return context.WithValue(ctx, fenceKey{}, claim)
}

// Unclaimed marks ctx as that of a call that acts on a domain no claim on
// its host names (a shut-off leftover, a record's guest whose claim is
// gone): there is no claim to fence on, and no pCPU it could take from a
// guest that has one. why says which.
func Unclaimed(ctx context.Context, why string) context.Context {
	return context.WithValue(ctx, fenceKey{}, "unclaimed: "+why)
}

// FenceOf returns what ctx was marked with, WithFence or Unclaimed.
func FenceOf(ctx context.Context) (string, bool) {
	s, ok := ctx.Value(fenceKey{}).(string)
	return s, ok && s != ""
}

// ErrUnfenced: a call that changes a domain came without a fence.
var ErrUnfenced = errors.New("unfenced: a call that changes a domain must act for a claim it fenced on")

// Guarded returns d refusing, with ErrUnfenced, every call that changes a
// domain whose context FenceOf finds no mark in, or that has no deadline.
// Reads pass.
func Guarded(d Driver) Driver { return guarded{d} }

type guarded struct{ d Driver }

func check(ctx context.Context, call, host, uuid string) error {
	if _, ok := FenceOf(ctx); !ok {
		return fmt.Errorf("%w: %s of %s on %s", ErrUnfenced, call, uuid, host)
	}
	if _, ok := ctx.Deadline(); !ok {
		return fmt.Errorf("%w: %s of %s on %s has no deadline; a fenced call ends with its lease", ErrUnfenced, call, uuid, host)
	}
	return nil
}

func (g guarded) Capabilities(ctx context.Context, host string) (*numa.Host, error) {
	return g.d.Capabilities(ctx, host)
}

func (g guarded) Define(ctx context.Context, host, xml string) error {
	if err := check(ctx, "define", host, "a domain"); err != nil {
		return err
	}
	return g.d.Define(ctx, host, xml)
}

func (g guarded) Start(ctx context.Context, host, uuid string) error {
	if err := check(ctx, "start", host, uuid); err != nil {
		return err
	}
	return g.d.Start(ctx, host, uuid)
}

func (g guarded) Shutdown(ctx context.Context, host, uuid string) error {
	if err := check(ctx, "shutdown", host, uuid); err != nil {
		return err
	}
	return g.d.Shutdown(ctx, host, uuid)
}

func (g guarded) Stop(ctx context.Context, host, uuid string) error {
	if err := check(ctx, "stop", host, uuid); err != nil {
		return err
	}
	return g.d.Stop(ctx, host, uuid)
}

func (g guarded) Undefine(ctx context.Context, host, uuid string) error {
	if err := check(ctx, "undefine", host, uuid); err != nil {
		return err
	}
	return g.d.Undefine(ctx, host, uuid)
}

func (g guarded) Lookup(ctx context.Context, host, uuid string) (*Domain, error) {
	return g.d.Lookup(ctx, host, uuid)
}

func (g guarded) Domains(ctx context.Context, host string) ([]Domain, error) {
	return g.d.Domains(ctx, host)
}

func (g guarded) PrepareMigration(ctx context.Context, dst, uuid, destXML string) error {
	return g.d.PrepareMigration(ctx, dst, uuid, destXML)
}

// Migrate fences itself (req.Fence) at the points the hypervisor allows;
// its context is marked by the step all the same.
func (g guarded) Migrate(ctx context.Context, req MigrateRequest, progress func(Progress)) error {
	if _, ok := FenceOf(ctx); !ok || req.Fence == nil {
		return fmt.Errorf("%w: migration of %s from %s to %s", ErrUnfenced, req.UUID, req.Source, req.Dest)
	}
	return g.d.Migrate(ctx, req, progress)
}

func (g guarded) Rollback(ctx context.Context, src, dst, uuid string) error {
	if err := check(ctx, "rollback", dst, uuid); err != nil {
		return err
	}
	return g.d.Rollback(ctx, src, dst, uuid)
}

func (g guarded) DetachDevices(ctx context.Context, host, uuid string, aliases []string) error {
	if err := check(ctx, "device detach", host, uuid); err != nil {
		return err
	}
	return g.d.DetachDevices(ctx, host, uuid, aliases)
}

func (g guarded) AttachDevices(ctx context.Context, host, uuid string, elements []string) error {
	if err := check(ctx, "device attach", host, uuid); err != nil {
		return err
	}
	return g.d.AttachDevices(ctx, host, uuid, elements)
}

func (g guarded) Repin(ctx context.Context, host, uuid, def string) error {
	if err := check(ctx, "re-pin", host, uuid); err != nil {
		return err
	}
	return g.d.Repin(ctx, host, uuid, def)
}

// Expired is ctx's error, or context.DeadlineExceeded once ctx's
// deadline has passed by the clock even if its timer has not fired yet:
// a worker that resumes after a freeze runs on before its timers do, and
// a call made then would act after its fence's lease. A driver checks it
// right before each call that changes a domain.
func Expired(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}
