package hypervisor

import (
	"encoding/xml"
	"fmt"
	"strings"

	"github.com/pinflow/pinflow/xmlpatch"
)

// DomainIdentity is what a domain XML says about which domain it is, and
// the size of its memory, which a migration moves. Drivers read it here
// and its pins with xmlpatch.Read.
type DomainIdentity struct {
	// Name is the domain's <name>, never empty.
	Name string
	// UUID is the domain's <uuid> in canonical form.
	UUID string
	// MemoryBytes is the domain's <memory>, 0 when absent or unreadable:
	// it only sizes progress figures and timeouts.
	MemoryBytes uint64
}

// ReadDomainIdentity reads the name, UUID and memory of domainXML. A
// document without a valid <uuid> or a <name> is refused, as libvirt
// would refuse it; pinflow addresses domains by UUID. The error wraps
// ErrRejected and says what is wrong, not whose XML it is: callers do.
func ReadDomainIdentity(domainXML string) (DomainIdentity, error) {
	var doc struct {
		XMLName xml.Name `xml:"domain"`
		Name    string   `xml:"name"`
		UUID    string   `xml:"uuid"`
		Memory  struct {
			Unit  string `xml:"unit,attr"`
			Value string `xml:",chardata"`
		} `xml:"memory"`
	}
	if err := xml.Unmarshal([]byte(domainXML), &doc); err != nil {
		return DomainIdentity{}, fmt.Errorf("does not parse: %v: %w", err, ErrRejected)
	}
	if strings.TrimSpace(doc.UUID) == "" {
		return DomainIdentity{}, fmt.Errorf("no <uuid>; pinflow addresses domains by UUID: %w", ErrRejected)
	}
	u, err := ParseUUID(doc.UUID)
	if err != nil {
		return DomainIdentity{}, fmt.Errorf("<uuid>: %v: %w", err, ErrRejected)
	}
	id := DomainIdentity{Name: strings.TrimSpace(doc.Name), UUID: u.String()}
	if id.Name == "" {
		return DomainIdentity{}, fmt.Errorf("<name> is missing or empty; a domain needs a name: %w", ErrRejected)
	}
	if n, err := xmlpatch.ScaledBytes(doc.Memory.Value, doc.Memory.Unit); err == nil {
		id.MemoryBytes = n
	}
	return id, nil
}
