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
// type='pci'> or an <interface type='hostdev'>, with its source address;
// or one a port of pinflow's reaches by its host-side name: an
// <interface type='direct'>, 'vdpa' or 'vhostuser' with pinflow's alias,
// with the name in its <source> (addr is then empty).
type hostDevice struct {
	el      *node
	address *node // <source><address>
	addr    string
	alias   string
	// source, nameAttr and name are a named device's <source>, the
	// attribute that names the device, and the name.
	source   *node
	nameAttr string
	name     string
}

// namedInterfaces are the interface types of ports that reach a device by
// its host-side name, with the <source> attribute that names it.
var namedInterfaces = map[string]string{"direct": "dev", "vdpa": "dev", "vhostuser": "path"}

// readDevices finds the PCI devices the domain passes through. A device
// named twice is malformed: no host could start such a domain.
func (d *domain) readDevices(one func(*node, string) (*node, error)) error {
	devs, err := one(d.root, "devices")
	if err != nil || devs == nil {
		return err
	}
	seen := map[string]bool{}
	for _, el := range devs.children {
		if el.kind != elementNode {
			continue
		}
		if !passesPCI(el) {
			dev, err := namedDevice(el, one)
			if err != nil {
				return err
			}
			if dev != nil {
				if seen[dev.name] {
					return malformed("device %s is passed to the guest twice; a device goes to one guest once", dev.name)
				}
				seen[dev.name] = true
				d.devices = append(d.devices, *dev)
			}
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

// namedDevice reads a port's interface that reaches its device by name,
// when el is one pinflow wrote (its alias is pinflow's); nil otherwise:
// the operator's own interfaces are not pinflow's to track.
func namedDevice(el *node, one func(*node, string) (*node, error)) (*hostDevice, error) {
	attr, ok := namedInterfaces[attrOr(el, "type", "")]
	if el.name != "interface" || !ok {
		return nil, nil
	}
	al, err := one(el, "alias")
	if err != nil || al == nil {
		return nil, err
	}
	alias, _ := al.attr("name")
	if !IsDeviceAlias(alias) {
		return nil, nil
	}
	src, err := one(el, "source")
	if err != nil {
		return nil, err
	}
	name := ""
	if src != nil {
		name = attrOr(src, attr, "")
	}
	if name == "" {
		return nil, malformed("<interface type='%s'> %s has no <source %s>; pinflow's ports name their device there", attrOr(el, "type", ""), alias, attr)
	}
	return &hostDevice{el: el, alias: alias, source: src, nameAttr: attr, name: name}, nil
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
func placedDevices(p *numa.Placement) (map[int][]placed, int, error) {
	out := map[int][]placed{}
	total := 0
	for _, t := range p.Devices {
		if len(t.Addresses) != t.Count {
			return nil, 0, badPlacement("request %d takes %d devices of %s:%s but names %d addresses; a host lists its devices one by one", t.Request, t.Count, t.VendorID, t.ProductID, len(t.Addresses))
		}
		for i, a := range t.Addresses {
			pd := placed{addr: a}
			if i < len(t.Names) {
				pd.name = t.Names[i]
			}
			out[t.Request] = append(out[t.Request], pd)
		}
		total += t.Count
	}
	return out, total, nil
}

// placed is one device a placement takes: its address and host-side name.
type placed struct{ addr, name string }

// planDevices maps each device element pinflow wrote (by its alias) to the
// address p takes for it. Every device p takes has exactly one element;
// passed-through devices pinflow did not write are left alone.
func (d *domain) planDevices(p *numa.Placement) (map[*hostDevice]placed, error) {
	taken, total, err := placedDevices(p)
	if err != nil {
		return nil, err
	}
	out := map[*hostDevice]placed{}
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
		if n < 0 || n >= len(taken[r]) {
			return nil, mismatch("the domain passes through device %s as %s, but the placement takes %d devices for PCI request %d; the domain and the placement must ask for the same devices", dev.addr+dev.name, dev.alias, len(taken[r]), r)
		}
		if dev.source != nil && taken[r][n].name == "" {
			return nil, badPlacement("the domain reaches device %s (%s) by name, and the placement's device %s has none on its host (dev_name)", dev.name, dev.alias, taken[r][n].addr)
		}
		out[dev] = taken[r][n]
	}
	if len(out) != total {
		return nil, mismatch("the placement takes %d PCI devices but the domain has %d elements pinflow wrote for them; the domain and the placement must ask for the same devices", total, len(out))
	}
	return out, nil
}

// deviceEdits rewrites the source address of each planned device element,
// keeping its other attributes and their order.
func (d *domain) deviceEdits(plan map[*hostDevice]placed) ([]edit, error) {
	var edits []edit
	for dev, pd := range plan {
		if dev.source != nil {
			if dev.name != pd.name {
				edits = append(edits, rewriteAttr(dev.source, dev.nameAttr, pd.name))
			}
			continue
		}
		a := pd.addr
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

// rewriteAttr sets one attribute of el's start tag, adding it last when
// el has none, keeping its other attributes, their order and its children.
func rewriteAttr(el *node, name, value string) edit {
	var kv []string
	found := false
	for _, at := range el.attrs {
		n := at.Name.Local
		if at.Name.Space != "" {
			n = at.Name.Space + ":" + n
		}
		v := at.Value
		if n == name {
			v, found = value, true
		}
		kv = append(kv, n, v)
	}
	if !found {
		kv = append(kv, name, value)
	}
	tag := element(el.name, kv...)
	if el.inner == el.end {
		return edit{el.start, el.end, tag}
	}
	return edit{el.start, el.inner, strings.TrimSuffix(tag, "/>") + ">"}
}
