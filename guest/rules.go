package guest

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pinflow/pinflow/numa"
)

// The kinds of refusal of the rules below.
var (
	// ErrState: the guest's state forbids the operation now.
	ErrState = errors.New("guest state forbids it")
	// ErrFixedDevices: the guest passes through devices that cannot be
	// unplugged, so it can never be live-migrated as it is.
	ErrFixedDevices = errors.New("devices cannot be unplugged")
)

// Refusal is a rule's refusal of an operation: its Reason, of the Kind
// ErrState or ErrFixedDevices.
type Refusal struct {
	Reason string
	Kind   error
}

func (e *Refusal) Error() string { return e.Reason }

// Unwrap gives the kind, for errors.Is.
func (e *Refusal) Unwrap() error { return e.Kind }

func refuse(kind error, format string, args ...any) error {
	return &Refusal{Reason: fmt.Sprintf(format, args...), Kind: kind}
}

// Facts is what the rules of the operations on a guest read of its
// record.
type Facts struct {
	UUID      string
	Host      string
	VMState   VMState
	TaskState TaskState
	Flavor    Flavor
	Placement *numa.Placement
	ClaimID   string
	// Resizing says the record keeps a resize that has not ended: one in
	// VERIFY_RESIZE, or one interrupted, which the audit settles.
	Resizing bool
}

// CanLiveMigrate says why the guest cannot be live-migrated, or nil.
func (f Facts) CanLiveMigrate() error {
	if err := f.Running(); err != nil {
		return err
	}
	return f.Unpluggable()
}

// Running says why the guest is not active on a host, as a live
// migration needs, or nil.
func (f Facts) Running() error {
	if f.VMState != VMActive || f.Host == "" {
		return refuse(ErrState, "instance %s is %s; only an active instance on a host can be live-migrated", f.UUID, f.VMState)
	}
	return f.notResizing()
}

// notResizing refuses a guest whose record keeps a resize that has not
// ended: its domain may be the new flavor's while its record names the
// old, and a move would act on the one with the other's placement.
func (f Facts) notResizing() error {
	if f.Resizing {
		return refuse(ErrState, "instance %s has a resize that has not ended (task state %q); confirm or revert it, or, if it was interrupted, let the audit settle it", f.UUID, f.TaskState)
	}
	return nil
}

// Unpluggable says why the guest's PCI devices cannot be unplugged for a
// live migration, or nil. QEMU cannot migrate a passed-through device,
// so a live migration unplugs the guest's devices before its copy and
// plugs the destination's in after it, as Nova does for SR-IOV and vDPA
// ports: a port's interface, which the guest's network stack lets go and
// takes back (direct, direct-physical, macvtap, vdpa, virtio-forwarder).
// A PCI alias's device (a GPU, an accelerator) and a remote-managed
// port's VF are the guest's for good: such a guest is refused, and
// cold-migrates instead.
func (f Facts) Unpluggable() error {
	fixed := f.FixedDevices()
	if len(fixed) == 0 {
		return nil
	}
	return refuse(ErrFixedDevices, "instance %s passes through %s, which cannot be unplugged for a live migration (only the interfaces of ports other than remote-managed can); a cold migration, or a live one that falls back to cold, moves it", f.UUID, strings.Join(fixed, " and "))
}

// FixedDevices names the guest's devices that a live migration cannot
// unplug (Unpluggable says why).
func (f Facts) FixedDevices() []string {
	if f.Placement == nil || len(f.Placement.Devices) == 0 {
		return nil
	}
	var fixed []string
	for _, r := range f.Flavor.PCIRequests {
		fixed = append(fixed, "the device of PCI alias "+r.Alias)
	}
	for _, p := range f.Flavor.Ports {
		if p.VNICType == numa.VNICRemoteManaged {
			fixed = append(fixed, fmt.Sprintf("the %s port %s", p.VNICType, p.Name))
		}
	}
	return fixed
}

// CanShelve says why the guest cannot be shelved and offloaded, or nil.
func (f Facts) CanShelve() error {
	if (f.VMState != VMActive && f.VMState != VMStopped) || f.Host == "" {
		return refuse(ErrState, "instance %s is %s; only an active or stopped instance on a host can be shelved", f.UUID, f.VMState)
	}
	return f.notResizing()
}

// CanUnshelve says why the guest cannot be unshelved, or nil.
func (f Facts) CanUnshelve() error {
	if f.VMState != VMShelvedOffloaded {
		return refuse(ErrState, "instance %s is %s; only a shelved_offloaded instance can be unshelved", f.UUID, f.VMState)
	}
	return nil
}

// CanResize says why the guest cannot be resized or cold-migrated, or
// nil.
func (f Facts) CanResize() error {
	if (f.VMState != VMActive && f.VMState != VMStopped) || f.Host == "" {
		return refuse(ErrState, "instance %s is %s; only an active or stopped instance on a host can be resized or cold-migrated", f.UUID, f.VMState)
	}
	return f.notResizing()
}

// CanEvacuate says why the guest cannot be evacuated, or nil; its host's
// state is the caller's to check.
func (f Facts) CanEvacuate() error {
	if f.Host == "" || f.ClaimID == "" {
		return refuse(ErrState, "instance %s is %s on no host; only a guest of a host can be evacuated", f.UUID, f.VMState)
	}
	if f.VMState == VMResized {
		return refuse(ErrState, "instance %s is in VERIFY_RESIZE; confirm or revert its resize first", f.UUID)
	}
	return nil
}
