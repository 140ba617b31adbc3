package sim

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/xmlpatch"
)

// The simulator keeps one document per domain, so a device unplugged or
// plugged, or a re-pin, changes the running guest and its definition at
// once, as libvirt's live-and-config flags do.

// DetachDevices unplugs the devices of the given user aliases from the
// domain; an alias it does not have is skipped. A domain migrating, or
// the incoming side of a migration, is refused.
func (d *Driver) DetachDevices(ctx context.Context, host, uuid string, aliases []string) error {
	return d.changeDomain(ctx, host, uuid, OpDetach, "detach devices", func(doc string) (string, error) {
		return xmlpatch.WithoutDevices(doc, aliases)
	})
}

// AttachDevices plugs each device element into the domain; one whose
// alias the domain has already is skipped. A device the host does not
// have is rejected, as a real host fails to plug it.
func (d *Driver) AttachDevices(ctx context.Context, host, uuid string, elements []string) error {
	return d.changeDomain(ctx, host, uuid, OpAttach, "attach devices", func(doc string) (string, error) {
		return xmlpatch.WithDevices(doc, elements)
	})
}

// changeDomain rewrites domain uuid's document with change, if no other
// call changed it meanwhile; what names the change in errors.
func (d *Driver) changeDomain(ctx context.Context, host, uuid string, op Op, what string, change func(string) (string, error)) error {
	fail := func(err error) error { return fmt.Errorf("sim: %s of %s on %s: %w", what, uuid, host, err) }
	u, err := domainUUID(uuid)
	if err != nil {
		return fail(err)
	}
	topo, err := d.topology(ctx, host)
	if err != nil {
		return fail(err)
	}
	if err := d.pace(ctx, host, u, op); err != nil {
		return fail(err)
	}
	for range 3 {
		dom, err := d.lookup(ctx, host, u)
		if err != nil {
			return fail(err)
		}
		doc, err := change(dom.XML)
		if err != nil {
			if !errors.Is(err, hypervisor.ErrRejected) {
				err = fmt.Errorf("%w: %w", err, hypervisor.ErrRejected)
			}
			return fail(err)
		}
		if doc == dom.XML {
			return nil
		}
		if err := checkPins(topo, doc); err != nil {
			return fail(err)
		}
		code, rest, err := d.runOnDomain(ctx, setXMLScript, host, u, dom.XML, doc)
		if err != nil {
			return fail(err)
		}
		if code != "CHANGED" {
			return d.codeErr(code, rest, host, u, fail)
		}
	}
	return fail(fmt.Errorf("the domain's XML keeps changing under concurrent calls; retry"))
}

// KEYS topo, domains, dom, power. ARGV the XML the change was made to, the
// changed XML.
var setXMLScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'OFF'} end
local f = redis.call('HMGET', KEYS[3], 'xml', 'incoming', 'migration')
if not f[1] then return {'NOTFOUND'} end
if f[2] == '1' then return {'INCOMING', f[3] or ''} end
if f[3] and f[3] ~= '' then return {'MIGRATING', f[3]} end
if f[1] ~= ARGV[1] then return {'CHANGED'} end
redis.call('HSET', KEYS[3], 'xml', ARGV[2])
return {'OK'}
`)
