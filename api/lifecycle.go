package api

import (
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/numa"
)

// BootInput describes a new guest. The caller picks the uuid, so the
// workflow id is known before the guest exists.
type BootInput struct {
	UUID   string       `json:"uuid"`
	Name   string       `json:"name"`
	Flavor guest.Flavor `json:"flavor"`
	// Host is where to boot; empty lets pinflow choose.
	Host string `json:"host,omitempty"`
	// Group is the server group the guest joins for life; "" for none.
	Group string `json:"group,omitempty"`
}

// BootResult says where the guest runs and how it is pinned.
type BootResult struct {
	UUID      string          `json:"uuid"`
	Host      string          `json:"host"`
	Placement *numa.Placement `json:"placement"`
}

// DeleteInput names the guest to delete.
type DeleteInput struct {
	UUID string `json:"uuid"`
}

// DeleteResult says which host, if any, the guest was removed from.
type DeleteResult struct {
	UUID string `json:"uuid"`
	Host string `json:"host,omitempty"`
}
