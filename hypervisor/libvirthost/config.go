// Package libvirthost describes how pinflow reaches a libvirt host and
// divides its CPUs and devices: a host's configuration and its checks,
// without the libvirt client, so that a caller can name one and the
// driver can use it.
package libvirthost

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/pinflow/pinflow/numa"
)

// Config is how pinflow reaches one libvirt host and divides its CPUs
// and devices.
type Config struct {
	// URI is the host's libvirt URI. Source hosts also use it to reach
	// this host during a peer-to-peer migration, so it must work from
	// every host, not only from the worker.
	URI string `json:"uri"`
	// MigrateURI is the migrate_uri for migrations to this host; empty
	// lets libvirt choose.
	MigrateURI string `json:"migrate_uri,omitempty"`
	// CPUDedicatedSet and CPUSharedSet split the host's online CPUs as
	// Nova's options of the same names do, and must not overlap; both
	// empty makes every online CPU pinnable and none shared.
	CPUDedicatedSet string `json:"cpu_dedicated_set,omitempty"`
	CPUSharedSet    string `json:"cpu_shared_set,omitempty"`
	// DeviceSpec lists the host's PCI devices guests may take, as a JSON
	// array of Nova's [pci] device_spec entries (ParseDeviceSpecs); empty
	// offers none.
	DeviceSpec string `json:"device_spec,omitempty"`
}

// Validate checks the URI, the migrate URI, the CPU sets and the device
// list; its error names the bad value.
func (c Config) Validate() error {
	if _, err := ParseURI(c.URI); err != nil {
		return err
	}
	if c.MigrateURI != "" {
		u, err := url.Parse(c.MigrateURI)
		if err != nil || u.Scheme == "" || u.Hostname() == "" {
			return fmt.Errorf("migrate uri %q is invalid; want scheme://address[:port], such as tcp://10.0.0.2", c.MigrateURI)
		}
	}
	var sets [2]numa.CPUSet
	for i, s := range []struct{ name, value string }{
		{"cpu_dedicated_set", c.CPUDedicatedSet},
		{"cpu_shared_set", c.CPUSharedSet},
	} {
		if s.value == "" {
			continue
		}
		set, err := numa.Parse(s.value)
		if err != nil {
			return fmt.Errorf("%s %q: %w", s.name, s.value, err)
		}
		sets[i] = set
	}
	if both := sets[0].Intersection(sets[1]); !both.IsEmpty() {
		return fmt.Errorf("cpus %s are in both cpu_dedicated_set %q and cpu_shared_set %q; the sets must not overlap, or a floating guest would run on pinned pCPUs",
			both, c.CPUDedicatedSet, c.CPUSharedSet)
	}
	if c.DeviceSpec != "" {
		if _, err := ParseDeviceSpecs(c.DeviceSpec); err != nil {
			return err
		}
	}
	return nil
}

// ParseURI checks that s is a libvirt URI with a driver, such as
// "qemu:///system" or "qemu+tcp://h1/system".
func ParseURI(s string) (*url.URL, error) {
	if s == "" {
		return nil, fmt.Errorf("uri is empty; want a libvirt URI such as qemu+tls://host/system")
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("uri %q is invalid: %v", s, err)
	}
	driver, transport, _ := strings.Cut(u.Scheme, "+")
	if driver == "" {
		return nil, fmt.Errorf("uri %q has no driver; want a libvirt URI such as qemu+tls://host/system", s)
	}
	switch transport {
	case "", "unix", "tcp", "tls", "ssh", "libssh", "libssh2":
	default:
		return nil, fmt.Errorf("uri %q: transport %q is not supported; use unix, tcp, tls, ssh, libssh or libssh2", s, transport)
	}
	return u, nil
}

// DeviceSpec is one entry of a host's device list, as Nova's [pci]
// device_spec: the PCI devices it matches are offered to guests, with its
// other keys as their tags (physical_network, remote_managed, trusted,
// ...). Only devices some entry matches are offered.
type DeviceSpec struct {
	// VendorID and ProductID are four hex digits, or "*" or empty for any.
	VendorID  string
	ProductID string
	// Address is DDDD:BB:SS.F, each field hex or "*"; empty matches any.
	// The address of an SR-IOV PF matches its VFs, not the PF itself, as
	// in Nova: list a PF by its vendor and product to pass it whole.
	Address string
	Tags    map[string]string
}

var (
	specHexID   = regexp.MustCompile(`^([0-9a-fA-F]{4}|\*)$`)
	specAddress = regexp.MustCompile(`^([0-9a-fA-F]{4}|\*):([0-9a-fA-F]{2}|\*):([0-9a-fA-F]{2}|\*)\.([0-7]|\*)$`)
)

// ParseDeviceSpecs reads a JSON array of device_spec entries, such as
// [{"vendor_id": "8086", "product_id": "154c", "physical_network": "physnet1"}].
// Its error names the entry and the bad value.
func ParseDeviceSpecs(data string) ([]DeviceSpec, error) {
	var raw []map[string]string
	if err := json.Unmarshal([]byte(data), &raw); err != nil {
		return nil, fmt.Errorf("device_spec: not a JSON array of objects of strings: %v", err)
	}
	out := make([]DeviceSpec, 0, len(raw))
	for i, e := range raw {
		where := fmt.Sprintf("device_spec[%d]", i)
		s := DeviceSpec{Tags: map[string]string{}}
		for k, v := range e {
			switch k {
			case "vendor_id", "product_id":
				if v != "" && !specHexID.MatchString(v) {
					return nil, fmt.Errorf("%s: %s %q: allowed are four hex digits or *", where, k, v)
				}
				if k == "vendor_id" {
					s.VendorID = strings.ToLower(v)
				} else {
					s.ProductID = strings.ToLower(v)
				}
			case "address":
				if !specAddress.MatchString(v) {
					return nil, fmt.Errorf("%s: address %q: allowed is DDDD:BB:SS.F with hex fields or *, such as 0000:81:*.*", where, v)
				}
				s.Address = strings.ToLower(v)
			case "devname", "dev_type", "numa_node", "parent_addr", "count":
				return nil, fmt.Errorf("%s: %s: pinflow matches devices by vendor_id, product_id and address; other keys are tags", where, k)
			default:
				if strings.TrimSpace(k) == "" {
					return nil, fmt.Errorf("%s: a tag needs a name", where)
				}
				s.Tags[k] = v
			}
		}
		if s.VendorID == "" && s.ProductID == "" && s.Address == "" {
			return nil, fmt.Errorf("%s: give vendor_id, product_id or address; an entry matching every device would offer the host's own", where)
		}
		out = append(out, s)
	}
	return out, nil
}

func (s DeviceSpec) matchesID(d numa.PCIDevice) bool {
	return (s.VendorID == "" || s.VendorID == "*" || s.VendorID == d.VendorID) &&
		(s.ProductID == "" || s.ProductID == "*" || s.ProductID == d.ProductID)
}

func addressMatches(pattern, addr string) bool {
	pf, af := strings.FieldsFunc(pattern, splitAddr), strings.FieldsFunc(addr, splitAddr)
	if len(pf) != 4 || len(af) != 4 {
		return false
	}
	for i := range pf {
		if pf[i] != "*" && pf[i] != af[i] {
			return false
		}
	}
	return true
}

func splitAddr(r rune) bool { return r == ':' || r == '.' }

// Matches says whether s offers d, whose host lists pfs (the addresses of
// its SR-IOV PFs).
func (s DeviceSpec) Matches(d numa.PCIDevice, pfs []string) bool {
	if !s.matchesID(d) {
		return false
	}
	if s.Address == "" {
		return true
	}
	if !strings.Contains(s.Address, "*") && slices.Contains(pfs, s.Address) {
		return d.PhysFunction == s.Address
	}
	return addressMatches(s.Address, d.Address)
}
