package activities

// InstanceWorkflowID is the one workflow id every operation on the guest
// uuid runs under, so Temporal refuses a second one while one is open. It
// lives here rather than in workflows, which imports this package, because
// the audit asks Temporal about guests under the same ids.
func InstanceWorkflowID(uuid string) string { return "instance-" + uuid }
