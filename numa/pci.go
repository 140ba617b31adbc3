package numa

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// DeviceType is a PCI device pool's dev_type.
type DeviceType string

// Device types, as Nova names them.
const (
	DeviceTypePCI  DeviceType = "type-PCI" // a whole device passed through
	DeviceTypePF   DeviceType = "type-PF"  // an SR-IOV physical function
	DeviceTypeVF   DeviceType = "type-VF"  // an SR-IOV virtual function
	DeviceTypeVDPA DeviceType = "vdpa"     // a vDPA device
)

// PCIPolicy is hw:pci_numa_affinity_policy: how close to the guest's host
// cells its PCI devices must be.
type PCIPolicy string

// PCI NUMA affinity policies.
const (
	// PCIPolicyRequired takes only devices on the guest's host cells.
	PCIPolicyRequired PCIPolicy = "required"
	// PCIPolicyLegacy takes devices on the guest's host cells when they
	// have enough, otherwise devices there or with no NUMA node. The
	// default.
	PCIPolicyLegacy PCIPolicy = "legacy"
	// PCIPolicyPreferred takes near devices first, then any.
	PCIPolicyPreferred PCIPolicy = "preferred"
	// PCIPolicySocket takes devices on the guest's host cells when they
	// have enough, otherwise devices on the sockets of those cells.
	PCIPolicySocket PCIPolicy = "socket"
)

const pciPolicies = "required, legacy, preferred or socket"

func (p PCIPolicy) valid() bool {
	switch p {
	case PCIPolicyRequired, PCIPolicyLegacy, PCIPolicyPreferred, PCIPolicySocket:
		return true
	}
	return false
}

// maxPoolDevices bounds a pool's count, so that sums over every pool of a
// host stay exact.
const maxPoolDevices = 1 << 20

// DevicePool is a group of identical free PCI devices of a host, as Nova's
// PCI stats pool them: Count devices of one vendor, product and type on one
// NUMA node, with the tags the operator gave them.
type DevicePool struct {
	VendorID  string
	ProductID string
	DevType   DeviceType
	// NUMANode is the host cell the devices are attached to; nil when the
	// host reports no NUMA node for them.
	NUMANode *int
	Count    int
	// Tags are the pool's other properties (physical_network,
	// remote_managed, address, ...), which requests match by name.
	Tags map[string]string
	// Addresses are the pool's devices, Count of them, when the host lists
	// its devices (Host.PCIDevices); a fit then names those it takes.
	Addresses []string
}

// The pool keys that are not tags.
var poolFields = map[string]bool{"vendor_id": true, "product_id": true, "dev_type": true, "numa_node": true, "count": true}

// MarshalJSON writes the pool flat, tags beside its fields, as the case
// format and Nova's pool dicts have it.
func (p DevicePool) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, len(p.Tags)+5)
	for k, v := range p.Tags {
		m[k] = v
	}
	m["vendor_id"], m["product_id"], m["dev_type"], m["count"] = p.VendorID, p.ProductID, p.DevType, p.Count
	m["numa_node"] = p.NUMANode
	return json.Marshal(m)
}

// UnmarshalJSON reads a flat pool: vendor_id, product_id and count are
// required, dev_type defaults to type-PCI, numa_node to none, and every
// other key is a tag with a string value.
func (p *DevicePool) UnmarshalJSON(data []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("a pool is a JSON object of vendor_id, product_id, count, numa_node, dev_type and tags")
	}
	out := DevicePool{DevType: DeviceTypePCI}
	str := func(k string) (string, error) {
		var s string
		if err := json.Unmarshal(m[k], &s); err != nil {
			return "", fmt.Errorf("%s %s: must be a string", k, truncate(m[k]))
		}
		return s, nil
	}
	for _, k := range []string{"vendor_id", "product_id", "count"} {
		if _, ok := m[k]; !ok {
			return fmt.Errorf("%s is missing", k)
		}
	}
	var err error
	if out.VendorID, err = str("vendor_id"); err != nil {
		return err
	}
	if out.ProductID, err = str("product_id"); err != nil {
		return err
	}
	if err := json.Unmarshal(m["count"], &out.Count); err != nil {
		return fmt.Errorf("count %s: allowed are whole numbers 0-%d", truncate(m["count"]), maxPoolDevices)
	}
	if raw, ok := m["numa_node"]; ok {
		if err := json.Unmarshal(raw, &out.NUMANode); err != nil {
			return fmt.Errorf("numa_node %s: allowed are a host cell id or null", truncate(raw))
		}
	}
	if _, ok := m["dev_type"]; ok {
		s, err := str("dev_type")
		if err != nil {
			return err
		}
		out.DevType = DeviceType(s)
	}
	for k := range m {
		if poolFields[k] {
			continue
		}
		s, err := str(k)
		if err != nil {
			return err
		}
		if out.Tags == nil {
			out.Tags = map[string]string{}
		}
		out.Tags[k] = s
	}
	*p = out
	return nil
}

// get returns the pool's value of a property a device spec names. The
// count and NUMA node are numbers, which no spec's string equals, as in
// Nova.
func (p *DevicePool) get(key string) (string, bool) {
	switch key {
	case "vendor_id":
		return p.VendorID, true
	case "product_id":
		return p.ProductID, true
	case "dev_type":
		return string(p.DevType), true
	case "numa_node", "count":
		return "", false
	}
	v, ok := p.Tags[key]
	return v, ok
}

// Matches reports whether the pool's devices have every property of one of
// specs, values compared without case as Nova compares them.
func (p *DevicePool) Matches(specs []DeviceSpec) bool {
	for _, s := range specs {
		if p.matchesOne(s) {
			return true
		}
	}
	return false
}

func (p *DevicePool) matchesOne(s DeviceSpec) bool {
	for k, want := range s {
		got, ok := p.get(k)
		if !ok || !strings.EqualFold(got, want) {
			return false
		}
	}
	return true
}

// remoteManaged reports whether a SmartNIC manages the pool's devices.
func (p *DevicePool) remoteManaged() bool { return boolFromString(p.Tags["remote_managed"]) }

// String names the pool's devices, e.g. "8086:154d type-VF on cell 0".
func (p *DevicePool) String() string {
	where := "no NUMA node"
	if p.NUMANode != nil {
		where = fmt.Sprintf("cell %d", *p.NUMANode)
	}
	return fmt.Sprintf("%s:%s %s on %s", p.VendorID, p.ProductID, p.DevType, where)
}

var (
	pciHexID   = regexp.MustCompile(`^[0-9a-fA-F]{4}$`)
	pciAddress = regexp.MustCompile(`^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)
)

// validate checks a pool against the host's cell ids; i is its index,
// which the error names.
func (p *DevicePool) validate(i int, h *Host) error {
	where := fmt.Sprintf("numa: host: pci_pools[%d]", i)
	if !pciHexID.MatchString(p.VendorID) {
		return fmt.Errorf("%s: vendor_id %q: allowed are four hex digits such as 8086", where, p.VendorID)
	}
	if !pciHexID.MatchString(p.ProductID) {
		return fmt.Errorf("%s: product_id %q: allowed are four hex digits such as 154d", where, p.ProductID)
	}
	switch p.DevType {
	case DeviceTypePCI, DeviceTypePF, DeviceTypeVF, DeviceTypeVDPA:
	default:
		return fmt.Errorf("%s: dev_type %q: allowed are type-PCI, type-PF, type-VF or vdpa", where, p.DevType)
	}
	if p.Count < 0 || p.Count > maxPoolDevices {
		return fmt.Errorf("%s: count %d: allowed are 0-%d", where, p.Count, maxPoolDevices)
	}
	if p.Addresses != nil && len(p.Addresses) != p.Count {
		return fmt.Errorf("%s: count %d but %d addresses: a pool of listed devices counts them", where, p.Count, len(p.Addresses))
	}
	if p.NUMANode != nil && h.Cell(*p.NUMANode) == nil {
		return fmt.Errorf("%s: numa_node %d: allowed are the host's cell ids (%s) or null", where, *p.NUMANode, cellIDList(h))
	}
	if a, ok := p.Tags["address"]; ok && !pciAddress.MatchString(a) {
		return fmt.Errorf("%s: address %q: allowed is a PCI address DDDD:BB:SS.F such as 0000:81:00.1", where, a)
	}
	for k := range p.Tags {
		if strings.TrimSpace(k) == "" {
			return fmt.Errorf("%s: a tag has an empty name; tags are named properties such as physical_network", where)
		}
	}
	return nil
}

func cellIDList(h *Host) string {
	ids := make([]int, len(h.Cells))
	for i, c := range h.Cells {
		ids[i] = c.ID
	}
	sort.Ints(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprint(id)
	}
	return strings.Join(parts, ", ")
}

// DeviceSpec is one kind of device a request accepts: property name to
// value (vendor_id, product_id, dev_type, physical_network, any pool tag).
type DeviceSpec map[string]string

// PCIRequest is a group of devices a guest asks for, as Nova's
// InstancePCIRequest: Count devices, each matching one of Specs.
type PCIRequest struct {
	Count int          `json:"count"`
	Specs []DeviceSpec `json:"spec"`
	// Policy is the NUMA affinity the devices need. A request as a guest
	// gives it carries its own (a PCI alias's or a port's) or none;
	// Request.AddDevices settles it with the flavor's and image's.
	Policy PCIPolicy `json:"numa_policy,omitempty"`
	// Alias is the PCI alias the request comes from, if any.
	Alias string `json:"alias,omitempty"`
	// Port and VNICType name the network port the request comes from, if
	// any (PortRequests).
	Port     string `json:"port,omitempty"`
	VNICType string `json:"vnic_type,omitempty"`
}

// UnmarshalJSON reads a request whose count, when absent, is one, as a PCI
// alias's is.
func (r *PCIRequest) UnmarshalJSON(data []byte) error {
	type plain PCIRequest
	p := plain{Count: 1}
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	*r = PCIRequest(p)
	return nil
}

// wants reports whether one of the request's specs names the device type
// exactly, which is how a request asks for PFs and vDPA devices.
func (r *PCIRequest) wants(t DeviceType) bool {
	for _, s := range r.Specs {
		if s["dev_type"] == string(t) {
			return true
		}
	}
	return false
}

// wantsRemoteManaged reports whether one of the request's specs asks for
// remote-managed devices.
func (r *PCIRequest) wantsRemoteManaged() bool {
	for _, s := range r.Specs {
		if boolFromString(s["remote_managed"]) {
			return true
		}
	}
	return false
}

// String names the request, e.g. "2 of 8086:154d (required)".
func (r *PCIRequest) String() string {
	alts := make([]string, len(r.Specs))
	for i, s := range r.Specs {
		keys := make([]string, 0, len(s))
		for k := range s {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if s["vendor_id"] != "" && s["product_id"] != "" {
			alts[i] = s["vendor_id"] + ":" + s["product_id"]
		}
		for _, k := range keys {
			if k == "vendor_id" || k == "product_id" {
				continue
			}
			if alts[i] != "" {
				alts[i] += " "
			}
			alts[i] += k + "=" + s[k]
		}
	}
	return fmt.Sprintf("%d of %s (%s)", r.Count, strings.Join(alts, " or "), r.policy())
}

// policy is the request's policy, legacy when unset.
func (r *PCIRequest) policy() PCIPolicy {
	if r.Policy == "" {
		return PCIPolicyLegacy
	}
	return r.Policy
}

// NetworkAffinity is which networks reach a host cell's NICs, or which a
// guest's ports are on: physical networks by name, and tunneled (overlay)
// networks.
type NetworkAffinity struct {
	Physnets []string `json:"physnets"`
	Tunneled bool     `json:"tunneled"`
}

func (n *NetworkAffinity) has(physnet string) bool {
	for _, p := range n.Physnets {
		if p == physnet {
			return true
		}
	}
	return false
}

// AddDevices adds to r the PCI devices and network affinity a guest asks
// for beside its flavor's CPUs and memory. Each request's NUMA policy
// becomes the flavor's or image's hw:pci_numa_affinity_policy when either
// sets one, else the request's own, else legacy, as in Nova; a port's own
// policy, though, comes before the flavor's and image's. A flavor and
// image that set different policies are invalid. A count below one, a
// request without specs or an unknown policy is an *InvalidRequestError,
// and r is left unchanged.
func (r *Request) AddDevices(pci []PCIRequest, network *NetworkAffinity, extraSpecs, imageProps map[string]string) error {
	var reqs []PCIRequest
	if len(pci) > 0 {
		// Nova settles the policy only for a guest that asks for devices.
		policy, err := pciPolicy(specs{flavor: extraSpecs, image: imageProps})
		if err != nil {
			return err
		}
		reqs = make([]PCIRequest, len(pci))
		for i, pr := range pci {
			if pr.Count < 1 {
				return invalid("InvalidPCIRequest", "pci_requests[%d].count %d: allowed are whole numbers of at least 1", i, pr.Count)
			}
			if len(pr.Specs) == 0 {
				return invalid("InvalidPCIRequest", "pci_requests[%d].spec is empty: give at least one device spec such as {\"vendor_id\": \"8086\", \"product_id\": \"154d\"}", i)
			}
			if pr.Policy != "" && !pr.Policy.valid() {
				return invalid("InvalidPCINUMAAffinity", "pci_requests[%d].numa_policy=%q: allowed values are %s", i, pr.Policy, pciPolicies)
			}
			reqs[i] = PCIRequest{Count: pr.Count, Specs: make([]DeviceSpec, len(pr.Specs)), Policy: pr.policy(),
				Alias: pr.Alias, Port: pr.Port, VNICType: pr.VNICType}
			for j, s := range pr.Specs {
				reqs[i].Specs[j] = make(DeviceSpec, len(s))
				for k, v := range s {
					reqs[i].Specs[j][k] = v
				}
			}
			if policy != "" && (pr.Port == "" || pr.Policy == "") {
				reqs[i].Policy = policy
			}
		}
	}
	r.PCI = reqs
	r.Network = nil
	if network != nil {
		n := NetworkAffinity{Physnets: append([]string(nil), network.Physnets...), Tunneled: network.Tunneled}
		r.Network = &n
	}
	return nil
}

// pciPolicy is the flavor's or image's hw:pci_numa_affinity_policy, "" when
// neither sets one.
func pciPolicy(s specs) (PCIPolicy, error) {
	f, i := s.get("pci_numa_affinity_policy")
	if f != "" && i != "" && f != i {
		return "", invalid("ImagePCINUMAPolicyForbidden",
			"image hw_pci_numa_affinity_policy=%s conflicts with flavor hw:pci_numa_affinity_policy=%s; set one, or the same in both", i, f)
	}
	key, v := "hw:pci_numa_affinity_policy", f
	if v == "" {
		key, v = "hw_pci_numa_affinity_policy", i
	}
	if v != "" && !PCIPolicy(v).valid() {
		return "", invalid("InvalidPCINUMAAffinity", "%s=%q: allowed values are %s", key, v, pciPolicies)
	}
	return PCIPolicy(v), nil
}

// imagePCIPolicy refuses an image whose hw_pci_numa_affinity_policy is not
// a policy, devices or not: Nova cannot read such an image at all.
func imagePCIPolicy(s specs) error {
	if v := s.image["hw_pci_numa_affinity_policy"]; v != "" && !PCIPolicy(v).valid() {
		return invalid("InvalidPCINUMAAffinity", "hw_pci_numa_affinity_policy=%q: allowed values are %s", v, pciPolicies)
	}
	return nil
}
