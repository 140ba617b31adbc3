package e2e

import (
	"fmt"
	"strings"
	"testing"
)

// hostUsage is the host-level usage `host show --json` prints.
type hostUsage struct {
	MemoryUsedMB  int64 `json:"memory_used_mb"`
	MemoryLimitMB int64 `json:"memory_limit_mb"`
	VCPUUsage     int   `json:"vcpu_usage"`
	VCPULimit     int64 `json:"vcpu_limit"`
}

func (s *stack) hostUsage(name string) hostUsage {
	s.t.Helper()
	var h struct {
		Usage hostUsage `json:"host_usage"`
	}
	s.jsonOf(&h, "host", "show", name)
	return h.Usage
}

// TestGuestsWithoutNUMATakeTheirHost boots and resizes guests without a
// NUMA topology, which take no cell's resources: a guest larger than any
// host is refused, and one that fits counts on its host's memory and
// shared vCPUs, beside pinned guests, through a resize's hold and confirm,
// a live migration, a shelve-offload and unshelve, an evacuation and a
// drain.
func TestGuestsWithoutNUMATakeTheirHost(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4", "--memory-mb", "8192", "--shared", "0-1", "--dedicated", "2-3")
	s.ok("host", "add", "b", "--cells", "1", "--cores", "4", "--memory-mb", "8192", "--shared", "0-1", "--dedicated", "2-3")
	s.refused("host memory usage would be", "boot", "--name", "huge", "--vcpus", "2", "--memory-mb", "99999999999", "--wait")

	var f struct {
		UUID string `json:"uuid"`
	}
	s.jsonOf(&f, "boot", "--name", "F", "--host", "a", "--vcpus", "2", "--memory-mb", "4096", "--wait")
	want := func(host string, mem int64, vcpus int, when string) {
		t.Helper()
		if got := s.hostUsage(host); got.MemoryUsedMB != mem || got.VCPUUsage != vcpus {
			t.Errorf("%s: host %s usage %+v, want %d MiB and %d shared vCPUs", when, host, got, mem, vcpus)
		}
	}
	want("a", 4096, 2, "F booted")
	// A pinned guest may take the cell's memory only as far as the host
	// has any left beside F.
	s.refused("no fit", "boot", "--name", "P", "--host", "a", "--vcpus", "1", "--memory-mb", "6144", "--spec", "hw:cpu_policy=dedicated", "--wait")
	s.boot("P", "a", 1)
	want("a", 5120, 2, "pinned P booted beside F")

	s.ok("resize", f.UUID, "--vcpus", "3", "--memory-mb", "6144", "--host", "b", "--confirm-window", "never")
	s.waitResized(f.UUID)
	want("a", 5120, 2, "F's source hold")
	want("b", 6144, 3, "F resized")
	s.ok("check")
	s.ok("resize", "confirm", f.UUID, "--wait")
	want("a", 1024, 0, "F's hold released")
	want("b", 6144, 3, "F confirmed")
	s.ok("check")
	if out := s.ok("host", "list"); !strings.Contains(out, fmt.Sprintf("host  mem %d/%d MiB, shared vCPUs %d/%d", 6144, 8192, 3, 8)) {
		t.Errorf("host list does not show b's host-level usage:\n%s", out)
	}

	// Every move carries it: a live migration, a shelve-offload and an
	// unshelve, and an evacuation, whose tombstone keeps it on the fenced
	// host until the host is back.
	s.ok("migrate", f.UUID, "--dest", "a", "--wait")
	want("a", 7168, 3, "F migrated to a")
	want("b", 0, 0, "F migrated away")
	s.ok("shelve", f.UUID, "--offload", "--wait")
	want("a", 1024, 0, "F offloaded")
	s.ok("unshelve", f.UUID, "--host", "b", "--wait")
	want("b", 6144, 3, "F unshelved on b")
	s.ok("sim", "power", "--host", "b", "--off")
	s.ok("host", "down", "b", "--fence", "--reason", "power supply failed")
	s.ok("evacuate", f.UUID, "--host", "a", "--wait")
	want("a", 7168, 3, "F evacuated to a")
	want("b", 6144, 3, "F's tombstone on the fenced b")
	s.ok("check")
	s.ok("sim", "power", "--host", "b", "--on")
	s.ok("host", "up", "b", "--wait")
	want("b", 0, 0, "b back up")
	s.ok("check")
	s.ok("host", "drain", "a", "--wait")
	want("a", 0, 0, "a drained")
	want("b", 7168, 3, "F and P drained to b")
	s.ok("check")

	s.refused("--cpu-allocation-ratio 0", "host", "add", "c", "--cells", "1", "--cores", "2", "--cpu-allocation-ratio", "0")
	s.ok("host", "add", "c", "--cells", "1", "--cores", "3", "--memory-mb", "4096", "--ram-allocation-ratio", "1.5", "--reserved-host-memory-mb", "1024",
		"--shared", "0-1", "--dedicated", "2")
	if got := s.hostUsage("c"); got.MemoryLimitMB != 5120 || got.VCPULimit != 8 {
		t.Errorf("host c limits %+v, want 4096×1.5−1024 = 5120 MiB and 2 shared CPUs × 4 = 8 vCPUs", got)
	}
	// A host given neither set keeps every CPU for pinned guests: none
	// floats over them.
	s.ok("host", "add", "d", "--cells", "1", "--cores", "2", "--memory-mb", "4096")
	if got := s.hostUsage("d"); got.VCPULimit != 0 {
		t.Errorf("host d limits %+v, want no shared vCPUs on a host without shared CPUs", got)
	}
	s.refused("has no shared CPUs", "boot", "--name", "G", "--host", "d", "--vcpus", "1", "--memory-mb", "512", "--wait")
}

// TestConcurrentBootsNeverOvercommit starts, all at once from separate
// CLI processes, more guests without a NUMA topology than host a has
// memory and shared vCPUs for, pinned guests beside them, and a resize
// onto a whose source hold stays on b until its confirm window ends. Some
// boots must be refused for want of room; whatever the interleaving, a
// never holds more than its limits, the guests that run there add up to
// what its ledger counts, and every ledger checks out.
func TestConcurrentBootsNeverOvercommit(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4", "--memory-mb", "8192", "--shared", "0-1", "--dedicated", "2-3")
	s.ok("host", "add", "b", "--cells", "1", "--cores", "4", "--memory-mb", "8192", "--shared", "0-1", "--dedicated", "2-3")
	var m struct {
		UUID string `json:"uuid"`
	}
	s.jsonOf(&m, "boot", "--name", "mover", "--host", "b", "--vcpus", "2", "--memory-mb", "2048", "--wait")

	type result struct {
		what string
		code int
		err  string
	}
	var cmds [][]string
	for i := range 8 { // 8 × 1536 MiB and 8 × 3 vCPUs: more than a has
		cmds = append(cmds, []string{"boot", "--name", fmt.Sprintf("float%d", i), "--host", "a", "--vcpus", "3", "--memory-mb", "1536", "--wait"})
	}
	for i := range 3 {
		cmds = append(cmds, []string{"boot", "--name", fmt.Sprintf("pinned%d", i), "--host", "a", "--vcpus", "1", "--memory-mb", "512",
			"--spec", "hw:cpu_policy=dedicated", "--wait"})
	}
	cmds = append(cmds, []string{"resize", m.UUID, "--vcpus", "3", "--memory-mb", "3072", "--host", "a", "--confirm-window", "2s", "--wait"})
	results := make(chan result, len(cmds))
	for _, args := range cmds {
		go func() {
			_, errOut, code := s.run(args...)
			results <- result{what: strings.Join(args, " "), code: code, err: errOut}
		}()
	}
	refused := 0
	for range cmds {
		r := <-results
		if r.code == 0 {
			continue
		}
		refused++
		if !strings.Contains(r.err, "host memory") && !strings.Contains(r.err, "host vCPU") &&
			!strings.Contains(r.err, "no fit") && !strings.Contains(r.err, "no room") {
			t.Errorf("pinflow %s: exit %d for another reason than room: %s", r.what, r.code, r.err)
		}
	}
	if refused == 0 {
		t.Errorf("every boot went through, though a cannot hold them all")
	}
	// A resize that went through waits in VERIFY_RESIZE until its window
	// confirms it; a refused one leaves nothing to follow.
	s.run("follow", m.UUID)

	for _, h := range []string{"a", "b"} {
		u := s.hostUsage(h)
		if u.MemoryUsedMB > u.MemoryLimitMB || int64(u.VCPUUsage) > u.VCPULimit {
			t.Errorf("host %s holds more than its limits: %+v", h, u)
		}
		var mem int64
		var vcpus int
		var rows []listed
		s.jsonOf(&rows, "list", "--host", h)
		for _, r := range rows {
			if r.VMState != "active" {
				continue
			}
			mem += r.Flavor.MemoryMB
			if r.Flavor.ExtraSpecs["hw:cpu_policy"] != "dedicated" {
				vcpus += r.Flavor.VCPUs
			}
		}
		if mem != u.MemoryUsedMB || vcpus != u.VCPUUsage {
			t.Errorf("host %s: its active guests take %d MiB and %d shared vCPUs, its ledger counts %+v", h, mem, vcpus, u)
		}
	}
	s.noDoublePins("a", "b")
	s.ok("check")
}
