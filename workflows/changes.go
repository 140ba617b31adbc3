package workflows

// The changes to workflows' commands since the last release, each a
// workflow.GetVersion change id (docs/versioning.md). Each names the
// release that adds it; its old branch goes when no worker of an older
// release runs and no run that started before that release is open, and
// the histories of the releases that needed it go with it.
const (
	// changeDeliveredTries (the release after v0.1.0): a step of
	// driverAttempts tries counts only the attempts that reached a
	// worker, each its own activity; before, Temporal retried the step.
	// Any operation runs it; guest operations are short, a resize waits
	// up to its confirm window.
	changeDeliveredTries = "delivered-tries"
	// changeAuditBatches (the release after v0.1.0): Reconcile audits
	// hosts in batches, one activity per batch, instead of one activity
	// per host. A Reconcile run lasts one audit interval.
	changeAuditBatches = "audit-batches"
	// changeDisruptionBudget (the release after v0.1.0): the operations
	// that migrate a guest (LiveMigration, Resize, Evacuate) hold a slot
	// of its server group's disruption budget.
	changeDisruptionBudget = "disruption-budget"
	// changeDrainBudget (the release after v0.1.0): a drain takes the slot
	// of a guest's group's disruption budget before the guest's move, and
	// shows the moves the budget holds back in its status. Drains run for
	// hours.
	changeDrainBudget = "drain-disruption-budget"
	// changeDrainLiveDevices (the release after v0.1.0): a live-then-cold
	// drain live-migrates a guest with devices too, unplugging its SR-IOV
	// ports, and the migration falls back to a cold one for devices that
	// cannot be unplugged.
	changeDrainLiveDevices = "drain-live-devices"
	// changeRevertKeepsResize (the release after v0.1.0): a resize's
	// revert, and the undo of its move, keep the record's resize info
	// until the guest's copy on the destination is gone, then forget it,
	// so that the audit settles a revert stopped before that forwards,
	// with the new flavor. Resizes wait up to their confirm window.
	changeRevertKeepsResize = "revert-keeps-resize"
)
