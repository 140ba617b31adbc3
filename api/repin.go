package api

import "github.com/pinflow/pinflow/numa"

// RepinInput asks to move a running guest's pinned vCPUs to other pCPUs
// of its host, in place.
type RepinInput struct {
	UUID string `json:"uuid"`
	// PCPUs are the pCPUs to pin the guest to: each guest cell takes
	// those of its host cell, its pinned vCPUs in order, then a reserved
	// emulator pCPU. Empty packs the guest onto the lowest pCPUs of its
	// cells that are free or its own.
	PCPUs numa.CPUSet `json:"pcpus,omitzero"`
}

// RepinResult says how the guest was pinned and is now.
type RepinResult struct {
	UUID   string          `json:"uuid"`
	Host   string          `json:"host"`
	Before *numa.Placement `json:"before"`
	After  *numa.Placement `json:"after"`
}
