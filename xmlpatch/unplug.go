package xmlpatch

import (
	"fmt"
	"slices"
	"strings"
)

// Device is one device element pinflow wrote for a placement (its user
// alias is DeviceAlias's), as the document has it.
type Device struct {
	Alias string `json:"alias"`
	// Address is the host PCI address it passes through, "dddd:bb:ss.f";
	// empty for a device a port reaches by name.
	Address string `json:"address,omitempty"`
	// Name is the host-side name such a port reaches its device by.
	Name string `json:"name,omitempty"`
	// Element is the element's text, byte for byte.
	Element string `json:"element"`
}

// Devices returns the device elements pinflow wrote in the domain, in
// document order: what a live migration unplugs before its copy and plugs
// again, rewritten for the destination, after it.
func Devices(domainXML string) ([]Device, error) {
	d, err := parseDomain(domainXML)
	if err != nil {
		return nil, err
	}
	var out []Device
	for _, dev := range d.devices {
		if IsDeviceAlias(dev.alias) {
			out = append(out, Device{Alias: dev.alias, Address: dev.addr, Name: dev.name, Element: d.doc[dev.el.start:dev.el.end]})
		}
	}
	return out, nil
}

// WithoutDevices returns the document without the device elements of the
// given aliases (and the blank before each), every other byte as it was.
// An alias the domain does not have is skipped: a device unplugged
// already.
func WithoutDevices(domainXML string, aliases []string) (string, error) {
	d, err := parseDomain(domainXML)
	if err != nil {
		return "", err
	}
	parent := d.root.elements("devices")
	var edits []edit
	for _, dev := range d.devices {
		if dev.alias == "" || !slices.Contains(aliases, dev.alias) {
			continue
		}
		blank := precedingBlank(d.doc, parent[0], dev.el)
		edits = append(edits, edit{dev.el.start - len(blank), dev.el.end, ""})
	}
	return d.apply(nil, edits), nil
}

// WithDevices returns the document with each element added as the last
// child of <devices>, indented as its last child is. An element whose
// alias the domain has already is skipped: a device plugged already. Each
// element must be one device element pinflow writes, with its alias.
func WithDevices(domainXML string, elements []string) (string, error) {
	d, err := parseDomain(domainXML)
	if err != nil {
		return "", err
	}
	parents := d.root.elements("devices")
	if len(parents) != 1 {
		return "", malformed("the domain has %d <devices> elements; a device goes into its one <devices>", len(parents))
	}
	devs := parents[0]
	have := map[string]bool{}
	for _, dev := range d.devices {
		have[dev.alias] = true
	}
	// The new elements line up with <devices>' last child, and the end
	// tag keeps its own line.
	ws := ""
	for _, c := range slices.Backward(devs.children) {
		if c.kind == elementNode {
			if in, ok := indentOf(d.doc, c.start); ok {
				ws = "\n" + in
			}
			break
		}
	}
	var sb strings.Builder
	for _, el := range elements {
		alias, err := deviceElementAlias(el)
		if err != nil {
			return "", err
		}
		if have[alias] {
			continue
		}
		have[alias] = true
		sb.WriteString(ws + strings.TrimSpace(el))
	}
	if sb.Len() == 0 {
		return domainXML, nil
	}
	at := devs.innerEnd
	// Before the blank that ends <devices>, so that its end tag stays
	// where it was.
	last := devs.children
	if n := len(last); n > 0 && last[n-1].isBlank(d.doc) {
		at = last[n-1].start
	}
	return d.apply(nil, []edit{{at, at, sb.String()}}), nil
}

// deviceElementAlias reads the user alias of one device element pinflow
// writes, and refuses any other element.
func deviceElementAlias(el string) (string, error) {
	n, err := parseTree(strings.TrimSpace(el))
	if err != nil {
		return "", malformed("device element: %v", err)
	}
	if _, named := namedInterfaces[attrOr(n, "type", "")]; !passesPCI(n) && (n.name != "interface" || !named) {
		return "", malformed("device element <%s>: allowed are <hostdev type='pci'> and <interface type='hostdev'|'direct'|'vdpa'|'vhostuser'>", n.name)
	}
	for _, c := range n.elements("alias") {
		if name, _ := c.attr("name"); IsDeviceAlias(name) {
			return name, nil
		}
	}
	return "", malformed("device element <%s> has no alias %sREQUEST-INDEX; pinflow plugs only the devices it wrote", n.name, deviceAliasPrefix)
}

// String says which device d is, for messages.
func (d Device) String() string { return fmt.Sprintf("%s (%s)", d.Alias, d.Address+d.Name) }
