package client

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/guestxml"
	"github.com/pinflow/pinflow/numa"
)

// aliasSpec is the flavor extra spec that asks for PCI devices by alias.
const aliasSpec = "pci_passthrough:alias"

// resolveAliases returns f with its pci_passthrough:alias resolved into
// PCI requests by the configured aliases (SetPCIAliases). The guest keeps
// them: a later change of the aliases moves no guest's devices.
func (c *Client) resolveAliases(f guest.Flavor) (guest.Flavor, error) {
	f.PCIRequests = nil
	spec, ok := f.ExtraSpecs[aliasSpec]
	if !ok {
		return f, nil
	}
	reqs, err := c.aliases.Requests(spec)
	if err != nil {
		return f, fmt.Errorf("%v: %w", err, ErrInvalid)
	}
	f.PCIRequests = reqs
	return f, nil
}

// checkPhysnets refuses an SR-IOV port on a physical network that no
// registered host has a device on (no host could ever take the guest),
// and a port whose device the domain XML cannot be written for.
func (c *Client) checkPhysnets(ctx context.Context, ports []numa.Port) error {
	var want []numa.Port
	for _, p := range ports {
		if p.VNICType == numa.VNICNormal {
			continue
		}
		if !slices.Contains(guestxml.WritableVNICTypes, p.VNICType) {
			return fmt.Errorf("port %s: vnic_type %s: pinflow writes the domain XML of normal, %s ports: %w",
				p.Name, p.VNICType, strings.Join(guestxml.WritableVNICTypes, ", "), ErrInvalid)
		}
		want = append(want, p)
	}
	if len(want) == 0 {
		return nil
	}
	offered, named, err := c.physnets(ctx)
	if err != nil {
		return err
	}
	for _, p := range want {
		if numa.ReachedByName(p.VNICType) && slices.Contains(offered, p.Physnet) && !slices.Contains(named, p.Physnet) {
			return fmt.Errorf("port %s: vnic_type %s reaches its device by the device's host-side name, and no host names a device on %s (dev_name in its device list): %w",
				p.Name, p.VNICType, p.Physnet, ErrInvalid)
		}
		if slices.Contains(offered, p.Physnet) {
			continue
		}
		known := "no host has devices on a physical network"
		if len(offered) > 0 {
			known = "hosts have devices on " + strings.Join(offered, ", ")
		}
		return fmt.Errorf("port %s: physical network %q: %s: %w", p.Name, p.Physnet, known, ErrInvalid)
	}
	return nil
}

// physnets are the physical networks the registered hosts' devices are on,
// and those some of them with a host-side name are on, sorted.
func (c *Client) physnets(ctx context.Context) (all, named []string, err error) {
	hosts, err := c.led.Hosts(ctx)
	if err != nil {
		return nil, nil, err
	}
	views, err := c.led.ReadHosts(ctx, hosts, nil)
	if err != nil {
		return nil, nil, err
	}
	for _, v := range views {
		if v.Topology == nil {
			continue
		}
		for _, d := range v.Topology.PCIDevices {
			n := d.Tags["physical_network"]
			if n != "" && !slices.Contains(all, n) {
				all = append(all, n)
			}
			if n != "" && d.DevName != "" && !slices.Contains(named, n) {
				named = append(named, n)
			}
		}
	}
	slices.Sort(all)
	slices.Sort(named)
	return all, named, nil
}

// SetPCIAliases sets the PCI aliases flavors ask for devices by
// (pci_passthrough:alias), as PINFLOW_PCI_ALIAS configures them.
func (c *Client) SetPCIAliases(a numa.PCIAliases) { c.aliases = a }
