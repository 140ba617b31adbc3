package numa

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// PCIAlias is one alias entry of the configuration, as Nova's [pci] alias:
// a name flavors ask for devices by (pci_passthrough:alias=NAME:COUNT),
// the device it stands for, and the NUMA policy its devices need. Entries
// of one name are alternatives, and must agree on type and policy.
type PCIAlias struct {
	Name      string `json:"name"`
	VendorID  string `json:"vendor_id,omitempty"`
	ProductID string `json:"product_id,omitempty"`
	// DeviceType is type-PCI, type-PF or type-VF; any when empty.
	DeviceType DeviceType `json:"device_type,omitempty"`
	// NUMAPolicy is the devices' policy unless the flavor or image sets
	// one; legacy when empty.
	NUMAPolicy PCIPolicy `json:"numa_policy,omitempty"`
	// CapabilityType, when given, is "pci", the only kind there is.
	CapabilityType string `json:"capability_type,omitempty"`
}

// PCIAliases are the configured aliases by name.
type PCIAliases map[string]aliasEntry

type aliasEntry struct {
	policy PCIPolicy
	specs  []DeviceSpec
}

// ParsePCIAliases reads the aliases from a JSON array of alias objects,
// refusing what Nova refuses: an unknown field, a name that is empty or
// longer than 256 characters, a vendor or product id that is not four hex
// digits, another device type or policy, and two entries of one name with
// different types or policies. Its error is one line naming the entry.
func ParsePCIAliases(data []byte) (PCIAliases, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("PCI aliases: a JSON array of alias objects such as "+
			`[{"name": "nic", "vendor_id": "8086", "product_id": "154c", "device_type": "type-VF"}]: %v`, err)
	}
	out := PCIAliases{}
	types := map[string]DeviceType{}
	for i, r := range raw {
		var a PCIAlias
		dec := json.NewDecoder(bytes.NewReader(r))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&a); err != nil {
			return nil, fmt.Errorf("PCI alias %d: %v; allowed fields are name, vendor_id, product_id, device_type, numa_policy and capability_type", i, err)
		}
		name := strings.TrimSpace(a.Name)
		where := fmt.Sprintf("PCI alias %d (%q)", i, a.Name)
		switch {
		case name == "" || len(a.Name) > 256:
			return nil, fmt.Errorf("%s: name: allowed are 1-256 characters", where)
		case strings.ContainsAny(name, ":,"):
			return nil, fmt.Errorf("%s: name: ':' and ',' separate aliases and counts in pci_passthrough:alias, so a name has neither", where)
		case a.VendorID != "" && !pciHexID.MatchString(a.VendorID):
			return nil, fmt.Errorf("%s: vendor_id %q: allowed are four hex digits such as 8086", where, a.VendorID)
		case a.ProductID != "" && !pciHexID.MatchString(a.ProductID):
			return nil, fmt.Errorf("%s: product_id %q: allowed are four hex digits such as 154c", where, a.ProductID)
		case a.DeviceType != "" && a.DeviceType != DeviceTypePCI && a.DeviceType != DeviceTypePF && a.DeviceType != DeviceTypeVF:
			return nil, fmt.Errorf("%s: device_type %q: allowed are type-PCI, type-PF or type-VF", where, a.DeviceType)
		case a.NUMAPolicy != "" && !a.NUMAPolicy.valid():
			return nil, fmt.Errorf("%s: numa_policy %q: allowed are %s", where, a.NUMAPolicy, pciPolicies)
		case a.CapabilityType != "" && a.CapabilityType != "pci":
			return nil, fmt.Errorf("%s: capability_type %q: allowed is pci", where, a.CapabilityType)
		}
		policy := a.NUMAPolicy
		if policy == "" {
			policy = PCIPolicyLegacy
		}
		spec := DeviceSpec{}
		if a.VendorID != "" {
			spec["vendor_id"] = a.VendorID
		}
		if a.ProductID != "" {
			spec["product_id"] = a.ProductID
		}
		if a.DeviceType != "" {
			spec["dev_type"] = string(a.DeviceType)
		}
		e, seen := out[name]
		if seen && e.policy != policy {
			return nil, fmt.Errorf("%s: numa_policy %s, but an earlier entry of the alias has %s; entries of one alias share their policy", where, policy, e.policy)
		}
		if seen && types[name] != a.DeviceType {
			return nil, fmt.Errorf("%s: device_type %q, but an earlier entry of the alias has %q; entries of one alias share their type", where, a.DeviceType, types[name])
		}
		types[name] = a.DeviceType
		out[name] = aliasEntry{policy: policy, specs: append(e.specs, spec)}
	}
	return out, nil
}

// Names returns the aliases' names, sorted.
func (a PCIAliases) Names() []string {
	names := make([]string, 0, len(a))
	for n := range a {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Requests turns a flavor's pci_passthrough:alias value, NAME:COUNT[,...],
// into the guest's PCI requests, each carrying its alias's policy (which
// AddDevices settles with the flavor's and image's). An alias that is not
// configured, or a count below one, is refused in one line.
func (a PCIAliases) Requests(spec string) ([]PCIRequest, error) {
	var out []PCIRequest
	for _, item := range strings.Split(spec, ",") {
		name, count, ok := strings.Cut(item, ":")
		name = strings.TrimSpace(name)
		n, err := strconv.Atoi(strings.TrimSpace(count))
		if !ok || name == "" || err != nil {
			return nil, invalid("InvalidPCIRequest", "pci_passthrough:alias=%q: allowed is ALIAS:COUNT[,ALIAS:COUNT...]", spec)
		}
		e, found := a[name]
		if !found {
			known := "none are configured (PINFLOW_PCI_ALIAS)"
			if len(a) > 0 {
				known = "configured are " + strings.Join(a.Names(), ", ")
			}
			return nil, invalid("PciRequestAliasNotDefined", "pci_passthrough:alias: PCI alias %q is not defined; %s", name, known)
		}
		if n < 1 || n > maxPoolDevices {
			return nil, invalid("InvalidPCIRequest", "pci_passthrough:alias: %s:%d: allowed counts are 1-%d", name, n, maxPoolDevices)
		}
		specs := make([]DeviceSpec, len(e.specs))
		for i, s := range e.specs {
			specs[i] = DeviceSpec{}
			for k, v := range s {
				specs[i][k] = v
			}
		}
		out = append(out, PCIRequest{Count: n, Specs: specs, Policy: e.policy, Alias: name})
	}
	return out, nil
}

// VNIC types of a port, as Neutron names them.
const (
	VNICNormal          = "normal"
	VNICDirect          = "direct"
	VNICDirectPhysical  = "direct-physical"
	VNICMacvtap         = "macvtap"
	VNICVDPA            = "vdpa"
	VNICVirtioForwarder = "virtio-forwarder"
	VNICRemoteManaged   = "remote-managed"
)

var vnicTypes = []string{VNICNormal, VNICDirect, VNICDirectPhysical, VNICMacvtap, VNICVDPA, VNICVirtioForwarder, VNICRemoteManaged}

// Port is one of a guest's network ports: which network it is on and how
// it reaches the guest.
type Port struct {
	// Name names the port; the PCI request it makes carries it.
	Name string `json:"name"`
	// Physnet is the port's physical network; empty for a tunneled
	// (overlay) network.
	Physnet string `json:"physical_network,omitempty"`
	// VNICType is normal (a virtual NIC, no device), or direct, macvtap,
	// direct-physical, vdpa, virtio-forwarder or remote-managed: each takes
	// one PCI device (a VF; a PF for direct-physical; a vDPA device).
	VNICType string `json:"vnic_type"`
	// Policy, when set, is the device's NUMA policy, before the flavor's
	// and image's.
	Policy PCIPolicy `json:"numa_policy,omitempty"`
	// Trusted, when set, asks for a device tagged trusted (or not).
	Trusted *bool `json:"trusted,omitempty"`
}

// ReachedByName says whether a port of vnic type vnic reaches its device
// by the device's host-side name (PCIDevice.DevName) rather than passing
// it through: macvtap (a VF's netdev), vdpa (a vhost-vdpa device) and
// virtio-forwarder (a relay's vhost-user socket).
func ReachedByName(vnic string) bool {
	return vnic == VNICMacvtap || vnic == VNICVDPA || vnic == VNICVirtioForwarder
}

// PortRequests returns the PCI requests and network affinity a guest's
// ports make, as Nova makes them: each SR-IOV port asks for one device on
// its physical network (of type PF for direct-physical, vdpa for vdpa, and
// remote-managed or not as its type says), and the guest needs affinity to
// every port's physical network, and to the tunnel when a port is on a
// tunneled network. A port with an unknown type or policy, a repeated
// name, or an SR-IOV type without a physical network is refused.
func PortRequests(ports []Port) ([]PCIRequest, *NetworkAffinity, error) {
	if len(ports) == 0 {
		return nil, nil, nil
	}
	var reqs []PCIRequest
	net := &NetworkAffinity{}
	names := map[string]bool{}
	for i, p := range ports {
		where := fmt.Sprintf("port %d (%q)", i, p.Name)
		if p.Name == "" || names[p.Name] {
			return nil, nil, invalid("InvalidPort", "%s: each port needs a name of its own", where)
		}
		names[p.Name] = true
		if !slices.Contains(vnicTypes, p.VNICType) {
			return nil, nil, invalid("InvalidPort", "%s: vnic_type %q: allowed are %s", where, p.VNICType, strings.Join(vnicTypes, ", "))
		}
		if p.Policy != "" && !p.Policy.valid() {
			return nil, nil, invalid("InvalidPort", "%s: numa_policy %q: allowed are %s", where, p.Policy, pciPolicies)
		}
		if p.Physnet == "" {
			net.Tunneled = true
		} else if !slices.Contains(net.Physnets, p.Physnet) {
			net.Physnets = append(net.Physnets, p.Physnet)
		}
		if p.VNICType == VNICNormal {
			continue
		}
		if p.Physnet == "" {
			return nil, nil, invalid("InvalidPort", "%s: a %s port takes a device on a physical network; give its physical_network", where, p.VNICType)
		}
		spec := DeviceSpec{"physical_network": p.Physnet, "remote_managed": strconv.FormatBool(p.VNICType == VNICRemoteManaged)}
		switch p.VNICType {
		case VNICDirectPhysical:
			spec["dev_type"] = string(DeviceTypePF)
		case VNICVDPA:
			spec["dev_type"] = string(DeviceTypeVDPA)
		}
		if ReachedByName(p.VNICType) {
			spec[TagDevNamed] = "true"
		}
		if p.Trusted != nil {
			spec["trusted"] = strconv.FormatBool(*p.Trusted)
		}
		reqs = append(reqs, PCIRequest{Count: 1, Specs: []DeviceSpec{spec}, Policy: p.Policy, Port: p.Name, VNICType: p.VNICType})
	}
	slices.Sort(net.Physnets)
	return reqs, net, nil
}
