package ledger

import (
	"fmt"
	"strconv"
)

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

// shape checks that reply s, tagged with one of the statuses, has the
// length its status carries (n of them; -1 for "at least" the next).
func shape(script string, s []string, want map[string]int) error {
	if len(s) == 0 {
		return fmt.Errorf("%s script replied nothing", script)
	}
	n, ok := want[s[0]]
	switch {
	case !ok:
		return fmt.Errorf("%s script replied %q", script, s)
	case n >= 0 && len(s) != n, n < 0 && len(s) < -n:
		return fmt.Errorf("%s script replied %q: %d values for %s", script, s, len(s), s[0])
	}
	return nil
}

// claimStateReply is claim_state.lua's answer.
type claimStateReply struct {
	status string // ok, unknown, state or host
	record string // ok: the claim's record as it now is
	// current is the claim's state (state), hostState the host's (host).
	current, hostState string
}

func decodeClaimState(res []string) (r claimStateReply, err error) {
	if err := shape("claim_state", res, map[string]int{"ok": 2, "unknown": 1, "state": 2, "host": 2}); err != nil {
		return r, err
	}
	r.status = res[0]
	switch r.status {
	case "ok":
		r.record = res[1]
	case "state":
		r.current = res[1]
	case "host":
		r.hostState = res[1]
	}
	return r, nil
}

// groupReply is the answer of group_create.lua (ok, conflict),
// group_delete.lua (ok, gone, members) and group_join.lua (ok, unknown,
// changed): what the group is, when it is not what the caller asked.
type groupReply struct {
	status string
	// policy, maxPerHost and maxMoving are the group's as it exists
	// (conflict, changed; maxMoving for conflict only).
	policy, maxPerHost, maxMoving string
	members                       string // members: how many it has
}

func decodeGroup(script string, res []string) (r groupReply, err error) {
	if err := shape(script, res, map[string]int{"ok": 1, "gone": 1, "unknown": 1, "conflict": 4, "changed": 3, "members": 2}); err != nil {
		return r, err
	}
	r.status = res[0]
	switch r.status {
	case "conflict":
		r.policy, r.maxPerHost, r.maxMoving = res[1], res[2], res[3]
	case "changed":
		r.policy, r.maxPerHost = res[1], res[2]
	case "members":
		r.members = res[1]
	}
	return r, nil
}

// groupBindReply is group_bind.lua's answer.
type groupBindReply struct {
	status string // ok, unknown or bound
	bound  string // bound: the host the group's members are on
}

func decodeGroupBind(res []string) (r groupBindReply, err error) {
	if err := shape("group_bind", res, map[string]int{"ok": 2, "unknown": 1, "bound": 3}); err != nil {
		return r, err
	}
	r.status = res[0]
	if r.status == "bound" {
		r.bound = res[1]
	}
	return r, nil
}

// groupSlotReply is group_slot.lua's answer to a take.
type groupSlotReply struct {
	status string // ok, none, unknown, full or expired
	max    int    // ok, full, expired: the group's budget
	// members hold the slots (full) or let their leases run out (expired).
	members []string
}

func decodeGroupSlot(res []string) (r groupSlotReply, err error) {
	if err := shape("group_slot", res, map[string]int{"ok": 2, "none": 1, "unknown": 1, "full": -2, "expired": -2}); err != nil {
		return r, err
	}
	r.status = res[0]
	if len(res) > 1 {
		if r.max, err = strconv.Atoi(res[1]); err != nil {
			return r, fmt.Errorf("group_slot script replied %q: %w", res, err)
		}
		r.members = res[2:]
	}
	return r, nil
}

// hostRemoveReply is host_remove.lua's answer.
type hostRemoveReply struct {
	status string // ok, gone, live or notdown
	// tombstones were removed (ok) or are held (notdown).
	tombstones int
	// claim and claimState name a live claim (live); hostState is the
	// host's (notdown).
	claim, claimState, hostState string
}

func decodeHostRemove(res []string) (r hostRemoveReply, err error) {
	if err := shape("host_remove", res, map[string]int{"ok": 2, "gone": 1, "live": 3, "notdown": 3}); err != nil {
		return r, err
	}
	r.status = res[0]
	switch r.status {
	case "ok":
		r.tombstones, err = strconv.Atoi(res[1])
	case "live":
		r.claim, r.claimState = res[1], res[2]
	case "notdown":
		r.hostState = res[1]
		r.tombstones, err = strconv.Atoi(res[2])
	}
	if err != nil {
		return r, fmt.Errorf("host_remove script replied %q: %w", res, err)
	}
	return r, nil
}

// leaseReply is the answer of fence.lua (ok, gone, token, down) and
// take.lua (ok, gone, token, leased).
type leaseReply struct {
	status string
	// until is when the fence's lease ends (fence ok) or the lease that
	// keeps the take out does (leased), in ms of the server's clock.
	until     int64
	hostState string // down
}

func decodeLease(script string, res []string) (r leaseReply, err error) {
	okLen := 1
	if script == "fence" {
		okLen = 2
	}
	if err := shape(script, res, map[string]int{"ok": okLen, "gone": 1, "token": 1, "down": 2, "leased": 2}); err != nil {
		return r, err
	}
	r.status = res[0]
	switch {
	case r.status == "down":
		r.hostState = res[1]
	case len(res) == 2:
		if r.until, err = strconv.ParseInt(res[1], 10, 64); err != nil {
			return r, fmt.Errorf("%s script replied %q: %w", script, res, err)
		}
	}
	return r, nil
}

// repinCommitReply is repin_commit.lua's answer.
type repinCommitReply struct {
	status string // ok, done, unknown, state or owner
	// which claim is gone (unknown) or in the wrong state (state: state).
	which, state string
	// pin is a pCPU not held by the claim that should give it, owner its
	// holder (owner).
	pin, owner string
}

func decodeRepinCommit(res []string) (r repinCommitReply, err error) {
	if err := shape("repin_commit", res, map[string]int{"ok": 2, "done": 1, "unknown": 2, "state": 3, "owner": 3}); err != nil {
		return r, err
	}
	r.status = res[0]
	switch r.status {
	case "unknown":
		r.which = res[1]
	case "state":
		r.which, r.state = res[1], res[2]
	case "owner":
		r.pin, r.owner = res[1], res[2]
	}
	return r, nil
}
