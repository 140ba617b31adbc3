package sim

import (
	"context"
	"fmt"
	"sort"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/hypervisor"
)

var _ hypervisor.Driver = (*Driver)(nil)

// Define makes a persistent domain on host from domainXML, named by its
// <uuid>; a new domain is shut off. Defining an existing domain replaces
// its XML and keeps its state, as libvirt does. A domain lives on one host:
// defining it on a second host is rejected while the first holds it.
func (d *Driver) Define(ctx context.Context, host, domainXML string) error {
	doc, err := parseDomain(domainXML)
	if err != nil {
		return fmt.Errorf("sim: define on %s: %w", host, err)
	}
	fail := func(err error) error {
		return fmt.Errorf("sim: define %s on %s: %w", doc.UUID, host, err)
	}
	if err := d.checkHost(ctx, host); err != nil {
		return fail(err)
	}
	if err := d.pace(ctx, host, OpDefine); err != nil {
		return fail(err)
	}
	if err := d.claimHome(ctx, host, doc.UUID); err != nil {
		return fail(err)
	}
	code, _, err := d.run(ctx, defineScript, d.domKeys(host, doc.UUID), doc.UUID, doc.Name, domainXML)
	if err != nil {
		return fail(err)
	}
	return d.codeErr(code, nil, host, doc.UUID, fail)
}

// claimHome makes host the domain's home. The home held by another host
// moves only when that host no longer has the domain (a definition whose
// undefine was interrupted, say).
func (d *Driver) claimHome(ctx context.Context, host, uuid string) error {
	for range 3 {
		code, rest, err := d.run(ctx, claimHomeScript, []string{d.homeKey(uuid), d.migrationKey(uuid)}, host)
		if err != nil {
			return err
		}
		switch code {
		case "OK":
			return nil
		case "MIGRATING":
			return fmt.Errorf("the domain is migrating from %s to %s; roll the migration back first: %w", rest[0], rest[1], hypervisor.ErrRejected)
		}
		other := rest[0]
		n, err := d.rdb.Exists(ctx, d.domKey(other, uuid)).Result()
		if err != nil {
			return err
		}
		if n == 1 {
			return fmt.Errorf("the domain is defined on %s, and a domain lives on one host; undefine it there first: %w", other, hypervisor.ErrRejected)
		}
		if _, _, err := d.run(ctx, moveHomeScript, []string{d.homeKey(uuid)}, other, host); err != nil {
			return err
		}
	}
	return fmt.Errorf("the domain's home keeps changing under concurrent defines; retry")
}

// codeErr turns a script's status code into the error of an operation on
// domain uuid; rest is the rest of the script's answer.
func (d *Driver) codeErr(code string, rest []string, host, uuid string, fail func(error) error) error {
	switch code {
	case "OK":
		return nil
	case "NOHOST":
		return fail(unknownHost(host))
	case "NOTFOUND":
		return fail(fmt.Errorf("%w", hypervisor.ErrNotFound))
	case "INCOMING":
		return fail(fmt.Errorf("the domain is the destination of an in-flight migration to %s; let it finish or roll it back: %w", host, hypervisor.ErrRejected))
	case "MIGRATING":
		return fail(fmt.Errorf("the domain is migrating away from %s; let it finish or roll it back: %w", host, hypervisor.ErrRejected))
	case "ACTIVE":
		return fail(fmt.Errorf("the domain is %s; stop it first: %w", rest[0], hypervisor.ErrRejected))
	case "NOTRUNNING":
		return fail(fmt.Errorf("the domain is %s, and only a running domain migrates: %w", rest[0], hypervisor.ErrRejected))
	case "EXISTS":
		return fail(fmt.Errorf("the domain is already defined on %s (%s): %w", host, rest[0], hypervisor.ErrRejected))
	}
	return fail(fmt.Errorf("unexpected script answer %q", code))
}

// Start boots a defined domain; a running one succeeds. A domain pinned to
// CPUs or nodes the host lacks is rejected, as a real host fails to start
// it. An injected failure leaves the domain shut off.
func (d *Driver) Start(ctx context.Context, host, uuid string) error {
	fail := func(err error) error { return fmt.Errorf("sim: start %s on %s: %w", uuid, host, err) }
	u, err := normUUID(uuid)
	if err != nil {
		return fail(fmt.Errorf("%v: %w", err, hypervisor.ErrNotFound))
	}
	topo, err := d.topology(ctx, host)
	if err != nil {
		return fail(err)
	}
	if err := d.pace(ctx, host, OpStart); err != nil {
		return fail(err)
	}
	// The placement check reads the XML outside the script; the script
	// starts the domain only if that XML is still the current one.
	for range 3 {
		dom, err := d.lookup(ctx, host, u)
		if err != nil {
			return fail(err)
		}
		if dom.State != hypervisor.StateRunning {
			doc, err := parseDomain(dom.XML)
			if err != nil {
				return fail(err)
			}
			if err := checkPlacement(topo, doc); err != nil {
				return fail(err)
			}
		}
		code, rest, err := d.run(ctx, startScript, d.domKeys(host, u), dom.XML)
		if err != nil {
			return fail(err)
		}
		if code != "CHANGED" {
			return d.codeErr(code, rest, host, u, fail)
		}
	}
	return fail(fmt.Errorf("the domain's XML keeps changing under concurrent defines; retry"))
}

// Stop powers a domain off; a stopped one succeeds. A domain migrating
// away is not stopped: roll the migration back first.
func (d *Driver) Stop(ctx context.Context, host, uuid string) error {
	fail := func(err error) error { return fmt.Errorf("sim: stop %s on %s: %w", uuid, host, err) }
	u, err := normUUID(uuid)
	if err != nil {
		return fail(fmt.Errorf("%v: %w", err, hypervisor.ErrNotFound))
	}
	if err := d.checkHost(ctx, host); err != nil {
		return fail(err)
	}
	if err := d.pace(ctx, host, OpStop); err != nil {
		return fail(err)
	}
	code, rest, err := d.run(ctx, stopScript, d.domKeys(host, u))
	if err != nil {
		return fail(err)
	}
	return d.codeErr(code, rest, host, u, fail)
}

// Undefine removes a stopped domain's definition; a missing one succeeds,
// a running or paused one is rejected (stop it first).
func (d *Driver) Undefine(ctx context.Context, host, uuid string) error {
	fail := func(err error) error { return fmt.Errorf("sim: undefine %s on %s: %w", uuid, host, err) }
	u, err := normUUID(uuid)
	if err != nil {
		// No domain has a malformed UUID, so there is nothing to remove.
		return d.checkHostOnly(ctx, host, fail)
	}
	if err := d.checkHost(ctx, host); err != nil {
		return fail(err)
	}
	if err := d.pace(ctx, host, OpUndefine); err != nil {
		return fail(err)
	}
	code, rest, err := d.run(ctx, undefineScript, d.domKeys(host, u), u)
	if err != nil {
		return fail(err)
	}
	if err := d.codeErr(code, rest, host, u, fail); err != nil {
		return err
	}
	if _, _, err := d.run(ctx, releaseHomeScript, []string{d.homeKey(u), d.migrationKey(u)}, host); err != nil {
		return fail(err)
	}
	return nil
}

func (d *Driver) checkHostOnly(ctx context.Context, host string, fail func(error) error) error {
	if err := d.checkHost(ctx, host); err != nil {
		return fail(err)
	}
	return nil
}

// Lookup returns one domain, or an error wrapping ErrNotFound.
func (d *Driver) Lookup(ctx context.Context, host, uuid string) (*hypervisor.Domain, error) {
	u, err := normUUID(uuid)
	if err != nil {
		if err := d.checkHost(ctx, host); err != nil {
			return nil, fmt.Errorf("sim: lookup %s on %s: %w", uuid, host, err)
		}
		return nil, fmt.Errorf("sim: lookup on %s: %v: %w", host, err, hypervisor.ErrNotFound)
	}
	dom, err := d.lookup(ctx, host, u)
	if err != nil {
		return nil, fmt.Errorf("sim: lookup %s on %s: %w", u, host, err)
	}
	return dom, nil
}

// lookup reads domain u (a normalised UUID) of host.
func (d *Driver) lookup(ctx context.Context, host, u string) (*hypervisor.Domain, error) {
	pipe := d.rdb.Pipeline()
	exists := pipe.Exists(ctx, d.topoKey(host))
	fields := pipe.HGetAll(ctx, d.domKey(host, u))
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	if exists.Val() == 0 {
		return nil, unknownHost(host)
	}
	m := fields.Val()
	if len(m) == 0 {
		return nil, fmt.Errorf("%w", hypervisor.ErrNotFound)
	}
	return domainOf(m), nil
}

func domainOf(m map[string]string) *hypervisor.Domain {
	return &hypervisor.Domain{UUID: m["uuid"], Name: m["name"], State: hypervisor.State(m["state"]), XML: m["xml"]}
}

// Domains lists every domain on host, with its XML, by name then UUID. The
// paused destination of an in-flight migration is listed too, as libvirt
// lists it.
func (d *Driver) Domains(ctx context.Context, host string) ([]hypervisor.Domain, error) {
	fail := func(err error) error { return fmt.Errorf("sim: domains of %s: %w", host, err) }
	pipe := d.rdb.Pipeline()
	exists := pipe.Exists(ctx, d.topoKey(host))
	members := pipe.SMembers(ctx, d.domainsKey(host))
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fail(err)
	}
	if exists.Val() == 0 {
		return nil, fail(unknownHost(host))
	}
	uuids := members.Val()
	out := make([]hypervisor.Domain, 0, len(uuids))
	if len(uuids) == 0 {
		return out, nil
	}
	pipe = d.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(uuids))
	for i, u := range uuids {
		cmds[i] = pipe.HGetAll(ctx, d.domKey(host, u))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fail(err)
	}
	for _, c := range cmds {
		// A domain undefined between the two reads is gone.
		if m := c.Val(); len(m) > 0 {
			out = append(out, *domainOf(m))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].UUID < out[j].UUID
	})
	return out, nil
}
