package libvirt

import (
	"context"
	"errors"
	"fmt"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"

	"github.com/pinflow/pinflow/hypervisor"
)

// lookup finds a domain by UUID; its error wraps hypervisor.ErrNotFound
// when the host has no such domain.
func (c *conn) lookup(ctx context.Context, uuid string) (golibvirt.Domain, error) {
	u, err := hypervisor.ParseUUID(uuid)
	if err != nil {
		return golibvirt.Domain{}, fmt.Errorf("libvirt: %s: %w", c.where(), err)
	}
	dom, err := call(ctx, c, func(l *golibvirt.Libvirt) (golibvirt.Domain, error) { return l.DomainLookupByUUID(golibvirt.UUID(u)) })
	if err != nil {
		return golibvirt.Domain{}, c.errorf(err, "look up domain %s", uuid)
	}
	return dom, nil
}

// state returns a domain's run state. Running covers libvirt's blocked and
// shutting-down states; paused covers suspended and crashed guests, whose
// QEMU still exists.
//
// A destination domain whose post-copy migration failed counts as paused
// although libvirt says running: its vCPUs wait for pages only the paused
// source holds, so it is no guest running on the destination until the
// migration is resumed.
func (c *conn) state(ctx context.Context, dom golibvirt.Domain) (hypervisor.State, error) {
	st, reason, err := c.stateReason(ctx, dom)
	if err != nil {
		return "", err
	}
	switch {
	case st == golibvirt.DomainShutoff:
		return hypervisor.StateShutoff, nil
	case st == golibvirt.DomainPaused, st == golibvirt.DomainPmsuspended, st == golibvirt.DomainCrashed,
		st == golibvirt.DomainRunning && golibvirt.DomainRunningReason(reason) == golibvirt.DomainRunningPostcopyFailed:
		return hypervisor.StatePaused, nil
	default:
		return hypervisor.StateRunning, nil
	}
}

// stateReason returns libvirt's state of a domain and the reason for it.
func (c *conn) stateReason(ctx context.Context, dom golibvirt.Domain) (golibvirt.DomainState, int32, error) {
	type sr struct {
		st     golibvirt.DomainState
		reason int32
	}
	v, err := call(ctx, c, func(l *golibvirt.Libvirt) (sr, error) {
		s, r, err := l.DomainGetState(dom, 0)
		return sr{golibvirt.DomainState(s), r}, err
	})
	if err != nil {
		return 0, 0, c.errorf(err, "get the state of domain %s", uuid.UUID(dom.UUID).String())
	}
	return v.st, v.reason, nil
}

// stateOf returns the state of the domain with the given UUID; its error
// wraps hypervisor.ErrNotFound when there is none.
func (c *conn) stateOf(ctx context.Context, uuid string) (hypervisor.State, error) {
	dom, err := c.lookup(ctx, uuid)
	if err != nil {
		return "", err
	}
	return c.state(ctx, dom)
}

// describe returns a domain with its state and migratable XML.
func (c *conn) describe(ctx context.Context, dom golibvirt.Domain) (*hypervisor.Domain, error) {
	st, err := c.state(ctx, dom)
	if err != nil {
		return nil, err
	}
	x, err := call(ctx, c, func(l *golibvirt.Libvirt) (string, error) {
		return l.DomainGetXMLDesc(dom, golibvirt.DomainXMLMigratable)
	})
	if err != nil {
		return nil, c.errorf(err, "get the XML of domain %s", uuid.UUID(dom.UUID).String())
	}
	return &hypervisor.Domain{UUID: uuid.UUID(dom.UUID).String(), Name: dom.Name, State: st, XML: x}, nil
}

// Define makes a persistent domain from domainXML, or updates the
// definition of the domain with the same UUID and name (for a running
// domain, from its next boot). libvirt validates the XML against its
// schema; a refusal wraps hypervisor.ErrRejected.
func (d *Driver) Define(ctx context.Context, host, domainXML string) error {
	id, err := hypervisor.ReadDomainIdentity(domainXML)
	if err != nil {
		return fmt.Errorf("libvirt: define on host %s: domain XML: %w", host, err)
	}
	c, err := d.connect(ctx, host)
	if err != nil {
		return err
	}
	_, err = call(ctx, c, func(l *golibvirt.Libvirt) (golibvirt.Domain, error) {
		return l.DomainDefineXMLFlags(domainXML, golibvirt.DomainDefineValidate)
	})
	if err != nil {
		return c.wrap(classifyDefinition(err), err, "define domain %s (%s)", id.UUID, id.Name)
	}
	return nil
}

// Start boots a defined domain. A running domain is left alone and a paused
// one is resumed: either way the guest runs afterwards.
func (d *Driver) Start(ctx context.Context, host, uuid string) error {
	c, err := d.connect(ctx, host)
	if err != nil {
		return err
	}
	return c.start(ctx, uuid)
}

func (c *conn) start(ctx context.Context, uuid string) error {
	return c.bringTo(ctx, uuid, hypervisor.StateRunning, "start", func(dom golibvirt.Domain, st hypervisor.State) error {
		if st == hypervisor.StatePaused {
			return do(ctx, c, func(l *golibvirt.Libvirt) error { return l.DomainResume(dom) })
		}
		return do(ctx, c, func(l *golibvirt.Libvirt) error { return l.DomainCreate(dom) })
	})
}

// Shutdown asks the guest to power off by pressing its ACPI power button
// (libvirt's shutdown in ACPI mode, or the hypervisor's default mode where
// ACPI is not supported) and returns without waiting: the domain is shut
// off once the guest has powered itself off. A guest that ignores ACPI, as
// one without an operating system does, keeps running; Stop powers it off.
// A shut-off domain succeeds at once; a missing one is an error wrapping
// hypervisor.ErrNotFound.
func (d *Driver) Shutdown(ctx context.Context, host, uuid string) error {
	c, err := d.connect(ctx, host)
	if err != nil {
		return err
	}
	return c.shutdown(ctx, uuid)
}

func (c *conn) shutdown(ctx context.Context, uuid string) error {
	return c.bringTo(ctx, uuid, hypervisor.StateShutoff, "shut down", func(dom golibvirt.Domain, _ hypervisor.State) error {
		press := func(mode golibvirt.DomainShutdownFlagValues) error {
			return do(ctx, c, func(l *golibvirt.Libvirt) error { return l.DomainShutdownFlags(dom, mode) })
		}
		err := press(golibvirt.DomainShutdownAcpiPowerBtn)
		switch libvirtCode(err) {
		case golibvirt.ErrArgumentUnsupported, golibvirt.ErrNoSupport, golibvirt.ErrOperationUnsupported:
			// A hypervisor without the ACPI mode; its default is the nearest.
			err = press(golibvirt.DomainShutdownDefault)
		}
		return err
	})
}

// Stop powers a domain off at once (libvirt's destroy); a shut-off domain
// is left alone. A missing domain is an error wrapping
// hypervisor.ErrNotFound.
func (d *Driver) Stop(ctx context.Context, host, uuid string) error {
	c, err := d.connect(ctx, host)
	if err != nil {
		return err
	}
	return c.stop(ctx, uuid)
}

func (c *conn) stop(ctx context.Context, uuid string) error {
	return c.bringTo(ctx, uuid, hypervisor.StateShutoff, "stop", func(dom golibvirt.Domain, _ hypervisor.State) error {
		err := do(ctx, c, func(l *golibvirt.Libvirt) error { return l.DomainDestroy(dom) })
		if libvirtCode(err) == golibvirt.ErrNoDomain {
			return nil // a transient domain is gone once it stops
		}
		return err
	})
}

// bringTo brings a domain to state want: it runs act, given the domain's
// state, unless the domain is there already; verb names the operation in
// errors. Someone else may bring the domain there between the state check
// and the call: libvirt then calls the operation invalid, which is success.
func (c *conn) bringTo(ctx context.Context, uuid string, want hypervisor.State, verb string,
	act func(golibvirt.Domain, hypervisor.State) error) error {
	dom, err := c.lookup(ctx, uuid)
	if err != nil {
		return err
	}
	st, err := c.state(ctx, dom)
	if err != nil {
		return err
	}
	if st == want {
		return nil
	}
	err = act(dom, st)
	if err == nil {
		return nil
	}
	if libvirtCode(err) == golibvirt.ErrOperationInvalid {
		if now, serr := c.state(ctx, dom); serr == nil && now == want {
			return nil
		}
	}
	return c.errorf(err, "%s domain %s (%s)", verb, uuid, dom.Name)
}

// Undefine removes a shut-off domain's definition together with its
// managed save image, snapshot and checkpoint metadata and NVRAM. A
// missing domain is success; a domain that still runs is an error.
func (d *Driver) Undefine(ctx context.Context, host, uuid string) error {
	c, err := d.connect(ctx, host)
	if err != nil {
		return err
	}
	return c.undefine(ctx, uuid)
}

func (c *conn) undefine(ctx context.Context, uuid string) error {
	dom, err := c.lookup(ctx, uuid)
	if errors.Is(err, hypervisor.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	st, err := c.state(ctx, dom)
	if errors.Is(err, hypervisor.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if st != hypervisor.StateShutoff {
		return fmt.Errorf("libvirt: undefine domain %s (%s) on %s: it is %s; stop it first", uuid, dom.Name, c.where(), st)
	}
	flags := golibvirt.DomainUndefineManagedSave | golibvirt.DomainUndefineSnapshotsMetadata |
		golibvirt.DomainUndefineCheckpointsMetadata | golibvirt.DomainUndefineNvram
	err = do(ctx, c, func(l *golibvirt.Libvirt) error { return l.DomainUndefineFlags(dom, flags) })
	if err == nil || libvirtCode(err) == golibvirt.ErrNoDomain {
		return nil
	}
	return c.errorf(err, "undefine domain %s (%s)", uuid, dom.Name)
}

// Lookup returns the domain with its state and migratable XML, or an error
// wrapping hypervisor.ErrNotFound.
func (d *Driver) Lookup(ctx context.Context, host, uuid string) (*hypervisor.Domain, error) {
	c, err := d.connect(ctx, host)
	if err != nil {
		return nil, err
	}
	dom, err := c.lookup(ctx, uuid)
	if err != nil {
		return nil, err
	}
	return c.describe(ctx, dom)
}

// Domains lists every domain of the host, running or only defined, with
// its state and migratable XML, in libvirt's order. Domains that vanish
// while they are listed are left out.
func (d *Driver) Domains(ctx context.Context, host string) ([]hypervisor.Domain, error) {
	c, err := d.connect(ctx, host)
	if err != nil {
		return nil, err
	}
	doms, err := call(ctx, c, func(l *golibvirt.Libvirt) ([]golibvirt.Domain, error) {
		ds, _, err := l.ConnectListAllDomains(1, 0)
		return ds, err
	})
	if err != nil {
		return nil, c.errorf(err, "list domains")
	}
	out := make([]hypervisor.Domain, 0, len(doms))
	for _, dom := range doms {
		desc, err := c.describe(ctx, dom)
		if errors.Is(err, hypervisor.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, *desc)
	}
	return out, nil
}
