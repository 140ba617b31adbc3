package libvirt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/pinflow/pinflow/hypervisor"
)

// An idle test guest sends well under 1 MiB when it migrates: its memory
// is zero pages. The policy tests need a guest that keeps dirtying memory,
// so that a bandwidth cap keeps its migration from converging. Without an
// OS or a disk, the guest boots a 36-byte multiboot kernel (QEMU loads it
// from <kernel> itself).

// Parameters of the dirtying kernel the policy tests boot: it writes to
// every page of an 8 MiB region, spinning between two pages. Unthrottled
// it dirties 10 to 20 times more memory a second than the cap below lets
// the migration send, so it does not converge even with a busy machine
// starving its vCPU; with auto-converge's throttle at its top (99%) it
// dirties far less, and converges.
const (
	busyPages = 2048
	busySpin  = 20000
	// busyCapMiBs is the bandwidth cap that keeps the busy guest's
	// migration from converging: 8 MiB dirty at every iteration takes 2s
	// to send, over 6 times QEMU's default downtime of 300ms.
	busyCapMiBs = 4
	// busyTimeout is the completion and progress timeout of the tests that
	// want one to fire. The progress clock runs from the start, so it
	// leaves room for a loaded machine to start the copy before the first
	// figure and send the busy region more than once.
	busyTimeout = 8 * time.Second
)

// dirtyingKernel is a multiboot kernel that, loaded at 1 MiB, writes a
// rising counter to the first word of each of pages pages from 4 MiB on,
// spinning spin times between two pages, and starts over, forever.
func dirtyingKernel(pages, spin uint32) []byte {
	const load, entry = 0x100000, 0x100020
	le := binary.LittleEndian
	header := make([]byte, 0x20)
	var magic, flags uint32 = 0x1BADB002, 1 << 16 // the load addresses below are valid
	le.PutUint32(header[0:], magic)
	le.PutUint32(header[4:], flags)
	le.PutUint32(header[8:], -(magic + flags))
	le.PutUint32(header[12:], load) // header_addr
	le.PutUint32(header[16:], load) // load_addr; load_end 0: the whole file, no bss
	le.PutUint32(header[28:], entry)
	code := []byte{
		0xBE, 0x00, 0x00, 0x40, 0x00, //       mov esi, 0x400000
		0x31, 0xD2, //                         xor edx, edx
		0x89, 0xF7, //                  pass:  mov edi, esi
		0xBB, 0, 0, 0, 0, //                   mov ebx, pages
		0x42,       //                  page:  inc edx
		0x89, 0x17, //                         mov [edi], edx
		0x81, 0xC7, 0x00, 0x10, 0x00, 0x00, // add edi, 4096
		0xB9, 0, 0, 0, 0, //                   mov ecx, spin
		0x49,       //                  spin:  dec ecx
		0x75, 0xFD, //                         jnz spin
		0x4B,       //                         dec ebx
		0x75, 0xEC, //                         jnz page
		0xEB, 0xE3, //                         jmp pass
	}
	le.PutUint32(code[10:], pages)
	le.PutUint32(code[24:], spin)
	return append(header, code...)
}

// busyGuest returns a guest named after n that boots the dirtying kernel,
// written to a file of the test's.
func busyGuest(t *testing.T, n int) guest {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dirtying-kernel.bin")
	if err := os.WriteFile(path, dirtyingKernel(busyPages, busySpin), 0o644); err != nil {
		t.Fatal(err)
	}
	g := newGuest(n)
	g.kernel = path
	return g
}

// ranFor waits until the QEMU process pid has used cpu of CPU time. A busy
// guest that booted on a loaded machine may not have run its kernel yet,
// and its memory is then zero pages that a migration sends at once: the
// kernel must have written its region first.
func ranFor(t *testing.T, pid int, cpu time.Duration) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// After the command name: state, ppid, ..., utime (12th) and
		// stime (13th), in clock ticks of 1/100 s.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		utime, err1 := strconv.ParseInt(f[11], 10, 64)
		stime, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("/proc/%d/stat: %q", pid, b)
		}
		used := time.Duration(utime+stime) * 10 * time.Millisecond
		if used >= cpu {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU (pid %d) used %v of CPU in a minute, want %v: the guest does not run", pid, used, cpu)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// jobWatch polls the source's job of a migration the test runs, keeping
// the most of libvirt's auto-converge throttle and of the domain's downtime
// limit seen while the job was active.
type jobWatch struct {
	mu       sync.Mutex
	throttle uint64 // percent
	downtime uint64 // ms
	stop     chan struct{}
	done     chan struct{}
}

func (e *migrationEnv) watchJob(t *testing.T, g guest) *jobWatch {
	t.Helper()
	ctx := opContext(t)
	c, err := e.d.connect(ctx, "src")
	if err != nil {
		t.Fatal(err)
	}
	dom, err := c.lookup(ctx, g.uuid)
	if err != nil {
		t.Fatal(err)
	}
	w := &jobWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			typ, params, err := c.l.DomainGetJobStats(dom, 0)
			if err != nil || !isActiveJob(typ) {
				continue
			}
			downtime, err := c.l.DomainMigrateGetMaxDowntime(dom, 0)
			w.mu.Lock()
			for _, p := range params {
				if v, ok := paramUint(p.Value); ok && p.Field == golibvirt.DomainJobAutoConvergeThrottle {
					w.throttle = max(w.throttle, v)
				}
			}
			if err == nil {
				w.downtime = max(w.downtime, downtime)
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(w.end)
	return w
}

// end stops the watch and returns what it saw.
func (w *jobWatch) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

func (w *jobWatch) seen() (throttle, downtime uint64) {
	w.end()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.throttle, w.downtime
}

// timeoutOf returns the timeout err carries, failing the test unless err is
// a 'libvirt: migrate' error matching ErrMigrationTimeout.
func timeoutOf(t *testing.T, what string, err error) *hypervisor.MigrationTimeoutError {
	t.Helper()
	var to *hypervisor.MigrationTimeoutError
	if !errors.Is(err, hypervisor.ErrMigrationTimeout) || !errors.As(err, &to) || !strings.HasPrefix(err.Error(), "libvirt: migrate ") {
		t.Fatalf("%s = %v; want a 'libvirt: migrate' error matching ErrMigrationTimeout", what, err)
	}
	return to
}

// TestMigrationPolicy migrates a guest that dirties memory faster than a
// bandwidth cap lets its migration send it, on real libvirtd and QEMU, and
// checks what each knob of the policy makes of that.
func TestMigrationPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("boots QEMU guests on two libvirtd hosts and migrates them for up to a minute each; slow, skipped with -short")
	}
	e := startMigrationEnv(t)
	destPins, destEmulator := [2]string{"1", "1"}, "1"
	// start boots g on src and returns a migration of it to dst under p,
	// and its QEMU pid on src.
	start := func(t *testing.T, g guest, p hypervisor.MigrationPolicy) (hypervisor.MigrateRequest, int) {
		t.Helper()
		e.boot(t, "src", g)
		src, err := e.d.Lookup(opContext(t), "src", g.uuid)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := e.hosts["src"].QEMUPid(g.name)
		if err != nil {
			t.Fatal(err)
		}
		if g.kernel != "" {
			ranFor(t, pid, 1500*time.Millisecond)
		}
		req := migration("src", "dst", g.uuid, repin(t, src.XML, destPins, destEmulator, "0"))
		req.Policy = p
		return req, pid
	}
	// stayed checks that g runs on src only, in the QEMU process it had.
	stayed := func(t *testing.T, g guest, pid int) {
		t.Helper()
		e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
		if now, err := e.hosts["src"].QEMUPid(g.name); err != nil || now != pid {
			t.Errorf("the guest's QEMU pid on src is %d (%v), want %d: it must keep running", now, err, pid)
		}
		if err := e.d.Rollback(opContext(t), "src", "dst", g.uuid); err != nil {
			t.Errorf("Rollback(src, dst, %s) after the abort = %v, want nil: nothing to undo", g.name, err)
		}
		e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
	}

	t.Run("the completion timeout aborts a migration the bandwidth cap keeps from converging", func(t *testing.T) {
		g := busyGuest(t, 30)
		req, pid := start(t, g, hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: busyTimeout, BandwidthMiBs: busyCapMiBs})
		var reports []hypervisor.Progress
		err := e.d.Migrate(opContext(t), req, func(p hypervisor.Progress) { reports = append(reports, p) })
		t.Logf("Migrate = %v", err)
		to := timeoutOf(t, "Migrate slower than its completion timeout", err)
		if to.Timeout != hypervisor.TimeoutCompletion || to.Limit != busyTimeout || to.Memory != 128<<20 || to.DataRemaining == 0 {
			t.Errorf("Migrate slower than its completion timeout: %+v; want the completion timeout of %s for 128 MiB, with data remaining", *to, busyTimeout)
		}
		if !strings.Contains(err.Error(), "aborted: not completed within "+busyTimeout.String()) {
			t.Errorf("Migrate slower than its completion timeout = %q; want it to say which timeout fired", err)
		}
		if last := reports[len(reports)-1]; last.Phase != PhaseAborting {
			t.Errorf("Migrate slower than its completion timeout: last progress %+v, want phase %s", last, PhaseAborting)
		}
		// How much the copy sent before the timeout depends on how soon a
		// loaded machine started it; that it was copying is what counts here.
		// The migration without the cap below shows the cap was the cause.
		var sent uint64
		for _, p := range reports {
			sent = max(sent, p.DataProcessed)
		}
		if sent == 0 {
			t.Errorf("Migrate slower than its completion timeout reported no data sent in %d reports; it should have been copying when the timeout aborted it", len(reports))
		}
		stayed(t, g, pid)

		// Without the cap the same guest moves: it was the cap.
		req.Policy = hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: time.Minute}
		if err := e.d.Migrate(opContext(t), req, nil); err != nil {
			t.Fatalf("Migrate without the bandwidth cap = %v, want nil", err)
		}
		e.runsOn(t, "dst", g, destPins, destEmulator)
	})

	t.Run("the progress timeout aborts a migration whose data remaining stops falling", func(t *testing.T) {
		g := busyGuest(t, 31)
		req, pid := start(t, g, hypervisor.MigrationPolicy{ProgressTimeout: busyTimeout, BandwidthMiBs: busyCapMiBs})
		err := e.d.Migrate(opContext(t), req, nil)
		t.Logf("Migrate = %v", err)
		to := timeoutOf(t, "Migrate that does not converge", err)
		if to.Timeout != hypervisor.TimeoutProgress || to.Limit != busyTimeout || to.LowestRemaining == 0 {
			t.Errorf("Migrate that does not converge: %+v; want the progress timeout of %s, with its lowest data remaining", *to, busyTimeout)
		}
		if !strings.Contains(err.Error(), "aborted: no progress for "+busyTimeout.String()+" (data remaining ") {
			t.Errorf("Migrate that does not converge = %q; want it to say which timeout fired, with the figures", err)
		}
		stayed(t, g, pid)
	})

	t.Run("a switch to post-copy completes a migration that does not converge", func(t *testing.T) {
		g := busyGuest(t, 32)
		req, _ := start(t, g, hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: 4 * time.Second, BandwidthMiBs: busyCapMiBs,
			AllowPostCopy: true, TimeoutAction: hypervisor.TimeoutPostCopy})
		var fences int
		req.Fence = func(context.Context) error { fences++; return nil }
		// Past the switch nothing aborts the migration, not even a cancel.
		ctx, cancel := context.WithCancel(opContext(t))
		defer cancel()
		var phases []string
		err := e.d.Migrate(ctx, req, func(p hypervisor.Progress) {
			if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
				phases = append(phases, p.Phase)
			}
			if p.Phase == PhasePostCopy {
				cancel()
			}
		})
		t.Logf("Migrate = %v; phases %v; %d fence calls", err, phases, fences)
		if err != nil {
			t.Fatalf("Migrate that switches to post-copy = %v, want nil", err)
		}
		// Setup may be over before the first poll, and on a loaded machine
		// the capped copy may still report setup when the timeout switches
		// it: what counts is the switch and the completion after it.
		if want := PhasePostCopy + " " + PhaseCompleted; !strings.HasSuffix(strings.Join(phases, " "), want) {
			t.Errorf("Migrate that switches to post-copy went through phases %v, want them to end %s", phases, want)
		}
		// Before the start, at each poll of the 4s, and before the switch.
		if fences < 3 {
			t.Errorf("Migrate that switches to post-copy called its fence %d times, want it before the start, at the polls and before the switch", fences)
		}
		e.runsOn(t, "dst", g, destPins, destEmulator)
	})

	// breakPostCopy breaks g's post-copy migration as a network failure
	// between the hosts would once the guest runs on the destination:
	// libvirt pauses it, the guest paused on both. A break during the
	// switch itself, while the device state is in flight, ends the
	// destination's QEMU: nothing can resume that.
	breakPostCopy := func(t *testing.T, g guest) {
		t.Helper()
		ctx := opContext(t)
		dst, err := e.d.connect(ctx, "dst")
		if err != nil {
			t.Error(err)
			return
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			dom, err := dst.lookup(ctx, g.uuid)
			if err == nil {
				st, reason, err := dst.stateReason(ctx, dom)
				if err == nil && st == golibvirt.DomainRunning && golibvirt.DomainRunningReason(reason) == golibvirt.DomainRunningPostcopy {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Errorf("the guest never ran on the destination in post-copy (last: %v)", err)
				return
			}
		}
		c, err := e.d.connect(ctx, "src")
		if err != nil {
			t.Error(err)
			return
		}
		dom, err := c.lookup(ctx, g.uuid)
		if err != nil {
			t.Error(err)
			return
		}
		// libvirt takes a moment after the switch to be in post-copy.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			err := c.l.DomainAbortJobFlags(dom, uint32(golibvirt.DomainAbortJobPostcopy))
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("break the post-copy migration: %v", err)
				return
			}
		}
	}

	t.Run("a post-copy migration that breaks is resumed, never rolled back", func(t *testing.T) {
		g := busyGuest(t, 37)
		req, _ := start(t, g, hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: 4 * time.Second, BandwidthMiBs: busyCapMiBs,
			AllowPostCopy: true, TimeoutAction: hypervisor.TimeoutPostCopy})
		var phases []string
		broken := false
		err := e.d.Migrate(opContext(t), req, func(p hypervisor.Progress) {
			if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
				phases = append(phases, p.Phase)
			}
			if p.Phase == PhasePostCopy && !broken {
				broken = true
				go breakPostCopy(t, g)
			}
		})
		t.Logf("Migrate = %v; phases %v", err, phases)
		if err != nil {
			t.Fatalf("Migrate whose post-copy broke = %v, want nil: it resumes", err)
		}
		if want := PhasePostCopy + " " + PhaseResuming; !strings.Contains(strings.Join(phases, " "), want) {
			t.Errorf("Migrate whose post-copy broke went through phases %v, want %s among them", phases, want)
		}
		e.runsOn(t, "dst", g, destPins, destEmulator)
	})

	t.Run("a post-copy migration that stalls is paused and resumed", func(t *testing.T) {
		g := busyGuest(t, 39)
		req, _ := start(t, g, hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: 4 * time.Second, BandwidthMiBs: busyCapMiBs,
			AllowPostCopy: true, TimeoutAction: hypervisor.TimeoutPostCopy})
		d := newTestDriver(t, e.hosts["src"], e.hosts["dst"])
		d.cfg.PostCopyStallTimeout, d.cfg.AbortTimeout = 2*time.Second, 30*time.Second
		// The destination's QEMU is stopped once the guest runs there
		// (its device state loaded): nothing flows, as with a hung
		// destination. It goes on when the driver pauses the migration,
		// or, should it never, after the watchdog's wait, so that the
		// test fails rather than hangs.
		var mu sync.Mutex
		frozen := 0
		thaw := func() {
			mu.Lock()
			defer mu.Unlock()
			if frozen > 0 {
				if err := syscall.Kill(frozen, syscall.SIGCONT); err != nil {
					t.Errorf("continue the destination's QEMU: %v", err)
				}
			}
			frozen = -1 // a pause that came first leaves it running
		}
		t.Cleanup(thaw)
		freeze := func() {
			ctx := opContext(t)
			dst, err := d.connect(ctx, "dst")
			if err != nil {
				t.Error(err)
				return
			}
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
				if dom, err := dst.lookup(ctx, g.uuid); err == nil {
					st, reason, err := dst.stateReason(ctx, dom)
					if err == nil && st == golibvirt.DomainRunning && golibvirt.DomainRunningReason(reason) == golibvirt.DomainRunningPostcopy {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Error("the guest never ran on the destination in post-copy")
					return
				}
			}
			pid, err := e.hosts["dst"].QEMUPid(g.name)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if frozen == 0 {
				if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
					t.Errorf("stop the destination's QEMU: %v", err)
					return
				}
				frozen = pid
				time.AfterFunc(3*time.Minute, thaw)
			}
		}
		var phases []string
		switched := false
		err := d.Migrate(opContext(t), req, func(p hypervisor.Progress) {
			if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
				phases = append(phases, p.Phase)
			}
			switch {
			case p.Phase == PhasePostCopy && !switched:
				// Held here, Migrate polls nothing: no stall can be seen
				// before the destination is stopped.
				switched = true
				freeze()
			case p.Phase == PhasePausing:
				thaw()
			}
		})
		t.Logf("Migrate = %v; phases %v", err, phases)
		if err != nil {
			t.Fatalf("Migrate whose post-copy stalled = %v, want nil: it pauses and resumes", err)
		}
		// The destination goes on as the pause is asked for: the pause
		// and a resume, or the copy's end, whichever comes first.
		if !slices.Contains(phases, PhasePausing) {
			t.Errorf("Migrate whose post-copy stalled went through phases %v, want %s among them", phases, PhasePausing)
		}
		e.runsOn(t, "dst", g, destPins, destEmulator)
	})

	t.Run("a retry resumes the broken post-copy migration an earlier attempt left", func(t *testing.T) {
		g := busyGuest(t, 38)
		req, _ := start(t, g, hypervisor.MigrationPolicy{AllowPostCopy: true})
		earlier := e.startEarlier(t, g, req.DestXML, busyCapMiBs, golibvirt.MigratePostcopy)
		ctx := opContext(t)
		c, err := e.d.connect(ctx, "src")
		if err != nil {
			t.Fatal(err)
		}
		dom, err := c.lookup(ctx, g.uuid)
		if err != nil {
			t.Fatal(err)
		}
		// The switch is refused until the earlier call's job has set up
		// post-copy, later under load than a fixed sleep allows.
		time.Sleep(time.Second) // into the copy
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			err := c.l.DomainMigrateStartPostCopy(dom, 0)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("switch to post-copy: %v", err)
			}
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			if st, _ := c.postCopyStage(ctx, dom); st == postCopyRunning {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the earlier migration never reached post-copy")
			}
		}
		breakPostCopy(t, g)
		if err := <-earlier; err == nil {
			t.Fatal("the broken post-copy migration's call = nil")
		}
		if st, err := c.postCopyStage(ctx, dom); st != postCopyFailed {
			t.Fatalf("the source after the break: post-copy stage %d (%v), want failed", st, err)
		}
		// Undoing it would destroy the guest's current memory on dst.
		err = e.d.Rollback(ctx, "src", "dst", g.uuid)
		t.Logf("Rollback = %v", err)
		if !errors.Is(err, hypervisor.ErrPostCopyFailed) {
			t.Errorf("Rollback of a broken post-copy migration = %v, want ErrPostCopyFailed", err)
		}
		if got, err := e.d.Lookup(ctx, "dst", g.uuid); err != nil || got.State != hypervisor.StatePaused {
			t.Errorf("the guest on dst after the refused rollback: %+v, %v; want it kept, and paused (post-copy failed)", got, err)
		}
		if err := e.d.Migrate(ctx, req, nil); err != nil {
			t.Fatalf("Migrate after the break = %v, want nil: it resumes the migration", err)
		}
		e.runsOn(t, "dst", g, destPins, destEmulator)
	})

	t.Run("a fence refusing the switch to post-copy aborts instead", func(t *testing.T) {
		g := busyGuest(t, 33)
		req, pid := start(t, g, hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: 4 * time.Second, BandwidthMiBs: busyCapMiBs,
			AllowPostCopy: true, TimeoutAction: hypervisor.TimeoutPostCopy})
		// The claim is gone for the switch only.
		d := newTestDriver(t, e.hosts["src"], e.hosts["dst"])
		req.Fence = func(ctx context.Context) error {
			if hypervisor.FencePoint(ctx) == "before the switch to post-copy" {
				return errClaimGone
			}
			return nil
		}
		var reports []hypervisor.Progress
		err := d.Migrate(opContext(t), req, func(p hypervisor.Progress) { reports = append(reports, p) })
		t.Logf("Migrate = %v", err)
		to := timeoutOf(t, "Migrate whose fence refuses the switch to post-copy", err)
		if to.Timeout != hypervisor.TimeoutCompletion || !errors.Is(err, hypervisor.ErrFenced) || !errors.Is(err, errClaimGone) {
			t.Errorf("Migrate whose fence refuses the switch to post-copy = %v; want the completion timeout, ErrFenced and the fence's error", err)
		}
		if !strings.Contains(err.Error(), "before the switch to post-copy") {
			t.Errorf("Migrate whose fence refuses the switch to post-copy = %q; want it to say where the fence refused", err)
		}
		for _, p := range reports {
			if p.Phase == PhasePostCopy {
				t.Errorf("Migrate whose fence refuses the switch to post-copy reported %+v", p)
			}
		}
		stayed(t, g, pid)
	})

	t.Run("a retry that takes over an earlier attempt's migration times it and fences it", func(t *testing.T) {
		g := busyGuest(t, 36)
		req, pid := start(t, g, hypervisor.MigrationPolicy{ProgressTimeout: busyTimeout, BandwidthMiBs: busyCapMiBs})
		earlier := e.startEarlier(t, g, req.DestXML, busyCapMiBs)
		var phases []string
		err := e.d.Migrate(opContext(t), req, func(p hypervisor.Progress) {
			if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
				phases = append(phases, p.Phase)
			}
		})
		t.Logf("Migrate = %v; phases %v", err, phases)
		if to := timeoutOf(t, "a retry taking over a migration that does not converge", err); to.Timeout != hypervisor.TimeoutProgress {
			t.Errorf("a retry taking over a migration that does not converge: %+v, want the progress timeout", *to)
		}
		if len(phases) == 0 || phases[0] != PhaseWaiting {
			t.Errorf("a retry taking over a migration went through phases %v, want them to start %s", phases, PhaseWaiting)
		}
		if err := <-earlier; err == nil {
			t.Errorf("the earlier attempt's migration call = nil after the retry aborted it")
		}
		stayed(t, g, pid)

		// The claim the move acts for goes while the retry follows it:
		// the next poll's fence aborts it.
		earlier = e.startEarlier(t, g, req.DestXML, busyCapMiBs)
		req.Policy = hypervisor.MigrationPolicy{}
		req.Fence = func(context.Context) error { return errClaimGone }
		err = e.d.Migrate(opContext(t), req, nil)
		t.Logf("Migrate = %v", err)
		if !errors.Is(err, hypervisor.ErrFenced) || !errors.Is(err, errClaimGone) {
			t.Errorf("a retry taking over a migration whose claim is gone = %v; want ErrFenced with the fence's error", err)
		}
		if err := <-earlier; err == nil {
			t.Errorf("the earlier attempt's migration call = nil after the fence aborted it")
		}
		stayed(t, g, pid)
	})

	t.Run("auto-converge slows the guest down until its migration converges", func(t *testing.T) {
		g := busyGuest(t, 34)
		req, _ := start(t, g, hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: 3 * time.Minute, BandwidthMiBs: busyCapMiBs, AllowAutoConverge: true})
		w := e.watchJob(t, g)
		err := e.d.Migrate(opContext(t), req, nil)
		throttle, _ := w.seen()
		t.Logf("Migrate = %v; auto-converge throttle up to %d%%", err, throttle)
		if err != nil {
			t.Fatalf("Migrate with auto-converge = %v, want nil", err)
		}
		if throttle == 0 {
			t.Errorf("Migrate with auto-converge: libvirt never reported the guest throttled")
		}
		e.runsOn(t, "dst", g, destPins, destEmulator)
	})

	t.Run("a longer max downtime lets the busy guest switch over", func(t *testing.T) {
		g := busyGuest(t, 35)
		// The 8 MiB region takes 2s at the cap.
		req, _ := start(t, g, hypervisor.MigrationPolicy{CompletionTimeoutPerGiB: time.Minute, BandwidthMiBs: busyCapMiBs, MaxDowntime: 5 * time.Second})
		w := e.watchJob(t, g)
		err := e.d.Migrate(opContext(t), req, nil)
		_, downtime := w.seen()
		t.Logf("Migrate = %v; downtime limit %dms", err, downtime)
		if err != nil {
			t.Fatalf("Migrate with a max downtime of 5s = %v, want nil", err)
		}
		if downtime != 5000 {
			t.Errorf("Migrate with a max downtime of 5s: the job's downtime limit was %dms, want 5000", downtime)
		}
		e.runsOn(t, "dst", g, destPins, destEmulator)
	})
}
