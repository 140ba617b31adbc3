// Package guest holds the vocabulary of a guest that the ledger stores,
// the activities and the audit act on, and the workflows and the CLI
// speak: its flavor, its vm and task states, and the workflow id its
// operations run under. It depends on nothing of pinflow but numa, so
// every package can use it without importing storage or workflow steps.
package guest

import (
	"fmt"
	"maps"
	"slices"
	"strings"

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
	// VMResized is Nova's RESIZED, shown as VERIFY_RESIZE: a resize or
	// cold migration waits for its confirmation or revert.
	VMResized VMState = "resized"
)

var vmStates = []VMState{VMBuilding, VMActive, VMStopped, VMShelvedOffloaded, VMError, VMDeleted, VMResized}

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
	// The steps of a resize or cold migration, with Nova's names.
	TaskResizePrep       TaskState = "resize_prep"
	TaskResizeMigrating  TaskState = "resize_migrating"
	TaskResizeFinish     TaskState = "resize_finish"
	TaskResizeConfirming TaskState = "resize_confirming"
	TaskResizeReverting  TaskState = "resize_reverting"
	// TaskRebuilding is an evacuation: the guest is rebuilt on a new host.
	TaskRebuilding TaskState = "rebuilding"
)

var taskStates = []TaskState{TaskNone, TaskSpawning, TaskMigrating, TaskShelving, TaskUnshelving, TaskDeleting,
	TaskResizePrep, TaskResizeMigrating, TaskResizeFinish, TaskResizeConfirming, TaskResizeReverting, TaskRebuilding}

// VMStates returns every vm state a record may have.
func VMStates() []VMState { return slices.Clone(vmStates) }

// TaskStates returns every task state a record may have, TaskNone first.
func TaskStates() []TaskState { return slices.Clone(taskStates) }

// Flavor is what an instance asks for, as Nova's flavor and image say it,
// with the PCI devices and network ports it asks for beside them.
type Flavor struct {
	VCPUs      int               `json:"vcpus"`
	MemoryMB   int64             `json:"memory_mb"`
	ExtraSpecs map[string]string `json:"extra_specs,omitempty"`
	ImageProps map[string]string `json:"image_props,omitempty"`
	// PCIRequests are the devices the flavor's pci_passthrough:alias asks
	// for, resolved with the aliases configured when the flavor was given
	// (numa.PCIAliases.Requests), so that a later change of the aliases
	// moves no guest's devices.
	PCIRequests []numa.PCIRequest `json:"pci_requests,omitempty"`
	// Ports are the guest's network ports; each SR-IOV one takes a device.
	Ports []numa.Port `json:"ports,omitempty"`
}

// Summary is the flavor in one line, as the boot flags give it.
func (f Flavor) Summary() string {
	parts := []string{fmt.Sprintf("%d vCPUs, %d MiB", f.VCPUs, f.MemoryMB)}
	for _, k := range slices.Sorted(maps.Keys(f.ExtraSpecs)) {
		parts = append(parts, k+"="+f.ExtraSpecs[k])
	}
	for _, k := range slices.Sorted(maps.Keys(f.ImageProps)) {
		parts = append(parts, k+"="+f.ImageProps[k])
	}
	return strings.Join(parts, ", ")
}

// Request builds the NUMA request the flavor and image make, with the
// devices and network affinity of the aliases and ports.
func (f Flavor) Request() (*numa.Request, error) {
	r, err := numa.NewRequest(f.VCPUs, f.MemoryMB, f.ExtraSpecs, f.ImageProps)
	if err != nil || (len(f.PCIRequests) == 0 && len(f.Ports) == 0) {
		return r, err
	}
	ports, network, err := numa.PortRequests(f.Ports)
	if err != nil {
		return nil, err
	}
	if err := r.AddDevices(append(slices.Clone(f.PCIRequests), ports...), network, f.ExtraSpecs, f.ImageProps); err != nil {
		return nil, err
	}
	return r, nil
}

// InstanceWorkflowID is the one workflow id every operation on the guest
// uuid runs under, so Temporal refuses a second one while one is open.
// The workflows start their operations under it and the audit asks
// Temporal about guests under it.
func InstanceWorkflowID(uuid string) string { return "instance-" + uuid }
