package api

// Error types the workers mark their failures with (the type of a
// Temporal application error), so that a caller tells them apart by
// name. Most are final: retrying cannot fix them.
const (
	ErrTypeNoFit           = "NoFit"
	ErrTypeInvalidRequest  = "InvalidRequest"
	ErrTypeUnknownInstance = "UnknownInstance"
	ErrTypeUnknownHost     = "UnknownHost"
	ErrTypeBadState        = "BadState"
	ErrTypeRejected        = "Rejected"
	ErrTypeHostDown        = "HostDown"
	// ErrTypeConflict: a drain's reservation or its adoption found the
	// pCPUs or the claim taken or changed; the drain plans the guest again.
	ErrTypeConflict = "Conflict"
	// ErrTypeMigrationTimeout: a timeout of the migration policy aborted
	// the live migration, and the guest runs on its source.
	ErrTypeMigrationTimeout = "MigrationTimeout"
	// ErrTypePostCopyFailed: the migration failed past its switch to
	// post-copy; it can only be resumed, never rolled back.
	ErrTypePostCopyFailed = "PostCopyFailed"
	// ErrTypeGroupRule: a claim, or a host choice, would break the hard
	// rule of the guest's server group.
	ErrTypeGroupRule = "GroupRule"
	// ErrTypeFenced: a step its fence refused, the claim it acts for
	// gone. Retrying cannot bring the claim back.
	ErrTypeFenced = "Fenced"
	// ErrTypeWorkerStopping: the worker stopped while its attempt of a
	// step went on at the hypervisor; the next attempt follows it. A
	// hand-over, not a failure: the step's tries do not count it.
	ErrTypeWorkerStopping = "WorkerStopping"
)
