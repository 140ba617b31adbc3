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

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/numa"
)

func checkVMState(s guest.VMState) error {
	for _, v := range guest.VMStates() {
		if s == v {
			return nil
		}
	}
	return fmt.Errorf("vm_state %q: %w: allowed are %v", s, ErrInvalid, guest.VMStates())
}

func checkTaskState(s guest.TaskState) error {
	states := guest.TaskStates()
	for _, v := range states {
		if s == v {
			return nil
		}
	}
	names := []string{`"" (none)`}
	for _, v := range states[1:] {
		names = append(names, string(v))
	}
	return fmt.Errorf("task_state %q: %w: allowed are %s", s, ErrInvalid, strings.Join(names, ", "))
}

// ResizeRecord is what an instance in VERIFY_RESIZE keeps for a revert: where it
// came from and what it was.
type ResizeRecord struct {
	SourceHost    string       `json:"source_host"`
	SourceClaimID string       `json:"source_claim_id"`
	OldFlavor     guest.Flavor `json:"old_flavor"`
	OldDomainXML  string       `json:"old_domain_xml,omitempty"`
	// NewFlavor is the flavor the resize moves the guest to, so that an
	// audit finishing an interrupted resize knows the flavor its new
	// claim was fitted for.
	NewFlavor *guest.Flavor `json:"new_flavor,omitempty"`
	// Cold: a cold migration (the same flavor), not a resize.
	Cold bool `json:"cold,omitempty"`
}

// Instance is an instance record. Host, Node, Placement and ClaimID are set
// together, only while the named claim is committed on Host.
type Instance struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
	Host string `json:"host,omitempty"`
	// Node lists the host NUMA cells the placement uses.
	Node      []int           `json:"node,omitempty"`
	VMState   guest.VMState   `json:"vm_state"`
	TaskState guest.TaskState `json:"task_state"`
	Request   guest.Flavor    `json:"request"`
	Placement *numa.Placement `json:"placement,omitempty"`
	DomainXML string          `json:"domain_xml,omitempty"`
	ClaimID   string          `json:"claim_id,omitempty"`
	// Group is the server group the instance is a member of, for life;
	// "" for none.
	Group string `json:"group,omitempty"`
	// Resize is set while a resize or cold migration waits for its
	// confirmation or revert (stored as the JSON hash field "resize").
	Resize    *ResizeRecord `json:"resize,omitempty"`
	UpdatedAt time.Time     `json:"updated_at"`
}

// Facts are what the guest's rules (guest.Facts) read of the record.
func (i *Instance) Facts() guest.Facts {
	return guest.Facts{UUID: i.UUID, Host: i.Host, VMState: i.VMState, TaskState: i.TaskState, Flavor: i.Request,
		Placement: i.Placement, ClaimID: i.ClaimID, Resizing: i.Resize != nil}
}

// CreateInstance records a new instance, not on any host, in vmState
// (usually building) with no task. creator names the operation that
// creates it (its workflow's first run id): creating it again for the
// same creator, name and flavor is a retry and changes nothing; for
// another creator it is ErrExists (a second boot of one uuid must not
// spawn a second copy), and with another name or flavor ErrConflict. An
// empty creator skips the creator check.
func (l *Ledger) CreateInstance(ctx context.Context, uuid, name string, flavor guest.Flavor, vmState guest.VMState, creator string) (*Instance, error) {
	return l.CreateMember(ctx, uuid, name, flavor, vmState, creator, "")
}

// CreateMember is CreateInstance of a member of server group ("" for
// none), which must exist (ErrUnknownGroup). The record states the
// group's rule, which every claim of the instance is held to, and the
// instance then joins the group; a retry after a crash in between joins
// it.
func (l *Ledger) CreateMember(ctx context.Context, uuid, name string, flavor guest.Flavor, vmState guest.VMState, creator, group string) (*Instance, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: create instance %s: %w", uuid, err) }
	var rule *GroupRule
	if group != "" {
		var err error
		if rule, err = l.groupRule(ctx, group); err != nil {
			return nil, wrap(err)
		}
	}
	if err := checkInstanceKeyName(uuid); err != nil {
		return nil, wrap(err)
	}
	if err := CheckGuestName(name); err != nil {
		return nil, wrap(err)
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
	policy, limit := "", ""
	if rule != nil {
		policy, limit = string(rule.Policy), rule.limit()
	}
	res, err := l.change(ctx, instCreateScript, []string{l.instKey(uuid)}, uuid, name, req, string(vmState), "", l.timestamp(), creator,
		group, policy, limit).StringSlice()
	if err != nil {
		return nil, wrap(err)
	}
	switch res[0] {
	case "conflict":
		return nil, wrap(fmt.Errorf("%w: instance exists as %q with flavor %s (or in another group)", ErrConflict, res[1], res[2]))
	case "other":
		return nil, wrap(fmt.Errorf("%w: instance %s was created by another operation and is %s", ErrExists, uuid, res[1]))
	}
	if rule != nil {
		if err := l.join(ctx, uuid, rule); err != nil {
			return nil, wrap(err)
		}
	}
	return l.Instance(ctx, uuid)
}

// Instance returns an instance record, or ErrUnknownInstance.
func (l *Ledger) Instance(ctx context.Context, uuid string) (*Instance, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: instance %s: %w", uuid, err) }
	if err := checkInstanceKeyName(uuid); err != nil {
		return nil, wrap(err)
	}
	f, err := l.rdb.HGetAll(ctx, l.instKey(uuid)).Result()
	if err != nil {
		return nil, wrap(err)
	}
	if f["uuid"] == "" {
		return nil, wrap(fmt.Errorf("%w: no record of %q", ErrUnknownInstance, uuid))
	}
	in, err := parseInstance(f)
	if err != nil {
		return nil, wrap(err)
	}
	return in, nil
}

// parseInstance reads an instance record's hash fields.
func parseInstance(f map[string]string) (*Instance, error) {
	in := &Instance{UUID: f["uuid"], Name: f["name"], Host: f["host"], VMState: guest.VMState(f["vm_state"]),
		TaskState: guest.TaskState(f["task_state"]), DomainXML: f["domain_xml"], ClaimID: f["claim_id"], Group: f["group"]}
	var err error
	if in.Node, err = parseNode(f["node"]); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(f["request"]), &in.Request); err != nil {
		return nil, fmt.Errorf("stored request: %w", err)
	}
	if p := f["placement"]; p != "" {
		in.Placement = &numa.Placement{}
		if err := json.Unmarshal([]byte(p), in.Placement); err != nil {
			return nil, fmt.Errorf("stored placement: %w", err)
		}
	}
	if r := f["resize"]; r != "" {
		in.Resize = &ResizeRecord{}
		if err := json.Unmarshal([]byte(r), in.Resize); err != nil {
			return nil, fmt.Errorf("stored resize: %w", err)
		}
	}
	if in.UpdatedAt, err = time.Parse(time.RFC3339Nano, f["updated_at"]); err != nil {
		return nil, fmt.Errorf("stored updated_at %q: %w", f["updated_at"], err)
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
	FromVM   []guest.VMState
	FromTask []guest.TaskState
	// VM is the new vm_state; "" keeps the current one.
	VM guest.VMState
	// Task is the new task_state (TaskNone clears it).
	Task guest.TaskState
}

// SetState applies t: compare-and-set on the instance's states. Being in
// the target states already succeeds without a change (a retry); starting
// from states t does not allow is ErrConflict and changes nothing.
func (l *Ledger) SetState(ctx context.Context, uuid string, t Transition) error {
	wrap := func(err error) error {
		return fmt.Errorf("ledger: set state of instance %s to %q/%q: %w", uuid, t.VM, t.Task, err)
	}
	if err := checkInstanceKeyName(uuid); err != nil {
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
// (the move at the end of a migration). It is MoveInstance with only the
// claim and domain XML.
func (l *Ledger) AttachInstance(ctx context.Context, uuid, host, claimID, domainXML string) error {
	return l.move(ctx, "attach", uuid, Move{Host: host, ClaimID: claimID, DomainXML: domainXML})
}

// Move says where an instance moves to: like AttachInstance (Host, ClaimID must
// name a committed claim of the instance on Host; DomainXML set when not empty),
// and in the same record script: Flavor, when not nil, becomes the record's
// request; Resize, when not nil, is stored; ClearResize removes it.
//
// StagedXML takes the domain XML staged for ClaimID (StageDomainXML)
// instead of DomainXML. A move that finds none staged for its claim, and
// has not attached the record to it already, removes the record's XML:
// that one was made for another placement.
type Move struct {
	Host, ClaimID, DomainXML string
	StagedXML                bool
	Flavor                   *guest.Flavor
	Resize                   *ResizeRecord
	ClearResize              bool
}

// MoveInstance points the instance at m's claim like AttachInstance, and
// changes its request and resize info in the same step, so that a record
// never names a claim sized for another flavor, nor a revert target that
// was dropped. Finding the change made already is a retry's success.
// Resize and ClearResize together are ErrInvalid, as are a flavor or an
// old flavor that make no request.
func (l *Ledger) MoveInstance(ctx context.Context, uuid string, m Move) error {
	return l.move(ctx, "move", uuid, m)
}

func (l *Ledger) move(ctx context.Context, op, uuid string, m Move) error {
	wrap := func(err error) error {
		return fmt.Errorf("ledger: %s instance %s to claim %s on %s: %w", op, uuid, m.ClaimID, m.Host, err)
	}
	if err := checkInstanceKeyName(uuid); err != nil {
		return wrap(err)
	}
	if m.Resize != nil && m.ClearResize {
		return wrap(fmt.Errorf("%w: a move either stores resize info or clears it, not both", ErrInvalid))
	}
	xmlMode := "keep"
	switch {
	case m.StagedXML && m.DomainXML != "":
		return wrap(fmt.Errorf("%w: a move takes either the domain XML given or the one staged, not both", ErrInvalid))
	case m.StagedXML:
		xmlMode = "staged"
	case m.DomainXML != "":
		xmlMode = "set"
	}
	request := ""
	if m.Flavor != nil {
		if _, err := m.Flavor.Request(); err != nil {
			return wrap(fmt.Errorf("%w: flavor: %v", ErrInvalid, err))
		}
		b, err := json.Marshal(m.Flavor)
		if err != nil {
			return wrap(err)
		}
		request = string(b)
	}
	resizeMode, resize := "keep", ""
	switch {
	case m.ClearResize:
		resizeMode = "clear"
	case m.Resize != nil:
		if err := m.Resize.check(); err != nil {
			return wrap(err)
		}
		b, err := json.Marshal(m.Resize)
		if err != nil {
			return wrap(err)
		}
		resizeMode, resize = "set", string(b)
	}
	c, err := l.getClaim(ctx, m.Host, m.ClaimID)
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
		m.Host, formatNode(cells), placement, m.ClaimID, m.DomainXML, xmlMode, l.timestamp(), DomainDigest(m.DomainXML),
		request, resizeMode, resize).StringSlice()
	if err != nil {
		return wrap(err)
	}
	if res[0] == "unknown" {
		return wrap(fmt.Errorf("%w: no record of %q", ErrUnknownInstance, uuid))
	}
	return nil
}

// check refuses resize info a revert could not act on.
func (r *ResizeRecord) check() error {
	if err := checkHostName(r.SourceHost); err != nil {
		return fmt.Errorf("resize source: %w", err)
	}
	if err := checkClaimID(r.SourceClaimID); err != nil {
		return fmt.Errorf("resize source: %w", err)
	}
	if _, err := r.OldFlavor.Request(); err != nil {
		return fmt.Errorf("%w: resize old flavor: %v", ErrInvalid, err)
	}
	if r.NewFlavor != nil {
		if _, err := r.NewFlavor.Request(); err != nil {
			return fmt.Errorf("%w: resize new flavor: %v", ErrInvalid, err)
		}
	}
	return nil
}

// ClearResize removes the record's resize info (nothing to clear: no error).
// A confirmed resize clears it once the source hold is released; a
// revert clears it in its MoveInstance back to the source.
func (l *Ledger) ClearResize(ctx context.Context, uuid string) error {
	wrap := func(err error) error { return fmt.Errorf("ledger: clear resize of instance %s: %w", uuid, err) }
	if err := checkInstanceKeyName(uuid); err != nil {
		return wrap(err)
	}
	res, err := l.change(ctx, instClearResizeScript, []string{l.instKey(uuid)}, l.timestamp()).StringSlice()
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
	if err := checkInstanceKeyName(uuid); err != nil {
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

// StageDomainXML keeps domainXML, the domain XML an operation made for the
// instance's claim claimID, in the instance's record until the move that
// attaches the record to that claim takes it (Move.StagedXML): workflows
// pass the claim id, and the document stays out of their history. An
// instance has one staged document, the last one staged.
func (l *Ledger) StageDomainXML(ctx context.Context, uuid, claimID, domainXML string) error {
	wrap := func(err error) error {
		return fmt.Errorf("ledger: stage domain xml of instance %s for claim %s: %w", uuid, claimID, err)
	}
	if err := checkInstanceKeyName(uuid); err != nil {
		return wrap(err)
	}
	if err := checkClaimID(claimID); err != nil {
		return wrap(err)
	}
	if domainXML == "" {
		return wrap(fmt.Errorf("%w: an empty domain XML", ErrInvalid))
	}
	n, err := l.change(ctx, instStageScript, []string{l.instKey(uuid)}, claimID, domainXML, DomainDigest(domainXML)).Int()
	if err != nil {
		return wrap(err)
	}
	if n == 0 {
		return wrap(fmt.Errorf("%w: no record of %q", ErrUnknownInstance, uuid))
	}
	return nil
}

// StagedDomainXML returns the domain XML staged for the instance's claim
// claimID, or ErrConflict when none is (another claim's, or none).
func (l *Ledger) StagedDomainXML(ctx context.Context, uuid, claimID string) (string, error) {
	wrap := func(err error) error {
		return fmt.Errorf("ledger: staged domain xml of instance %s for claim %s: %w", uuid, claimID, err)
	}
	if err := checkInstanceKeyName(uuid); err != nil {
		return "", wrap(err)
	}
	f, err := l.rdb.HMGet(ctx, l.instKey(uuid), "uuid", "staged_claim_id", "staged_xml").Result()
	if err != nil {
		return "", wrap(err)
	}
	if f[0] == nil {
		return "", wrap(fmt.Errorf("%w: no record of %q", ErrUnknownInstance, uuid))
	}
	if f[1] != claimID || f[2] == nil {
		return "", wrap(fmt.Errorf("%w: no domain XML is staged for the claim", ErrConflict))
	}
	return f[2].(string), nil
}

// DeleteInstance deletes an instance record that is attached to no claim
// (release the claim and detach first, or ErrConflict). Deleting a deleted
// or unknown instance succeeds.
func (l *Ledger) DeleteInstance(ctx context.Context, uuid string) error {
	wrap := func(err error) error { return fmt.Errorf("ledger: delete instance %s: %w", uuid, err) }
	if err := checkInstanceKeyName(uuid); err != nil {
		return wrap(err)
	}
	// A member leaves its group first: a retry after a crash between the
	// two finds the record, and its group, still there. The record names
	// no host and no claim by now (the delete script checks it again),
	// since the instance's operations run one at a time.
	f, err := l.rdb.HMGet(ctx, l.instKey(uuid), "host", "claim_id", "group").Result()
	if err != nil {
		return wrap(err)
	}
	host, _ := f[0].(string)
	claimID, _ := f[1].(string)
	if group, _ := f[2].(string); group != "" && host == "" && claimID == "" {
		if err := l.leave(ctx, uuid, group); err != nil {
			return wrap(err)
		}
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
	// VMState and TaskState are the record's states.
	VMState   guest.VMState
	TaskState guest.TaskState
}

// Names says whether the home is claim c: c is its instance's resident
// claim. A nil home names none.
func (h *Home) Names(c *Claim) bool {
	return h != nil && h.Host == c.Host && h.ClaimID == c.ID
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
	if err := checkInstanceKeyName(uuid); err != nil {
		return Home{}, wrap(err)
	}
	v, err := l.rdb.HMGet(ctx, l.instKey(uuid), "uuid", "host", "claim_id", "domain_digest", "vm_state", "task_state").Result()
	if err != nil {
		return Home{}, wrap(err)
	}
	if v[0] == nil {
		return Home{}, wrap(fmt.Errorf("%w: no record of %q", ErrUnknownInstance, uuid))
	}
	str := func(x any) string { s, _ := x.(string); return s }
	return Home{Host: str(v[1]), ClaimID: str(v[2]), DomainDigest: str(v[3]),
		VMState: guest.VMState(str(v[4])), TaskState: guest.TaskState(str(v[5]))}, nil
}
