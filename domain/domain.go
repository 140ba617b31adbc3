// Package domain writes the libvirt domain XML of a new guest from its
// flavor: vCPUs, memory, guest NUMA cells and huge pages. Pinning is not its
// job: xmlpatch writes a placement's <cputune> and <numatune> into the
// document this package makes.
package domain

import (
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/pinflow/pinflow/numa"
)

// Options say what kind of guest to write. The zero value writes a small
// software-emulated (TCG) x86_64 guest with a serial console and no disk,
// which boots on any host that has QEMU. Each field's default tag is the
// Default constant of the same name (TestDefaultTags holds them together):
// envconfig applies the tag, New the constant to a field left empty.
type Options struct {
	// Type is the libvirt domain type: "qemu" (software emulation) or "kvm".
	Type string `envconfig:"DOMAIN_TYPE" default:"qemu"`
	// Emulator is the QEMU binary.
	Emulator string `envconfig:"DOMAIN_EMULATOR" default:"/usr/bin/qemu-system-x86_64"`
	// Machine is the machine type.
	Machine string `envconfig:"DOMAIN_MACHINE" default:"pc"`
}

// Defaults of the Options fields.
const (
	DefaultType     = "qemu"
	DefaultEmulator = "/usr/bin/qemu-system-x86_64"
	DefaultMachine  = "pc"
)

func (o Options) withDefaults() Options {
	if o.Type == "" {
		o.Type = DefaultType
	}
	if o.Emulator == "" {
		o.Emulator = DefaultEmulator
	}
	if o.Machine == "" {
		o.Machine = DefaultMachine
	}
	return o
}

// New returns the domain XML of a guest called name with the given uuid
// whose vCPUs, memory and guest NUMA cells come from req, and whose huge
// page sizes come from the placement p fitted for it (nil: none).
func New(name, uuid string, req *numa.Request, p *numa.Placement, o Options) (string, error) {
	o = o.withDefaults()
	if o.Type != "qemu" && o.Type != "kvm" {
		return "", fmt.Errorf("domain: type %q: allowed are qemu or kvm", o.Type)
	}
	if strings.TrimSpace(name) == "" || uuid == "" {
		return "", fmt.Errorf("domain: a guest needs a name and a uuid, got %q and %q", name, uuid)
	}
	d := &libvirtxml.Domain{
		Type:   o.Type,
		Name:   name,
		UUID:   uuid,
		Memory: &libvirtxml.DomainMemory{Value: uint(req.MemoryMB), Unit: "MiB"},
		VCPU:   &libvirtxml.DomainVCPU{Placement: "static", Value: uint(req.VCPUs)},
		OS: &libvirtxml.DomainOS{
			Type: &libvirtxml.DomainOSType{Arch: "x86_64", Machine: o.Machine, Type: "hvm"},
		},
		Clock:      &libvirtxml.DomainClock{Offset: "utc"},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Emulator: o.Emulator,
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainSerialTarget{Port: new(uint)},
			}},
			Consoles: []libvirtxml.DomainConsole{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: new(uint)},
			}},
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "none"},
		},
	}
	if req.HasNUMA() {
		cpu := &libvirtxml.DomainCPU{Numa: &libvirtxml.DomainNuma{}}
		if o.Type == "qemu" {
			cpu.Mode, cpu.Match = "custom", "exact"
			cpu.Model = &libvirtxml.DomainCPUModel{Fallback: "forbid", Value: "qemu64"}
		} else {
			cpu.Mode = "host-passthrough"
		}
		cpu.Topology = &libvirtxml.DomainCPUTopology{Sockets: len(req.Cells), Dies: 1, Cores: req.VCPUs / len(req.Cells), Threads: 1}
		if req.VCPUs%len(req.Cells) != 0 {
			cpu.Topology = &libvirtxml.DomainCPUTopology{Sockets: req.VCPUs, Dies: 1, Cores: 1, Threads: 1}
		}
		var hugepages []libvirtxml.DomainMemoryHugepage
		for _, c := range req.Cells {
			id := uint(c.ID)
			cpu.Numa.Cell = append(cpu.Numa.Cell, libvirtxml.DomainCell{
				ID: &id, CPUs: c.SharedVCPUs.Union(c.DedicatedVCPUs).String(), Memory: uint(c.MemoryMB), Unit: "MiB",
			})
		}
		if p != nil {
			for _, c := range p.Cells {
				if c.PageSizeKB != 0 {
					hugepages = append(hugepages, libvirtxml.DomainMemoryHugepage{Size: uint(c.PageSizeKB), Unit: "KiB", Nodeset: fmt.Sprint(c.GuestCell)})
				}
			}
		}
		d.CPU = cpu
		if len(hugepages) > 0 {
			d.MemoryBacking = &libvirtxml.DomainMemoryBacking{MemoryHugePages: &libvirtxml.DomainMemoryHugepages{Hugepages: hugepages}}
		}
	}
	out, err := d.Marshal()
	if err != nil {
		return "", fmt.Errorf("domain: %s: %w", name, err)
	}
	return out, nil
}
