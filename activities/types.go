package activities

import (
	"errors"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// InstanceInfo is what workflows need of an instance record. It leaves
// out the domain XML, which stays in Redis rather than in workflow history.
type InstanceInfo struct {
	UUID      string          `json:"uuid"`
	Name      string          `json:"name"`
	Host      string          `json:"host,omitempty"`
	VMState   guest.VMState   `json:"vm_state"`
	TaskState guest.TaskState `json:"task_state"`
	Flavor    guest.Flavor    `json:"flavor"`
	Placement *numa.Placement `json:"placement,omitempty"`
	ClaimID   string          `json:"claim_id,omitempty"`
	// ClaimToken is the resident claim's token as the operation found it
	// when it began: its steps take the claim from it (see DomainInput).
	ClaimToken string `json:"claim_token,omitempty"`
	// ResizeSource is the source hold of a resize in VERIFY_RESIZE (or one
	// interrupted), which a delete frees too.
	ResizeSource *ClaimRef `json:"resize_source,omitempty"`
	// Resizing says the record keeps a resize that has not ended: one in
	// VERIFY_RESIZE, or one interrupted, which the audit settles.
	Resizing bool `json:"resizing,omitempty"`
}

// Facts are what the guest's rules (guest.Facts) read of the instance.
func (i InstanceInfo) Facts() guest.Facts {
	return guest.Facts{UUID: i.UUID, Host: i.Host, VMState: i.VMState, TaskState: i.TaskState, Flavor: i.Flavor,
		Placement: i.Placement, ClaimID: i.ClaimID, Resizing: i.Resizing}
}

// CanLiveMigrate says why the instance cannot be live-migrated, or nil.
func (i InstanceInfo) CanLiveMigrate() error { return ruled(i.Facts().CanLiveMigrate()) }

// Running says why the instance is not active on a host, as a live
// migration needs, or nil.
func (i InstanceInfo) Running() error { return ruled(i.Facts().Running()) }

// Unpluggable says why the instance's PCI devices cannot be unplugged
// for a live migration (guest.Facts.Unpluggable), or nil.
func (i InstanceInfo) Unpluggable() error { return ruled(i.Facts().Unpluggable()) }

// CanShelve says why the instance cannot be shelved and offloaded, or nil.
func (i InstanceInfo) CanShelve() error { return ruled(i.Facts().CanShelve()) }

// CanUnshelve says why the instance cannot be unshelved, or nil.
func (i InstanceInfo) CanUnshelve() error { return ruled(i.Facts().CanUnshelve()) }

// CanResize says why the instance cannot be resized or cold-migrated, or
// nil.
func (i InstanceInfo) CanResize() error { return ruled(i.Facts().CanResize()) }

// CanEvacuate says why the instance cannot be evacuated, or nil; its
// host's state is the workflow's to check.
func (i InstanceInfo) CanEvacuate() error { return ruled(i.Facts().CanEvacuate()) }

// ruled is a refusal of the guest's rules as the workflows' error: a
// state that forbids it now, or devices that always will.
func ruled(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, guest.ErrFixedDevices):
		return BadRequest(err.Error())
	}
	return BadState(err.Error())
}

// Owner names the workflow run that owns a claim.
type Owner struct {
	WorkflowID string `json:"workflow_id"`
	FirstRunID string `json:"first_run_id"`
}

// CreateInstanceInput is a new guest's record.
type CreateInstanceInput struct {
	UUID   string       `json:"uuid"`
	Name   string       `json:"name"`
	Flavor guest.Flavor `json:"flavor"`
	// Creator is the creating workflow's first run id: a record another
	// operation created is refused, a retry of the same one is not.
	Creator string `json:"creator,omitempty"`
	// Group is the server group the guest joins for life; "" for none.
	Group string `json:"group,omitempty"`
}

// ChooseHostInput asks for a host for a guest.
type ChooseHostInput struct {
	UUID    string       `json:"uuid"`
	Flavor  guest.Flavor `json:"flavor"`
	Exclude []string     `json:"exclude,omitempty"`
}

// ClaimInput asks for a claim of the guest's flavor on a host.
type ClaimInput struct {
	Host    string           `json:"host"`
	ClaimID string           `json:"claim_id"`
	UUID    string           `json:"uuid"`
	Kind    ledger.ClaimKind `json:"kind"`
	Owner   Owner            `json:"owner"`
	Flavor  guest.Flavor     `json:"flavor"`
}

// ClaimResult is the claim made.
type ClaimResult struct {
	Host    string `json:"host"`
	ClaimID string `json:"claim_id"`
	// Token is the claim's random token: fenced hypervisor steps prove
	// with it that the claim they act for is still the one made.
	Token     string            `json:"token,omitempty"`
	State     ledger.ClaimState `json:"state,omitempty"`
	Placement numa.Placement    `json:"placement"`
}

// ReleaseInput names a claim to release.
type ReleaseInput struct {
	Host    string `json:"host"`
	ClaimID string `json:"claim_id"`
	// OnlyPending releases the claim only while it is pending.
	OnlyPending bool `json:"only_pending,omitempty"`
}

// TaskStateInput sets an instance's task state and, when VMState is set,
// its vm state.
type TaskStateInput struct {
	UUID      string          `json:"uuid"`
	TaskState guest.TaskState `json:"task_state"`
	VMState   guest.VMState   `json:"vm_state,omitempty"`
}

// DomainInput names a guest on a host.
type DomainInput struct {
	UUID string `json:"uuid"`
	Host string `json:"host"`
	// ClaimID is the claim on Host the step acts for: the guest's
	// resident claim, or the one its operation made there; Token is its
	// token as the operation knows it (read when it began, or given by the
	// claim). The step takes the claim from Token for its operation's
	// run, or, with Final (a step past the run's forward steps: a
	// compensation that tears one copy down or keeps the other, a step
	// after the commit), on to the run's final token, so that no forward
	// attempt of the run acts after it. A run from before steps named
	// them leaves them empty: the step finds the claim, and fences with
	// the token it has.
	ClaimID string `json:"claim_id,omitempty"`
	Token   string `json:"token,omitempty"`
	Final   bool   `json:"final,omitempty"`
	// LeaveOff: RestoreDomain defines the guest again but does not start
	// it (it was powered off before the operation).
	LeaveOff bool `json:"leave_off,omitempty"`
}

// PrepareMigrationInput asks for the destination XML of a migration,
// staged for the destination claim DestClaimID.
type PrepareMigrationInput struct {
	UUID        string         `json:"uuid"`
	Source      string         `json:"source"`
	Dest        string         `json:"dest"`
	Placement   numa.Placement `json:"placement"`
	DestClaimID string         `json:"dest_claim_id"`
}

// MigrateInput is one live migration.
type MigrateInput struct {
	UUID   string `json:"uuid"`
	Source string `json:"source"`
	Dest   string `json:"dest"`
	// DestClaimID and DestToken name the destination claim the migration
	// acts for: the guest is defined there with the XML staged for it,
	// and the driver's fence checks it before the switchover.
	DestClaimID string `json:"dest_claim_id"`
	DestToken   string `json:"dest_token"`
}

// RollbackResult says where a migration's rollback left the guest.
type RollbackResult struct {
	// OnDest: the migration had completed, the guest runs on the
	// destination only, and nothing was rolled back; the operation must
	// finish forwards.
	OnDest bool `json:"on_dest,omitempty"`
}

// CommitMigrationInput makes a finished migration's destination claim the
// guest's resident claim.
type CommitMigrationInput struct {
	UUID          string `json:"uuid"`
	Source        string `json:"source"`
	Dest          string `json:"dest"`
	SourceClaimID string `json:"source_claim_id"`
	DestClaimID   string `json:"dest_claim_id"`
}

// ClearHostInput detaches an instance from its host after its claim was
// released and sets its vm state. With OnlyClaimID, it detaches only from
// that claim: a record attached elsewhere is left as it is.
type ClearHostInput struct {
	UUID        string        `json:"uuid"`
	VMState     guest.VMState `json:"vm_state"`
	OnlyClaimID string        `json:"only_claim_id,omitempty"`
}

// SpawnInput starts a guest on a host with a placement.
type SpawnInput struct {
	UUID      string         `json:"uuid"`
	Host      string         `json:"host"`
	Placement numa.Placement `json:"placement"`
	// ClaimID and Token name the claim the guest is spawned on; Spawn
	// stages the guest's XML for it and fences on it right before it
	// defines and starts the guest.
	ClaimID string `json:"claim_id"`
	Token   string `json:"token"`
}

// AttachInput makes a spawned guest's claim resident and its record point
// at it, with the domain XML staged for the claim.
type AttachInput struct {
	UUID    string `json:"uuid"`
	Host    string `json:"host"`
	ClaimID string `json:"claim_id"`
}
