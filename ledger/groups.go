package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// GroupPolicy is a server group's placement rule, as Nova names them.
type GroupPolicy string

// Server group policies. The hard ones are part of every claim; the soft
// ones are preferences of the host choice.
const (
	// PolicyAffinity: every member on one host.
	PolicyAffinity GroupPolicy = "affinity"
	// PolicyAntiAffinity: at most MaxPerHost members on any host.
	PolicyAntiAffinity GroupPolicy = "anti-affinity"
	// PolicySoftAffinity: members together where they fit.
	PolicySoftAffinity GroupPolicy = "soft-affinity"
	// PolicySoftAntiAffinity: members apart where they fit.
	PolicySoftAntiAffinity GroupPolicy = "soft-anti-affinity"
)

var groupPolicies = []GroupPolicy{PolicyAffinity, PolicyAntiAffinity, PolicySoftAffinity, PolicySoftAntiAffinity}

// Hard says whether claims enforce the policy.
func (p GroupPolicy) Hard() bool { return p == PolicyAffinity || p == PolicyAntiAffinity }

// ParseGroupPolicy reads a policy name, refusing any other with one line
// that names it and the policies there are.
func ParseGroupPolicy(s string) (GroupPolicy, error) {
	if p := GroupPolicy(s); slices.Contains(groupPolicies, p) {
		return p, nil
	}
	return "", fmt.Errorf("group policy %q: %w: policies are affinity, anti-affinity, soft-affinity and soft-anti-affinity", s, ErrInvalid)
}

// groupNameRule is the rule for group names: they are part of keys, of a
// host's group counters and of undo entries, so they carry no ':' or '|'.
const groupNameRule = "1-64 characters of letters, digits, '.', '_' and '-', starting with a letter or digit"

// CheckGroupName refuses a group name that cannot be part of the
// ledger's keys, with an error wrapping ErrInvalid.
func CheckGroupName(name string) error {
	if !validName(name, 64, "._-") {
		return fmt.Errorf("group name %s: %w: group names are %s", quoteName(name), ErrInvalid, groupNameRule)
	}
	return nil
}

// Group is a server group: a rule on where its members may run, and who
// they are.
type Group struct {
	Name   string      `json:"name"`
	Policy GroupPolicy `json:"policy"`
	// MaxPerHost is the most members of an anti-affinity group one host
	// may hold (Nova's max_server_per_host); 0 for the other policies.
	MaxPerHost int `json:"max_per_host,omitempty"`
	// MaxUnavailable is the group's disruption budget: the most members
	// that may be moving (an operation that stops or migrates them) at
	// once; 0 for none.
	MaxUnavailable int `json:"max_unavailable,omitempty"`
	// Host is where an affinity group's members are: fixed by the first
	// member's claim, free again when every member has left.
	Host      string    `json:"host,omitempty"`
	Members   []string  `json:"members"`
	CreatedAt time.Time `json:"created_at"`
}

// GroupRule is what an instance's record keeps of its group: the rule
// its claims are held to, stated once when it joined, since a group's
// rule never changes.
type GroupRule struct {
	Name       string      `json:"name"`
	Policy     GroupPolicy `json:"policy"`
	MaxPerHost int         `json:"max_per_host,omitempty"`
}

// limit is the most members of the group a host may hold, as the claim
// script takes it: "" for none.
func (r *GroupRule) limit() string { return maxField(r.Policy, r.MaxPerHost) }

// maxField is the stored max_per_host of a rule.
func maxField(policy GroupPolicy, max int) string {
	if policy != PolicyAntiAffinity {
		return ""
	}
	return strconv.Itoa(max)
}

// CheckGroup refuses a group that cannot be made: a bad name or policy, a
// limit below 1, or a limit on a policy other than anti-affinity (as Nova
// refuses max_server_per_host there). A zero MaxPerHost of an
// anti-affinity group means 1.
func CheckGroup(g *Group) error {
	if err := CheckGroupName(g.Name); err != nil {
		return err
	}
	if _, err := ParseGroupPolicy(string(g.Policy)); err != nil {
		return err
	}
	switch {
	case g.MaxPerHost < 0:
		return fmt.Errorf("group %s: max members per host %d: %w: it is a whole number from 1", g.Name, g.MaxPerHost, ErrInvalid)
	case g.MaxPerHost > 0 && g.Policy != PolicyAntiAffinity:
		return fmt.Errorf("group %s: max members per host %d: %w: only an anti-affinity group takes it, not %s", g.Name, g.MaxPerHost, ErrInvalid, g.Policy)
	case g.MaxUnavailable < 0:
		return fmt.Errorf("group %s: max members unavailable %d: %w: it is a whole number from 1, or 0 for no budget", g.Name, g.MaxUnavailable, ErrInvalid)
	}
	return nil
}

// CreateGroup makes a server group with no members. Making it again with
// the same rule is a retry and succeeds; with another rule it is
// ErrExists.
func (l *Ledger) CreateGroup(ctx context.Context, g Group) error {
	wrap := func(err error) error { return fmt.Errorf("ledger: create group %s: %w", g.Name, err) }
	if err := CheckGroup(&g); err != nil {
		return wrap(err)
	}
	if g.Policy == PolicyAntiAffinity && g.MaxPerHost == 0 {
		g.MaxPerHost = 1
	}
	raw, err := l.change(ctx, groupCreateScript, []string{l.groupKey(g.Name)}, string(g.Policy), maxField(g.Policy, g.MaxPerHost), l.timestamp(),
		g.MaxUnavailable).Slice()
	if err != nil {
		return wrap(err)
	}
	res, err := decodeGroup("group_create", replyStrings(raw))
	if err != nil {
		return wrap(err)
	}
	if res.status == "conflict" {
		budget := ""
		if res.maxMoving != "0" {
			budget = ", at most " + res.maxMoving + " moving at once"
		}
		return wrap(fmt.Errorf("%w: group %s exists with policy %s%s%s", ErrExists, g.Name, res.policy, perHost(res.maxPerHost), budget))
	}
	return wrap0(l.rdb.SAdd(ctx, l.groupsKey(), g.Name).Err(), wrap)
}

func perHost(max string) string {
	if max == "" {
		return ""
	}
	return ", at most " + max + " per host"
}

func wrap0(err error, wrap func(error) error) error {
	if err != nil {
		return wrap(err)
	}
	return nil
}

// Group returns a server group with its members, or ErrUnknownGroup.
func (l *Ledger) Group(ctx context.Context, name string) (*Group, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: group %s: %w", name, err) }
	if err := CheckGroupName(name); err != nil {
		return nil, wrap(err)
	}
	p := l.rdb.Pipeline()
	rec := p.HGetAll(ctx, l.groupKey(name))
	members := p.SMembers(ctx, l.membersKey(name))
	if _, err := p.Exec(ctx); err != nil {
		return nil, wrap(err)
	}
	f := rec.Val()
	if f["policy"] == "" {
		return nil, wrap(fmt.Errorf("%w: no group %q", ErrUnknownGroup, name))
	}
	g := &Group{Name: name, Policy: GroupPolicy(f["policy"]), Host: f["host"], Members: members.Val()}
	slices.Sort(g.Members)
	if f["max_per_host"] != "" {
		n, err := strconv.Atoi(f["max_per_host"])
		if err != nil {
			return nil, wrap(fmt.Errorf("stored max_per_host %q: %w", f["max_per_host"], err))
		}
		g.MaxPerHost = n
	}
	if f["max_unavailable"] != "" {
		n, err := strconv.Atoi(f["max_unavailable"])
		if err != nil {
			return nil, wrap(fmt.Errorf("stored max_unavailable %q: %w", f["max_unavailable"], err))
		}
		g.MaxUnavailable = n
	}
	if t, err := time.Parse(time.RFC3339Nano, f["created_at"]); err == nil {
		g.CreatedAt = t
	}
	return g, nil
}

// Groups returns every server group, by name.
func (l *Ledger) Groups(ctx context.Context) ([]Group, error) {
	names, err := l.rdb.SMembers(ctx, l.groupsKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("ledger: groups: %w", err)
	}
	slices.Sort(names)
	out := make([]Group, 0, len(names))
	for _, n := range names {
		g, err := l.Group(ctx, n)
		if errors.Is(err, ErrUnknownGroup) {
			// Deleted since the names were read, or a creation that
			// failed after naming it.
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, *g)
	}
	return out, nil
}

// DeleteGroup deletes a server group that has no members; one with
// members is ErrConflict, naming them. A member whose instance record is
// gone (its delete was cut short) no longer counts and is dropped first.
// Deleting a deleted group succeeds.
func (l *Ledger) DeleteGroup(ctx context.Context, name string) error {
	wrap := func(err error) error { return fmt.Errorf("ledger: delete group %s: %w", name, err) }
	g, err := l.Group(ctx, name)
	if errors.Is(err, ErrUnknownGroup) {
		return wrap0(l.rdb.SRem(ctx, l.groupsKey(), name).Err(), wrap)
	}
	if err != nil {
		return err
	}
	var live []string
	for _, u := range g.Members {
		n, err := l.rdb.Exists(ctx, l.instKey(u)).Result()
		if err != nil {
			return wrap(err)
		}
		if n == 1 {
			live = append(live, u)
			continue
		}
		if err := l.change(ctx, groupLeaveScript, []string{l.groupKey(name), l.membersKey(name)}, u).Err(); err != nil {
			return wrap(err)
		}
	}
	if len(live) > 0 {
		return wrap(fmt.Errorf("%w: it has %d members (%s); delete them first", ErrConflict, len(live), strings.Join(live, ", ")))
	}
	raw, err := l.change(ctx, groupDeleteScript, []string{l.groupKey(name), l.membersKey(name), l.movingKey(name), l.groupHostsKey(name)}).Slice()
	if err != nil {
		return wrap(err)
	}
	res, err := decodeGroup("group_delete", replyStrings(raw))
	if err != nil {
		return wrap(err)
	}
	if res.status == "members" {
		return wrap(fmt.Errorf("%w: it has %s members; a member joined while it was being deleted", ErrConflict, res.members))
	}
	return wrap0(l.rdb.SRem(ctx, l.groupsKey(), name).Err(), wrap)
}

// groupRule reads the rule a member of group name is held to, or
// ErrUnknownGroup.
func (l *Ledger) groupRule(ctx context.Context, name string) (*GroupRule, error) {
	if err := CheckGroupName(name); err != nil {
		return nil, err
	}
	f, err := l.rdb.HMGet(ctx, l.groupKey(name), "policy", "max_per_host").Result()
	if err != nil {
		return nil, err
	}
	policy, _ := f[0].(string)
	if policy == "" {
		return nil, fmt.Errorf("%w: no group %q", ErrUnknownGroup, name)
	}
	r := &GroupRule{Name: name, Policy: GroupPolicy(policy)}
	if s, _ := f[1].(string); s != "" {
		if r.MaxPerHost, err = strconv.Atoi(s); err != nil {
			return nil, fmt.Errorf("group %s: stored max_per_host %q: %w", name, s, err)
		}
	}
	return r, nil
}

// join makes uuid a member of the group its record names with rule r.
func (l *Ledger) join(ctx context.Context, uuid string, r *GroupRule) error {
	raw, err := l.change(ctx, groupJoinScript, []string{l.groupKey(r.Name), l.membersKey(r.Name)}, uuid, string(r.Policy), r.limit()).Slice()
	if err != nil {
		return err
	}
	res, err := decodeGroup("group_join", replyStrings(raw))
	if err != nil {
		return err
	}
	switch res.status {
	case "unknown":
		return fmt.Errorf("%w: group %s was deleted while the instance joined it", ErrUnknownGroup, r.Name)
	case "changed":
		return fmt.Errorf("%w: group %s was made again with policy %s%s while the instance joined it", ErrConflict, r.Name, res.policy, perHost(res.maxPerHost))
	}
	return nil
}

// leave takes uuid out of group name.
func (l *Ledger) leave(ctx context.Context, uuid, name string) error {
	return l.change(ctx, groupLeaveScript, []string{l.groupKey(name), l.membersKey(name)}, uuid).Err()
}

// memberRule reads the group rule of the instance a claim is for, nil
// when it is no member. A record's group never changes, so the answer is
// kept for the instance once its record is seen.
func (l *Ledger) memberRule(ctx context.Context, spec *ClaimSpec) (*GroupRule, error) {
	if r, ok := l.rules.get(spec.InstanceUUID); ok {
		return r, nil
	}
	f, err := l.rdb.HMGet(ctx, l.instKey(spec.InstanceUUID), "uuid", "group", "group_policy", "group_max").Result()
	if err != nil {
		return nil, err
	}
	var r *GroupRule
	if name, _ := f[1].(string); name != "" {
		policy, _ := f[2].(string)
		r = &GroupRule{Name: name, Policy: GroupPolicy(policy)}
		if s, _ := f[3].(string); s != "" {
			if r.MaxPerHost, err = strconv.Atoi(s); err != nil {
				return nil, fmt.Errorf("instance %s: stored group_max %q: %w", spec.InstanceUUID, s, err)
			}
		}
	}
	if u, _ := f[0].(string); u != "" {
		l.rules.put(spec.InstanceUUID, r)
	}
	return r, nil
}

// ruleCache maps instance uuids to their group rules (nil for none). It
// forgets everything when full: a miss costs one read.
type ruleCache struct {
	mu sync.Mutex
	m  map[string]*GroupRule
}

const maxCachedRules = 1 << 16

func (c *ruleCache) get(uuid string) (*GroupRule, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.m[uuid]
	return r, ok
}

func (c *ruleCache) put(uuid string, r *GroupRule) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCachedRules {
		c.m = map[string]*GroupRule{}
	}
	c.m[uuid] = r
}

// claimRule reads the group rule a claim is counted under (nil for none)
// and the limit its script holds the host to ("" for none).
func (l *Ledger) claimRule(ctx context.Context, spec *ClaimSpec) (*GroupRule, string, error) {
	if spec.Kind == KindQuarantine {
		// It holds what a domain uses that no record explains.
		return nil, "", nil
	}
	r, err := l.memberRule(ctx, spec)
	if err != nil || r == nil {
		return nil, "", err
	}
	if !enforced(spec.Kind) {
		return r, "", nil
	}
	return r, r.limit(), nil
}

// enforced says whether a claim of this kind is held to its group's hard
// rule: every claim an operation makes to place or move a guest is; a
// quarantine or a resident claim rebuilt from a running domain records
// what already runs, so it is counted but never refused.
func enforced(k ClaimKind) bool { return k != KindQuarantine && k != KindInstance }

// bindAffinity lets a claim of an affinity member on host through: the
// group's host is host, or becomes it. A group bound to a host that an
// operator fenced down keeps its place there: only an evacuation, which
// moves the group's members off it, takes the group with its first claim
// elsewhere; any other claim (a boot, an unshelve, a move) is refused,
// naming the host and the way out. A host removed holds no member: the
// first claim elsewhere takes the group.
func (l *Ledger) bindAffinity(ctx context.Context, r *GroupRule, host string, kind ClaimKind) error {
	from := ""
	for range 2 {
		raw, err := l.change(ctx, groupBindScript, []string{l.groupKey(r.Name)}, host, from).Slice()
		if err != nil {
			return err
		}
		res, err := decodeGroupBind(replyStrings(raw))
		if err != nil {
			return err
		}
		switch res.status {
		case "ok":
			return nil
		case "unknown":
			return fmt.Errorf("%w: group %s is gone; its members' claims are refused", ErrUnknownGroup, r.Name)
		}
		bound := res.bound
		st, err := l.HostStatus(ctx, bound)
		if err != nil && !errors.Is(err, ErrUnknownHost) {
			return err
		}
		if from != "" || (err == nil && st.State != HostDown) {
			return &GroupRuleError{Group: r.Name, Policy: r.Policy, Host: host, BoundTo: bound}
		}
		if err == nil && kind != KindEvacuationDest {
			return &GroupRuleError{Group: r.Name, Policy: r.Policy, Host: host, BoundTo: bound, BoundDown: true}
		}
		// Fenced down, or removed: its members cannot be there.
		from = bound
	}
	return &GroupRuleError{Group: r.Name, Policy: r.Policy, Host: host}
}

// unbindAffinity gives back the ref of a claim on host that failed.
func (l *Ledger) unbindAffinity(ctx context.Context, r *GroupRule, host string) {
	// A ref not given back only keeps the group on the host longer, which
	// breaks no rule.
	_ = l.change(ctx, groupUnbindScript, []string{l.groupKey(r.Name)}, host).Err()
}

// GroupRuleError is a claim refused because it would break its guest's
// server group rule on the host. Nothing was changed.
type GroupRuleError struct {
	Group  string
	Policy GroupPolicy
	Host   string
	// BoundTo is the host an affinity group's members are on; BoundDown
	// says an operator fenced it down.
	BoundTo   string
	BoundDown bool
	// Members are the group's members on the host, for anti-affinity.
	Members []string
	// Max is the most members of an anti-affinity group a host may hold.
	Max int
}

func (e *GroupRuleError) Error() string {
	if e.Policy == PolicyAffinity {
		if e.BoundTo == "" {
			return fmt.Sprintf("host %s would break the affinity of group %s", e.Host, e.Group)
		}
		if e.BoundDown {
			return fmt.Sprintf("host %s would break the affinity of group %s, whose members are on host %s, which is down: "+
				"evacuate them first ('pinflow host evacuate %s'), which takes the group to their new host, or remove host %s",
				e.Host, e.Group, e.BoundTo, e.BoundTo, e.BoundTo)
		}
		return fmt.Sprintf("host %s would break the affinity of group %s, whose members are on host %s", e.Host, e.Group, e.BoundTo)
	}
	return fmt.Sprintf("host %s would break the anti-affinity of group %s: it holds %d of its members already (%s), and the group allows %d per host",
		e.Host, e.Group, len(e.Members), strings.Join(e.Members, ", "), e.Max)
}

// Unwrap makes a rule refusal a conflict for errors.Is.
func (e *GroupRuleError) Unwrap() error { return ErrConflict }

// groupMembersOn lists the members of group with claims on host, for a
// refusal's message.
func (l *Ledger) groupMembersOn(ctx context.Context, host, group string) []string {
	fields, err := l.rdb.HKeys(ctx, l.hostKeys(host).groups).Result()
	if err != nil {
		return nil
	}
	var out []string
	for _, f := range fields {
		if g, u, ok := strings.Cut(f, "|"); ok && g == group {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}

// groupHostsKey is the set of hosts a group's members claimed on: a hint
// for where to read the hosts' counters (GroupMembers), written after
// each member's claim in a command of its own (another slot).
func (l *Ledger) groupHostsKey(name string) string { return l.prefix + ":group:{" + name + "}:hosts" }

// noteGroupHost adds host to the hosts group's members claimed on. A hint
// lost (a crash right after the claim) only lets a choice propose a host
// whose claim the group's rule then refuses.
func (l *Ledger) noteGroupHost(ctx context.Context, group, host string) {
	_ = l.rdb.SAdd(ctx, l.groupHostsKey(group), host).Err()
}

// GroupOf returns the server group instance uuid is a member of, "" for
// none (and for an instance without a record).
func (l *Ledger) GroupOf(ctx context.Context, uuid string) (string, error) {
	r, err := l.MemberRule(ctx, uuid)
	if err != nil || r == nil {
		return "", err
	}
	return r.Name, nil
}

// MemberRule returns the rule of the server group instance uuid is a
// member of, nil for none (and for an instance without a record).
func (l *Ledger) MemberRule(ctx context.Context, uuid string) (*GroupRule, error) {
	if err := checkInstanceKeyName(uuid); err != nil {
		return nil, fmt.Errorf("ledger: group of %s: %w", uuid, err)
	}
	return l.memberRule(ctx, &ClaimSpec{InstanceUUID: uuid})
}

// GroupMembers returns, per host, the members of group name that hold a
// claim there, as each host's own counters say, sorted.
func (l *Ledger) GroupMembers(ctx context.Context, name string) (map[string][]string, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: hosts of group %s: %w", name, err) }
	if err := CheckGroupName(name); err != nil {
		return nil, wrap(err)
	}
	hosts, err := l.rdb.SMembers(ctx, l.groupHostsKey(name)).Result()
	if err != nil {
		return nil, wrap(err)
	}
	p := l.rdb.Pipeline()
	cmds := make([]*redis.StringSliceCmd, len(hosts))
	for i, h := range hosts {
		cmds[i] = p.HKeys(ctx, l.hostKeys(h).groups)
	}
	if _, err := p.Exec(ctx); err != nil {
		return nil, wrap(err)
	}
	out := map[string][]string{}
	for i, c := range cmds {
		for _, f := range c.Val() {
			if g, u, ok := strings.Cut(f, "|"); ok && g == name {
				out[hosts[i]] = append(out[hosts[i]], u)
			}
		}
		slices.Sort(out[hosts[i]])
	}
	return out, nil
}

// movingKey holds the slots of a group's disruption budget: the members
// moving, each with the end of its lease.
func (l *Ledger) movingKey(name string) string { return l.prefix + ":group:{" + name + "}:moving" }

// Budget is what taking a slot of a group's disruption budget found.
type Budget struct {
	// Group is the member's group, "" when it is no member.
	Group string
	// Max is the group's budget, 0 for none.
	Max int
	// Taken says the member holds a slot now (or needs none).
	Taken bool
	// Moving are the members holding the slots, when none was free.
	Moving []string
	// Expired are, when no slot was free, the members whose slot's lease
	// ran out: the caller judges whether each one's operation is still
	// open (KeepGroupSlot) or ended (DropGroupSlot), and takes again.
	Expired []string
}

// TakeGroupSlot takes a slot of the disruption budget of instance uuid's
// server group for lease, or renews the one it holds: at most the
// group's MaxUnavailable members hold one at once. force takes it even
// past the budget (an evacuation: its guest is down already, and it
// counts). A member of a group without a budget, or no member, needs no
// slot.
func (l *Ledger) TakeGroupSlot(ctx context.Context, uuid string, lease time.Duration, force bool) (Budget, error) {
	wrap := func(err error) error { return fmt.Errorf("ledger: disruption slot of %s: %w", uuid, err) }
	r, err := l.MemberRule(ctx, uuid)
	if err != nil {
		return Budget{}, wrap(err)
	}
	if r == nil {
		return Budget{Taken: true}, nil
	}
	f := "0"
	if force {
		f = "1"
	}
	raw, err := l.change(ctx, groupSlotScript, []string{l.groupKey(r.Name), l.movingKey(r.Name)}, "take", uuid, lease.Milliseconds(), f).Slice()
	if err != nil {
		return Budget{}, wrap(err)
	}
	res, err := decodeGroupSlot(replyStrings(raw))
	if err != nil {
		return Budget{}, wrap(err)
	}
	b := Budget{Group: r.Name, Max: res.max}
	switch res.status {
	case "ok", "none":
		b.Taken = true
	case "unknown":
		return Budget{}, wrap(fmt.Errorf("%w: group %s of the instance is gone", ErrUnknownGroup, r.Name))
	case "full":
		b.Moving = slices.Sorted(slices.Values(res.members))
	case "expired":
		b.Expired = slices.Sorted(slices.Values(res.members))
	}
	return b, nil
}

// KeepGroupSlot renews the slot member uuid holds, whose lease ran out
// while its operation is still open (its workers were away); a slot no
// longer held stays so.
func (l *Ledger) KeepGroupSlot(ctx context.Context, group, uuid string, lease time.Duration) error {
	return l.slotOp(ctx, group, uuid, "keep", lease.Milliseconds())
}

// DropGroupSlot gives back the slot of member uuid whose operation ended
// without giving it back, only while its lease has run out: a renewal
// that came meanwhile keeps it.
func (l *Ledger) DropGroupSlot(ctx context.Context, group, uuid string) error {
	return l.slotOp(ctx, group, uuid, "drop")
}

// slotOp runs op of the slot script on member uuid's slot in group: by
// the group's name, since a member deleted since it took its slot has no
// rule to find the group by.
func (l *Ledger) slotOp(ctx context.Context, group, uuid, op string, args ...any) error {
	if err := CheckGroupName(group); err != nil {
		return fmt.Errorf("ledger: %s the disruption slot of %s: %w", op, uuid, err)
	}
	if err := l.change(ctx, groupSlotScript, []string{l.groupKey(group), l.movingKey(group)}, append([]any{op, uuid}, args...)...).Err(); err != nil {
		return fmt.Errorf("ledger: %s the disruption slot of %s: %w", op, uuid, err)
	}
	return nil
}

// RenewGroupSlot renews the slot instance uuid holds in its group's
// disruption budget, and says whether it still held one: one dropped
// meanwhile is taken again, past the budget, since its guest is moving.
func (l *Ledger) RenewGroupSlot(ctx context.Context, uuid string, lease time.Duration) (bool, error) {
	r, err := l.MemberRule(ctx, uuid)
	if err != nil || r == nil {
		return false, err
	}
	n, err := l.change(ctx, groupSlotScript, []string{l.groupKey(r.Name), l.movingKey(r.Name)}, "renew", uuid, lease.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("ledger: renew the disruption slot of %s: %w", uuid, err)
	}
	return n > 0, nil
}

// GiveGroupSlot gives back the slot instance uuid holds in its group's
// disruption budget; giving back a slot not held succeeds.
func (l *Ledger) GiveGroupSlot(ctx context.Context, uuid string) error {
	r, err := l.MemberRule(ctx, uuid)
	if err != nil || r == nil {
		return err
	}
	if err := l.change(ctx, groupSlotScript, []string{l.groupKey(r.Name), l.movingKey(r.Name)}, "give", uuid).Err(); err != nil {
		return fmt.Errorf("ledger: give back the disruption slot of %s: %w", uuid, err)
	}
	return nil
}

// GroupMoving lists the members of group name holding a slot of its
// disruption budget now.
func (l *Ledger) GroupMoving(ctx context.Context, name string) ([]string, error) {
	// A slot whose lease ran out counts until its operation is judged
	// ended (TakeGroupSlot's caller).
	ms, err := l.rdb.ZRange(ctx, l.movingKey(name), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("ledger: members of group %s moving: %w", name, err)
	}
	slices.Sort(ms)
	if ms == nil {
		ms = []string{}
	}
	return ms, nil
}
