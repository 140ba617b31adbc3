package api

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pinflow/pinflow/ledger"
)

// Reservation is capacity a drain holds for one guest on its target: the
// guest's move adopts it (AdoptClaim) instead of claiming anew.
type Reservation struct {
	Host    string `json:"host"`
	ClaimID string `json:"claim_id"`
	// Owner is the drain's workflow id, the owner the claim must have.
	Owner string `json:"owner"`
	// Token is the drain's token: its conditional release frees the claim
	// only while no move has adopted it.
	Token string `json:"token"`
}

// DrainPolicy is how a drain moves each guest.
type DrainPolicy string

// Drain policies.
const (
	DrainLive DrainPolicy = "live" // live migration; the default
	DrainCold DrainPolicy = "cold" // cold migration, confirmed at once
	// DrainLiveThenCold live-migrates, and cold-migrates a guest whose
	// live migration fails.
	DrainLiveThenCold DrainPolicy = "live-then-cold"
)

// DrainPolicies are the policies a drain takes.
var DrainPolicies = []DrainPolicy{DrainLive, DrainCold, DrainLiveThenCold}

// Drain limits, KubeVirt's defaults: two outbound migrations per source
// host (the drain's parallelism) and two inbound per target; each guest
// is tried on up to three targets.
const (
	DefaultDrainParallel  = 2
	DefaultDrainPerTarget = 2
	DefaultDrainAttempts  = 3
)

// DefaultDrainSettle is how long a drain waits, by default, for the
// operations in flight on its host to end before it gives up.
const DefaultDrainSettle = 2 * time.Minute

// DrainInput names the host to empty and how.
type DrainInput struct {
	Host   string      `json:"host"`
	Reason string      `json:"reason,omitempty"`
	Policy DrainPolicy `json:"policy,omitempty"`
	// Parallel bounds the moves running at once (outbound from the host);
	// 0 takes DefaultDrainParallel.
	Parallel int `json:"parallel,omitempty"`
	// PerTarget bounds the moves running at once onto one target; 0 takes
	// DefaultDrainPerTarget.
	PerTarget int `json:"per_target,omitempty"`
	// Attempts bounds the targets tried for one guest; 0 takes
	// DefaultDrainAttempts.
	Attempts int `json:"attempts,omitempty"`
	// Settle bounds the wait for operations in flight on the host (a
	// migration onto it, a resize awaiting its confirmation) to end
	// before the plan is made; 0 takes DefaultDrainSettle.
	Settle time.Duration `json:"settle,omitempty"`
}

// Upper bounds of a drain's limits: past them a value is a slip of the
// keyboard, not a plan (no host streams 64 migrations at once, and a
// guest that failed on ten targets will not fit on an eleventh).
const (
	MaxDrainParallel = 64
	MaxDrainAttempts = 10
	MaxDrainSettle   = 24 * time.Hour
)

// WithDefaults fills in the zero policy and limits.
func (in DrainInput) WithDefaults() DrainInput {
	if in.Policy == "" {
		in.Policy = DrainLive
	}
	for _, l := range []struct {
		v   *int
		def int
	}{
		{&in.Parallel, DefaultDrainParallel}, {&in.PerTarget, DefaultDrainPerTarget}, {&in.Attempts, DefaultDrainAttempts},
	} {
		if *l.v == 0 {
			*l.v = l.def
		}
	}
	if in.Settle == 0 {
		in.Settle = DefaultDrainSettle
	}
	return in
}

// Check is the one rule of a drain's input, for the CLI and the
// workflow alike (the workflow fills in the defaults first): one line
// naming a bad value and what is allowed.
func (in DrainInput) Check() error {
	if !slices.Contains(DrainPolicies, in.Policy) {
		return fmt.Errorf("drain policy %q: policies are live, cold and live-then-cold", in.Policy)
	}
	for _, l := range []struct {
		name   string
		v, max int
	}{{"parallel", in.Parallel, MaxDrainParallel}, {"per-target", in.PerTarget, MaxDrainParallel}, {"attempts", in.Attempts, MaxDrainAttempts}} {
		if l.v < 1 || l.v > l.max {
			return fmt.Errorf("drain %s %d: it must be 1 to %d", l.name, l.v, l.max)
		}
	}
	if in.Settle <= 0 || in.Settle > MaxDrainSettle {
		return fmt.Errorf("drain settle %v: it must be more than 0s and at most %v", in.Settle, MaxDrainSettle)
	}
	// The host is disabled with the reason behind a prefix, under the
	// ledger's rule for reasons.
	if in.Reason != "" {
		if err := ledger.CheckReason(in.DisableReason()); err != nil || strings.TrimSpace(in.Reason) == "" {
			return fmt.Errorf("drain reason %q: it must be 1-%d printable characters on one line", in.Reason, ledger.MaxReason-len(drainReasonPrefix))
		}
	}
	return nil
}

// Limits says how the drain moves its guests, for people: its input
// holds the settle in nanoseconds.
func (in DrainInput) Limits() string {
	return fmt.Sprintf("%s moves, at most %d at once and %d onto one target, up to %d targets a guest; operations in flight may hold the plan up for %s",
		in.Policy, in.Parallel, in.PerTarget, in.Attempts, readable(in.Settle))
}

// SettleText is the drain's Settle for people, as Limits says it.
func (in DrainInput) SettleText() string { return readable(in.Settle) }

// readable is a duration without the zero minutes and seconds
// time.Duration.String ends in: 2m, 1h, 1h30m, 1m30s.
func readable(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// DrainGuestState is where one guest of a drain is.
type DrainGuestState string

// Drain guest states.
const (
	GuestReserved DrainGuestState = "reserved" // its target's capacity is held
	GuestMoving   DrainGuestState = "moving"
	GuestMoved    DrainGuestState = "moved"
	GuestFailed   DrainGuestState = "failed" // left on the host, with Error
)

// DrainGuest is one guest of a drain and how its move goes.
type DrainGuest struct {
	UUID     string          `json:"uuid"`
	Name     string          `json:"name,omitempty"`
	Target   string          `json:"target,omitempty"`
	State    DrainGuestState `json:"state"`
	Attempts int             `json:"attempts"`
	// Tried are the targets its moves failed on.
	Tried []string `json:"tried,omitempty"`
	Error string   `json:"error,omitempty"`
	// Reservation is what the drain holds for it on Target, until its move
	// adopts it.
	Reservation *Reservation `json:"reservation,omitempty"`
	// Waiting says what holds its move back: its server group's
	// disruption budget, spent by the members named.
	Waiting string `json:"waiting,omitempty"`
}

// DrainStatus is a drain's progress, as its status query answers.
type DrainStatus struct {
	Host   string       `json:"host"`
	Paused bool         `json:"paused"`
	Moving int          `json:"moving"`
	Guests []DrainGuest `json:"guests"`
	// MaxMoving and MaxPerTarget are the most moves seen running at once,
	// in all and onto one target: the limits held.
	MaxMoving    int `json:"max_moving"`
	MaxPerTarget int `json:"max_per_target"`
	// Waiting says which cloud-wide limit holds the next move back.
	Waiting string `json:"waiting,omitempty"`
	Done    bool   `json:"done"`
}

// DrainResult is how a drain ended, guest by guest.
type DrainResult struct {
	Host   string       `json:"host"`
	Guests []DrainGuest `json:"guests"`
	Moved  int          `json:"moved"`
	Failed int          `json:"failed"`
}

// DrainStatusQuery is the query a drain answers with its DrainStatus.
const DrainStatusQuery = "drain-status"

// DrainPauseUpdate stops a drain's new moves (the running ones finish)
// and DrainResumeUpdate starts them again; neither takes an argument. A
// pause of a paused drain, a resume of one not paused, and either once
// the drain has no move left to start are refused.
const (
	DrainPauseUpdate  = "drain-pause"
	DrainResumeUpdate = "drain-resume"
)

// DrainWorkflowID is the one workflow id of a host's drain: a second
// drain of the host while one runs is refused.
func DrainWorkflowID(host string) string { return "drain-" + host }

// drainReasonPrefix starts the reason a drain disables its host with.
const drainReasonPrefix = "drain: "

// DisableReason is the reason the drain disables its host with.
func (in DrainInput) DisableReason() string {
	if in.Reason == "" {
		return "drain"
	}
	return drainReasonPrefix + in.Reason
}

// Summary is the drain's progress in one line, as --wait prints it.
func (st *DrainStatus) Summary() string {
	n := map[DrainGuestState]int{}
	for _, g := range st.Guests {
		n[g.State]++
	}
	line := fmt.Sprintf("%d of %d guests moved, %d moving, %d failed", n[GuestMoved], len(st.Guests), st.Moving, n[GuestFailed])
	if st.Paused {
		line += "; paused: no new move starts until 'pinflow host drain resume " + st.Host + "'"
	}
	if st.Waiting != "" {
		line += "; waiting: " + st.Waiting
	}
	return line
}

// Table is each guest's progress as the markdown table the UI shows.
func (st *DrainStatus) Table() string {
	if len(st.Guests) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("| guest | name | state | target | attempts | note |\n|---|---|---|---|---|---|\n")
	for _, g := range st.Guests {
		note := g.Error
		if g.Waiting != "" {
			note = "waiting for " + g.Waiting
		}
		b.WriteString(fmt.Sprintf("| `%s` | %s | %s | %s | %d | %s |\n", g.UUID, cell(g.Name), g.State, cell(g.Target), g.Attempts, cell(note)))
	}
	return b.String()
}

// cell keeps a value from breaking its markdown table row.
func cell(v string) string {
	return strings.NewReplacer("|", "\\|", "\r", " ", "\n", " ").Replace(v)
}
