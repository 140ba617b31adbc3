package ledger

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

// HostState is what operators said of a host.
type HostState string

// Host states.
const (
	HostUp        HostState = "up"        // the default: takes new claims
	HostDown      HostState = "down"      // fenced by an operator: powered off or cut off, its guests may be evacuated; takes no claims
	HostReturning HostState = "returning" // coming back: its tombstones are being cleared; takes no claims, no evacuation starts from it
	HostDisabled  HostState = "disabled"  // kept from new guests by an operator (maintenance): its guests stay; takes the claims that name it, automatic choice skips it
)

// HostStatus is a host's state with the operator's reason, the fencing token
// recorded when it was marked down, and when it changed.
type HostStatus struct {
	Host   string    `json:"host"`
	State  HostState `json:"state"`
	Reason string    `json:"reason,omitempty"`
	Token  string    `json:"token,omitempty"`
	Since  time.Time `json:"since,omitzero"` // omitzero: omitempty never omits a struct
	// AutoEvacuate: every audit of this down host starts an evacuation of
	// each guest still on it, until the host returns.
	AutoEvacuate bool `json:"auto_evacuate,omitempty"`
}

// statusFields are the host state hash's fields, in the order read.
var statusFields = []string{"state", "reason", "token", "since", "evacuate"}

// parseStatus reads the host state hash's fields, as HMGET returns them
// in statusFields' order; no hash is a host never marked, which is up.
func parseStatus(host string, vals []any) (HostStatus, error) {
	str := func(i int) string {
		if i >= len(vals) {
			return ""
		}
		s, _ := vals[i].(string)
		return s
	}
	st := HostStatus{Host: host, State: HostState(str(0)), Reason: str(1), Token: str(2), AutoEvacuate: str(4) == "on"}
	if st.State == "" {
		st.State = HostUp
	}
	if since := str(3); since != "" {
		t, err := time.Parse(time.RFC3339Nano, since)
		if err != nil {
			return HostStatus{}, fmt.Errorf("stored host state since %q: %w", since, err)
		}
		st.Since = t
	}
	return st, nil
}

// HostStatus returns the host's status; a registered host never marked is up. Unknown host: ErrUnknownHost.
func (l *Ledger) HostStatus(ctx context.Context, host string) (HostStatus, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: status of host %s: %w", host, err) }
	if err := checkHostName(host); err != nil {
		return HostStatus{}, fmt.Errorf("ledger: host status: %w", err)
	}
	k := l.hostKeys(host)
	var gen *redis.BoolCmd
	var vals *redis.SliceCmd
	if _, err := l.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		gen = p.HExists(ctx, k.topo, "gen")
		vals = p.HMGet(ctx, k.state, statusFields...)
		return nil
	}); err != nil {
		return HostStatus{}, wrap(err)
	}
	if !gen.Val() {
		return HostStatus{}, wrap(fmt.Errorf("%w: %q is not registered", ErrUnknownHost, host))
	}
	st, err := parseStatus(host, vals.Val())
	if err != nil {
		return HostStatus{}, wrap(err)
	}
	return st, nil
}

// HostStatuses returns the statuses of many hosts, read in one pipeline
// (choosing a host reads them all). A host that is not registered is left
// out of the map; a malformed name is ErrInvalid and nothing is read.
func (l *Ledger) HostStatuses(ctx context.Context, hosts []string) (map[string]HostStatus, error) {
	for _, h := range hosts {
		if err := checkHostName(h); err != nil {
			return nil, fmt.Errorf("ledger: host statuses: %w", err)
		}
	}
	out := make(map[string]HostStatus, len(hosts))
	if len(hosts) == 0 {
		return out, nil
	}
	gens := make([]*redis.BoolCmd, len(hosts))
	vals := make([]*redis.SliceCmd, len(hosts))
	if _, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, h := range hosts {
			k := l.hostKeys(h)
			gens[i] = p.HExists(ctx, k.topo, "gen")
			vals[i] = p.HMGet(ctx, k.state, statusFields...)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("ledger: host statuses: %w", err)
	}
	for i, h := range hosts {
		if !gens[i].Val() {
			continue
		}
		st, err := parseStatus(h, vals[i].Val())
		if err != nil {
			return nil, fmt.Errorf("ledger: status of host %s: %w", h, err)
		}
		out[h] = st
	}
	return out, nil
}

// MaxReason is the most characters (runes) an operator's reason may have.
const MaxReason = 200

// CheckReason refuses a reason nobody could read in a status line: it
// must be 1 to MaxReason printable characters, not all blank.
func CheckReason(reason string) error {
	ok := utf8.ValidString(reason) && strings.TrimSpace(reason) != "" && utf8.RuneCountInString(reason) <= MaxReason
	for _, r := range reason {
		ok = ok && unicode.IsPrint(r)
	}
	if !ok {
		return fmt.Errorf("reason %q: %w: reasons are 1-%d printable characters, not all blank", reason, ErrInvalid, MaxReason)
	}
	return nil
}

// SetHostDown records that an operator fenced the host (reason 1-200 printable chars,
// else ErrInvalid), with a new random token; a host already down keeps its
// token and reason (a retry). A returning host goes back to down with a new
// token, and so does a disabled one, its reason replaced by the fencing's.
//
// From then on the claim script refuses every new claim on the host
// (ErrHostDown); releases and every other change still work there.
func (l *Ledger) SetHostDown(ctx context.Context, host, reason string) (HostStatus, error) {
	if err := CheckReason(reason); err != nil {
		return HostStatus{}, fmt.Errorf("ledger: set host %s down: %w", host, err)
	}
	var tok [16]byte
	if _, err := crand.Read(tok[:]); err != nil {
		return HostStatus{}, fmt.Errorf("ledger: set host %s down: token: %w", host, err)
	}
	return l.setHostState(ctx, host, string(HostDown), reason, hex.EncodeToString(tok[:]))
}

// SetHostAutoEvacuate turns a down host's automatic evacuation on or off:
// while on, the audit starts an evacuation of each guest still on the
// host. A host that is not down: ErrConflict; leaving down turns it off.
func (l *Ledger) SetHostAutoEvacuate(ctx context.Context, host string, on bool) (HostStatus, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: set automatic evacuation of host %s: %w", host, err) }
	if err := checkHostName(host); err != nil {
		return HostStatus{}, fmt.Errorf("ledger: set automatic evacuation: %w", err)
	}
	arg := "off"
	if on {
		arg = "on"
	}
	k := l.hostKeys(host)
	res, err := l.change(ctx, hostEvacuateScript, []string{k.topo, k.state}, arg).Slice()
	if err != nil {
		return HostStatus{}, wrap(err)
	}
	switch status, _ := res[0].(string); status {
	case "nohost":
		return HostStatus{}, wrap(fmt.Errorf("%w: %q is not registered", ErrUnknownHost, host))
	case "conflict":
		cur, _ := res[1].(string)
		return HostStatus{}, wrap(fmt.Errorf("%w: the host is %s; only a host fenced down is evacuated", ErrConflict, cur))
	case "ok":
		return parseStatus(host, res[1:])
	}
	return HostStatus{}, wrap(fmt.Errorf("host evacuate script replied %v", res))
}

// SetHostReturning moves a down host to returning (returning stays returning);
// an up or disabled host: ErrConflict.
func (l *Ledger) SetHostReturning(ctx context.Context, host string) (HostStatus, error) {
	return l.setHostState(ctx, host, string(HostReturning), "", "")
}

// SetHostUp moves a returning host to up, only while it holds no tombstone (else
// ErrConflict naming how many); up stays up; a down host: ErrConflict (it must
// return first); a disabled one: ErrConflict (SetHostEnabled brings it up).
func (l *Ledger) SetHostUp(ctx context.Context, host string) (HostStatus, error) {
	return l.setHostState(ctx, host, string(HostUp), "", "")
}

// SetHostDisabled records that an operator keeps new guests off an up host
// (reason 1-200 printable chars, else ErrInvalid), with the reason and the
// time. A host disabled already takes the new reason and keeps its time (a
// retry, or a new word on the same maintenance). A down or returning host
// is ErrConflict: it must be up first.
//
// The claim script still takes claims there: only the automatic choice of a
// host skips a host that is not up, so an operation that names the host
// lands on it. SetHostDown fences a disabled host like any other; the host
// that returns from that comes up enabled.
func (l *Ledger) SetHostDisabled(ctx context.Context, host, reason string) (HostStatus, error) {
	if err := CheckReason(reason); err != nil {
		return HostStatus{}, fmt.Errorf("ledger: set host %s disabled: %w", host, err)
	}
	return l.setHostState(ctx, host, string(HostDisabled), reason, "")
}

// SetHostEnabled moves a disabled host back to up, dropping its reason; an up
// host stays up (a retry). A down or returning host is ErrConflict: it comes
// back with SetHostReturning and SetHostUp.
func (l *Ledger) SetHostEnabled(ctx context.Context, host string) (HostStatus, error) {
	return l.setHostState(ctx, host, moveEnabled, "", "")
}

// moveEnabled is the host state script's move from disabled to up; its
// target "up" is the move from returning.
const moveEnabled = "enabled"

// setHostState runs the host state script's move: a target state, or
// moveEnabled.
func (l *Ledger) setHostState(ctx context.Context, host, move, reason, token string) (HostStatus, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: set host %s %s: %w", host, move, err) }
	if err := checkHostName(host); err != nil {
		return HostStatus{}, fmt.Errorf("ledger: set host state: %w", err)
	}
	k := l.hostKeys(host)
	res, err := l.change(ctx, hostStateScript, []string{k.topo, k.state, k.claims}, move, reason, token, l.timestamp()).Slice()
	if err != nil {
		return HostStatus{}, wrap(err)
	}
	status, _ := res[0].(string)
	switch status {
	case "nohost":
		return HostStatus{}, wrap(fmt.Errorf("%w: %q is not registered", ErrUnknownHost, host))
	case "conflict":
		cur, _ := res[1].(string)
		return HostStatus{}, wrap(fmt.Errorf("%w: %s", ErrConflict, refusal(move, HostState(cur))))
	case "tombstones":
		return HostStatus{}, wrap(fmt.Errorf("%w: the host still holds %d tombstone claims; destroy the guests left there and release them first",
			ErrConflict, toInt(res[1])))
	case "ok":
		st, err := parseStatus(host, res[1:])
		if err != nil {
			return HostStatus{}, wrap(err)
		}
		return st, nil
	}
	return HostStatus{}, wrap(fmt.Errorf("host state script replied %v", res))
}

// refusal says why the host state script refused move from state cur.
func refusal(move string, cur HostState) string {
	switch {
	case move == string(HostReturning):
		return fmt.Sprintf("the host is %s; only a host that is down can be returning", cur)
	case move == string(HostUp) && cur == HostDown:
		return "the host is down; it must be returning before it is up"
	case move == string(HostUp) && cur == HostDisabled:
		return "the host is disabled, not returning; enabling it brings it up"
	case move == string(HostDisabled) || move == moveEnabled:
		return fmt.Sprintf("the host is %s; only an up or disabled host is disabled or enabled: it must be brought up first", cur)
	}
	return fmt.Sprintf("the host is %q", cur)
}
