package ledger

import "fmt"

// The scripts answer with flat arrays whose first element, for every
// script that changes something, names what happened; the shapes are in
// each script's header. The replies Go reads beyond that tag are decoded
// here into named fields, once, so that a script and the one reader of
// its reply change together.

// replyStrings is a reply with each element as a string: Redis gives Lua
// numbers as integers and strings as strings, and false as nil.
func replyStrings(res []any) []string {
	s := make([]string, len(res))
	for i, v := range res {
		if v != nil {
			s[i] = fmt.Sprint(v)
		}
	}
	return s
}

// readReply is read.lua's answer: a host's state at one instant.
type readReply struct {
	gen, digest string
	// topology is the host's topology, sent only when the caller's digest
	// is stale (hasTopology).
	topology    string
	hasTopology bool
	rev         string
	pins, usage string // comma-joined pins, and field,value pairs
	// existing is the asked-for claim's record, "" if none.
	existing string
}

// decodeRead reads read.lua's reply; known is false for an unknown host.
func decodeRead(res []any) (r readReply, known bool, err error) {
	if len(res) == 0 {
		return readReply{}, false, nil
	}
	if len(res) != 7 {
		return readReply{}, true, fmt.Errorf("read script returned %d values, want 7", len(res))
	}
	s := replyStrings(res)
	r = readReply{gen: s[0], digest: s[1], topology: s[2], hasTopology: res[2] != nil, rev: s[3], pins: s[4], usage: s[5], existing: s[6]}
	return r, true, nil
}

// claimReply is claim.lua's answer: status, then what that status
// carries.
type claimReply struct {
	status string // ok, exists, nohost, down, gen, taken, full or group
	// rev is the host's revision after the claim (ok) or as the refusal
	// saw it (taken, full).
	rev int64
	// values are the new values of the claim's usage fields, in argument
	// order (ok).
	values    []int64
	record    string // exists: the claim's record as first made
	hostState string // down
	gen       string // gen: the host's current topology generation
	// pins and usage are the host's state a refusal saw (taken, full):
	// the retry fits on it without reading the host again.
	pins, usage string
	pin, owner  string // taken: a pin the claim wanted and its owner
	// field, used, want and limit say which usage field is full (full).
	field, used, want, limit string
	members                  string // group: the group's members on the host
}

// decodeClaim reads claim.lua's reply; a shape the script does not send
// is an error naming it.
func decodeClaim(res []any) (claimReply, error) {
	status, _ := res[0].(string)
	if status == "ok" && len(res) >= 2 {
		// Every claim made answers so: its counters are read as numbers,
		// with no strings made on the way.
		r := claimReply{status: status, rev: toInt(res[1]), values: make([]int64, len(res)-2)}
		for i, v := range res[2:] {
			r.values[i] = toInt(v)
		}
		return r, nil
	}
	s := replyStrings(res)
	r := claimReply{status: s[0]}
	bad := func() (claimReply, error) { return claimReply{}, fmt.Errorf("claim script replied %q", s) }
	switch {
	case r.status == "exists" && len(s) == 2:
		r.record = s[1]
	case r.status == "nohost" && len(s) == 1:
	case r.status == "down" && len(s) == 2:
		r.hostState = s[1]
	case r.status == "gen" && len(s) == 2:
		r.gen = s[1]
	case r.status == "taken" && len(s) == 6:
		r.rev, r.pins, r.usage, r.pin, r.owner = toInt(res[1]), s[2], s[3], s[4], s[5]
	case r.status == "full" && len(s) == 8:
		r.rev, r.pins, r.usage = toInt(res[1]), s[2], s[3]
		r.field, r.used, r.want, r.limit = s[4], s[5], s[6], s[7]
	case r.status == "group" && len(s) == 2:
		r.members = s[1]
	default:
		return bad()
	}
	return r, nil
}

// lostRace says why the claim script refused a claim, for people.
func (r claimReply) lostRace() string {
	switch r.status {
	case "taken":
		return fmt.Sprintf("pCPU %s was taken by claim %s", r.pin, r.owner)
	case "gen":
		return fmt.Sprintf("the host topology changed to generation %s", r.gen)
	case "full":
		return fmt.Sprintf("%s has %s of %s in use, %s more do not fit", describeField(r.field), r.used, r.limit, r.want)
	}
	return "claim script replied " + r.status
}

// releaseReply is release.lua's answer.
type releaseReply struct {
	status string // released, absent, token, unmet or no-undo
	// rev, freed and counters are the host's revision after the release,
	// the pins it freed and the counters it changed (released).
	rev             int64
	freed, counters string
}

// decodeRelease reads release.lua's reply.
func decodeRelease(res []any) (releaseReply, error) {
	s := replyStrings(res)
	r := releaseReply{status: s[0]}
	switch {
	case r.status == "released" && len(s) == 4:
		r.rev, r.freed, r.counters = toInt(res[1]), s[2], s[3]
	case (r.status == "absent" || r.status == "token" || r.status == "unmet" || r.status == "no-undo") && len(s) == 1:
	default:
		return releaseReply{}, fmt.Errorf("release script replied %q", s)
	}
	return r, nil
}
