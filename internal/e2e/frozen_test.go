package e2e

import (
	"context"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor/sim"
)

// frozenWorker is the worker a test stops with SIGSTOP while it holds a
// call at a gate. Its log is read while it runs, so it writes to a locked
// buffer, at debug level, where every activity attempt's end shows.
type frozenWorker struct {
	s    *stack
	cmd  *exec.Cmd
	log  lockedBuffer
	link *temporalLink
}

// freezableWorker stops the stack's workers and starts the one worker
// that takes the operations from now on, so that the gated call is its
// own. It reaches Temporal through a link the test can cut, and is
// killed when the test ends: a stopped process ignores the SIGTERM of
// stopWorkersAtEnd.
func (s *stack) freezableWorker() *frozenWorker {
	s.t.Helper()
	for _, w := range s.workers {
		if w.ProcessState == nil {
			if err := w.Process.Signal(syscall.SIGTERM); err != nil {
				s.t.Fatal(err)
			}
			_ = w.Wait()
		}
	}
	w := &frozenWorker{s: s, cmd: exec.Command(s.worker), link: newTemporalLink(s.t, s.envOf("PINFLOW_TEMPORAL_ADDRESS"))}
	w.cmd.Env = append(slices.Clone(s.env), "PINFLOW_LOG_LEVEL=debug", "PINFLOW_TEMPORAL_ADDRESS="+strings.Join(w.link.addrs, ","))
	w.cmd.Stdout, w.cmd.Stderr = &w.log, &w.log
	if err := w.cmd.Start(); err != nil {
		s.t.Fatalf("start the worker to freeze: %v", err)
	}
	s.t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
		if s.t.Failed() {
			s.t.Logf("frozen worker log:\n%s", w.log.String())
		}
	})
	return w
}

func (w *frozenWorker) signal(sig syscall.Signal) {
	w.s.t.Helper()
	if err := syscall.Kill(w.cmd.Process.Pid, sig); err != nil {
		w.s.t.Fatalf("signal %v to the worker: %v", sig, err)
	}
}

// freezeAt stops the worker while it holds a call on uuid at gate. An
// attempt whose deadline ran out at the gate before the stop made way for
// another: the worker runs on until that one arrives.
func (w *frozenWorker) freezeAt(gate sim.Gate, uuid string) {
	s := w.s
	s.t.Helper()
	for n := 1; ; n++ {
		s.ok("sim", "gate", "--at", string(gate), "--guest", uuid, "--wait-arrived", strconv.Itoa(n))
		w.signal(syscall.SIGSTOP)
		st, err := s.simulator().GateState(context.Background(), gate, uuid)
		if err != nil {
			s.t.Fatal(err)
		}
		if st.Arrived > st.Cancelled {
			return
		}
		w.signal(syscall.SIGCONT)
	}
}

// ends counts the attempts of activity the worker has seen end, however
// they ended (activities.Observer logs each).
func (w *frozenWorker) ends(activity string) int {
	n := 0
	for _, l := range strings.Split(w.log.String(), "\n") {
		if strings.Contains(l, `msg="activity `) && strings.Contains(l, "ActivityType="+activity+" ") {
			n++
		}
	}
	return n
}

// thaw continues the worker and waits until the attempt of activity it
// was frozen in has ended: whatever it was still to do, it has done. It
// resumes cut off from Temporal, whose answer to its heartbeat (the
// workflow is gone) would cancel the attempt: only its fence may stop it.
func (w *frozenWorker) thaw(activity string) {
	s := w.s
	s.t.Helper()
	before := w.ends(activity)
	w.link.cut()
	w.signal(syscall.SIGCONT)
	s.eventually("the frozen "+activity+" attempt to end", 2*time.Minute, func() bool { return w.ends(activity) > before })
	w.link.mend()
}

// temporalLink carries a worker's connections to Temporal, and holds
// whatever either side sends while it is cut.
type temporalLink struct {
	addrs  []string // what the worker dials, one per Temporal address
	mu     sync.Mutex
	open   chan struct{} // closed while the link is up
	lns    []net.Listener
	conns  []net.Conn
	closed bool
}

func newTemporalLink(t testing.TB, targets string) *temporalLink {
	t.Helper()
	l := &temporalLink{open: make(chan struct{})}
	close(l.open)
	t.Cleanup(l.close)
	for _, to := range strings.Split(targets, ",") {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l.lns = append(l.lns, ln)
		l.addrs = append(l.addrs, ln.Addr().String())
		go l.accept(ln, strings.TrimSpace(to))
	}
	return l
}

func (l *temporalLink) accept(ln net.Listener, to string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", to)
		if err != nil {
			c.Close()
			continue
		}
		l.mu.Lock()
		closed := l.closed
		l.conns = append(l.conns, c, u)
		l.mu.Unlock()
		if closed {
			c.Close()
			u.Close()
			return
		}
		go l.pump(u, c)
		go l.pump(c, u)
	}
}

// pump copies src to dst, holding each chunk while the link is cut.
func (l *temporalLink) pump(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			l.mu.Lock()
			open := l.open
			l.mu.Unlock()
			<-open
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (l *temporalLink) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.open:
		l.open = make(chan struct{})
	default:
	}
}

func (l *temporalLink) mend() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.open:
	default:
		close(l.open)
	}
}

func (l *temporalLink) close() {
	l.mend()
	l.mu.Lock()
	l.closed = true
	lns, conns := l.lns, l.conns
	l.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	for _, c := range conns {
		c.Close()
	}
}

// terminate terminates the guest's operation, as an operator would.
func (s *stack) terminate(uuid string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.tc.TerminateWorkflow(ctx, guest.InstanceWorkflowID(uuid), "", "its worker is frozen"); err != nil {
		s.t.Fatalf("terminate the operation of %s: %v", uuid, err)
	}
}

// startSecondWorker starts a worker on a task queue of its own, which the
// CLI uses from now on: a frozen worker's pending polls would take tasks
// of the old queue and sit on them until they time out.
func (s *stack) startSecondWorker() {
	s.t.Helper()
	s.env = append(s.env, "PINFLOW_TEMPORAL_TASK_QUEUE="+s.envOf("PINFLOW_TEMPORAL_TASK_QUEUE")+"-after")
	s.startWorker()
}

// checkSurvived checks that the guest runs on host alone, pinned to its
// record's claim there, its record active with no task, and that the
// promise holds on a and b and pinflow check passes.
func (s *stack) checkSurvived(uuid, host string) {
	s.t.Helper()
	g := s.guest(uuid)
	if hostOf(g) != host || g.VMState != "active" || g.TaskState != nil {
		s.t.Errorf("after the frozen worker resumed, the record of %s says %s on %q with task %v, want active on %s with no task",
			uuid, g.VMState, hostOf(g), g.TaskState, host)
	}
	s.checkAgreement(uuid, host)
	s.noDoublePins("a", "b")
	s.ok("check")
}

// TestFrozenWorkerRevertSparesSettledGuest freezes the worker while a
// resize revert's stop of the guest on the destination is held, terminates
// the revert and has the audit settle the guest forwards on the
// destination, where it runs. The frozen stop, once its worker resumes,
// must not touch the guest that now lives there.
func TestFrozenWorkerRevertSparesSettledGuest(t *testing.T) {
	t.Parallel()
	s, x, _ := twoHosts(t) // X on a 0-1, B on b 0-1
	w := s.freezableWorker()
	s.ok("resize", x, "--memory-mb", "2048", "--host", "b", "--confirm-window", "never")
	s.waitResized(x)
	s.ok("sim", "gate", "--at", "stop", "--guest", x, "--hold")
	s.ok("resize", "revert", x)
	w.freezeAt(sim.GateStop, x)
	s.terminate(x)
	s.startSecondWorker()

	s.pastMinGrace()
	s.reconcile("--grace", "0")
	s.eventually("the audit to settle X on b", 2*time.Minute, func() bool {
		g := s.guest(x)
		return hostOf(g) == "b" && g.VMState == "active" && g.TaskState == nil
	})
	s.waitClosed(x)
	s.checkAgreement(x, "b")

	s.ok("sim", "gate", "--at", "stop", "--guest", x, "--release")
	w.thaw("DestroyDomain")
	s.checkSurvived(x, "b")
}

// TestFrozenWorkerOffloadSparesUnshelvedGuest freezes the worker while a
// shelve's offload is held at its shutdown or its stop, terminates the
// shelve, then shelves the guest again and unshelves it onto the same
// host, on a new claim. The frozen call, once its worker resumes, must not
// touch the guest that runs there again.
func TestFrozenWorkerOffloadSparesUnshelvedGuest(t *testing.T) {
	t.Parallel()
	for _, gate := range []sim.Gate{sim.GateShutdown, sim.GateStop} {
		t.Run(string(gate), func(t *testing.T) {
			t.Parallel()
			s, x, _ := twoHosts(t) // X on a 0-1, B on b 0-1
			w := s.freezableWorker()
			s.ok("sim", "gate", "--at", string(gate), "--guest", x, "--hold")
			s.ok("shelve", x, "--offload")
			w.freezeAt(gate, x)
			s.terminate(x)
			s.startSecondWorker()

			before := s.hostClaimOf("a", x)
			// The new shelve passes the gate; the frozen call, already
			// inside it, goes on when its worker resumes.
			s.ok("sim", "gate", "--at", string(gate), "--guest", x, "--release")
			s.ok("shelve", x, "--offload", "--wait")
			s.ok("unshelve", x, "--host", "a", "--wait")
			if after := s.hostClaimOf("a", x); after == before {
				t.Fatalf("X was unshelved onto claim %s on a, its claim from before the shelve", after)
			}
			s.checkAgreement(x, "a")

			w.thaw("Offload")
			s.checkSurvived(x, "a")
		})
	}
}
