// Package workflows holds pinflow's durable operations on a guest (boot,
// live migration, shelve-offload, unshelve, delete) and the periodic ledger
// audit, as Temporal workflows over the activities package.
//
// Their inputs, results, names, ids, queries and updates are in package
// api, which callers use without linking this package.
//
// Every operation on one guest runs under the same workflow id,
// guest.InstanceWorkflowID(uuid), started with conflict policy FAIL:
// the Temporal server refuses a second operation while one is open, so two
// operations on one guest can never interleave. Each step that changes the
// world registers its compensation before it runs; a failure or a
// cancellation before the commit point runs the compensations in reverse
// order, in a disconnected context so that cancellation compensates too. A
// compensation that fails stops the unwinding: what it did not undo may
// still need the resources the earlier steps hold (a guest that was not
// rolled back still runs on its destination claim), so they are kept and
// reported. A compensation releases only a pending claim.
//
// # Interruptions
//
// Hypervisor steps that have a compensation heartbeat and are waited
// for: a cancel reaches the step through its context, and the workflow
// compensates only once the step has ended. The commit point is the
// hypervisor's success (the guest runs on the destination, the new guest
// started, the old one is off its host); a success is authoritative even
// when a cancel arrived meanwhile, and everything after it runs in a
// disconnected context, retried until done. A migration's rollback looks
// first where the guest runs, and finishes a migration that completed
// forwards instead of undoing it.
//
// Steps that act on a claim's pCPUs fence on it (see package activities):
// an attempt that outlived its workflow, which termination and timeouts
// allow, cannot start a guest or switch a migration over onto pCPUs the
// audit freed. A terminated workflow runs no compensation at all; the
// audit frees what it left pending, keeps what its guest uses, and starts
// Settle to finish forwards a move whose guest already runs on its new
// claim.
//
// # Replay
//
// A worker must pick up any run a worker of the same release left open,
// at any workflow task: the golden histories of every workflow, recorded
// on a real server and cut short before each of their workflow tasks,
// replay in the tests against the current code.
//
// # Reconciliation
//
// Reconcile, run by the Temporal Schedule ReconcileScheduleID and by
// `pinflow reconcile`, audits each host's claims from the ledger, never
// from a list of workflows (visibility is eventually consistent; Nova bug
// 1845146 was an audit trusting a stale list). It asks DescribeWorkflow,
// which is strongly consistent, about each claim's owner, keeps every
// claim whose owner runs with the claim's first run id, and frees with
// compare-and-delete only pending claims of closed, replaced or forgotten
// owners and committed claims no instance names while no workflow of the
// instance is open. Any error or doubt keeps the claim.
//
// Drift between the ledger and the hypervisors (a domain pinned to another
// claim's pCPUs, a running domain without a claim, a committed claim
// without a domain, pins outside the domain's claim, a guest whose cpuset
// reaches another guest's pinned pCPUs) is reported, never
// repaired automatically. Each case has more than one cause and the
// repairs disagree: re-pinning or destroying a guest, claiming for it, or
// freeing a claim a guest may come back to. The wrong guess destroys a
// guest or hands one pCPU to two guests, and a step in progress explains
// much drift for a moment (the report marks drift whose instance has an
// open workflow). The claims that can go unambiguously, those no workflow
// will ever finish, are the orphans and leaks the audit frees.
package workflows

// All returns the workflow functions a worker runs, for registering
// them: the worker and the replay tests register the same list.
func All() []any {
	return []any{Boot, LiveMigration, ShelveOffload, Unshelve, Delete, Reconcile, Settle, Replug, Recover, ReleaseQuarantine,
		Resize, Evacuate, HostUp, Drain, HostAdd, HostDisable, HostEnable, HostDown, HostAutoEvacuate, HostRemove, Repin,
		Defrag}
}
