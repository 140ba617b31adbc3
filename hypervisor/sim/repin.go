package sim

import (
	"context"

	"github.com/pinflow/pinflow/hypervisor"
)

// Repin gives domain uuid the pins of def in place: a running guest's
// threads are where its document says, so the document becomes def. A
// change no running guest can take in place is rejected as libvirt's is
// (hypervisor.RepinPins), and so are pins the host lacks; a domain
// migrating, or the incoming side of a migration, is refused.
func (d *Driver) Repin(ctx context.Context, host, uuid, def string) error {
	return d.changeDomain(ctx, host, uuid, OpRepin, "re-pin", func(doc string) (string, error) {
		if _, err := hypervisor.RepinPins(doc, def); err != nil {
			return "", err
		}
		return def, nil
	})
}
