package api

import (
	"fmt"
	"strings"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/numa"
)

// DefragInput names the host to defragment and what for.
type DefragInput struct {
	Host string `json:"host"`
	// Flavor is the flavor to make room for; nil frees as many whole cores
	// as re-pins can.
	Flavor *guest.Flavor `json:"flavor,omitempty"`
	// Parallel bounds the migrations running at once; 0 takes
	// DefaultDrainParallel. Re-pins run one after another: each takes
	// milliseconds, and the next may take the pCPUs it frees.
	Parallel int `json:"parallel,omitempty"`
}

// WithDefaults fills in the zero limits.
func (in DefragInput) WithDefaults() DefragInput {
	if in.Parallel == 0 {
		in.Parallel = DefaultDrainParallel
	}
	return in
}

// Check is the rule of a defrag's limits: one line naming a bad value
// and what is allowed. The flavor is the plan's to judge
// (guest.Flavor.Request).
func (in DefragInput) Check() error {
	if in.Parallel < 1 || in.Parallel > MaxDrainParallel {
		return fmt.Errorf("defrag parallel %d: it must be 1 to %d", in.Parallel, MaxDrainParallel)
	}
	return nil
}

// DrainInput is how the defrag's migrations move: live, Parallel at once,
// each with the drain's other limits.
func (in DefragInput) DrainInput() DrainInput {
	return DrainInput{Host: in.Host, Policy: DrainLive, Parallel: in.Parallel}.WithDefaults()
}

// DefragWorkflowID is the one workflow id of a host's defrag: a second
// one while it runs is refused.
func DefragWorkflowID(host string) string { return "defrag-" + host }

// RepinState is where one re-pin of a defrag is.
type RepinState string

// Re-pin states.
const (
	RepinPlanned   RepinState = "planned"
	RepinRunning   RepinState = "repinning"
	RepinDone      RepinState = "repinned"
	RepinFailed    RepinState = "failed"
	RepinNotTried  RepinState = "not-tried" // a step before it failed
	RepinCancelled RepinState = "cancelled"
)

// DefragRepin is one re-pin of a defrag and how it goes.
type DefragRepin struct {
	UUID  string      `json:"uuid"`
	Name  string      `json:"name,omitempty"`
	From  numa.CPUSet `json:"from"`
	To    numa.CPUSet `json:"to"`
	State RepinState  `json:"state"`
	Error string      `json:"error,omitempty"`
}

// DefragStatus is a defrag's progress, as its status query answers: its
// migrations, as a drain's guests, then its re-pins.
type DefragStatus struct {
	Host string `json:"host"`
	// For is the flavor it makes room for, empty for whole cores.
	For        string        `json:"for,omitempty"`
	Paused     bool          `json:"paused"`
	Migrations []DrainGuest  `json:"migrations"`
	Repins     []DefragRepin `json:"repins"`
	Done       bool          `json:"done"`
}

// DefragResult is how a defrag ended, step by step.
type DefragResult struct {
	DefragStatus
	// Failed counts the migrations and re-pins that failed or were not
	// tried.
	Failed int `json:"failed"`
}

// DefragStatusQuery is the query a defrag answers with its DefragStatus.
// It takes the drain's pause and resume Updates.
const DefragStatusQuery = "defrag-status"

// Summary is the defrag's progress in one line.
func (st *DefragStatus) Summary() string {
	moved, repinned, failed := 0, 0, 0
	for _, g := range st.Migrations {
		switch g.State {
		case GuestMoved:
			moved++
		case GuestFailed:
			failed++
		}
	}
	for _, r := range st.Repins {
		switch r.State {
		case RepinDone:
			repinned++
		case RepinFailed, RepinNotTried:
			failed++
		}
	}
	line := fmt.Sprintf("%d of %d migrations, %d of %d re-pins done, %d failed", moved, len(st.Migrations), repinned, len(st.Repins), failed)
	if st.Paused {
		line += "; paused: no new step starts until 'pinflow host defrag resume " + st.Host + "'"
	}
	return line
}

// Table is each step as the markdown table the UI shows.
func (st *DefragStatus) Table() string {
	if len(st.Migrations)+len(st.Repins) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("| guest | name | step | state | note |\n|---|---|---|---|---|\n")
	for _, g := range st.Migrations {
		b.WriteString(fmt.Sprintf("| `%s` | %s | migrate to %s | %s | %s |\n", g.UUID, cell(g.Name), cell(g.Target), g.State, cell(g.Error)))
	}
	for _, r := range st.Repins {
		b.WriteString(fmt.Sprintf("| `%s` | %s | re-pin %s to %s | %s | %s |\n", r.UUID, cell(r.Name), r.From, r.To, r.State, cell(r.Error)))
	}
	return b.String()
}
