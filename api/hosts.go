package api

import (
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/numa"
)

// HostWorkflowID is the workflow id of every change to a whole host: its
// registration, its state as operators set it, its return (HostUp) and
// its removal. Started with conflict policy FAIL, it keeps two changes of
// one host from interleaving.
func HostWorkflowID(host string) string { return "host-" + host }

// HostAddInput is a host to register: its topology, or how libvirt
// reaches it (libvirt then reports the topology) and its limits.
type HostAddInput struct {
	Host     string              `json:"host"`
	Topology *numa.Host          `json:"topology,omitempty"`
	Libvirt  *libvirthost.Config `json:"libvirt,omitempty"`
	// Limits are a libvirt host's; a topology carries its own.
	Limits *numa.Limits `json:"limits,omitempty"`
}

// HostAddResult is a registration: the topology registered and the
// host's generation, which grows each time its topology changes.
type HostAddResult struct {
	Host       string     `json:"host"`
	Generation int64      `json:"generation"`
	Topology   *numa.Host `json:"topology"`
}

// HostStateInput is a change of a host's state; the reason is the
// operator's, for the record.
type HostStateInput struct {
	Host   string `json:"host"`
	Reason string `json:"reason,omitempty"`
	// AutoEvacuate, for HostDown, has every audit of the host evacuate
	// its guests until it returns (HostAutoEvacuate).
	AutoEvacuate bool `json:"auto_evacuate,omitempty"`
}

// HostAutoEvacuateInput turns a down host's automatic evacuation on or
// off.
type HostAutoEvacuateInput struct {
	Host string `json:"host"`
	On   bool   `json:"on"`
}

// HostRemoveInput names a host to remove.
type HostRemoveInput struct {
	Host string `json:"host"`
}

// HostRemoveResult says what went with a removed host.
type HostRemoveResult struct {
	Host string `json:"host"`
	// Tombstones is how many tombstones of guests evacuated from the
	// host went with it.
	Tombstones int `json:"tombstones"`
	// Kept says why the simulator keeps the host's machine, when it does:
	// it still holds domains, as a dead machine would.
	Kept string `json:"kept,omitempty"`
}
