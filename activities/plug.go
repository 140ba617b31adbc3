package activities

import (
	"context"
	"errors"
	"fmt"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/xmlpatch"
)

// A live migration of a guest with SR-IOV or vDPA ports unplugs their
// interfaces on the source before the copy (QEMU cannot migrate a
// passed-through device) and plugs the destination's in once the guest
// runs there; a migration that rolls back plugs the source's in again.
// Unplugging frees nothing in the ledger: the devices stay in the guest's
// claim until the claim goes.

// UnplugDevices unplugs from the guest on in.Host every device pinflow
// passed through to it (its elements with pinflow's aliases). A device
// unplugged already is skipped, so a retry is safe.
func (a *Activities) UnplugDevices(ctx context.Context, in DomainInput) error {
	return a.heartbeating(ctx, func(ctx context.Context) error {
		dom, err := a.Driver.Lookup(ctx, in.Host, in.UUID)
		if err != nil {
			return classify(err)
		}
		devs, err := xmlpatch.Devices(dom.XML)
		if err != nil || len(devs) == 0 {
			return classify(err)
		}
		aliases := make([]string, len(devs))
		for i, d := range devs {
			aliases[i] = d.Alias
		}
		f, err := a.fenceDomain(ctx, in, true)
		if err != nil {
			return err
		}
		return f.do(ctx, func(ctx context.Context) error { return a.Driver.DetachDevices(ctx, in.Host, in.UUID, aliases) })
	})
}

// PlugDevicesInput names the guest, the host it runs on and the claim
// that holds its devices there.
type PlugDevicesInput struct {
	UUID    string `json:"uuid"`
	Host    string `json:"host"`
	ClaimID string `json:"claim_id"`
	// Token and Final: as DomainInput's.
	Token string `json:"token,omitempty"`
	Final bool   `json:"final,omitempty"`
}

// PlugDevices plugs into the guest on in.Host the devices its record's
// domain XML passes through, while its record names claim in.ClaimID on
// that host: the source's claim before a migration commits (plugging back
// after a rollback), the destination's after. A record that names another
// claim is api.ErrTypeBadState: the guest moved on, and these devices are no
// longer its. The plug fences on the claim, so an attempt that outlived
// the claim plugs in nothing another guest may now own; a host marked
// down is api.ErrTypeHostDown.
func (a *Activities) PlugDevices(ctx context.Context, in PlugDevicesInput) error {
	return a.heartbeating(ctx, func(ctx context.Context) error {
		var inst *ledger.Instance
		if err := waitLedger(ctx, func(ctx context.Context) (err error) { inst, err = a.Ledger.Instance(ctx, in.UUID); return err }); err != nil {
			return classify(err)
		}
		if inst.Host != in.Host || inst.ClaimID != in.ClaimID {
			return BadState(fmt.Sprintf("instance %s's record names claim %q on %q, not %s on %s: its devices there are not plugged in",
				in.UUID, inst.ClaimID, inst.Host, in.ClaimID, in.Host))
		}
		elements, err := deviceElements(inst.DomainXML)
		if err != nil || len(elements) == 0 {
			return classify(err)
		}
		// Under the claim, taken for the operation: a plug of one that
		// ended plugs in nothing another guest may now own.
		f, err := a.fenceDomain(ctx, DomainInput{UUID: in.UUID, Host: in.Host, ClaimID: in.ClaimID, Token: in.Token, Final: in.Final}, false)
		if err != nil {
			return err
		}
		err = f.do(ctx, func(ctx context.Context) error { return a.Driver.AttachDevices(ctx, in.Host, in.UUID, elements) })
		if errors.Is(err, hypervisor.ErrNotFound) {
			return BadState(fmt.Sprintf("instance %s has no domain on %s to plug its devices into", in.UUID, in.Host))
		}
		return classify(err)
	})
}
