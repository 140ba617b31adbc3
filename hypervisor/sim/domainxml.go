package sim

import (
	"encoding/xml"
	"fmt"
	"strings"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// domainDoc is what the simulator reads of a domain XML besides its pins
// (see checkPins): its identity, and its memory, the data a migration
// moves.
type domainDoc struct {
	XMLName xml.Name `xml:"domain"`
	Name    string   `xml:"name"`
	UUID    string   `xml:"uuid"`
	Memory  struct {
		Unit  string `xml:"unit,attr"`
		Value string `xml:",chardata"`
	} `xml:"memory"`
}

// parseDomain reads a domain XML; a document without a valid <uuid> or a
// <name> is rejected, as libvirt would.
func parseDomain(doc string) (*domainDoc, error) {
	var d domainDoc
	if err := xml.Unmarshal([]byte(doc), &d); err != nil {
		return nil, fmt.Errorf("domain xml: %v: %w", err, hypervisor.ErrRejected)
	}
	id, err := hypervisor.ParseUUID(d.UUID)
	if err != nil {
		return nil, fmt.Errorf("domain xml: <uuid>: %v: %w", err, hypervisor.ErrRejected)
	}
	d.UUID = id.String()
	d.Name = strings.TrimSpace(d.Name)
	if d.Name == "" {
		return nil, fmt.Errorf("domain xml: <name> is missing or empty; a domain needs a name: %w", hypervisor.ErrRejected)
	}
	return &d, nil
}

// memoryBytes is the guest memory in bytes, 0 when absent or unreadable
// (it only sizes the progress figures).
func (d *domainDoc) memoryBytes() uint64 {
	n, err := xmlpatch.ScaledBytes(d.Memory.Value, d.Memory.Unit)
	if err != nil {
		return 0
	}
	return n
}

// checkPins checks that every cpuset and nodeset of domainXML names CPUs
// and cells of host, which is what a real host checks when the guest
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
	return hypervisor.PinsFit(pins, cpus, nodes)
}
