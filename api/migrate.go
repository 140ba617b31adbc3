package api

import (
	"time"

	"github.com/pinflow/pinflow/numa"
)

// LiveMigrationInput names the guest to move and, optionally, where.
type LiveMigrationInput struct {
	UUID string `json:"uuid"`
	// Dest is the destination host; empty lets pinflow choose one.
	Dest string `json:"dest,omitempty"`
	// ColdFallback: when the live migration itself fails (the hypervisor
	// refuses to prepare or migrate, and the guest is back on its source),
	// cold-migrate instead, with ConfirmWindow as a Resize's.
	ColdFallback  bool          `json:"cold_fallback,omitempty"`
	ConfirmWindow time.Duration `json:"confirm_window,omitempty"`
	// AutoConfirm confirms the cold migration it falls back to as soon as
	// the guest runs on its destination.
	AutoConfirm bool `json:"auto_confirm,omitempty"`
	// Reservation is a drain's claim for the guest on its destination,
	// which the migration adopts instead of claiming; Dest is its host.
	Reservation *Reservation `json:"reservation,omitempty"`
}

// LiveMigrationResult says where the guest went and how it is pinned there.
type LiveMigrationResult struct {
	UUID      string          `json:"uuid"`
	Source    string          `json:"source"`
	Dest      string          `json:"dest"`
	Placement *numa.Placement `json:"placement"`
	// Cold is the cold migration the live one fell back to, if it did.
	Cold *ResizeResult `json:"cold,omitempty"`
}
