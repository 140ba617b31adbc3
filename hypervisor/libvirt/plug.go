package libvirt

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/pinflow/pinflow/hypervisor"
)

// unplugPoll is how often DetachDevices looks whether the guest has let
// its devices go.
const unplugPoll = 100 * time.Millisecond

// DetachDevices unplugs the devices of the given user aliases from the
// domain's definition and, while it runs, from the guest. A PCI unplug
// asks the guest, which lets the device go when it is ready: libvirt
// returns once it has asked, so DetachDevices waits until the running
// domain's XML no longer has the device, or ctx ends. An alias the domain
// does not have is skipped.
func (d *Driver) DetachDevices(ctx context.Context, host, uuid string, aliases []string) error {
	c, err := d.connect(ctx, host)
	if err != nil {
		return err
	}
	dom, err := c.lookup(ctx, uuid)
	if err != nil {
		return err
	}
	for _, alias := range aliases {
		if err := c.detach(ctx, dom, uuid, alias); err != nil {
			return err
		}
	}
	return nil
}

func (c *conn) detach(ctx context.Context, dom golibvirt.Domain, uuid, alias string) error {
	live, config, err := c.hasAlias(ctx, dom, alias)
	if err != nil {
		return err
	}
	if !live && !config {
		return nil
	}
	flags := uint32(0)
	if live {
		flags |= uint32(golibvirt.DomainDeviceModifyLive)
	}
	if config {
		flags |= uint32(golibvirt.DomainDeviceModifyConfig)
	}
	err = do(ctx, c, func(l *golibvirt.Libvirt) error { return l.DomainDetachDeviceAlias(dom, alias, flags) })
	// A removal already asked for and not yet done is asked again: the
	// guest has it in hand.
	if err != nil && libvirtCode(err) != golibvirt.ErrDeviceMissing && libvirtCode(err) != golibvirt.ErrOperationInvalid {
		return c.errorf(err, "detach device %s from domain %s (%s)", alias, uuid, dom.Name)
	}
	for live {
		if live, _, err = c.hasAlias(ctx, dom, alias); err != nil {
			return err
		}
		if !live {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("libvirt: detach device %s from domain %s on %s: the guest has not let it go: %w", alias, uuid, c.where(), ctx.Err())
		case <-time.After(unplugPoll):
		}
	}
	return nil
}

// AttachDevices plugs each device element into the domain's definition
// and, while it runs, into the guest. An element whose user alias the
// domain has already (running or defined) is not plugged there again.
func (d *Driver) AttachDevices(ctx context.Context, host, uuid string, elements []string) error {
	c, err := d.connect(ctx, host)
	if err != nil {
		return err
	}
	dom, err := c.lookup(ctx, uuid)
	if err != nil {
		return err
	}
	for _, el := range elements {
		alias, err := elementAlias(el)
		if err != nil {
			return fmt.Errorf("libvirt: attach to domain %s on %s: %w: %w", uuid, c.where(), err, hypervisor.ErrRejected)
		}
		live, config, err := c.hasAlias(ctx, dom, alias)
		if err != nil {
			return err
		}
		st, err := c.state(ctx, dom)
		if err != nil {
			return err
		}
		flags := uint32(0)
		if !live && st != hypervisor.StateShutoff {
			flags |= uint32(golibvirt.DomainDeviceModifyLive)
		}
		if !config {
			flags |= uint32(golibvirt.DomainDeviceModifyConfig)
		}
		if flags == 0 {
			continue
		}
		if err := do(ctx, c, func(l *golibvirt.Libvirt) error { return l.DomainAttachDeviceFlags(dom, el, flags) }); err != nil {
			return c.wrap(classifyDefinition(err), err, "attach device %s to domain %s (%s)", alias, uuid, dom.Name)
		}
	}
	return nil
}

// hasAlias says whether the running domain (live) and its definition
// (config) have a device with the user alias. A domain that is not
// running has no live devices.
func (c *conn) hasAlias(ctx context.Context, dom golibvirt.Domain, alias string) (live, config bool, err error) {
	st, err := c.state(ctx, dom)
	if err != nil {
		return false, false, err
	}
	read := func(flags golibvirt.DomainXMLFlags) (bool, error) {
		x, err := call(ctx, c, func(l *golibvirt.Libvirt) (string, error) { return l.DomainGetXMLDesc(dom, flags) })
		if err != nil {
			return false, c.errorf(err, "get the XML of domain %s", dom.Name)
		}
		aliases, err := deviceAliases(x)
		return aliases[alias], err
	}
	if st != hypervisor.StateShutoff {
		if live, err = read(0); err != nil {
			return false, false, err
		}
	}
	config, err = read(golibvirt.DomainXMLInactive)
	return live, config, err
}

// deviceAliases returns the alias names of the devices of a domain XML:
// the <alias name> of each child of <devices>.
func deviceAliases(domainXML string) (map[string]bool, error) {
	out := map[string]bool{}
	dec := xml.NewDecoder(strings.NewReader(domainXML))
	var path []string
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("libvirt: domain XML: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			path = append(path, t.Name.Local)
			if len(path) == 4 && path[1] == "devices" && t.Name.Local == "alias" {
				for _, a := range t.Attr {
					if a.Name.Local == "name" {
						out[a.Value] = true
					}
				}
			}
		case xml.EndElement:
			path = path[:len(path)-1]
		}
	}
}

// elementAlias reads the user alias ("ua-...") a device element carries,
// by which it is found again.
func elementAlias(el string) (string, error) {
	aliases, err := deviceAliases("<domain><devices>" + el + "</devices></domain>")
	if err != nil {
		return "", err
	}
	for a := range aliases {
		if strings.HasPrefix(a, "ua-") {
			return a, nil
		}
	}
	return "", fmt.Errorf("device element %.60q has no user alias (<alias name='ua-...'/>), by which it is found again", el)
}
