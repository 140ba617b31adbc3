package api

import (
	"github.com/pinflow/pinflow/numa"
)

// ShelveOffloadInput names the guest to shelve and offload.
type ShelveOffloadInput struct {
	UUID string `json:"uuid"`
}

// ShelveOffloadResult says which host the guest left.
type ShelveOffloadResult struct {
	UUID string `json:"uuid"`
	Host string `json:"host"`
}

// UnshelveInput names the shelved guest and, optionally, its host.
type UnshelveInput struct {
	UUID string `json:"uuid"`
	Host string `json:"host,omitempty"`
}

// UnshelveResult says where the guest now runs and how it is pinned.
type UnshelveResult struct {
	UUID      string          `json:"uuid"`
	Host      string          `json:"host"`
	Placement *numa.Placement `json:"placement"`
}
