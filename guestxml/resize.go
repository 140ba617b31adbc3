package guestxml

import (
	"encoding/xml"
	"fmt"
	"reflect"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/pinflow/pinflow/numa"
)

// Resize returns current, the domain XML of an existing guest, rewritten for a
// new flavor: req's vCPUs, memory and guest NUMA cells, and the huge page sizes of
// the placement p fitted for it (nil: none), as New writes them. Everything else
// the document holds (devices such as disks and interfaces, name, uuid, type,
// os, features, metadata) is kept, so a resized guest keeps its disks. The old
// pins (<vcpu cpuset>, <cputune> vcpupin/emulatorpin/iothreadpin and vcpusched,
// <numatune>) are dropped: they were fitted for the old flavor, and
// xmlpatch.Patch writes the new placement's into the result. The PCI
// devices pinflow wrote for the old flavor give way to the new one's.
func Resize(current string, req *numa.Request, p *numa.Placement, o Options) (string, error) {
	o, err := o.check()
	if err != nil {
		return "", fmt.Errorf("domain: resize: %w", err)
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(current); err != nil {
		return "", fmt.Errorf("domain: resize: the current domain XML does not parse: %w", err)
	}
	switch {
	case strings.TrimSpace(d.Name) == "":
		return "", fmt.Errorf("domain: resize: the current domain XML has no <name>")
	case strings.TrimSpace(d.UUID) == "":
		return "", fmt.Errorf("domain: resize: guest %q has no <uuid>", d.Name)
	}
	f := newFlavor(req, p)
	d.Memory = f.memory
	// Without <currentMemory> libvirt starts the guest with all of
	// <memory>: the new flavor's, not an old balloon target that may
	// exceed it.
	d.CurrentMemory = nil
	// f.vcpu has no current= (all vCPUs online) and no cpuset= (an old
	// pin); <vcpus> enables vCPUs by the old count.
	d.VCPU, d.VCPUs = f.vcpu, nil
	d.CPU = resizeCPU(d.CPU, f, o.Type)
	if d.MemoryBacking != nil {
		d.MemoryBacking.MemoryHugePages = nil
	}
	if f.hugepages != nil {
		if d.MemoryBacking == nil {
			d.MemoryBacking = &libvirtxml.DomainMemoryBacking{}
		}
		d.MemoryBacking.MemoryHugePages = f.hugepages
	}
	if isZero(d.MemoryBacking) {
		d.MemoryBacking = nil
	}
	if t := d.CPUTune; t != nil {
		t.VCPUPin, t.EmulatorPin, t.IOThreadPin, t.VCPUSched = nil, nil, nil, nil
		if isZero(t) {
			d.CPUTune = nil
		}
	}
	d.NUMATune = nil
	if d.Devices == nil {
		d.Devices = &libvirtxml.DomainDeviceList{}
	}
	dropDevices(d.Devices)
	if err := addDevices(d.Devices, req, p); err != nil {
		return "", fmt.Errorf("domain: resize: %s: %w", d.Name, err)
	}
	out, err := d.Marshal()
	if err != nil {
		return "", fmt.Errorf("domain: resize: %s: %w", d.Name, err)
	}
	return out, nil
}

// resizeCPU returns cpu with the topology and guest cells of f. The mode and
// model the guest ran with are kept; a guest that gains NUMA cells without
// either gets New's. A guest left without cells gets a topology only if it
// had one, since the old one no longer multiplies out to the vCPU count.
func resizeCPU(cpu *libvirtxml.DomainCPU, f flavor, typ string) *libvirtxml.DomainCPU {
	if cpu == nil {
		cpu = &libvirtxml.DomainCPU{}
	}
	// The element name comes from the struct tag; a parsed one would make
	// an otherwise empty <cpu> look set.
	cpu.XMLName = xml.Name{}
	if f.numa != nil {
		if cpu.Mode == "" && cpu.Model == nil {
			setCPUModel(cpu, typ)
		}
		cpu.Topology = f.topology
	} else if cpu.Topology != nil {
		cpu.Topology = f.topology
	}
	// Replaced whole: the old cells' distances and interconnects name old cells.
	cpu.Numa = f.numa
	if isZero(cpu) {
		return nil
	}
	return cpu
}

// isZero reports whether the element pointed to is nil or has nothing set,
// so that it is left out instead of written empty.
func isZero[T any](p *T) bool { return p == nil || reflect.ValueOf(*p).IsZero() }
