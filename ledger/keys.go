package ledger

import (
	"fmt"
	"strings"
)

// DefaultKeyPrefix starts every key the ledger writes unless Options says
// otherwise.
const DefaultKeyPrefix = "pinflow"

// Names are restricted so a host or uuid can never carry its own '{' or '}'
// into a key and move it to another Cluster slot, and so keys stay printable.
// Each starts with a letter or digit; then come up to max-1 more of those
// or of the punctuation allowed.
func validName(s string, max int, punct string) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			continue
		}
		if i == 0 || strings.IndexByte(punct, c) < 0 {
			return false
		}
	}
	return true
}

// validKeyName is the rule for instance uuids; host names follow it
// without ':', the separator of the keys they are part of.
func validKeyName(s string) bool  { return validName(s, 253, "._:-") }
func validHostName(s string) bool { return validName(s, 253, "._-") }
func validClaimID(s string) bool  { return validName(s, 200, "._:/@+=-") }
func validPrefix(s string) bool   { return validName(s, 64, "._:-") }

const (
	hostNameRule = "1-253 characters of letters, digits, '.', '_' and '-', starting with a letter or digit"
	nameRule     = "1-253 characters of letters, digits, '.', '_', ':' and '-', starting with a letter or digit"
	claimRule    = "1-200 characters of letters, digits and . _ : / @ + = -, starting with a letter or digit"
)

// CheckHostName refuses a host name that cannot be part of the ledger's
// keys, with an error wrapping ErrInvalid that names it and the rule.
// Every command and activity that takes a host name checks it here.
func CheckHostName(h string) error {
	if !validHostName(h) {
		return fmt.Errorf("host name %s: %w: host names are %s", quoteName(h), ErrInvalid, hostNameRule)
	}
	return nil
}

// checkHostName is CheckHostName for the ledger's own methods.
func checkHostName(h string) error { return CheckHostName(h) }

// checkInstanceKeyName checks an instance uuid against the key name rule
// only: the ledger keys instances by whatever id it is given, and leaves the
// UUID syntax to the drivers (hypervisor.ParseUUID).
func checkInstanceKeyName(u string) error {
	if !validKeyName(u) {
		return fmt.Errorf("instance uuid %s: %w: uuids are %s", quoteName(u), ErrInvalid, nameRule)
	}
	return nil
}

func checkClaimID(id string) error {
	if !validClaimID(id) {
		return fmt.Errorf("claim id %q: %w: claim ids are %s", id, ErrInvalid, claimRule)
	}
	return nil
}

// hostKeys are one host's keys. The {host} hash tag puts all of them in one
// Redis Cluster slot, which is what lets one script change them together.
type hostKeys struct {
	topo, pins, claims, usage, undo, lease string
	// state is what operators said of the host (HostStatus).
	state string
	// groups counts the members of server groups with claims on the host.
	groups string
	// host is the host's name, for the change hints (see hinter).
	host string
}

func (l *Ledger) hostKeys(host string) *hostKeys {
	// Made once per host: every claim and release needs them.
	if k, ok := l.keys.Load(host); ok {
		return k.(*hostKeys)
	}
	base := l.prefix + ":host:{" + host + "}:"
	k := &hostKeys{topo: base + "topo", pins: base + "pins", claims: base + "claims", usage: base + "usage", undo: base + "undo",
		lease: base + "lease", state: base + "state", groups: base + "groups", host: host}
	l.keys.Store(host, k)
	return k
}

// all lists the keys in the order the host scripts take them.
func (k hostKeys) all() []string {
	return []string{k.topo, k.pins, k.claims, k.usage, k.undo, k.lease, k.state, k.groups}
}

func (l *Ledger) instKey(uuid string) string { return l.prefix + ":inst:{" + uuid + "}" }

// groupKey is a server group's record and membersKey its members, in the
// group's own slot.
func (l *Ledger) groupKey(name string) string   { return l.prefix + ":group:{" + name + "}" }
func (l *Ledger) membersKey(name string) string { return l.prefix + ":group:{" + name + "}:members" }

// groupsKey is the set of server group names, in its own slot.
func (l *Ledger) groupsKey() string { return l.prefix + ":groups" }

// hostsKey is the set of registered host names. It lives in its own slot,
// so it is written in its own command, after the host's topology.
func (l *Ledger) hostsKey() string { return l.prefix + ":hosts" }

// movesKey holds the slots of the moves running at once (TakeMoveSlot).
func (l *Ledger) movesKey() string { return l.prefix + ":moves" }

// changedKey is the sorted set of hosts whose usage or topology changed
// lately (see ChangedSince), in its own slot like hostsKey.
func (l *Ledger) changedKey() string { return l.prefix + ":placement:changed" }

// deploymentKey names the Temporal deployment the ledger serves (Bind),
// read and written alone, in its own slot.
func (l *Ledger) deploymentKey() string { return l.prefix + ":deployment" }
