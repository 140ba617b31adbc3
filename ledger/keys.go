package ledger

import (
	"fmt"
	"regexp"
)

// DefaultKeyPrefix starts every key the ledger writes unless Options says
// otherwise.
const DefaultKeyPrefix = "pinflow"

// Names are restricted so a host or uuid can never carry its own '{' or '}'
// into a key and move it to another Cluster slot, and so keys stay printable.
var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$`)
	claimRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,199}$`)
	prefixRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$`)
)

const (
	nameRule  = "1-253 characters of letters, digits, '.', '_', ':' and '-', starting with a letter or digit"
	claimRule = "1-200 characters of letters, digits and . _ : / @ + = -, starting with a letter or digit"
)

func checkHostName(h string) error {
	if !nameRE.MatchString(h) {
		return fmt.Errorf("host name %q: %w: host names are %s", h, ErrInvalid, nameRule)
	}
	return nil
}

func checkUUID(u string) error {
	if !nameRE.MatchString(u) {
		return fmt.Errorf("instance uuid %q: %w: uuids are %s", u, ErrInvalid, nameRule)
	}
	return nil
}

func checkClaimID(id string) error {
	if !claimRE.MatchString(id) {
		return fmt.Errorf("claim id %q: %w: claim ids are %s", id, ErrInvalid, claimRule)
	}
	return nil
}

// hostKeys are one host's keys. The {host} hash tag puts all of them in one
// Redis Cluster slot, which is what lets one script change them together.
type hostKeys struct {
	topo, pins, claims, usage string
}

func (l *Ledger) hostKeys(host string) hostKeys {
	base := l.prefix + ":host:{" + host + "}:"
	return hostKeys{topo: base + "topo", pins: base + "pins", claims: base + "claims", usage: base + "usage"}
}

// all lists the keys in the order the host scripts take them.
func (k hostKeys) all() []string { return []string{k.topo, k.pins, k.claims, k.usage} }

func (l *Ledger) instKey(uuid string) string { return l.prefix + ":inst:{" + uuid + "}" }

// hostsKey is the set of registered host names. It lives in its own slot,
// so it is written in its own command, after the host's topology.
func (l *Ledger) hostsKey() string { return l.prefix + ":hosts" }
