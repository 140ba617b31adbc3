// Package hypervisor defines what pinflow asks of a hypervisor: host NUMA
// capabilities, the guest lifecycle, and live migration with a rewritten
// destination XML. Implementations: sim (a simulator whose state lives in
// Redis) and libvirt (go-libvirt speaking to each host's libvirtd).
package hypervisor

import (
	"context"
	"errors"
	"fmt"

	"github.com/pinflow/pinflow/numa"
)

// Errors every driver returns, wrapped with %w, so callers can branch.
var (
	// ErrUnknownHost: the driver does not know the host name.
	ErrUnknownHost = errors.New("unknown host")
	// ErrNotFound: no domain with that UUID on that host.
	ErrNotFound = errors.New("domain not found")
	// ErrRejected: the hypervisor refused the request itself (a bad
	// domain XML, a destination that cannot take the guest); retrying the
	// same request cannot succeed.
	ErrRejected = errors.New("rejected by the hypervisor")
	// ErrPostCopyFailed: a migration failed after its switch to post-copy.
	// The guest's memory is split between the hosts and it is paused; it
	// cannot go back to the source, only on: calling Migrate again resumes
	// the migration.
	ErrPostCopyFailed = errors.New("the migration failed after its switch to post-copy; only resuming it can complete it")
)

// State is a domain's run state.
type State string

// Domain run states.
const (
	StateRunning State = "running"
	StateShutoff State = "shutoff"
	StatePaused  State = "paused"
)

// Domain is a guest as one host's hypervisor sees it.
type Domain struct {
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	State State  `json:"state"`
	// XML is the domain's current definition (migratable form).
	XML string `json:"xml"`
}

// Progress is how far a live migration has come.
type Progress struct {
	Percent       int    `json:"percent"`
	DataTotal     uint64 `json:"data_total"`
	DataProcessed uint64 `json:"data_processed"`
	DataRemaining uint64 `json:"data_remaining"`
	Phase         string `json:"phase"`
}

// MigrateRequest is one live migration.
type MigrateRequest struct {
	UUID    string
	Source  string
	Dest    string
	DestXML string
	// Fence says whether the operation that asked for the migration still
	// wants it (the destination claim it acts for still exists with its
	// token); nil means no fence.
	Fence func(ctx context.Context) error
	// Policy bounds the migration and says what may help it converge; the
	// zero value sets no bound (see MigrationPolicy).
	Policy MigrationPolicy
}

// CheckFence asks the request's fence whether the migration may go on;
// its error wraps ErrFenced and the fence's own, and names point, where
// the driver asked.
func (r MigrateRequest) CheckFence(ctx context.Context, point string) error {
	if r.Fence == nil {
		return nil
	}
	if err := r.Fence(context.WithValue(ctx, fencePointKey{}, point)); err != nil {
		return fmt.Errorf("%w (checked %s): %w", ErrFenced, point, err)
	}
	return nil
}

type fencePointKey struct{}

// FencePoint is where in a migration CheckFence asks its fence, from the
// context the fence gets ("before the switch to post-copy"), or "".
func FencePoint(ctx context.Context) string {
	p, _ := ctx.Value(fencePointKey{}).(string)
	return p
}

// ErrFenced: the step's fence did not let it act, because the operation
// it acts for no longer holds the claim the step needs, or because the
// step could not prove that it still does before its lease ran out; the
// step did not take effect. The fence's own error says which.
var ErrFenced = errors.New("fenced: the claim this step acts for is gone, changed or not confirmed")

// Driver manages the guests of a set of hosts, addressed by host name.
// Every method is safe to call again after an unknown outcome: defining an
// existing domain with the same XML, stopping a stopped one, undefining a
// missing one succeed.
type Driver interface {
	// Capabilities returns the host's NUMA topology, without usage.
	Capabilities(ctx context.Context, host string) (*numa.Host, error)
	// Define makes a persistent domain from xml (its <uuid> names it).
	Define(ctx context.Context, host, xml string) error
	// Start boots a defined domain; starting a running one succeeds.
	Start(ctx context.Context, host, uuid string) error
	// Shutdown asks the guest to power itself off (an ACPI power button
	// press) and returns without waiting; the domain is shut off once the
	// guest has done so. A shut-off domain succeeds at once.
	Shutdown(ctx context.Context, host, uuid string) error
	// Stop powers a domain off at once (destroy); stopping a stopped one
	// succeeds.
	Stop(ctx context.Context, host, uuid string) error
	// Undefine removes a stopped domain's definition; a missing one succeeds.
	Undefine(ctx context.Context, host, uuid string) error
	// Lookup returns one domain, or ErrNotFound.
	Lookup(ctx context.Context, host, uuid string) (*Domain, error)
	// Domains lists every domain on the host, with its XML.
	Domains(ctx context.Context, host string) ([]Domain, error)
	// PrepareMigration checks that dst can take the domain with destXML
	// before any data moves.
	PrepareMigration(ctx context.Context, dst, uuid, destXML string) error
	// Migrate live-migrates the running domain req.UUID from req.Source to
	// req.Dest with req.DestXML as its definition there, calling progress
	// as it goes. It returns when the guest runs on the destination only.
	// Cancelling ctx aborts the migration and leaves the guest running on
	// its source, unless the migration had passed its point of no return:
	// then it completes and Migrate returns nil. req.Fence, when set, is
	// called before the migration starts and as close before its point of
	// no return as the hypervisor allows; its error aborts the migration.
	// A switch to post-copy is such a point: the fence is called right
	// before it, and a refusal aborts instead. A timeout of req.Policy
	// that aborts leaves the guest running on its source, as a cancel
	// does, and returns an error matching ErrMigrationTimeout; a bad
	// req.Policy is refused with ErrRejected before anything starts.
	Migrate(ctx context.Context, req MigrateRequest, progress func(Progress)) error
	// Rollback undoes a failed or aborted migration: the guest runs on src,
	// and dst holds no trace of it.
	Rollback(ctx context.Context, src, dst, uuid string) error
	// DetachDevices unplugs the devices of the given user aliases from the
	// domain, running and defined, and returns once the guest has let
	// them go; an alias the domain does not have is skipped.
	DetachDevices(ctx context.Context, host, uuid string, aliases []string) error
	// AttachDevices plugs each device element into the domain, running and
	// defined; an element whose user alias the domain has already is
	// skipped.
	AttachDevices(ctx context.Context, host, uuid string, elements []string) error
	// Repin gives domain uuid the pins of def, its definition with the
	// vCPU, emulator and I/O thread pins of a new placement on the same
	// host, without stopping it: each thread of a running domain runs on
	// its new pCPUs from the call on, and def becomes the domain's
	// definition, so a restart keeps them. A change no running guest can
	// take in place is ErrRejected before anything changes (RepinPins).
	// Repinning to the pins the domain has succeeds.
	Repin(ctx context.Context, host, uuid, def string) error
}
