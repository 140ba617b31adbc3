package ledger

import (
	"fmt"
	"strconv"
	"strings"
)

// undoEntry is what a claim took, kept beside its record so that
// release.lua frees it without decoding the record's JSON:
//
//	token|pins|field,n,field,n|group|uuid
//
// The pins are the claim's pCPUs and then its PCI device addresses, the
// counters what it added to each usage field, in the order it added them.
// The member part, "|group|uuid", is there for a claim of a server
// group's member only; every reader (release.lua's parse, parseUndo)
// takes an entry without it as a claim outside any group, which is what
// an entry written before groups existed is, so the format has one
// version and carries no number.
type undoEntry struct {
	token    string
	pins     pinSet
	counters []counter
	// group and uuid name the member a claim of a group's member counts.
	group, uuid string
}

// String is the entry as the ledger stores it.
func (u undoEntry) String() string {
	e := append([]byte(nil), u.token...)
	e = append(e, '|')
	e = u.pins.append(e)
	e = append(e, '|')
	for i, c := range u.counters {
		if i > 0 {
			e = append(e, ',')
		}
		e = append(e, c.field...)
		e = append(e, ',')
		e = strconv.AppendInt(e, c.val, 10)
	}
	if u.group != "" {
		e = append(e, '|')
		e = append(e, u.group...)
		e = append(e, '|')
		e = append(e, u.uuid...)
	}
	return string(e)
}

// parseUndo reads a stored undo entry.
func parseUndo(s string) (undoEntry, error) {
	parts := strings.Split(s, "|")
	if len(parts) != 3 && len(parts) != 5 {
		return undoEntry{}, fmt.Errorf("undo entry %q is not token|pins|counters, with |group|uuid after them for a group's member", s)
	}
	u := undoEntry{token: parts[0], pins: parsePins(parts[1]), counters: parseCounterList(parts[2])}
	if len(parts) == 5 {
		u.group, u.uuid = parts[3], parts[4]
	}
	return u, nil
}

// String is the pins as an undo entry holds them: the pCPUs, then the
// device addresses, comma-joined.
func (p pinSet) String() string { return string(p.append(nil)) }

func (p pinSet) append(e []byte) []byte {
	for i, cpu := range p.cpus {
		if i > 0 {
			e = append(e, ',')
		}
		e = strconv.AppendInt(e, int64(cpu), 10)
	}
	for i, a := range p.devs {
		if i > 0 || len(p.cpus) > 0 {
			e = append(e, ',')
		}
		e = append(e, a...)
	}
	return e
}
