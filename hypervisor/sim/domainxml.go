package sim

import (
	"fmt"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// parseDomain reads a domain XML's identity; a document without a valid
// <uuid> or a <name> is rejected, as libvirt would.
func parseDomain(doc string) (hypervisor.DomainIdentity, error) {
	id, err := hypervisor.ReadDomainIdentity(doc)
	if err != nil {
		return hypervisor.DomainIdentity{}, fmt.Errorf("domain xml: %w", err)
	}
	return id, nil
}

// checkPins checks that every cpuset and nodeset of domainXML names CPUs
// and cells of host, and every device passed through one of its devices, which is what a real host checks when the guest
// starts or arrives; its error wraps hypervisor.ErrRejected.
func checkPins(host *numa.Host, domainXML string) error {
	pins, err := xmlpatch.Read(domainXML)
	if err != nil {
		return fmt.Errorf("%w: %w", err, hypervisor.ErrRejected)
	}
	var cpus, nodes numa.CPUSet
	for _, c := range host.Cells {
		cpus = cpus.Union(c.CPUs).Union(c.PCPUs)
		nodes = nodes.With(c.ID)
	}
	if err := hypervisor.PinsFit(pins, cpus, nodes); err != nil {
		return err
	}
	return hypervisor.DevicesFit(pins, host)
}
