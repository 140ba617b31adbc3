package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pinflow/pinflow/numa"
)

// VMState is an instance's power and life state, with Nova's names.
type VMState string

// VM states.
const (
	VMBuilding         VMState = "building"
	VMActive           VMState = "active"
	VMStopped          VMState = "stopped"
	VMShelvedOffloaded VMState = "shelved_offloaded"
	VMError            VMState = "error"
	VMDeleted          VMState = "deleted"
)

var vmStates = []VMState{VMBuilding, VMActive, VMStopped, VMShelvedOffloaded, VMError, VMDeleted}

// TaskState is the operation under way on an instance, with Nova's names;
// TaskNone when there is none.
type TaskState string

// Task states.
const (
	TaskNone       TaskState = ""
	TaskSpawning   TaskState = "spawning"
	TaskMigrating  TaskState = "migrating"
	TaskShelving   TaskState = "shelving"
	TaskUnshelving TaskState = "unshelving"
	TaskDeleting   TaskState = "deleting"
)

var taskStates = []TaskState{TaskNone, TaskSpawning, TaskMigrating, TaskShelving, TaskUnshelving, TaskDeleting}

func checkVMState(s VMState) error {
	for _, v := range vmStates {
		if s == v {
			return nil
		}
	}
	return fmt.Errorf("vm_state %q: %w: allowed are %v", s, ErrInvalid, vmStates)
}

func checkTaskState(s TaskState) error {
	for _, v := range taskStates {
		if s == v {
			return nil
		}
	}
	return fmt.Errorf("task_state %q: %w: allowed are \"\" (none), spawning, migrating, shelving, unshelving, deleting", s, ErrInvalid)
}

// Flavor is what an instance asks for, as Nova's flavor and image say it.
type Flavor struct {
	VCPUs      int               `json:"vcpus"`
	MemoryMB   int64             `json:"memory_mb"`
	ExtraSpecs map[string]string `json:"extra_specs,omitempty"`
	ImageProps map[string]string `json:"image_props,omitempty"`
}

// Request builds the NUMA request the flavor and image make.
func (f Flavor) Request() (*numa.Request, error) {
	return numa.NewRequest(f.VCPUs, f.MemoryMB, f.ExtraSpecs, f.ImageProps)
}

// Instance is an instance record. Host, Node, Placement and ClaimID are set
// together, only while the named claim is committed on Host.
type Instance struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
	Host string `json:"host,omitempty"`
	// Node lists the host NUMA cells the placement uses.
	Node      []int           `json:"node,omitempty"`
	VMState   VMState         `json:"vm_state"`
	TaskState TaskState       `json:"task_state"`
	Request   Flavor          `json:"request"`
	Placement *numa.Placement `json:"placement,omitempty"`
	DomainXML string          `json:"domain_xml,omitempty"`
	ClaimID   string          `json:"claim_id,omitempty"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// CreateInstance records a new instance, not on any host, in vmState
// (usually building) with no task. creator names the operation that
// creates it (its workflow's first run id): creating it again for the
// same creator, name and flavor is a retry and changes nothing; for
// another creator it is ErrExists (a second boot of one uuid must not
// spawn a second copy), and with another name or flavor ErrConflict. An
// empty creator skips the creator check.
func (l *Ledger) CreateInstance(ctx context.Context, uuid, name string, flavor Flavor, vmState VMState, creator string) (*Instance, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: create instance %s: %w", uuid, err) }
	if err := checkUUID(uuid); err != nil {
		return nil, wrap(err)
	}
	if name == "" || len(name) > 255 {
		return nil, wrap(fmt.Errorf("name %q: %w: names are 1-255 characters", name, ErrInvalid))
	}
	if err := checkVMState(vmState); err != nil {
		return nil, wrap(err)
	}
	if _, err := flavor.Request(); err != nil {
		return nil, wrap(fmt.Errorf("%w: %v", ErrInvalid, err))
	}
	req, err := json.Marshal(flavor)
	if err != nil {
		return nil, wrap(err)
	}
	res, err := l.change(ctx, instCreateScript, []string{l.instKey(uuid)}, uuid, name, req, string(vmState), "", l.timestamp(), creator).StringSlice()
	if err != nil {
		return nil, wrap(err)
	}
	switch res[0] {
	case "conflict":
		return nil, wrap(fmt.Errorf("%w: instance exists as %q with flavor %s", ErrConflict, res[1], res[2]))
	case "other":
		return nil, wrap(fmt.Errorf("%w: instance %s was created by another operation and is %s", ErrExists, uuid, res[1]))
	}
	return l.Instance(ctx, uuid)
}

// Instance returns an instance record, or ErrUnknownInstance.
func (l *Ledger) Instance(ctx context.Context, uuid string) (*Instance, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: instance %s: %w", uuid, err) }
	if err := checkUUID(uuid); err != nil {
		return nil, wrap(err)
	}
	f, err := l.rdb.HGetAll(ctx, l.instKey(uuid)).Result()
	if err != nil {
		return nil, wrap(err)
	}
	if f["uuid"] == "" {
		return nil, wrap(fmt.Errorf("%w: no record of %q", ErrUnknownInstance, uuid))
	}
	in := &Instance{UUID: f["uuid"], Name: f["name"], Host: f["host"], VMState: VMState(f["vm_state"]),
		TaskState: TaskState(f["task_state"]), DomainXML: f["domain_xml"], ClaimID: f["claim_id"]}
	if in.Node, err = parseNode(f["node"]); err != nil {
		return nil, wrap(err)
	}
	if err := json.Unmarshal([]byte(f["request"]), &in.Request); err != nil {
		return nil, wrap(fmt.Errorf("stored request: %w", err))
	}
	if p := f["placement"]; p != "" {
		in.Placement = &numa.Placement{}
		if err := json.Unmarshal([]byte(p), in.Placement); err != nil {
			return nil, wrap(fmt.Errorf("stored placement: %w", err))
		}
	}
	if in.UpdatedAt, err = time.Parse(time.RFC3339Nano, f["updated_at"]); err != nil {
		return nil, wrap(fmt.Errorf("stored updated_at %q: %w", f["updated_at"], err))
	}
	return in, nil
}

func formatNode(cells []int) string {
	parts := make([]string, len(cells))
	for i, c := range cells {
		parts[i] = strconv.Itoa(c)
	}
	return strings.Join(parts, ",")
}

func parseNode(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("stored node %q is not a list of cell ids", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// Transition is a conditional change of an instance's states.
type Transition struct {
	// FromVM and FromTask are the states the change may start from; empty
	// allows any.
	FromVM   []VMState
	FromTask []TaskState
	// VM is the new vm_state; "" keeps the current one.
	VM VMState
	// Task is the new task_state (TaskNone clears it).
	Task TaskState
}

// SetState applies t: compare-and-set on the instance's states. Being in
// the target states already succeeds without a change (a retry); starting
// from states t does not allow is ErrConflict and changes nothing.
func (l *Ledger) SetState(ctx context.Context, uuid string, t Transition) error {
	wrap := func(err error) error {
		return fmt.Errorf("ledger: set state of instance %s to %q/%q: %w", uuid, t.VM, t.Task, err)
	}
	if err := checkUUID(uuid); err != nil {
		return wrap(err)
	}
	if t.VM != "" {
		if err := checkVMState(t.VM); err != nil {
			return wrap(err)
		}
	}
	if err := checkTaskState(t.Task); err != nil {
		return wrap(err)
	}
	args := []any{string(t.VM), string(t.Task), l.timestamp(), len(t.FromVM)}
	for _, s := range t.FromVM {
		args = append(args, string(s))
	}
	args = append(args, len(t.FromTask))
	for _, s := range t.FromTask {
		args = append(args, string(s))
	}
	res, err := l.change(ctx, instStateScript, []string{l.instKey(uuid)}, args...).StringSlice()
	if err != nil {
		return wrap(err)
	}
	switch res[0] {
	case "unknown":
		return wrap(fmt.Errorf("%w: no record of %q", ErrUnknownInstance, uuid))
	case "conflict":
		return wrap(fmt.Errorf("%w: it is %q/%q; allowed from vm_state %v, task_state %q", ErrConflict, res[1], res[2], t.FromVM, t.FromTask))
	}
	return nil
}

// AttachInstance points the instance at host and the claim that holds its
// resources there: host, node, placement (copied from the claim) and claim
// id change together, and domainXML too when not empty. The claim must
// exist on host, be committed and belong to the instance, or nothing
// changes (ErrUnknownClaim, ErrConflict).
//
// The claim lives in the host's slot and the record in the instance's, so
// the claim is checked first and the record written after; callers commit
// the claim before attaching, and the workflow lock on the instance keeps
// anyone else from releasing that claim in between. Attaching again is a
// retry's success; attaching to a new claim replaces the old attachment
// (the move at the end of a migration).
func (l *Ledger) AttachInstance(ctx context.Context, uuid, host, claimID, domainXML string) error {
	wrap := func(err error) error {
		return fmt.Errorf("ledger: attach instance %s to claim %s on %s: %w", uuid, claimID, host, err)
	}
	if err := checkUUID(uuid); err != nil {
		return wrap(err)
	}
	c, err := l.GetClaim(ctx, host, claimID)
	if err != nil {
		return wrap(err)
	}
	if c.InstanceUUID != uuid {
		return wrap(fmt.Errorf("%w: the claim belongs to instance %s", ErrConflict, c.InstanceUUID))
	}
	if c.State != StateCommitted {
		return wrap(fmt.Errorf("%w: the claim is %s; commit it before attaching", ErrConflict, c.State))
	}
	placement, err := json.Marshal(c.Placement)
	if err != nil {
		return wrap(err)
	}
	cells := make([]int, 0, len(c.Usage))
	for _, u := range c.Usage {
		cells = append(cells, u.Cell)
	}
	sort.Ints(cells)
	res, err := l.change(ctx, instAttachScript, []string{l.instKey(uuid)},
		host, formatNode(cells), placement, claimID, domainXML, boolArg(domainXML != ""), l.timestamp(), DomainDigest(domainXML)).StringSlice()
	if err != nil {
		return wrap(err)
	}
	if res[0] == "unknown" {
		return wrap(fmt.Errorf("%w: no record of %q", ErrUnknownInstance, uuid))
	}
	return nil
}

// DetachInstance clears the instance's host, node, placement and claim id,
// which must name claimID. It runs after, never before, the claim's
// release: while the claim still exists it is ErrConflict, so the record
// never stops naming resources the ledger still holds for it. Detaching a
// detached instance succeeds without a change.
func (l *Ledger) DetachInstance(ctx context.Context, uuid, claimID string) error {
	wrap := func(err error) error {
		return fmt.Errorf("ledger: detach instance %s from claim %s: %w", uuid, claimID, err)
	}
	if err := checkClaimID(claimID); err != nil {
		return wrap(err)
	}
	in, err := l.Instance(ctx, uuid)
	if err != nil {
		return wrap(err)
	}
	if in.ClaimID == "" && in.Host == "" {
		return nil
	}
	if in.ClaimID != claimID {
		return wrap(fmt.Errorf("%w: the instance is attached to claim %q", ErrConflict, in.ClaimID))
	}
	if in.Host != "" {
		held, err := l.rdb.HExists(ctx, l.hostKeys(in.Host).claims, claimID).Result()
		if err != nil {
			return wrap(err)
		}
		if held {
			return wrap(fmt.Errorf("%w: claim %s still holds resources on %s; release it first", ErrConflict, claimID, in.Host))
		}
	}
	res, err := l.change(ctx, instDetachScript, []string{l.instKey(uuid)}, claimID, l.timestamp()).StringSlice()
	if err != nil {
		return wrap(err)
	}
	switch res[0] {
	case "unknown":
		return wrap(fmt.Errorf("%w: no record of %q", ErrUnknownInstance, uuid))
	case "conflict":
		return wrap(fmt.Errorf("%w: the instance is attached to claim %q", ErrConflict, res[1]))
	}
	return nil
}

// SetDomainXML stores the instance's libvirt domain XML.
func (l *Ledger) SetDomainXML(ctx context.Context, uuid, domainXML string) error {
	wrap := func(err error) error { return fmt.Errorf("ledger: set domain xml of instance %s: %w", uuid, err) }
	if err := checkUUID(uuid); err != nil {
		return wrap(err)
	}
	n, err := l.change(ctx, instXMLScript, []string{l.instKey(uuid)}, domainXML, l.timestamp(), DomainDigest(domainXML)).Int()
	if err != nil {
		return wrap(err)
	}
	if n == 0 {
		return wrap(fmt.Errorf("%w: no record of %q", ErrUnknownInstance, uuid))
	}
	return nil
}

// DeleteInstance deletes an instance record that is attached to no claim
// (release the claim and detach first, or ErrConflict). Deleting a deleted
// or unknown instance succeeds.
func (l *Ledger) DeleteInstance(ctx context.Context, uuid string) error {
	wrap := func(err error) error { return fmt.Errorf("ledger: delete instance %s: %w", uuid, err) }
	if err := checkUUID(uuid); err != nil {
		return wrap(err)
	}
	res, err := l.change(ctx, instDeleteScript, []string{l.instKey(uuid)}).StringSlice()
	if err != nil {
		return wrap(err)
	}
	if res[0] == "conflict" {
		return wrap(fmt.Errorf("%w: it is still on host %q with claim %q; release and detach first", ErrConflict, res[1], res[2]))
	}
	return nil
}

// Home is where an instance's record says it lives.
type Home struct {
	Host    string
	ClaimID string
	// DomainDigest is DomainDigest of the domain XML pinflow last defined
	// for the instance; "" when unknown.
	DomainDigest string
}

// DomainDigest identifies a domain XML document: a hypervisor that returns
// the same digest returns the very document pinflow defined, pins included.
func DomainDigest(domainXML string) string {
	if domainXML == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(domainXML))
	return hex.EncodeToString(sum[:16])
}

// Home returns the host, claim id and domain digest the instance's record
// names (host and claim id "" when it is detached), or ErrUnknownInstance.
// It reads those fields only, for an audit that checks every resident
// claim of a host.
func (l *Ledger) Home(ctx context.Context, uuid string) (Home, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: instance %s: %w", uuid, err) }
	if err := checkUUID(uuid); err != nil {
		return Home{}, wrap(err)
	}
	v, err := l.rdb.HMGet(ctx, l.instKey(uuid), "uuid", "host", "claim_id", "domain_digest").Result()
	if err != nil {
		return Home{}, wrap(err)
	}
	if v[0] == nil {
		return Home{}, wrap(fmt.Errorf("%w: no record of %q", ErrUnknownInstance, uuid))
	}
	str := func(x any) string { s, _ := x.(string); return s }
	return Home{Host: str(v[1]), ClaimID: str(v[2]), DomainDigest: str(v[3])}, nil
}
