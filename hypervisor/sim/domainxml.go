package sim

import (
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"strings"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/numa"
)

// domainDoc is what the simulator reads of a domain XML: its identity, its
// memory (the data a migration moves) and its pinning (checked against the
// host like a real hypervisor does when the guest starts).
type domainDoc struct {
	XMLName xml.Name `xml:"domain"`
	Name    string   `xml:"name"`
	UUID    string   `xml:"uuid"`
	Memory  struct {
		Unit  string `xml:"unit,attr"`
		Value string `xml:",chardata"`
	} `xml:"memory"`
	VCPU struct {
		CPUSet string `xml:"cpuset,attr"`
	} `xml:"vcpu"`
	CPUTune struct {
		VCPUPins     []cpusetAttr `xml:"vcpupin"`
		EmulatorPin  *cpusetAttr  `xml:"emulatorpin"`
		IOThreadPins []cpusetAttr `xml:"iothreadpin"`
	} `xml:"cputune"`
	NUMATune struct {
		Memory *struct {
			Nodeset string `xml:"nodeset,attr"`
		} `xml:"memory"`
		MemNodes []struct {
			CellID  string `xml:"cellid,attr"`
			Nodeset string `xml:"nodeset,attr"`
		} `xml:"memnode"`
	} `xml:"numatune"`
}

type cpusetAttr struct {
	VCPU     string `xml:"vcpu,attr"`
	IOThread string `xml:"iothread,attr"`
	CPUSet   string `xml:"cpuset,attr"`
}

// parseDomain reads a domain XML; a document without a valid <uuid> or a
// <name> is rejected, as libvirt would.
func parseDomain(doc string) (*domainDoc, error) {
	var d domainDoc
	if err := xml.Unmarshal([]byte(doc), &d); err != nil {
		return nil, fmt.Errorf("domain xml: %v: %w", err, hypervisor.ErrRejected)
	}
	uuid, err := normUUID(d.UUID)
	if err != nil {
		return nil, fmt.Errorf("domain xml: <uuid>: %v: %w", err, hypervisor.ErrRejected)
	}
	d.UUID = uuid
	d.Name = strings.TrimSpace(d.Name)
	if d.Name == "" {
		return nil, fmt.Errorf("domain xml: <name> is missing or empty; a domain needs a name: %w", hypervisor.ErrRejected)
	}
	return &d, nil
}

// normUUID returns a UUID in libvirt's canonical form (lower case, dashed
// 8-4-4-4-12). Like libvirt it accepts the 32 hex digits with or without
// dashes.
func normUUID(s string) (string, error) {
	s = strings.TrimSpace(s)
	digits := strings.ToLower(strings.ReplaceAll(s, "-", ""))
	if len(digits) != 32 {
		return "", fmt.Errorf("uuid %q: must be 32 hex digits, like 0f8fad5b-d9cb-469f-a165-70867728950e", s)
	}
	if _, err := hex.DecodeString(digits); err != nil {
		return "", fmt.Errorf("uuid %q: must be 32 hex digits, like 0f8fad5b-d9cb-469f-a165-70867728950e", s)
	}
	return digits[0:8] + "-" + digits[8:12] + "-" + digits[12:16] + "-" + digits[16:20] + "-" + digits[20:], nil
}

// memoryBytes is the guest memory in bytes, 0 when absent or unreadable
// (it only sizes the progress figures).
func (d *domainDoc) memoryBytes() uint64 {
	var n uint64
	if _, err := fmt.Sscan(strings.TrimSpace(d.Memory.Value), &n); err != nil {
		return 0
	}
	unit := map[string]uint64{
		"b": 1, "bytes": 1,
		"kb": 1000, "k": 1024, "kib": 1024, "": 1024,
		"mb": 1000 * 1000, "m": 1 << 20, "mib": 1 << 20,
		"gb": 1000 * 1000 * 1000, "g": 1 << 30, "gib": 1 << 30,
		"tb": 1000 * 1000 * 1000 * 1000, "t": 1 << 40, "tib": 1 << 40,
	}[strings.ToLower(d.Memory.Unit)]
	return n * unit
}

// checkPlacement verifies that every cpuset and nodeset of the domain names
// CPUs and cells the host has, which is what a real host checks when the
// guest starts or arrives.
func checkPlacement(host *numa.Host, d *domainDoc) error {
	var online numa.CPUSet
	cells := map[int]bool{}
	var cellIDs numa.CPUSet
	for _, c := range host.Cells {
		online = online.Union(c.CPUs).Union(c.PCPUs)
		cells[c.ID] = true
		cellIDs = cellIDs.Union(numa.NewCPUSet(c.ID))
	}
	cpus := func(what, list string) error {
		if list == "" {
			return nil
		}
		set, err := numa.Parse(list)
		if err != nil {
			return fmt.Errorf("%s cpuset %q: not a cpuset list: %w", what, list, hypervisor.ErrRejected)
		}
		if !set.IsSubsetOf(online) {
			return fmt.Errorf("%s cpuset %q: cpus %s are not on the host, whose cpus are %s: %w",
				what, list, set.Difference(online), online, hypervisor.ErrRejected)
		}
		return nil
	}
	nodes := func(what, list string) error {
		if list == "" {
			return nil
		}
		set, err := numa.Parse(list)
		if err != nil {
			return fmt.Errorf("%s nodeset %q: not a node list: %w", what, list, hypervisor.ErrRejected)
		}
		for _, id := range set.List() {
			if !cells[id] {
				return fmt.Errorf("%s nodeset %q: node %d is not on the host, whose nodes are %s: %w",
					what, list, id, cellIDs, hypervisor.ErrRejected)
			}
		}
		return nil
	}
	if err := cpus("<vcpu>", d.VCPU.CPUSet); err != nil {
		return err
	}
	for _, p := range d.CPUTune.VCPUPins {
		if err := cpus("<vcpupin vcpu='"+p.VCPU+"'>", p.CPUSet); err != nil {
			return err
		}
	}
	if p := d.CPUTune.EmulatorPin; p != nil {
		if err := cpus("<emulatorpin>", p.CPUSet); err != nil {
			return err
		}
	}
	for _, p := range d.CPUTune.IOThreadPins {
		if err := cpus("<iothreadpin iothread='"+p.IOThread+"'>", p.CPUSet); err != nil {
			return err
		}
	}
	if m := d.NUMATune.Memory; m != nil {
		if err := nodes("<numatune><memory>", m.Nodeset); err != nil {
			return err
		}
	}
	for _, m := range d.NUMATune.MemNodes {
		if err := nodes("<memnode cellid='"+m.CellID+"'>", m.Nodeset); err != nil {
			return err
		}
	}
	return nil
}
