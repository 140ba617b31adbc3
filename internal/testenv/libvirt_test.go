package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// libvirtTestGuest is a diskless TCG guest small enough for any machine.
const libvirtTestGuest = `<domain type='qemu'>
  <name>testenv-guest</name>
  <uuid>a1b2c3d4-0000-4000-8000-00000000e0e0</uuid>
  <memory unit='MiB'>64</memory>
  <vcpu placement='static'>1</vcpu>
  <cputune><vcpupin vcpu='0' cpuset='0'/><emulatorpin cpuset='0'/></cputune>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <memballoon model='none'/>
  </devices>
</domain>`

// libvirtAlive reports whether pid runs and is not a zombie.
func libvirtAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	return err == nil && !strings.Contains(string(b), "State:\tZ")
}

func TestStartLibvirtHostStopsDaemonAndGuests(t *testing.T) {
	var h *LibvirtHost
	var daemon, qemu int
	t.Run("host", func(t *testing.T) {
		h = StartLibvirtHost(t, "envhost")
		if want := "qemu+unix:///system?socket=" + h.Socket; h.URI != want {
			t.Errorf("StartLibvirtHost(envhost).URI = %q, want %q", h.URI, want)
		}
		if fi, err := os.Stat(h.Socket); err != nil || fi.Mode()&os.ModeSocket == 0 {
			t.Fatalf("StartLibvirtHost(envhost): socket %s: %v", h.Socket, err)
		}
		b, err := os.ReadFile(filepath.Join(h.Dir, "libvirtd.pid"))
		if err != nil {
			t.Fatal(err)
		}
		daemon, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		host, err := exec.Command(LibvirtVirshBin, "-c", h.URI, "hostname").CombinedOutput()
		if err != nil || strings.TrimSpace(string(host)) != "envhost" {
			t.Errorf("virsh hostname on envhost = %q, %v; want envhost (the daemon's own UTS namespace)", host, err)
		}
		xml := filepath.Join(t.TempDir(), "guest.xml")
		if err := os.WriteFile(xml, []byte(libvirtTestGuest), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(LibvirtVirshBin, "-c", h.URI, "create", xml).CombinedOutput(); err != nil {
			t.Fatalf("virsh create on envhost: %v\n%s", err, out)
		}
		if qemu, err = h.QEMUPid("testenv-guest"); err != nil {
			t.Fatal(err)
		}
		vcpus, emulator, err := h.VCPUAffinity("testenv-guest")
		if err != nil || vcpus[0] != "0" || emulator != "0" {
			t.Errorf("VCPUAffinity(testenv-guest) = %v, %q, %v; want vcpu 0 and the emulator on cpu 0", vcpus, emulator, err)
		}
	})
	if h == nil || daemon == 0 || qemu == 0 {
		t.Fatal("the host did not start")
	}
	// The subtest's cleanup has stopped the host.
	deadline := time.Now().Add(10 * time.Second)
	for (libvirtAlive(daemon) || libvirtAlive(qemu)) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if libvirtAlive(daemon) || libvirtAlive(qemu) {
		t.Errorf("after the test: libvirtd %d alive %v, qemu %d alive %v; want both gone", daemon, libvirtAlive(daemon), qemu, libvirtAlive(qemu))
	}
	if _, err := os.Stat(h.Socket); !os.IsNotExist(err) {
		t.Errorf("after the test: socket %s still exists (%v)", h.Socket, err)
	}
}

func TestLibvirtStatusField(t *testing.T) {
	status := "Name:\tCPU 0/TCG\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\n"
	for key, want := range map[string]string{"Cpus_allowed_list": "0-1", "Name": "CPU 0/TCG", "Missing": ""} {
		if got := libvirtStatusField(status, key); got != want {
			t.Errorf("libvirtStatusField(status, %q) = %q, want %q", key, got, want)
		}
	}
}
