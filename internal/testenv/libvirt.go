package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Programs the libvirt helpers need; deploy/deps.sh installs them (Debian
// packages libvirt-daemon, libvirt-daemon-driver-qemu, qemu-system-x86 and
// libvirt-clients; unshare is in util-linux).
const (
	LibvirtdBin       = "libvirtd"
	LibvirtQEMUBin    = "qemu-system-x86_64"
	LibvirtVirshBin   = "virsh"
	LibvirtUnshareBin = "unshare"
)

// libvirtStopTimeout bounds deploy/libvirt-host.sh stop; it waits up to
// 10 s for the daemon and 10 s per guest itself.
const libvirtStopTimeout = 2 * time.Minute

// libvirtMaxSocketPath is the longest unix socket path sockaddr_un takes.
const libvirtMaxSocketPath = 107

// LibvirtHost is one libvirtd "host" started by deploy/libvirt-host.sh: a
// private daemon, in its own mount and UTS namespaces, whose whole state
// lives under Dir.
type LibvirtHost struct {
	// Name is the host's name and the daemon's hostname.
	Name string
	// Dir holds the daemon's configuration, state, logs and socket.
	Dir string
	// Socket is the daemon's unix socket.
	Socket string
	// URI reaches the daemon's QEMU driver:
	// "qemu+unix:///system?socket=<Socket>".
	URI string
}

// LibvirtHostScript returns the path of deploy/libvirt-host.sh in this
// source tree.
func LibvirtHostScript() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy", "libvirt-host.sh")
}

// RequireLibvirt checks that real libvirt hosts can run here: root, and
// libvirtd, QEMU, virsh and unshare installed. Otherwise the test is
// skipped, or fails under CI=true.
func RequireLibvirt(t testing.TB) {
	t.Helper()
	for _, bin := range []string{LibvirtdBin, LibvirtQEMUBin, LibvirtVirshBin, LibvirtUnshareBin} {
		RequireProgram(t, bin)
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("testenv: libvirt hosts need root (mount namespaces, QEMU as root); under CI=true a missing dependency fails the run")
		}
		t.Skipf("testenv: libvirt hosts need root (mount namespaces, QEMU as root); skipping")
	}
}

// StartLibvirtHost starts a libvirtd host called name in a new temporary
// directory and returns once its socket accepts connections. When the test
// ends it destroys the host's guests, stops the daemon and kills any QEMU
// process left behind, and then reports an error if one survived.
//
// The first connection to a fresh daemon probes QEMU's capabilities, which
// takes seconds; the cache from earlier hosts of this test binary is copied
// in, so only the first host pays for it.
func StartLibvirtHost(t testing.TB, name string) *LibvirtHost {
	t.Helper()
	RequireLibvirt(t)
	dir := filepath.Join(t.TempDir(), name)
	if len(dir)+len("/sock/libvirt-sock") > libvirtMaxSocketPath {
		// Long test names make long temporary paths; a unix socket path
		// must stay short.
		short, err := os.MkdirTemp("", "pinflow-lvh-")
		if err != nil {
			t.Fatalf("testenv: libvirt host %s: %v", name, err)
		}
		t.Cleanup(func() { os.RemoveAll(short) })
		dir = filepath.Join(short, name)
	}
	h := &LibvirtHost{Name: name, Dir: dir, Socket: filepath.Join(dir, "sock", "libvirt-sock")}
	if err := libvirtCaps.restore(dir); err != nil {
		t.Fatalf("testenv: libvirt host %s: seeding the QEMU capability cache: %v", name, err)
	}
	out, err := h.script("start")
	if err != nil {
		t.Fatalf("testenv: libvirt host %s: deploy/libvirt-host.sh start: %v\n%s", name, err, out)
	}
	h.URI = strings.TrimSpace(string(out))
	t.Cleanup(func() {
		libvirtCaps.save(dir)
		if t.Failed() {
			t.Logf("testenv: libvirt host %s: last lines of %s:\n%s", name, filepath.Join(dir, "libvirtd.log"), h.LogTail(40))
		}
		if out, err := h.script("stop"); err != nil {
			t.Errorf("testenv: libvirt host %s: deploy/libvirt-host.sh stop: %v\n%s", name, err, out)
		}
	})
	return h
}

// Restart stops the host, its guests included, and starts it again on the
// same directory, as a host reboot would: persistent domains stay defined,
// and clients must connect again.
func (h *LibvirtHost) Restart(t testing.TB) {
	t.Helper()
	if out, err := h.script("stop"); err != nil {
		t.Fatalf("testenv: libvirt host %s: deploy/libvirt-host.sh stop: %v\n%s", h.Name, err, out)
	}
	if out, err := h.script("start"); err != nil {
		t.Fatalf("testenv: libvirt host %s: deploy/libvirt-host.sh start: %v\n%s", h.Name, err, out)
	}
}

// script runs deploy/libvirt-host.sh cmd for the host and returns its
// combined output.
func (h *LibvirtHost) script(cmd string) ([]byte, error) {
	c := exec.Command("bash", LibvirtHostScript(), cmd, h.Name, h.Dir)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		return out.Bytes(), err
	case <-time.After(libvirtStopTimeout):
		c.Process.Kill()
		<-done
		return out.Bytes(), fmt.Errorf("timed out after %v", libvirtStopTimeout)
	}
}

// LogTail returns the last n lines of the daemon's log.
func (h *LibvirtHost) LogTail(n int) string {
	lines, err := lastLines(filepath.Join(h.Dir, "libvirtd.log"), n)
	if err != nil {
		return err.Error()
	}
	return strings.Join(lines, "\n")
}

// QEMUPid returns the pid of the QEMU process running the domain called
// domain, from the pid file libvirt keeps in the host's run directory.
func (h *LibvirtHost) QEMUPid(domain string) (int, error) {
	path := filepath.Join(h.Dir, "run", "qemu", domain+".pid")
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("testenv: libvirt host %s: qemu pid of %s: %w", h.Name, domain, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("testenv: libvirt host %s: %s holds %q, not a pid", h.Name, path, b)
	}
	return pid, nil
}

// libvirtVCPUThread matches the names QEMU gives its vCPU threads,
// "CPU 0/TCG" or "CPU 0/KVM".
var libvirtVCPUThread = regexp.MustCompile(`^CPU (\d+)/[A-Z]+$`)

// VCPUAffinity returns, for each vCPU of the running domain called domain,
// the host CPUs its QEMU thread may run on (Cpus_allowed_list, such as
// "0-1"), and the affinity of QEMU's main (emulator) thread.
func (h *LibvirtHost) VCPUAffinity(domain string) (vcpus map[int]string, emulator string, err error) {
	pid, err := h.QEMUPid(domain)
	if err != nil {
		return nil, "", err
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(tasks) == 0 {
		return nil, "", fmt.Errorf("testenv: libvirt host %s: qemu pid %d of %s has no threads", h.Name, pid, domain)
	}
	vcpus = map[int]string{}
	for _, task := range tasks {
		comm, err1 := os.ReadFile(filepath.Join(task, "comm"))
		status, err2 := os.ReadFile(filepath.Join(task, "status"))
		if err1 != nil || err2 != nil {
			continue // the thread ended while we looked
		}
		allowed := libvirtStatusField(string(status), "Cpus_allowed_list")
		if filepath.Base(task) == strconv.Itoa(pid) {
			emulator = allowed
		}
		if m := libvirtVCPUThread.FindStringSubmatch(strings.TrimSpace(string(comm))); m != nil {
			n, _ := strconv.Atoi(m[1])
			vcpus[n] = allowed
		}
	}
	return vcpus, emulator, nil
}

// libvirtStatusField returns the value of one "Key:\tvalue" line of a
// /proc status file.
func libvirtStatusField(status, key string) string {
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// libvirtCapsCache keeps the QEMU capability cache of the first host that
// probed QEMU, so later hosts of the same test binary start warm. libvirt
// checks each entry against the QEMU binary and the daemon and probes again
// when it does not match, so a stale copy costs time, never correctness.
type libvirtCapsCache struct {
	mu    sync.Mutex
	files map[string][]byte
}

var libvirtCaps libvirtCapsCache

// libvirtCapsDir is where libvirtd keeps the cache, relative to the host's
// directory (its /var/cache/libvirt).
const libvirtCapsDir = "cache/qemu/capabilities"

func (c *libvirtCapsCache) save(hostDir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.files) > 0 {
		return
	}
	paths, _ := filepath.Glob(filepath.Join(hostDir, libvirtCapsDir, "*.xml"))
	files := map[string][]byte{}
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
			files[filepath.Base(p)] = b
		}
	}
	c.files = files
}

func (c *libvirtCapsCache) restore(hostDir string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.files) == 0 {
		return nil
	}
	dir := filepath.Join(hostDir, libvirtCapsDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, b := range c.files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
