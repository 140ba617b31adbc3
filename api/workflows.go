package api

import (
	"context"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/temporal"
)

// Typed search attributes that make each run findable in the Web UI and
// through visibility queries. They are for people and dashboards: nothing
// in pinflow decides anything from them (visibility is eventually
// consistent).
var (
	AttrInstance   = temporal.NewSearchAttributeKeyKeyword("PinflowInstance")
	AttrOperation  = temporal.NewSearchAttributeKeyKeyword("PinflowOperation")
	AttrSourceHost = temporal.NewSearchAttributeKeyKeyword("PinflowSourceHost")
	AttrDestHost   = temporal.NewSearchAttributeKeyKeyword("PinflowDestHost")
	AttrPhase      = temporal.NewSearchAttributeKeyKeyword("PinflowPhase")
)

// StartAttributes are the search attributes a run of op carries from its
// start: the operation, the phase started and, when it has one, the
// instance. Starters set them, so a run is findable before its first
// workflow task; the run upserts the same, which covers runs started
// otherwise (a drain's moves, the Web UI).
func StartAttributes(op Operation, uuid string) []temporal.SearchAttributeUpdate {
	attrs := []temporal.SearchAttributeUpdate{AttrOperation.ValueSet(string(op)), AttrPhase.ValueSet(string(PhaseStarted))}
	if uuid != "" {
		attrs = append(attrs, AttrInstance.ValueSet(uuid))
	}
	return attrs
}

// OperatorsView is the visibility query of the operators' runs: every
// operation but the audit's own (the scheduled Reconcile every minute and
// the Settle runs it starts), which would crowd the Web UI's list. Saved
// as a view in the Web UI, it is the list operators start from.
var OperatorsView = fmt.Sprintf("%[1]s != '%[2]s' AND %[1]s != '%[3]s'", AttrOperation.GetName(), OpReconcile, OpSettle)

// SearchAttributes lists pinflow's custom search attributes and their
// types, for registering them with a namespace.
func SearchAttributes() map[string]enumspb.IndexedValueType {
	out := map[string]enumspb.IndexedValueType{}
	for _, k := range []temporal.SearchAttributeKeyKeyword{AttrInstance, AttrOperation, AttrSourceHost, AttrDestHost, AttrPhase} {
		out[k.GetName()] = enumspb.INDEXED_VALUE_TYPE_KEYWORD
	}
	for _, k := range []temporal.SearchAttributeKeyInt64{AttrFreed, AttrDrift} {
		out[k.GetName()] = enumspb.INDEXED_VALUE_TYPE_INT
	}
	return out
}

// Operation names a kind of workflow, as shown in PinflowOperation.
type Operation string

// The operations.
const (
	OpBoot          Operation = "boot"
	OpLiveMigration Operation = "live-migration"
	OpShelveOffload Operation = "shelve-offload"
	OpUnshelve      Operation = "unshelve"
	OpDelete        Operation = "delete"
	OpReconcile     Operation = "reconcile"
	OpSettle        Operation = "settle"
	OpReplug        Operation = "replug"
	OpRecover       Operation = "recover"
	OpUnquarantine  Operation = "quarantine-release"
	OpResize        Operation = "resize"
	OpColdMigration Operation = "cold-migration"
	OpEvacuation    Operation = "evacuation"
	OpHostUp        Operation = "host-up"
	OpDrain         Operation = "drain"
	OpHostAdd       Operation = "host-add"
	OpHostDisable   Operation = "host-disable"
	OpHostEnable    Operation = "host-enable"
	OpHostDown      Operation = "host-down"
	OpHostEvacuate  Operation = "host-auto-evacuate"
	OpHostRemove    Operation = "host-remove"
	OpRepin         Operation = "repin"
	OpDefrag        Operation = "defrag"
)

// Phase is where an operation stands, as shown in PinflowPhase and the
// status query. The migration phases follow Nova's migration states.
type Phase string

// The phases.
const (
	PhaseStarted     Phase = "started"
	PhaseScheduling  Phase = "scheduling"
	PhaseAccepted    Phase = "accepted" // the destination claim is held
	PhasePreparing   Phase = "preparing"
	PhaseRunning     Phase = "running"
	PhaseCommitting  Phase = "committing"
	PhasePoweringOff Phase = "powering-off"
	PhaseReleasing   Phase = "releasing"
	PhaseSpawning    Phase = "spawning"
	PhaseDeleting    Phase = "deleting"
	PhaseAuditing    Phase = "auditing"
	PhaseRecovering  Phase = "recovering"
	PhaseRollingBack Phase = "rolling-back"
	// PhaseUnplugging and PhasePlugging take a live-migrated guest's PCI
	// devices out before its copy and put the destination's in after.
	PhaseUnplugging Phase = "unplugging"
	PhasePlugging   Phase = "plugging"
	// PhaseVerifyResize is Nova's VERIFY_RESIZE: a resized guest runs on
	// its destination while its source hold is kept for a revert.
	PhaseVerifyResize Phase = "verify-resize"
	PhaseConfirming   Phase = "confirming"
	PhaseReverting    Phase = "reverting"
	PhaseRebuilding   Phase = "rebuilding"
	// PhaseRepinning: the guest's vCPU, emulator and I/O thread pins
	// change while it runs.
	PhaseRepinning Phase = "repinning"
	PhaseCompleted Phase = "completed"
	PhaseError     Phase = "error"
)

// StatusQuery is the query type that returns a Status.
const StatusQuery = "status"

// Status is what the status query returns: where an operation stands.
type Status struct {
	Operation Operation `json:"operation"`
	Instance  string    `json:"instance,omitempty"`
	Phase     Phase     `json:"phase"`
	Source    string    `json:"source,omitempty"`
	Dest      string    `json:"dest,omitempty"`
	// Progress is the share of the operation's steps done, 0-100.
	Progress int    `json:"progress"`
	Detail   string `json:"detail,omitempty"`
	Error    string `json:"error,omitempty"`
	// ConfirmBy is when a resize in VERIFY_RESIZE confirms by itself;
	// zero when it waits for an operator however long.
	ConfirmBy time.Time `json:"confirm_by,omitzero"`
}

// RegisterSearchAttributes adds pinflow's search attributes that the
// namespace lacks; those it has are left as they are.
func RegisterSearchAttributes(ctx context.Context, op operatorservice.OperatorServiceClient, namespace string) error {
	existing, err := op.ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("list search attributes of namespace %s: %w", namespace, err)
	}
	missing := map[string]enumspb.IndexedValueType{}
	for name, typ := range SearchAttributes() {
		if _, ok := existing.GetCustomAttributes()[name]; !ok {
			missing[name] = typ
		}
	}
	if len(missing) == 0 {
		return nil
	}
	req := &operatorservice.AddSearchAttributesRequest{Namespace: namespace, SearchAttributes: missing}
	if _, err := op.AddSearchAttributes(ctx, req); err != nil {
		var exists *serviceerror.AlreadyExists
		if !errors.As(err, &exists) {
			return fmt.Errorf("register search attributes in namespace %s: %w", namespace, err)
		}
	}
	return nil
}
