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
)

// HostStatus is a host's state with the operator's reason, the fencing token
// recorded when it was marked down, and when it changed.
type HostStatus struct {
	Host   string    `json:"host"`
	State  HostState `json:"state"`
	Reason string    `json:"reason,omitempty"`
	Token  string    `json:"token,omitempty"`
	Since  time.Time `json:"since,omitzero"` // omitzero: omitempty never omits a struct
}

// statusFields are the host state hash's fields, in the order read.
var statusFields = []string{"state", "reason", "token", "since"}

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
	st := HostStatus{Host: host, State: HostState(str(0)), Reason: str(1), Token: str(2)}
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

// checkReason refuses a reason nobody could read in a status line.
func checkReason(reason string) error {
	ok := utf8.ValidString(reason) && strings.TrimSpace(reason) != "" && utf8.RuneCountInString(reason) <= 200
	for _, r := range reason {
		ok = ok && unicode.IsPrint(r)
	}
	if !ok {
		return fmt.Errorf("reason %q: %w: reasons are 1-200 printable characters, not all blank", reason, ErrInvalid)
	}
	return nil
}

// SetHostDown records that an operator fenced the host (reason 1-200 printable chars,
// else ErrInvalid), with a new random token; a host already down keeps its
// token and reason (a retry). A returning host goes back to down with a new token.
//
// From then on the apply script refuses every new claim on the host
// (ErrHostDown); releases and every other change still work there.
func (l *Ledger) SetHostDown(ctx context.Context, host, reason string) (HostStatus, error) {
	if err := checkReason(reason); err != nil {
		return HostStatus{}, fmt.Errorf("ledger: set host %s down: %w", host, err)
	}
	var tok [16]byte
	if _, err := crand.Read(tok[:]); err != nil {
		return HostStatus{}, fmt.Errorf("ledger: set host %s down: token: %w", host, err)
	}
	return l.setHostState(ctx, host, HostDown, reason, hex.EncodeToString(tok[:]))
}

// SetHostReturning moves a down host to returning (returning stays returning); an up host: ErrConflict.
func (l *Ledger) SetHostReturning(ctx context.Context, host string) (HostStatus, error) {
	return l.setHostState(ctx, host, HostReturning, "", "")
}

// SetHostUp moves a returning host to up, only while it holds no tombstone (else
// ErrConflict naming how many); up stays up; a down host: ErrConflict (it must return first).
func (l *Ledger) SetHostUp(ctx context.Context, host string) (HostStatus, error) {
	return l.setHostState(ctx, host, HostUp, "", "")
}

func (l *Ledger) setHostState(ctx context.Context, host string, to HostState, reason, token string) (HostStatus, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: set host %s %s: %w", host, to, err) }
	if err := checkHostName(host); err != nil {
		return HostStatus{}, fmt.Errorf("ledger: set host state: %w", err)
	}
	k := l.hostKeys(host)
	res, err := l.change(ctx, hostStateScript, []string{k.topo, k.state, k.claims}, string(to), reason, token, l.timestamp()).Slice()
	if err != nil {
		return HostStatus{}, wrap(err)
	}
	status, _ := res[0].(string)
	switch status {
	case "nohost":
		return HostStatus{}, wrap(fmt.Errorf("%w: %q is not registered", ErrUnknownHost, host))
	case "conflict":
		cur, _ := res[1].(string)
		switch HostState(cur) {
		case HostUp:
			return HostStatus{}, wrap(fmt.Errorf("%w: the host is up; only a host that is down can be returning", ErrConflict))
		case HostDown:
			return HostStatus{}, wrap(fmt.Errorf("%w: the host is down; it must be returning before it is up", ErrConflict))
		}
		return HostStatus{}, wrap(fmt.Errorf("%w: the host is %q", ErrConflict, cur))
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
