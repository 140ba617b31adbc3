package xmlpatch

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/pinflow/pinflow/numa"
)

// deviceAliasPrefix begins the user alias of every device element pinflow
// writes for a placement: ua-pci-R-I is the I-th device taken for the
// placement's PCI request R. libvirt keeps user aliases ("ua-") in the
// definition, so Patch finds its own elements again on any host.
const deviceAliasPrefix = "ua-pci-"

// DeviceAlias is the user alias of the element of the index-th device
// taken for PCI request request.
func DeviceAlias(request, index int) string {
	return fmt.Sprintf("%s%d-%d", deviceAliasPrefix, request, index)
}

// IsDeviceAlias says whether a user alias is one of DeviceAlias's.
func IsDeviceAlias(name string) bool { return strings.HasPrefix(name, deviceAliasPrefix) }

// hostDevice is one PCI device the domain passes through: a <hostdev
// type='pci'> or an <interface type='hostdev'>, with its source address.
type hostDevice struct {
	el      *node
	address *node // <source><address>
	addr    string
	alias   string
}

// readDevices finds the PCI devices the domain passes through. A device
// named twice is malformed: no host could start such a domain.
func (d *domain) readDevices(one func(*node, string) (*node, error)) error {
	devs, err := one(d.root, "devices")
	if err != nil || devs == nil {
		return err
	}
	seen := map[string]bool{}
	for _, el := range devs.children {
		if el.kind != elementNode || !passesPCI(el) {
			continue
		}
		src, err := one(el, "source")
		if err != nil {
			return err
		}
		if src == nil {
			return malformed("<%s type='%s'> has no <source>; a PCI device passed through names its host address", el.name, attrOr(el, "type", ""))
		}
		addr, err := one(src, "address")
		if err != nil {
			return err
		}
		if addr == nil {
			return malformed("<%s type='%s'><source> has no <address>; a PCI device passed through names its host address", el.name, attrOr(el, "type", ""))
		}
		a, err := pciAddress(addr)
		if err != nil {
			return err
		}
		if seen[a] {
			return malformed("PCI device %s is passed through twice; a device goes to one guest once", a)
		}
		seen[a] = true
		dev := hostDevice{el: el, address: addr, addr: a}
		if al, _ := one(el, "alias"); al != nil {
			dev.alias, _ = al.attr("name")
		}
		d.devices = append(d.devices, dev)
	}
	return nil
}

// passesPCI says whether a child of <devices> passes a host PCI device
// through: <hostdev mode='subsystem' type='pci'> or <interface
// type='hostdev'> (an SR-IOV VF as a network interface).
func passesPCI(el *node) bool {
	switch el.name {
	case "hostdev":
		return attrOr(el, "mode", "subsystem") == "subsystem" && attrOr(el, "type", "") == "pci"
	case "interface":
		return attrOr(el, "type", "") == "hostdev"
	}
	return false
}

func attrOr(n *node, name, def string) string {
	if v, ok := n.attr(name); ok {
		return strings.TrimSpace(v)
	}
	return def
}

// pciAddress reads <address domain bus slot function> as numa's
// "dddd:bb:ss.f". libvirt takes each number in hex (0x...) or decimal.
func pciAddress(n *node) (string, error) {
	if t := attrOr(n, "type", "pci"); t != "pci" {
		return "", malformed("<source><address type='%.20s'>: a PCI device's address has type pci", t)
	}
	limits := []struct {
		name string
		max  uint64
	}{{"domain", 0xffff}, {"bus", 0xff}, {"slot", 0x1f}, {"function", 0x7}}
	var v [4]uint64
	for i, l := range limits {
		s, ok := n.attr(l.name)
		if !ok {
			return "", malformed("<source><address> has no %s; a PCI address gives domain, bus, slot and function", l.name)
		}
		s = strings.TrimSpace(s)
		var err error
		if h, isHex := strings.CutPrefix(strings.ToLower(s), "0x"); isHex {
			v[i], err = strconv.ParseUint(h, 16, 64)
		} else {
			v[i], err = strconv.ParseUint(s, 10, 64)
		}
		if err != nil || v[i] > l.max {
			return "", malformed("<source><address %s='%.20s'>: allowed are 0-%#x, in hex (0x...) or decimal", l.name, s, l.max)
		}
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", v[0], v[1], v[2], v[3]), nil
}

// splitAddress is pciAddress's inverse for an address numa validated.
func splitAddress(a string) (dom, bus, slot, fn string, err error) {
	var d, b, s, f uint64
	if _, err := fmt.Sscanf(a, "%4x:%2x:%2x.%1x", &d, &b, &s, &f); err != nil || fmt.Sprintf("%04x:%02x:%02x.%x", d, b, s, f) != a {
		return "", "", "", "", badPlacement("device address %q: allowed is dddd:bb:ss.f in lower-case hex", a)
	}
	return fmt.Sprintf("0x%04x", d), fmt.Sprintf("0x%02x", b), fmt.Sprintf("0x%02x", s), fmt.Sprintf("0x%x", f), nil
}

// placedDevices flattens a placement's devices: for each PCI request, the
// addresses taken for it, in order.
func placedDevices(p *numa.Placement) (map[int][]string, int, error) {
	out := map[int][]string{}
	total := 0
	for _, t := range p.Devices {
		if len(t.Addresses) != t.Count {
			return nil, 0, badPlacement("request %d takes %d devices of %s:%s but names %d addresses; a host lists its devices one by one", t.Request, t.Count, t.VendorID, t.ProductID, len(t.Addresses))
		}
		out[t.Request] = append(out[t.Request], t.Addresses...)
		total += t.Count
	}
	return out, total, nil
}

// planDevices maps each device element pinflow wrote (by its alias) to the
// address p takes for it. Every device p takes has exactly one element;
// passed-through devices pinflow did not write are left alone.
func (d *domain) planDevices(p *numa.Placement) (map[*hostDevice]string, error) {
	placed, total, err := placedDevices(p)
	if err != nil {
		return nil, err
	}
	out := map[*hostDevice]string{}
	for i := range d.devices {
		dev := &d.devices[i]
		if !IsDeviceAlias(dev.alias) {
			continue
		}
		rest := strings.TrimPrefix(dev.alias, deviceAliasPrefix)
		var r, n int
		if _, err := fmt.Sscanf(rest, "%d-%d", &r, &n); err != nil || DeviceAlias(r, n) != dev.alias {
			return nil, malformed("device alias %q: pinflow's are %sREQUEST-INDEX", dev.alias, deviceAliasPrefix)
		}
		if n < 0 || n >= len(placed[r]) {
			return nil, mismatch("the domain passes through device %s as %s, but the placement takes %d devices for PCI request %d; the domain and the placement must ask for the same devices", dev.addr, dev.alias, len(placed[r]), r)
		}
		out[dev] = placed[r][n]
	}
	if len(out) != total {
		return nil, mismatch("the placement takes %d PCI devices but the domain has %d elements pinflow wrote for them; the domain and the placement must ask for the same devices", total, len(out))
	}
	return out, nil
}

// deviceEdits rewrites the source address of each planned device element,
// keeping its other attributes and their order.
func (d *domain) deviceEdits(plan map[*hostDevice]string) ([]edit, error) {
	var edits []edit
	for dev, a := range plan {
		if dev.addr == a {
			continue
		}
		dom, bus, slot, fn, err := splitAddress(a)
		if err != nil {
			return nil, err
		}
		values := map[string]string{"domain": dom, "bus": bus, "slot": slot, "function": fn}
		var kv []string
		for _, at := range dev.address.attrs {
			name := at.Name.Local
			if at.Name.Space != "" {
				name = at.Name.Space + ":" + name
			}
			v := at.Value
			if nv, ok := values[name]; ok {
				v = nv
			}
			kv = append(kv, name, v)
		}
		tag := element(dev.address.name, kv...)
		if dev.address.inner == dev.address.end {
			edits = append(edits, edit{dev.address.start, dev.address.end, tag})
			continue
		}
		// Keep the children of an <address> that has some (<zpci>).
		edits = append(edits, edit{dev.address.start, dev.address.inner, strings.TrimSuffix(tag, "/>") + ">"})
	}
	return edits, nil
}
