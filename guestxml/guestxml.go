// Package guestxml writes the libvirt domain XML of a new guest from its
// flavor: vCPUs, memory, guest NUMA cells and huge pages. Pinning is not its
// job: xmlpatch writes a placement's <cputune> and <numatune> into the
// document this package makes.
package guestxml

import (
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/pinflow/pinflow/numa"
)

// Options say what kind of guest to write. The zero value writes a small
// software-emulated (TCG) x86_64 guest with a serial console and no disk,
// which boots on any host that has QEMU: New gives a field left empty the
// Default constant of its name.
type Options struct {
	// Type is the libvirt domain type: "qemu" (software emulation) or "kvm".
	Type string `envconfig:"DOMAIN_TYPE"`
	// Emulator is the QEMU binary.
	Emulator string `envconfig:"DOMAIN_EMULATOR"`
	// Machine is the machine type.
	Machine string `envconfig:"DOMAIN_MACHINE"`
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

// check applies the defaults and rejects a type New and Resize cannot write.
func (o Options) check() (Options, error) {
	o = o.withDefaults()
	if o.Type != "qemu" && o.Type != "kvm" {
		return o, fmt.Errorf("type %q: allowed are qemu or kvm", o.Type)
	}
	return o, nil
}

// New returns the domain XML of a guest called name with the given uuid
// whose vCPUs, memory and guest NUMA cells come from req, and whose huge
// page sizes and PCI devices come from the placement p fitted for it (nil:
// none).
func New(name, uuid string, req *numa.Request, p *numa.Placement, o Options) (string, error) {
	o, err := o.check()
	if err != nil {
		return "", fmt.Errorf("domain: %w", err)
	}
	if strings.TrimSpace(name) == "" || uuid == "" {
		return "", fmt.Errorf("domain: a guest needs a name and a uuid, got %q and %q", name, uuid)
	}
	f := newFlavor(req, p)
	d := &libvirtxml.Domain{
		Type:   o.Type,
		Name:   name,
		UUID:   uuid,
		Memory: f.memory,
		VCPU:   f.vcpu,
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
	if err := addDevices(d.Devices, req, p); err != nil {
		return "", fmt.Errorf("domain: %s: %w", name, err)
	}
	// A guest without NUMA cells gets no <cpu>: the hypervisor's default
	// model and topology serve it.
	if f.numa != nil {
		d.CPU = &libvirtxml.DomainCPU{Topology: f.topology, Numa: f.numa}
		setCPUModel(d.CPU, o.Type)
	}
	if f.hugepages != nil {
		d.MemoryBacking = &libvirtxml.DomainMemoryBacking{MemoryHugePages: f.hugepages}
	}
	out, err := d.Marshal()
	if err != nil {
		return "", fmt.Errorf("domain: %s: %w", name, err)
	}
	return out, nil
}

// flavor is what a guest's flavor and placement decide in its domain XML:
// New writes it into a fresh document, Resize over an existing one.
type flavor struct {
	memory   *libvirtxml.DomainMemory
	vcpu     *libvirtxml.DomainVCPU
	topology *libvirtxml.DomainCPUTopology
	// numa and hugepages are nil when the guest has no NUMA cells or no
	// huge pages.
	numa      *libvirtxml.DomainNuma
	hugepages *libvirtxml.DomainMemoryHugepages
}

func newFlavor(req *numa.Request, p *numa.Placement) flavor {
	f := flavor{
		memory: &libvirtxml.DomainMemory{Value: uint(req.MemoryMB), Unit: "MiB"},
		vcpu:   &libvirtxml.DomainVCPU{Placement: "static", Value: uint(req.VCPUs)},
		// One socket per guest cell, so the guest sees its cells as
		// sockets; one socket per vCPU when the cells cannot split them
		// evenly (or there are none), as sockets*cores*threads must equal
		// the vCPU count.
		topology: &libvirtxml.DomainCPUTopology{Sockets: req.VCPUs, Dies: 1, Cores: 1, Threads: 1},
	}
	if !req.HasNUMA() {
		return f
	}
	if n := len(req.Cells); req.VCPUs%n == 0 {
		f.topology = &libvirtxml.DomainCPUTopology{Sockets: n, Dies: 1, Cores: req.VCPUs / n, Threads: 1}
	}
	f.numa = &libvirtxml.DomainNuma{}
	for _, c := range req.Cells {
		id := uint(c.ID)
		f.numa.Cell = append(f.numa.Cell, libvirtxml.DomainCell{
			ID: &id, CPUs: c.SharedVCPUs.Union(c.DedicatedVCPUs).String(), Memory: uint(c.MemoryMB), Unit: "MiB",
		})
	}
	var pages []libvirtxml.DomainMemoryHugepage
	if p != nil {
		for _, c := range p.Cells {
			if c.PageSizeKB != 0 {
				pages = append(pages, libvirtxml.DomainMemoryHugepage{Size: uint(c.PageSizeKB), Unit: "KiB", Nodeset: fmt.Sprint(c.GuestCell)})
			}
		}
	}
	if len(pages) > 0 {
		f.hugepages = &libvirtxml.DomainMemoryHugepages{Hugepages: pages}
	}
	return f
}

// setCPUModel writes the CPU model a guest of domain type typ gets: TCG
// emulates a fixed qemu64, KVM passes the host CPU through.
func setCPUModel(cpu *libvirtxml.DomainCPU, typ string) {
	if typ == "qemu" {
		cpu.Mode, cpu.Match = "custom", "exact"
		cpu.Model = &libvirtxml.DomainCPUModel{Fallback: "forbid", Value: "qemu64"}
		return
	}
	cpu.Mode = "host-passthrough"
}
