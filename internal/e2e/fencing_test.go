package e2e

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
)

// waitClosed waits until the guest's workflow has closed and returns the
// guest as pinflow shows it.
func (s *stack) waitClosed(uuid string) shownGuest {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_ = s.tc.GetWorkflow(ctx, guest.InstanceWorkflowID(uuid), "").Get(ctx, nil)
	return s.guest(uuid)
}

// noDoublePins fails the test if pinflow's promise is broken on any of
// the hosts (chaos.doublePins): a pCPU one running or paused domain pins
// within reach of another, or a PCI device two running domains use.
func (s *stack) noDoublePins(hosts ...string) {
	s.t.Helper()
	led, rdb, err := ledger.Open(context.Background(), s.redisConfig)
	if err != nil {
		s.t.Fatal(err)
	}
	defer rdb.Close()
	c := &chaos{s: s, t: s.t, led: led, drv: s.simulator()}
	for _, h := range hosts {
		clash, err := c.doublePins(context.Background(), h)
		if err != nil {
			s.t.Fatal(err)
		}
		if clash != "" {
			s.t.Errorf("host %s: the promise is broken: %s", h, clash)
		}
	}
}

// TestCancelAtSwitchover is the first double pin of wave one: a cancel
// that reaches a live migration around its switchover. The migration is
// held at a gate of the simulator until the cancel has reached it there:
// before its copy, with its copy done before the point of no return (the
// cancel aborts it: the guest stays on a), and past that point (the cancel
// cannot stop it: the guest ends on b). Either way the guest runs on
// exactly its record's claim, the audit frees nothing it uses, and a new
// guest on the destination gets other pCPUs.
func TestCancelAtSwitchover(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ gate, host string }{{"migrate", "a"}, {"switchover", "a"}, {"switched", "b"}} {
		t.Run(tt.gate, func(t *testing.T) {
			s, vmA, _ := twoHosts(t)
			s.ok("sim", "gate", "--at", tt.gate, "--hold")
			s.ok("migrate", vmA, "--dest", "b")
			s.ok("sim", "gate", "--at", tt.gate, "--wait-arrived", "1")
			s.ok("cancel", vmA)
			s.ok("sim", "gate", "--at", tt.gate, "--wait-cancelled", "1")
			s.ok("sim", "gate", "--at", tt.gate, "--release")
			g := s.waitClosed(vmA)
			host := hostOf(g)
			if host != tt.host || g.TaskState != nil {
				t.Fatalf("after a cancel at gate %s A is on %q with task %v, want %s and no task", tt.gate, host, g.TaskState, tt.host)
			}
			s.checkAgreement(vmA, host)
			s.pastMinGrace()
			res := s.reconcile("--grace", "0")
			if n := res.Total.Freed.Total(); n != 0 {
				t.Errorf("the audit after the cancel freed %d claims: %+v", n, res.Hosts)
			}
			s.run("boot", "--name", "C", "--host", "b", "--vcpus", "2", "--memory-mb", "1024", "--spec", "hw:cpu_policy=dedicated", "--wait")
			s.noDoublePins("a", "b")
			s.checkAgreement(vmA, host)
		})
	}
}

// TestCancelDuringSpawn is the second: a cancel while the spawn's start
// is held at the simulator's gate. The workflow waits for the spawn
// attempt to end before it compensates, so no guest is left running on
// pCPUs the ledger has freed, and the next boot on the host shares
// nothing.
func TestCancelDuringSpawn(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "2", "--memory-mb", "8192")
	s.ok("sim", "gate", "--at", "start", "--hold")
	out := s.ok("boot", "--name", "A", "--host", "a", "--vcpus", "2", "--memory-mb", "1024", "--spec", "hw:cpu_policy=dedicated", "--json")
	uuid := jsonField(t, out, "uuid")
	s.ok("sim", "gate", "--at", "start", "--wait-arrived", "1")
	s.ok("cancel", uuid)
	s.ok("sim", "gate", "--at", "start", "--wait-cancelled", "1")
	g := s.waitClosed(uuid)
	if g.VMState != "error" || hostOf(g) != "" {
		t.Errorf("after the cancel A is %s on %q, want error on no host", g.VMState, hostOf(g))
	}
	if got := s.pinned("a"); got != "" {
		t.Errorf("after the cancel a has %q pinned, want nothing", got)
	}
	s.ok("sim", "gate", "--at", "start", "--release")
	b := s.boot("B", "a", 2)
	s.noDoublePins("a")
	s.checkAgreement(b, "a")
	s.ok("delete", uuid, "--wait")
	s.checkAgreement(b, "a")
}

// TestAuditRacesCommits is the third: audits with no grace every few
// milliseconds while guests boot and migrate. No claim of an operation
// that ran to its end may be freed, whenever the audit looks.
func TestAuditRacesCommits(t *testing.T) {
	t.Parallel()
	s, vmA, vmB := twoHosts(t)
	s.ok("host", "add", "c", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	stop := make(chan struct{})
	freed := make(chan int, 1)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				freed <- n
				return
			default:
			}
			res := s.reconcile("--grace", "0")
			n += res.Total.Freed.Total()
		}
	}()
	for range 3 {
		s.ok("migrate", vmA, "--dest", "c", "--wait")
		s.ok("migrate", vmB, "--dest", "a", "--wait")
		s.ok("migrate", vmA, "--dest", "b", "--wait")
		s.ok("migrate", vmB, "--dest", "c", "--wait")
		s.ok("migrate", vmA, "--dest", "a", "--wait")
		s.ok("migrate", vmB, "--dest", "b", "--wait")
	}
	close(stop)
	if n := <-freed; n != 0 {
		t.Errorf("audits racing completed migrations freed %d claims, want none", n)
	}
	s.checkAgreement(vmA, "a")
	s.checkAgreement(vmB, "b")
	s.noDoublePins("a", "b", "c")
}

// TestGracefulWorkerStopHandsOver stops the worker gracefully (a rolling
// restart) in the middle of a migration, more times than the step has
// tries: the migration is not aborted, since a hand-over is no try; each
// next worker takes it over and follows it to its end.
func TestGracefulWorkerStopHandsOver(t *testing.T) {
	t.Parallel()
	s, vmA, _ := twoHosts(t)
	// The migration is held at its start on the worker being stopped; the
	// stop ends that attempt, and the next worker's attempt is held too
	// until it has arrived.
	s.ok("sim", "gate", "--at", "migrate", "--hold")
	s.ok("migrate", vmA, "--dest", "b")
	const stops = 3 // the migrate step's tries
	for stop := 1; stop <= stops; stop++ {
		s.ok("sim", "gate", "--at", "migrate", "--wait-arrived", strconv.Itoa(stop))
		old := s.workers[len(s.workers)-1]
		if err := old.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		_ = old.Wait()
		s.startWorker()
	}
	s.ok("sim", "gate", "--at", "migrate", "--wait-arrived", strconv.Itoa(stops+1))
	s.ok("sim", "gate", "--at", "migrate", "--release")
	g := s.waitClosed(vmA)
	if hostOf(g) != "b" {
		t.Fatalf("after a graceful worker stop A is on %q, want b: the migration must not be aborted", hostOf(g))
	}
	s.checkAgreement(vmA, "b")
}

func jsonField(t testing.TB, out, field string) string {
	t.Helper()
	key := `"` + field + `":`
	i := strings.Index(out, key)
	if i < 0 {
		t.Fatalf("no %s in %s", field, out)
	}
	rest := strings.TrimLeft(out[i+len(key):], ` "`)
	return rest[:strings.IndexAny(rest, `",}`)]
}
