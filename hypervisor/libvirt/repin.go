package libvirt

import (
	"context"
	"fmt"
	"maps"
	"slices"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/numa"
)

// Repin moves a running domain's threads to the pins of def with
// libvirt's live pin calls (virDomainPinVcpuFlags, virDomainPinEmulator,
// virDomainPinIOThread), each of which sets one thread's cgroup and
// affinity at once, and then defines def, so that the next start keeps
// them. A shut-off domain is only defined. The pins must name CPUs the
// host has; libvirt refuses others before it changes the thread.
func (d *Driver) Repin(ctx context.Context, host, uuid, def string) error {
	c, err := d.connect(ctx, host)
	if err != nil {
		return err
	}
	dom, err := c.lookup(ctx, uuid)
	if err != nil {
		return err
	}
	st, err := c.state(ctx, dom)
	if err != nil {
		return err
	}
	cur, err := call(ctx, c, func(l *golibvirt.Libvirt) (string, error) { return l.DomainGetXMLDesc(dom, 0) })
	if err != nil {
		return c.errorf(err, "get the XML of domain %s", dom.Name)
	}
	pins, err := hypervisor.RepinPins(cur, def)
	if err != nil {
		return fmt.Errorf("libvirt: re-pin domain %s on %s: %w", uuid, c.where(), err)
	}
	if st != hypervisor.StateShutoff {
		pin := func(what string, set numa.CPUSet, f func(l *golibvirt.Libvirt, m []byte) error) error {
			if err := do(ctx, c, func(l *golibvirt.Libvirt) error { return f(l, cpuMap(set)) }); err != nil {
				return c.wrap(classifyDefinition(err), err, "pin %s of domain %s to %s", what, uuid, set)
			}
			return nil
		}
		for v := range pins.VCPUs {
			set := pins.VCPUPins[v]
			if set.IsEmpty() {
				set = pins.DefaultCPUs
			}
			if set.IsEmpty() {
				continue
			}
			if err := pin(fmt.Sprintf("vCPU %d", v), set, func(l *golibvirt.Libvirt, m []byte) error {
				return l.DomainPinVcpuFlags(dom, uint32(v), m, uint32(golibvirt.DomainAffectLive))
			}); err != nil {
				return err
			}
		}
		if !pins.EmulatorPins.IsEmpty() {
			if err := pin("the emulator threads", pins.EmulatorPins, func(l *golibvirt.Libvirt, m []byte) error {
				return l.DomainPinEmulator(dom, m, golibvirt.DomainAffectLive)
			}); err != nil {
				return err
			}
		}
		for _, id := range slices.Sorted(maps.Keys(pins.IOThreadPins)) {
			if err := pin(fmt.Sprintf("I/O thread %d", id), pins.IOThreadPins[id], func(l *golibvirt.Libvirt, m []byte) error {
				return l.DomainPinIothread(dom, uint32(id), m, golibvirt.DomainAffectLive)
			}); err != nil {
				return err
			}
		}
	}
	return d.Define(ctx, host, def)
}

// cpuMap is set as libvirt's CPU bitmap: bit n of byte n/8 for CPU n,
// as long as its highest CPU needs.
func cpuMap(set numa.CPUSet) []byte {
	cpus := set.List()
	if len(cpus) == 0 {
		return nil
	}
	m := make([]byte, cpus[len(cpus)-1]/8+1)
	for _, n := range cpus {
		m[n/8] |= 1 << (n % 8)
	}
	return m
}
