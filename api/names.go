package api

// The workflow types a caller starts, by name. A worker registers each
// workflow function under its function name, which running histories
// hold as their workflow type: these names and the functions' names
// change together or not at all.
const (
	WorkflowBoot              = "Boot"
	WorkflowLiveMigration     = "LiveMigration"
	WorkflowShelveOffload     = "ShelveOffload"
	WorkflowUnshelve          = "Unshelve"
	WorkflowDelete            = "Delete"
	WorkflowReconcile         = "Reconcile"
	WorkflowSettle            = "Settle"
	WorkflowReplug            = "Replug"
	WorkflowRecover           = "Recover"
	WorkflowReleaseQuarantine = "ReleaseQuarantine"
	WorkflowResize            = "Resize"
	WorkflowEvacuate          = "Evacuate"
	WorkflowHostUp            = "HostUp"
	WorkflowDrain             = "Drain"
	WorkflowHostAdd           = "HostAdd"
	WorkflowHostDisable       = "HostDisable"
	WorkflowHostEnable        = "HostEnable"
	WorkflowHostDown          = "HostDown"
	WorkflowHostAutoEvacuate  = "HostAutoEvacuate"
	WorkflowHostRemove        = "HostRemove"
	WorkflowRepin             = "Repin"
	WorkflowDefrag            = "Defrag"
)
