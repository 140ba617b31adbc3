package api

import (
	"github.com/pinflow/pinflow/numa"
)

// Leftover is a tombstone on a returning host: the guest it names was
// evacuated and may still be defined there.
type Leftover struct {
	Host    string `json:"host"`
	UUID    string `json:"uuid"`
	ClaimID string `json:"claim_id"`
	// Token is the tombstone's token as the host's return found it: the
	// clearing takes the tombstone from it.
	Token string `json:"token,omitempty"`
}

// EvacuateInput names the guest of a fenced host and, optionally, where
// to rebuild it.
type EvacuateInput struct {
	UUID string `json:"uuid"`
	Dest string `json:"dest,omitempty"`
}

// EvacuateResult says where the guest was rebuilt.
type EvacuateResult struct {
	UUID      string          `json:"uuid"`
	Source    string          `json:"source"`
	Host      string          `json:"host"`
	Placement *numa.Placement `json:"placement"`
}

// HostUpInput names a fenced host that is back.
type HostUpInput struct {
	Host string `json:"host"`
}

// HostUpResult lists the leftovers destroyed.
type HostUpResult struct {
	Host      string     `json:"host"`
	Leftovers []Leftover `json:"leftovers,omitempty"`
}
