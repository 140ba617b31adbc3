package hypervisor

import (
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// ParseUUID reads a domain UUID in the forms libvirt writes and accepts:
// 32 hex digits in either case, dashed 8-4-4-4-12 or not, with blanks
// around them. Its String method gives the canonical form drivers address
// domains by. The error names s and the form wanted.
func ParseUUID(s string) (uuid.UUID, error) {
	t := strings.TrimSpace(s)
	// uuid.Parse also takes {...} and urn:uuid: forms, which libvirt does not.
	if len(t) == 32 || len(t) == 36 {
		if u, err := uuid.Parse(t); err == nil {
			return u, nil
		}
	}
	return uuid.UUID{}, fmt.Errorf("uuid %q is invalid; want 32 hex digits such as 0f8fad5b-d9cb-469f-a165-70867728950e", s)
}
