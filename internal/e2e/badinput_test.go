package e2e

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/ledger"
)

// TestBadInputChangesNothing: every kind of bad input is refused in one
// line naming what was wrong, with a non-zero exit, and leaves the
// guests' records, the hosts' ledgers and the hypervisors' domains as
// they were.
func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	s, vmA, vmB := twoHosts(t)
	led, err := ledger.New(s.redisClient(), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The state read straight from the ledger and the hypervisors: every
	// guest's record, each host's claims, pins and usage, every domain.
	state := func() string {
		t.Helper()
		ctx := context.Background()
		insts, err := led.Instances(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sort.Slice(insts, func(i, j int) bool { return insts[i].UUID < insts[j].UUID })
		parts := []any{insts}
		for _, h := range []string{"a", "b"} {
			snap, err := led.Snapshot(ctx, h)
			if err != nil {
				t.Fatal(err)
			}
			parts = append(parts, snap, s.domains(h))
		}
		b, err := json.Marshal(parts)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	before := state()
	dedicated := []string{"--spec", "hw:cpu_policy=dedicated"}
	for _, tc := range []struct {
		kind string
		want string
		args []string
	}{
		{"unknown command", `unknown command "bot"`, []string{"bot"}},
		{"unknown flag", "unknown flag: --vcpu", []string{"boot", "--name", "X", "--vcpu", "1", "--memory-mb", "1"}},
		{"missing required flag", "--memory-mb is required", []string{"boot", "--name", "X", "--vcpus", "1"}},
		{"zero vCPUs", "--vcpus 0 --memory-mb 512: allowed are whole numbers from 1", []string{"boot", "--name", "X", "--vcpus", "0", "--memory-mb", "512"}},
		{"not a number", `--vcpus "two": allowed are whole numbers`, []string{"boot", "--name", "X", "--vcpus", "two", "--memory-mb", "512"}},
		{"flag given twice", `--dest "b": given twice`, []string{"migrate", vmA, "--dest", "b", "--dest", "b"}},
		{"bad extra spec value", "hw:cpu_policy", append([]string{"boot", "--name", "X", "--vcpus", "1", "--memory-mb", "512"}, "--spec", "hw:cpu_policy=pinned")},
		{"misspelt extra spec", "did you mean hw:cpu_policy", []string{"boot", "--name", "X", "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_polcy=dedicated"}},
		{"spec that is not KEY=VALUE", `"dedicated" is not KEY=VALUE`, []string{"boot", "--name", "X", "--vcpus", "1", "--memory-mb", "512", "--spec", "dedicated"}},
		{"flavor key as image property", "hw_cpu_policy", []string{"boot", "--name", "X", "--vcpus", "1", "--memory-mb", "512", "--image-prop", "hw:cpu_policy=dedicated"}},
		{"too many vCPUs", "vcpus 8193: allowed are 1-8192", []string{"boot", "--name", "X", "--vcpus", "8193", "--memory-mb", "512"}},
		{"guest name with a newline", `guest name "two\nlines": invalid input`, []string{"boot", "--name", "two\nlines", "--vcpus", "1", "--memory-mb", "512"}},
		{"bad host name", `host name "a{b}": invalid input`, []string{"boot", "--name", "X", "--host", "a{b}", "--vcpus", "1", "--memory-mb", "512"}},
		{"unknown host", `unknown host "nowhere"; registered hosts are a, b`, append([]string{"boot", "--name", "X", "--host", "nowhere", "--vcpus", "1", "--memory-mb", "512"}, dedicated...)},
		{"unknown guest", `unknown instance "nobody"`, []string{"migrate", "nobody"}},
		{"empty guest name", "got an empty name", []string{"show", ""}},
		{"migrate to its own host", "it already runs on a", []string{"migrate", vmA, "--dest", "a"}},
		{"cold and cold fallback", "--cold and --cold-fallback exclude each other", []string{"migrate", vmA, "--cold", "--cold-fallback"}},
		{"negative confirm window", `--confirm-window "-1s": allowed are a positive duration such as 90s or 2h, never for no automatic confirm`, []string{"resize", vmA, "--vcpus", "1", "--confirm-window", "-1s"}},
		{"zero confirm window", `--confirm-window "0": allowed are a positive duration`, []string{"resize", vmA, "--vcpus", "1", "--confirm-window", "0"}},
		{"confirm window of a live migration", "--confirm-window is for a cold migration (--cold or --cold-fallback); a live migration has no confirm step", []string{"migrate", vmA, "--confirm-window", "1h"}},
		{"resize to zero vCPUs", "--vcpus 0: allowed are whole numbers from 1, or the flag left out to keep the guest's", []string{"resize", vmA, "--vcpus", "0"}},
		{"guest memory below QEMU's", "--memory-mb 4: allowed are 128 MiB (QEMU's default guest memory) or more", []string{"boot", "--name", "X", "--vcpus", "1", "--memory-mb", "4"}},
		{"resize memory below QEMU's", "--memory-mb 4: allowed are 128 MiB", []string{"resize", vmA, "--memory-mb", "4"}},
		{"extra spec key given twice", `--spec "hw:cpu_policy=shared": hw:cpu_policy given twice (as hw:cpu_policy=dedicated too); a key takes one value`,
			append([]string{"boot", "--name", "X", "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated"}, "--spec", "hw:cpu_policy=shared")},
		{"resize to its flavor", "that is its current flavor", []string{"resize", vmA, "--vcpus", "2"}},
		{"resize decision without a resize", "no resize awaiting confirmation", []string{"resize", "confirm", vmA}},
		{"unshelve of an active guest", "only a shelved_offloaded instance can be unshelved", []string{"unshelve", vmA}},
		{"shelve without --offload", "add --offload", []string{"shelve", vmA}},
		{"evacuate from a host that is up", "pinflow evacuates only from a host marked down (fenced)", []string{"evacuate", vmA}},
		{"cancel with nothing running", "no operation is running on it", []string{"cancel", vmB}},
		{"host down without --fence", "add --fence", []string{"host", "down", "a", "--reason", "x"}},
		{"host disable without a reason", "--reason is required", []string{"host", "disable", "a"}},
		{"host up of an up host", "the host is up already", []string{"host", "up", "a"}},
		{"remove a host with guests", "", []string{"host", "remove", "a"}},
		{"bad huge pages", `--hugepages "2M"`, []string{"host", "add", "c", "--cells", "1", "--cores", "2", "--hugepages", "2M"}},
		{"drain parallelism out of bounds", "drain parallel 1000000: it must be 1 to 64", []string{"host", "drain", "a", "--parallel", "1000000"}},
		{"bad list state", `--state "runing" is not a state`, []string{"list", "--state", "runing"}},
		{"bad output format", `--output "yaml": allowed are json and table`, []string{"list", "--output", "yaml"}},
		{"contradicting output flags", "--json is --output json; give one of them", []string{"list", "--json", "--output", "table"}},
		{"explain without a guest or flavor", "name a guest, or give a flavor", []string{"explain"}},
		{"ops limit out of bounds", "--limit 0: allowed are 1 to 1000", []string{"ops", "--limit", "0"}},
		{"too many arguments", "takes one guest", []string{"delete", vmA, vmB}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			line := s.refused(tc.want, tc.args...)
			if strings.Contains(line, "\n") {
				t.Errorf("refusal of %s is more than one line: %q", tc.kind, line)
			}
			if after := state(); after != before {
				t.Errorf("refused %s (%q) changed the state:\nbefore %s\nafter  %s", tc.kind, line, before, after)
			}
		})
	}
	// The comparison sees a change that is not refused.
	s.ok("host", "disable", "b", "--reason", "check")
	if state() == before {
		t.Errorf("disabling host b left the compared state as it was")
	}
}

// domains lists the simulated domains on host with their pins.
func (s *stack) domains(host string) any {
	s.t.Helper()
	doms, err := s.simulator().Domains(context.Background(), host)
	if err != nil {
		s.t.Fatal(err)
	}
	return doms
}

// TestBadInputExitStatus: a command line that cannot work as typed exits
// 2 whichever command finds it; an operation refused or failed exits 1,
// with one line that names what the operator can act on (guests by name
// and UUID, the group's rule) and no Go package prefix; a cancel that
// ends cancelled, as asked, exits 0.
func TestBadInputExitStatus(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	for _, h := range []string{"a", "b"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "8", "--memory-mb", "16384")
	}
	vmA := s.boot("A", "a", 2)
	s.ok("group", "create", "g", "--policy", "anti-affinity")
	s.ok("group", "create", "p", "--policy", "affinity")
	member := func(name, group, host string) string {
		var res struct {
			UUID string `json:"uuid"`
		}
		s.jsonOf(&res, "boot", "--name", name, "--group", group, "--host", host, "--vcpus", "1", "--memory-mb", "512",
			"--spec", "hw:cpu_policy=dedicated", "--wait")
		return res.UUID
	}
	m1, p1 := member("M1", "g", "a"), member("P1", "p", "a")
	member("M2", "g", "b")
	boot := []string{"boot", "--name", "X", "--vcpus", "1", "--memory-mb", "512"}
	for _, tc := range []struct {
		code int
		want string
		args []string
	}{
		{2, "did you mean hw:cpu_policy", append(boot, "--spec", "hw:cpu_polcy=dedicated")},
		{2, "did you mean hw:cpu_policy", []string{"explain", "--vcpus", "1", "--memory-mb", "512", "--spec", "hw:cpu_polcy=dedicated"}},
		{2, "cpus 4-20 are not on the host", []string{"host", "add", "c", "--cells", "1", "--cores", "4", "--dedicated", "2-20"}},
		{2, `--memory-mb "64G"`, []string{"host", "add", "c", "--cells", "1", "--cores", "4", "--memory-mb", "64G"}},
		{2, `unknown host "nowhere"`, append(boot, "--host", "nowhere", "--spec", "hw:cpu_policy=dedicated")},
		{2, `"nowhere" is not registered`, []string{"host", "show", "nowhere"}},
		{2, `unknown instance "nobody"`, []string{"migrate", "nobody"}},
		{2, `no server group "nosuch"`, append(boot, "--group", "nosuch")},
		{2, `unknown command "bot"; did you mean boot`, []string{"bot", "--name", "x"}},
		{1, "anti-affinity group g allows 1 of its members per host", append(boot, "--group", "g", "--host", "b")},
		{1, "anti-affinity group g allows 1 of its members per host", []string{"migrate", m1, "--dest", "b", "--wait"}},
		{1, "anti-affinity group g allows 1 of its members per host", []string{"migrate", m1, "--cold", "--dest", "b", "--wait"}},
		{1, "affinity group p keeps its members on host a", []string{"migrate", p1, "--dest", "b", "--wait"}},
		{1, "affinity group p keeps its members on host a", []string{"migrate", p1, "--cold", "--dest", "b", "--wait"}},
		{1, "group g exists with policy anti-affinity, at most 1 per host; choose another name", []string{"group", "create", "g", "--policy", "anti-affinity"}},
		{1, "host remove a: it holds guests A (" + vmA + "), M1 (" + m1 + "), P1 (" + p1 + "); evacuate, migrate or delete them first",
			[]string{"host", "remove", "a"}},
		{1, "no", []string{"boot", "--name", "big", "--host", "b", "--vcpus", "8", "--memory-mb", "512", "--spec", "hw:cpu_policy=dedicated", "--wait"}},
	} {
		_, errOut, code := s.run(tc.args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		line := lines[len(lines)-1]
		if code != tc.code || !strings.HasPrefix(line, "pinflow: ") || !strings.Contains(line, tc.want) {
			t.Errorf("pinflow %s: exit %d, %q; want exit %d and a line containing %q", strings.Join(tc.args, " "), code, line, tc.code, tc.want)
		}
		for _, prefix := range []string{"numa:", "ledger:", "invalid request"} {
			if strings.Contains(line, prefix) {
				t.Errorf("pinflow %s: line %q has the package prefix %q; stderr:\n%s", strings.Join(tc.args, " "), line, prefix, errOut)
			}
		}
	}
	// The moves refused by their group started nothing.
	for _, u := range []string{m1, p1} {
		if g := s.guest(u); hostOf(g) != "a" || g.TaskState != nil {
			t.Errorf("guest %s after refused moves: on %q with task %v, want on a with none", u, hostOf(g), g.TaskState)
		}
	}

	// A cancel followed to its end, cancelled as asked, exits 0.
	s.ok("sim", "gate", "--at", "migrate", "--hold")
	s.ok("migrate", vmA, "--dest", "b")
	s.ok("sim", "gate", "--at", "migrate", "--wait-arrived", "1")
	bg := s.start("cancel", vmA, "--wait")
	s.ok("sim", "gate", "--at", "migrate", "--wait-cancelled", "1")
	s.ok("sim", "gate", "--at", "migrate", "--release")
	out, errOut, code := bg.wait(t)
	if code != 0 || !strings.Contains(out, "was cancelled; its steps were compensated") {
		t.Errorf("cancel %s --wait: exit %d, %q %q; want exit 0 saying it was cancelled", vmA, code, out, errOut)
	}
}
