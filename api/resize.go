package api

import (
	"time"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/numa"
)

// DefaultConfirmWindow is how long a resize waits in VERIFY_RESIZE for a
// confirm or a revert before it confirms itself: it bounds how long a
// guest holds pCPUs on two hosts. (Nova's resize_confirm_window is off
// by default, so its holds last until someone acts.)
const DefaultConfirmWindow = time.Hour

// ResizeDecisionUpdate is the Update that confirms or reverts a resize in
// VERIFY_RESIZE; its argument is DecisionConfirm or DecisionRevert.
const ResizeDecisionUpdate = "resize-decision"

// A resize's decisions.
const (
	DecisionConfirm = "confirm"
	DecisionRevert  = "revert"
)

// ResizeInput names the guest, its new flavor and, optionally, where.
type ResizeInput struct {
	UUID string `json:"uuid"`
	// Flavor is the new flavor; nil is a cold migration, which keeps the
	// guest's flavor and moves it to another host.
	Flavor *guest.Flavor `json:"flavor,omitempty"`
	// Dest is where to; empty lets pinflow choose (for a resize, the
	// guest's own host too, when it can hold both placements at once).
	Dest string `json:"dest,omitempty"`
	// ConfirmWindow is how long VERIFY_RESIZE waits before confirming by
	// itself: 0 takes DefaultConfirmWindow, a negative one waits for an
	// operator however long it takes.
	ConfirmWindow time.Duration `json:"confirm_window,omitempty"`
	// AutoConfirm confirms as soon as the guest runs on its destination,
	// with no VERIFY_RESIZE wait: a drain's cold migrations.
	AutoConfirm bool `json:"auto_confirm,omitempty"`
	// Reservation is a drain's claim for the guest on its destination,
	// which the operation adopts instead of claiming; Dest is its host.
	Reservation *Reservation `json:"reservation,omitempty"`
}

// ResizeResult says where the guest ended and how the resize ended.
type ResizeResult struct {
	UUID      string          `json:"uuid"`
	Source    string          `json:"source"`
	Dest      string          `json:"dest"`
	Host      string          `json:"host"`
	Placement *numa.Placement `json:"placement"`
	// Outcome is confirmed, auto-confirmed or reverted.
	Outcome string `json:"outcome"`
}
