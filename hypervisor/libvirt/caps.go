package libvirt

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// ParseCapabilities reads the NUMA topology of libvirt's capabilities XML
// (<host><topology><cells>) into a host spec: per cell its CPUs, SMT sibling
// groups, memory in MiB, page pools and socket. Only CPUs in online count
// (the CPUs without a socket_id, which libvirt reports for offline ones,
// never do); an empty online set means every listed CPU is online. Cells
// without memory are left out, since no guest memory can be placed there.
// The spec's cpu_dedicated_set and cpu_shared_set are left empty for the
// caller to fill in.
func ParseCapabilities(capsXML string, online numa.CPUSet) (numa.HostSpec, error) {
	var caps libvirtxml.Caps
	if err := caps.Unmarshal(capsXML); err != nil {
		return numa.HostSpec{}, fmt.Errorf("libvirt: capabilities XML does not parse: %w", err)
	}
	if caps.Host.NUMA == nil || caps.Host.NUMA.Cells == nil || len(caps.Host.NUMA.Cells.Cells) == 0 {
		return numa.HostSpec{}, fmt.Errorf("libvirt: capabilities XML has no <host><topology><cells>; the host reports no NUMA topology")
	}
	var spec numa.HostSpec
	for _, cell := range caps.Host.NUMA.Cells.Cells {
		where := fmt.Sprintf("libvirt: capabilities: cell %d", cell.ID)
		if cell.Memory == nil {
			return numa.HostSpec{}, fmt.Errorf("%s has no <memory>", where)
		}
		memKiB, err := toKiB(cell.Memory.Size, cell.Memory.Unit)
		if err != nil {
			return numa.HostSpec{}, fmt.Errorf("%s: memory: %w", where, err)
		}
		if memKiB/1024 == 0 {
			continue
		}
		cs := numa.CellSpec{ID: cell.ID, MemoryMB: int64(memKiB / 1024)}
		for _, p := range cell.PageInfo {
			size, err := toKiB(uint64(p.Size), p.Unit)
			if err != nil || size == 0 {
				return numa.HostSpec{}, fmt.Errorf("%s: page size %d %s is invalid; want a positive size in KiB, MiB or GiB", where, p.Size, p.Unit)
			}
			cs.MemPages = append(cs.MemPages, numa.PagePool{SizeKB: int64(size), Total: int64(p.Count)})
		}
		sort.Slice(cs.MemPages, func(i, j int) bool { return cs.MemPages[i].SizeKB < cs.MemPages[j].SizeKB })

		var cpus numa.CPUSet
		var groups []string
		if cell.CPUS != nil {
			for _, cpu := range cell.CPUS.CPUs {
				if cpu.SocketID == nil || (!online.IsEmpty() && !online.Contains(cpu.ID)) {
					continue
				}
				if cpu.ID < 0 || cpu.ID > numa.MaxCPU {
					return numa.HostSpec{}, fmt.Errorf("%s: cpu id %d is out of range 0-%d", where, cpu.ID, numa.MaxCPU)
				}
				cpus = cpus.Union(numa.NewCPUSet(cpu.ID))
				if cs.Socket == nil {
					socket := *cpu.SocketID
					cs.Socket = &socket
				}
				group := strings.TrimSpace(cpu.Siblings)
				if group == "" {
					group = fmt.Sprint(cpu.ID)
				}
				groups = append(groups, group)
			}
		}
		// Sibling groups in the order of their first CPU, without the
		// offline threads of a core.
		seen := map[string]bool{}
		for _, g := range groups {
			set, err := numa.Parse(g)
			if err != nil {
				return numa.HostSpec{}, fmt.Errorf("%s: siblings %q: %w", where, g, err)
			}
			set = set.Intersection(cpus)
			if key := set.String(); !set.IsEmpty() && !seen[key] {
				seen[key] = true
				cs.Siblings = append(cs.Siblings, set.List())
			}
		}
		cs.CPUs = cpus.List()
		spec.Cells = append(spec.Cells, cs)
	}
	if len(spec.Cells) == 0 {
		return numa.HostSpec{}, fmt.Errorf("libvirt: capabilities: no NUMA cell has memory")
	}
	return spec, nil
}

// toKiB converts a libvirt size with its unit attribute to KiB; libvirt
// writes capabilities in KiB, but the schema allows other units.
func toKiB(n uint64, unit string) (uint64, error) {
	b, err := xmlpatch.ScaledBytes(strconv.FormatUint(n, 10), unit)
	return b / 1024, err
}

// Capabilities returns the host's NUMA topology from libvirt's capabilities
// and its online CPUs, with the host's cpu_dedicated_set and cpu_shared_set
// applied as Nova applies them. The topology has no usage.
func (d *Driver) Capabilities(ctx context.Context, host string) (*numa.Host, error) {
	spec, err := d.HostSpec(ctx, host)
	if err != nil {
		return nil, err
	}
	h, err := spec.Host(nil)
	if err != nil {
		return nil, fmt.Errorf("libvirt: host %s: topology from capabilities: %w", host, err)
	}
	return h, nil
}

// HostSpec is Capabilities in the operator's spec form (numa.HostSpec), with
// the host's cpu_dedicated_set and cpu_shared_set filled in, and the PCI
// devices its device_spec offers (from libvirt's node devices), for storing
// or printing a host's topology.
func (d *Driver) HostSpec(ctx context.Context, host string) (numa.HostSpec, error) {
	c, err := d.connect(ctx, host)
	if err != nil {
		return numa.HostSpec{}, err
	}
	capsXML, err := call(ctx, c, func(l *golibvirt.Libvirt) (string, error) { return l.ConnectGetCapabilities() })
	if err != nil {
		return numa.HostSpec{}, c.errorf(err, "get capabilities")
	}
	online, err := c.onlineCPUs(ctx)
	if err != nil {
		return numa.HostSpec{}, err
	}
	spec, err := ParseCapabilities(capsXML, online)
	if err != nil {
		return numa.HostSpec{}, fmt.Errorf("%w (%s)", err, c.where())
	}
	spec.CPUDedicatedSet = c.hc.CPUDedicatedSet
	spec.CPUSharedSet = c.hc.CPUSharedSet
	if c.hc.DeviceSpec != "" {
		specs, err := libvirthost.ParseDeviceSpecs(c.hc.DeviceSpec)
		if err != nil {
			return numa.HostSpec{}, fmt.Errorf("libvirt: host %s: %w", host, err)
		}
		docs, err := c.pciNodeDevices(ctx)
		if err != nil {
			return numa.HostSpec{}, err
		}
		cells := make([]int, len(spec.Cells))
		for i, cell := range spec.Cells {
			cells[i] = cell.ID
		}
		if spec.PCIDevices, err = OfferedDevices(docs, specs, cells); err != nil {
			return numa.HostSpec{}, fmt.Errorf("libvirt: host %s: %w (%s)", host, err, c.where())
		}
	}
	return spec, nil
}

// onlineCPUs asks the host which CPUs are online.
func (c *conn) onlineCPUs(ctx context.Context) (numa.CPUSet, error) {
	cpumap, err := call(ctx, c, func(l *golibvirt.Libvirt) ([]byte, error) {
		m, _, _, err := l.NodeGetCPUMap(1, 1, 0)
		return m, err
	})
	if libvirtCode(err) == golibvirt.ErrNoSupport {
		// Drivers without a CPU map list only online CPUs in their
		// capabilities.
		return numa.CPUSet{}, nil
	}
	if err != nil {
		return numa.CPUSet{}, c.errorf(err, "get the online CPU map")
	}
	var ids []int
	for i, b := range cpumap {
		for bit := 0; bit < 8; bit++ {
			if b&(1<<bit) != 0 && i*8+bit <= numa.MaxCPU {
				ids = append(ids, i*8+bit)
			}
		}
	}
	if len(ids) == 0 {
		return numa.CPUSet{}, fmt.Errorf("libvirt: %s reports no online CPUs", c.where())
	}
	return numa.NewCPUSet(ids...), nil
}
