package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCLIWaitsOutARedisRestart: a `host up` and a boot run while the
// ledger's Redis restarts, held loading its data until both have been
// refused by it (-LOADING), succeed once it has loaded, with none of
// Redis' words (EXECABORT, LOADING) in what they print; the host is up,
// the guest booted and pinned, and the ledger checks clean.
func TestCLIWaitsOutARedisRestart(t *testing.T) {
	t.Parallel()
	s := redisRestartStack(t)
	release := s.redis.RestartLoadingHeld(t)
	defer release()
	up := s.start("host", "up", "h3", "--wait")
	s.eventually("host up to be refused by the loading Redis", 2*time.Minute, func() bool { return s.refusedWhileLoading(up) })
	boot := s.start("boot", "--name", "G", "--host", "h1", "--vcpus", "2", "--memory-mb", "1024",
		"--spec", "hw:cpu_policy=dedicated", "--wait", "--json")
	s.eventually("boot to be refused by the loading Redis", 2*time.Minute, func() bool { return s.refusedWhileLoading(boot) })
	release()

	var bootOut string
	for _, bg := range []*background{up, boot} {
		out, errOut, code := bg.wait(t)
		if code != 0 || strings.Contains(out+errOut, "EXECABORT") || strings.Contains(out+errOut, "LOADING") {
			t.Errorf("pinflow %s during the Redis restart: exit %d, stdout %q, stderr %q; want success without Redis' words",
				strings.Join(bg.args, " "), code, out, errOut)
		}
		if bg == boot {
			bootOut = out
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if st := s.hostState("h3"); st != "up" {
		t.Errorf("h3 is %q after its host up, want up", st)
	}
	if g := s.guest(jsonField(t, bootOut, "uuid")); hostOf(g) != "h1" || g.VMState != "active" || g.pcpus() != "0-1" {
		t.Errorf("G is %s on %q pinned %q, want active on h1 pinned 0-1", g.VMState, hostOf(g), g.pcpus())
	}
	s.ok("check")
}

// TestCLIGivesUpOnARedisStillLoading: a `host up` and a boot against a
// Redis that stays loading its data past the CLI's wait fail each with
// exit 1 and one line saying the ledger's Redis is unavailable and since
// when, with none of Redis' words, and change nothing.
func TestCLIGivesUpOnARedisStillLoading(t *testing.T) {
	t.Parallel()
	s := redisRestartStack(t)
	before := s.ledgerView()
	release := s.redis.RestartLoadingHeld(t)
	defer release()
	// The load is held until after both have given up: the CLI's wait
	// (30 s) is what ends them.
	up := s.start("host", "up", "h3", "--wait")
	boot := s.start("boot", "--name", "G", "--host", "h1", "--vcpus", "2", "--memory-mb", "1024",
		"--spec", "hw:cpu_policy=dedicated", "--wait", "--json")
	for _, bg := range []*background{up, boot} {
		out, errOut, code := bg.wait(t)
		line := strings.TrimSpace(errOut)
		if code != 1 || out != "" || strings.Contains(line, "\n") || !strings.HasPrefix(line, "pinflow: ") ||
			!strings.Contains(line, "the ledger's Redis at "+s.redis.URL()+" has been unavailable since ") ||
			!strings.Contains(line, "it is loading its data after a restart") ||
			strings.Contains(line, "EXECABORT") || strings.Contains(line, "LOADING") {
			t.Errorf("pinflow %s against a Redis still loading: exit %d, stdout %q, stderr %q; want exit 1 and one line saying the ledger's Redis is unavailable since when, without Redis' words",
				strings.Join(bg.args, " "), code, out, errOut)
		}
	}
	if info, err := s.redis.Do("INFO", "persistence"); err != nil || !strings.Contains(info, "loading:1") {
		t.Fatalf("the Redis stopped loading before the commands gave up (%v): the test's gate did not hold", err)
	}
	release()
	if after := s.ledgerView(); after != before {
		t.Errorf("the commands that gave up changed the ledger:\nbefore %s\nafter  %s", before, after)
	}
	s.ok("check")
}

// redisRestartStack is a stack with hosts h1, h2 and h3, h3 down.
func redisRestartStack(t *testing.T) *stack {
	t.Helper()
	if onCluster() {
		t.Skip("restarts the stack's own Redis server, which the cluster does not have")
	}
	s := newStack(t)
	for _, h := range []string{"h1", "h2", "h3"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	s.ok("host", "down", "h3", "--fence", "--reason", "kernel update")
	return s
}

// hostState is the state `host list` gives host.
func (s *stack) hostState(host string) string {
	s.t.Helper()
	var hosts []struct {
		Host   string `json:"host"`
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	}
	s.jsonOf(&hosts, "host", "list")
	for _, h := range hosts {
		if h.Host == host {
			return h.Status.State
		}
	}
	s.t.Fatalf("host list has no %s", host)
	return ""
}

// ledgerView is the hosts and guests as the CLI shows them.
func (s *stack) ledgerView() string {
	s.t.Helper()
	var hosts, guests []json.RawMessage
	s.jsonOf(&hosts, "host", "list")
	s.jsonOf(&guests, "list")
	out, _ := json.Marshal([]any{hosts, guests})
	return string(out)
}

// refusedWhileLoading says whether the CLI command bg is still running
// and the stack's Redis, still loading its data, has refused it a
// command: a connection of bg's process whose last command was not the
// handshake (HELLO, CLIENT), which a loading server answers.
func (s *stack) refusedWhileLoading(bg *background) bool {
	s.t.Helper()
	select {
	case <-bg.done:
		s.t.Fatalf("pinflow %s ended while the Redis was loading: exit %d (%v), stdout %q, stderr %q",
			strings.Join(bg.args, " "), bg.code, bg.err, bg.stdout.String(), bg.stderr.String())
	default:
	}
	ports := redisPorts(bg.cmd.Process.Pid, s.redis.Port)
	clients, err := s.redis.Do("CLIENT", "LIST")
	if err != nil || len(ports) == 0 {
		return false
	}
	refused := false
	for _, c := range strings.Split(clients, "\n") {
		var addr, cmd string
		for _, f := range strings.Fields(c) {
			if v, ok := strings.CutPrefix(f, "addr="); ok {
				addr = v
			} else if v, ok := strings.CutPrefix(f, "cmd="); ok {
				cmd = v
			}
		}
		_, port, _ := strings.Cut(addr, ":")
		if ports[port] && cmd != "hello" && cmd != "NULL" && !strings.HasPrefix(cmd, "client") {
			refused = true
		}
	}
	info, err := s.redis.Do("INFO", "persistence")
	if err != nil || !strings.Contains(info, "loading:1") {
		s.t.Fatalf("the Redis stopped loading before pinflow %s was refused (%v): the test's gate did not hold", strings.Join(bg.args, " "), err)
	}
	return refused
}

// redisPorts are the local ports of the process pid's TCP connections to
// port on loopback, as the server names its clients (addr=127.0.0.1:N).
func redisPorts(pid, port int) map[string]bool {
	inodes := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); ok && err == nil {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	table, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return nil
	}
	// sl local_address rem_address st ... inode, addresses as hex IP:PORT.
	remote := fmt.Sprintf("0100007F:%04X", port)
	ports := map[string]bool{}
	for _, l := range strings.Split(string(table), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) < 10 || f[2] != remote || !inodes[f[9]] {
			continue
		}
		_, local, _ := strings.Cut(f[1], ":")
		if n, err := strconv.ParseUint(local, 16, 16); err == nil {
			ports[strconv.FormatUint(n, 10)] = true
		}
	}
	return ports
}
