package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
)

// shownGroup is `pinflow group show --json`.
type shownGroup struct {
	Name    string              `json:"name"`
	Policy  string              `json:"policy"`
	Host    string              `json:"host"`
	Members []string            `json:"members"`
	OnHosts map[string][]string `json:"on_hosts"`
	Holds   bool                `json:"holds"`
	Broken  []string            `json:"broken"`
}

// groupBoots boots n members of group at once, each from its own CLI
// process, and returns the uuids of those that booted and the last
// stderr line of each refused one.
func (s *stack) groupBoots(group string, n int) (booted []string, refusals []string) {
	s.t.Helper()
	type result struct {
		uuid, line string
	}
	results := make(chan result, n)
	for i := range n {
		go func() {
			out, errOut, code := s.run("boot", "--name", fmt.Sprintf("%s-%d", group, i), "--group", group, "--vcpus", "1", "--memory-mb", "512",
				"--spec", "hw:cpu_policy=dedicated", "--wait", "--json")
			if code != 0 {
				lines := strings.Split(strings.TrimSpace(errOut), "\n")
				results <- result{line: lines[len(lines)-1]}
				return
			}
			results <- result{uuid: jsonField(s.t, out, "uuid")}
		}()
	}
	for range n {
		r := <-results
		if r.uuid != "" {
			booted = append(booted, r.uuid)
		} else {
			refusals = append(refusals, r.line)
		}
	}
	return booted, refusals
}

// membersRunning counts, per host, the domains of uuids that run there,
// as the hypervisors see them.
func (s *stack) membersRunning(uuids []string, hosts ...string) map[string]int {
	s.t.Helper()
	want := map[string]bool{}
	for _, u := range uuids {
		want[u] = true
	}
	out := map[string]int{}
	for _, h := range hosts {
		doms, err := s.simulator().Domains(context.Background(), h)
		if err != nil {
			s.t.Fatal(err)
		}
		for _, d := range doms {
			if want[d.UUID] && d.State == hypervisor.StateRunning {
				out[h]++
			}
		}
	}
	return out
}

// TestServerGroups races members of an anti-affinity group and of an
// affinity group for three hosts, from separate CLI processes: every
// interleaving ends with the rule intact at the ledger and at the
// hypervisors, the losers refused naming the rule. A named host that
// would break a rule, a drain plan, and the group's life are checked
// through the CLI too.
func TestServerGroups(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	hosts := []string{"a", "b", "c"}
	for _, h := range hosts {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}

	s.ok("group", "create", "quorum", "--policy", "anti-affinity")
	quorum, refusals := s.groupBoots("quorum", 5)
	if len(quorum) != 3 || len(refusals) != 2 {
		t.Fatalf("5 boots of a 1-per-host anti-affinity group onto 3 hosts: %d booted, refused %q; want 3 and 2", len(quorum), refusals)
	}
	for _, r := range refusals {
		if !strings.Contains(r, "anti-affinity") || !strings.Contains(r, "quorum") {
			t.Errorf("a refused member's error %q does not name the group's rule", r)
		}
	}
	var g shownGroup
	s.jsonOf(&g, "group", "show", "quorum")
	if !g.Holds || len(g.OnHosts) != 3 {
		t.Errorf("group show quorum = %+v, want its rule holding with one member on each of 3 hosts", g)
	}
	for h, n := range s.membersRunning(quorum, hosts...) {
		if n != 1 {
			t.Errorf("host %s runs %d members of quorum, want 1", h, n)
		}
	}
	// A refused boot leaves its record in error, a member still.
	if len(g.Members) != 5 {
		t.Errorf("quorum has members %v, want the 5 booted and refused", g.Members)
	}

	// Naming a host that holds a member is refused before anything starts.
	member := s.guest(quorum[0])
	other := "a"
	if hostOf(member) == "a" {
		other = "b"
	}
	s.refused("anti-affinity group quorum allows 1 of its members per host", "migrate", quorum[0], "--dest", other, "--wait")
	// explain says the same of every host.
	var ex struct {
		Groups []struct {
			Group string   `json:"group"`
			Hosts []string `json:"hosts"`
		} `json:"groups"`
	}
	out, errOut, _ := s.run("explain", quorum[0], "--json")
	if err := json.Unmarshal([]byte(out), &ex); err != nil {
		t.Fatalf("explain %s --json: %v\n%s%s", quorum[0], err, out, errOut)
	}
	ruled := 0
	for _, g := range ex.Groups {
		if g.Group == "its server group's rule" {
			ruled = len(g.Hosts)
		}
	}
	if ruled != 2 {
		t.Errorf("explain %s: groups %+v, want the two other hosts refused by its server group's rule", quorum[0], ex.Groups)
	}

	// An affinity group's first members race: all land on one host.
	s.ok("group", "create", "pair", "--policy", "affinity")
	pair, refusals := s.groupBoots("pair", 3)
	if len(pair) != 3 {
		t.Fatalf("3 boots of an affinity group: %d booted, refused %q; want all", len(pair), refusals)
	}
	g = shownGroup{}
	s.jsonOf(&g, "group", "show", "pair")
	if !g.Holds || g.Host == "" || len(g.OnHosts) != 1 || len(g.OnHosts[g.Host]) != 3 {
		t.Errorf("group show pair = %+v, want all 3 members on the group's host", g)
	}
	if n := s.membersRunning(pair, hosts...); n[g.Host] != 3 {
		t.Errorf("members of pair run %v, want all 3 on %s", n, g.Host)
	}
	// A drain of the affinity group's host cannot move them.
	var plan struct {
		Unplaceable []struct {
			UUID   string `json:"uuid"`
			Reason string `json:"reason"`
		} `json:"unplaceable"`
	}
	out, _, _ = s.run("host", "plan-drain", g.Host, "--json")
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatalf("host plan-drain %s --json: %v\n%s", g.Host, err, out)
	}
	stuck := 0
	for _, u := range plan.Unplaceable {
		if strings.Contains(u.Reason, "affinity group pair keeps its members on host "+g.Host) {
			stuck++
		}
	}
	if stuck != 3 {
		t.Errorf("plan-drain %s: unplaceable %+v, want the 3 members of pair held there by their group", g.Host, plan.Unplaceable)
	}

	s.refused("it has 5 members", "group", "delete", "quorum")
	s.noDoublePins(hosts...)
	s.ok("check")
}

// TestServerGroupsBadInput: each bad group request is one line naming
// the value and what is allowed, and changes nothing.
func TestServerGroupsBadInput(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "2")
	s.ok("group", "create", "db", "--policy", "anti-affinity", "--max-per-host", "2")
	for _, tc := range []struct {
		want string
		args []string
	}{
		{`--policy "spread": allowed are affinity, anti-affinity, soft-affinity and soft-anti-affinity`, []string{"group", "create", "x", "--policy", "spread"}},
		{"--max-per-host is for anti-affinity groups, not affinity", []string{"group", "create", "x", "--policy", "affinity", "--max-per-host", "2"}},
		{"--max-per-host 0: allowed are whole numbers from 1", []string{"group", "create", "x", "--policy", "anti-affinity", "--max-per-host", "0"}},
		{"--max-per-host -1: allowed are whole numbers from 1", []string{"group", "create", "x", "--policy", "anti-affinity", "--max-per-host", "-1"}},
		{`group name "a:b"`, []string{"group", "create", "a:b", "--policy", "affinity"}},
		{"exists with policy anti-affinity, at most 2 per host", []string{"group", "create", "db", "--policy", "anti-affinity"}},
		{`no server group "nosuch"`, []string{"boot", "--name", "vm", "--group", "nosuch", "--vcpus", "1", "--memory-mb", "512"}},
		{`no server group "nosuch"`, []string{"group", "show", "nosuch"}},
		{`no server group "nosuch"`, []string{"group", "delete", "nosuch"}},
	} {
		s.refused(tc.want, tc.args...)
	}
	if out := s.ok("group", "list"); strings.Count(out, "\n") != 2 || !strings.Contains(out, "db") {
		t.Errorf("group list after bad input:\n%s\nwant the header and db alone", out)
	}
	var rows []listed
	s.jsonOf(&rows, "list")
	if len(rows) != 0 {
		t.Errorf("bad input left guests %+v", rows)
	}
	s.ok("group", "delete", "db")
	if out := s.ok("group", "list"); !strings.Contains(out, "no server groups") {
		t.Errorf("group list after the delete: %q", out)
	}
}

// TestEvacuationKeepsAntiAffinity: the members of a 1-per-host group fill
// three hosts; when one is fenced, its member has nowhere to go that
// keeps the rule and stays evacuable, its failure naming the hosts in
// the way. A new host comes up, and the member's evacuation races a boot
// of another member for it: exactly one of them gets it.
func TestEvacuationKeepsAntiAffinity(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	hosts := []string{"a", "b", "c"}
	for _, h := range hosts {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	s.ok("group", "create", "quorum", "--policy", "anti-affinity")
	members, refusals := s.groupBoots("quorum", 3)
	if len(members) != 3 {
		t.Fatalf("3 members onto 3 hosts: booted %d, refused %q", len(members), refusals)
	}
	s.ok("sim", "power", "--host", "a", "--off")
	s.ok("host", "down", "a", "--fence", "--reason", "PSU failed")
	var onA string
	for _, u := range members {
		if hostOf(s.guest(u)) == "a" {
			onA = u
		}
	}
	out, _, code := s.run("host", "evacuate", "a", "--wait")
	if code == 0 || !strings.Contains(out, onA+": failed: ") || !strings.Contains(out, "keeps the anti-affinity of group quorum") ||
		!strings.Contains(out, "hosts b, c hold 1 of its members each") {
		t.Fatalf("host evacuate a with no host keeping the rule: exit %d\n%s\nwant %s failed naming the rule and hosts b, c", code, out, onA)
	}
	if g := s.guest(onA); hostOf(g) != "a" {
		t.Fatalf("the member that could not be evacuated is on %q, want still a (evacuable)", hostOf(g))
	}

	s.ok("host", "add", "d", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	type result struct {
		out, errOut string
		code        int
	}
	evac, boot := make(chan result, 1), make(chan result, 1)
	go func() {
		out, errOut, code := s.run("host", "evacuate", "a", "--wait")
		evac <- result{out, errOut, code}
	}()
	go func() {
		out, errOut, code := s.run("boot", "--name", "late", "--group", "quorum", "--vcpus", "1", "--memory-mb", "512",
			"--spec", "hw:cpu_policy=dedicated", "--wait", "--json")
		boot <- result{out, errOut, code}
	}()
	e, b := <-evac, <-boot
	if (e.code == 0) == (b.code == 0) {
		t.Fatalf("the evacuation (exit %d: %s%s) and the boot (exit %d: %s) raced for the one host that keeps the rule: want exactly one through",
			e.code, e.out, e.errOut, b.code, b.errOut)
	}
	var g shownGroup
	s.jsonOf(&g, "group", "show", "quorum")
	if !g.Holds {
		t.Errorf("group show quorum = %+v, want its rule holding", g)
	}
	if n := s.membersRunning(g.Members, "b", "c", "d"); n["b"] != 1 || n["c"] != 1 || n["d"] != 1 {
		t.Errorf("members running per host %v, want one on each of b, c and d", n)
	}
	s.noDoublePins("b", "c", "d")
	s.ok("check")
}

// statusDetail waits until the open operation on uuid says, in its
// status, something containing want, and returns it.
func (s *stack) statusDetail(uuid, want string) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	last := ""
	for ctx.Err() == nil {
		if v, err := s.tc.QueryWorkflow(ctx, guest.InstanceWorkflowID(uuid), "", api.StatusQuery); err == nil {
			var st api.Status
			if v.Get(&st) == nil {
				last = st.Detail
				if strings.Contains(last, want) {
					return last
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("the operation on %s never said %q; last %q", uuid, want, last)
	return ""
}

// TestDisruptionBudget: a group that lets one member move at a time.
// While a member's migration is held at the simulator's gate, another
// member's migration waits for the budget, saying for whom, and moves
// once the first is done; a drain moves the members one at a time, its
// status saying what holds the next back.
func TestDisruptionBudget(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	for _, h := range []string{"a", "b", "c"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	s.ok("group", "create", "db", "--policy", "soft-anti-affinity", "--max-unavailable", "1")
	boot := func(name, host string) string {
		out := s.ok("boot", "--name", name, "--group", "db", "--host", host, "--vcpus", "1", "--memory-mb", "512",
			"--spec", "hw:cpu_policy=dedicated", "--wait", "--json")
		return jsonField(t, out, "uuid")
	}
	m1, m2 := boot("m1", "a"), boot("m2", "b")

	s.ok("sim", "gate", "--at", "migrate", "--hold")
	s.ok("migrate", m1, "--dest", "c")
	s.ok("sim", "gate", "--at", "migrate", "--wait-arrived", "1")
	var g struct {
		Moving []string `json:"moving"`
	}
	s.jsonOf(&g, "group", "show", "db")
	if len(g.Moving) != 1 || g.Moving[0] != m1 {
		t.Fatalf("group show db while m1 moves: moving %v, want [%s]", g.Moving, m1)
	}
	s.ok("migrate", m2, "--dest", "c")
	s.statusDetail(m2, "waiting for the disruption budget of group db: 1 of its members are moving ("+m1+"), and it allows 1")
	if got := hostOf(s.guest(m2)); got != "b" {
		t.Fatalf("m2 moved to %q while m1 held the budget", got)
	}
	s.ok("sim", "gate", "--at", "migrate", "--release")
	if g := s.waitClosed(m1); hostOf(g) != "c" {
		t.Errorf("m1 ended on %q, want c", hostOf(g))
	}
	if g := s.waitClosed(m2); hostOf(g) != "c" {
		t.Errorf("m2 ended on %q, want c once m1 was done", hostOf(g))
	}
	s.jsonOf(&g, "group", "show", "db")
	if len(g.Moving) != 0 {
		t.Errorf("group show db after both moves: moving %v, want none", g.Moving)
	}

	// A drain of c, which now holds both, moves one member at a time
	// however many moves it may run, and its status says what holds the
	// other back.
	s.ok("sim", "gate", "--at", "migrate", "--hold")
	s.ok("host", "drain", "c", "--parallel", "2")
	s.ok("sim", "gate", "--at", "migrate", "--wait-arrived", "1")
	s.eventually("the drain of c says the budget holds a move back", 2*time.Minute, func() bool {
		for _, dg := range s.drainState("c").Guests {
			if strings.Contains(dg.Waiting, "the disruption budget of group db: 1 of its members are moving") {
				return true
			}
		}
		return false
	})
	if out := s.ok("host", "drain", "status", "c"); !strings.Contains(out, "waiting for the disruption budget of group db") {
		t.Errorf("host drain status c does not say what holds a move back:\n%s", out)
	}
	s.ok("sim", "gate", "--at", "migrate", "--release")
	s.drainDone("c")
	for _, u := range []string{m1, m2} {
		if h := hostOf(s.guest(u)); h == "c" || h == "" {
			t.Errorf("after the drain of c, %s is on %q", u, h)
		}
	}
	s.noDoublePins("a", "b", "c")
	s.ok("check")
}

// TestAutomaticEvacuation fences a host with --auto-evacuate while the
// only hosts left would break a member's anti-affinity: each audit starts
// its evacuation, which refuses, until a host that keeps the rule comes;
// the next audit rebuilds it there. Turning it off, and asking it of a
// host that is not down, are answered in one line.
func TestAutomaticEvacuation(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	for _, h := range []string{"a", "b", "c"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	s.ok("group", "create", "quorum", "--policy", "anti-affinity")
	members, refusals := s.groupBoots("quorum", 3)
	if len(members) != 3 {
		t.Fatalf("3 members onto 3 hosts: booted %d, refused %q", len(members), refusals)
	}
	var onA string
	for _, u := range members {
		if hostOf(s.guest(u)) == "a" {
			onA = u
		}
	}
	s.refused("host evacuate b: the host is up; pinflow evacuates only from a host marked down (fenced)", "host", "evacuate", "b", "--retry")
	s.ok("sim", "power", "--host", "a", "--off")
	if out := s.ok("host", "down", "a", "--fence", "--reason", "PSU failed", "--auto-evacuate"); !strings.Contains(out, "every audit evacuates its guests") {
		t.Fatalf("host down --auto-evacuate said %q", out)
	}
	if line := s.hostLine("a"); !strings.Contains(line, "evacuated by every audit") {
		t.Errorf("host show a: %q, want it to say every audit evacuates it", line)
	}

	res := s.reconcile("--host", "a")
	if h := hostAudit(res, "a"); !slices.Equal(h.Evacuated, []string{onA}) {
		t.Fatalf("audit of the down host a started evacuations of %v, want %s", h.Evacuated, onA)
	}
	if g := s.waitClosed(onA); hostOf(g) != "a" {
		t.Fatalf("with no host keeping the rule, %s went to %q; want it still on a", onA, hostOf(g))
	}

	s.ok("host", "add", "d", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	res = s.reconcile("--host", "a")
	if h := hostAudit(res, "a"); !slices.Equal(h.Evacuated, []string{onA}) {
		t.Fatalf("second audit of a started evacuations of %v, want %s", h.Evacuated, onA)
	}
	if g := s.waitClosed(onA); hostOf(g) != "d" {
		t.Fatalf("once d came up, the audit's evacuation left %s on %q; want d", onA, hostOf(g))
	}
	var g shownGroup
	s.jsonOf(&g, "group", "show", "quorum")
	if !g.Holds {
		t.Errorf("group show quorum = %+v, want its rule holding", g)
	}
	if res := s.reconcile("--host", "a"); len(hostAudit(res, "a").Evacuated) != 0 {
		t.Errorf("an audit of a with no guest left started %v", hostAudit(res, "a").Evacuated)
	}
	if out := s.ok("host", "evacuate", "a", "--retry=false"); !strings.Contains(out, "audits no longer evacuate the guests of a") {
		t.Errorf("host evacuate --retry=false said %q", out)
	}
	if line := s.hostLine("a"); strings.Contains(line, "evacuated by every audit") {
		t.Errorf("host show a after --retry=false: %q", line)
	}
	s.noDoublePins("b", "c", "d")
	s.ok("check")
}
