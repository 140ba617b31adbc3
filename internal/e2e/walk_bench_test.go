package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkFleetWalk times every command that walks the whole fleet on
// 100,000 simulated hosts (PINFLOW_BENCH_WALK_HOSTS) with a guest on
// each, through the pinflow CLI and the real worker on a dev server: host
// list (text and JSON), list, check, a drain plan, and the audit
// (reconcile --wait). For each it prints the wall time, the CLI's peak
// resident memory and the size of what it printed, and the same for the
// CLI at PINFLOW_BENCH_WALK_BASELINE when set (a build of another commit),
// on the same fleet.
func BenchmarkFleetWalk(b *testing.B) {
	hosts := 100_000
	if v := os.Getenv("PINFLOW_BENCH_WALK_HOSTS"); v != "" {
		fmt.Sscan(v, &hosts)
	}
	s := newStack(b)
	_, names := seedFleet(b, s, "walk-%06d", hosts, 1, func(string, int) {})

	for _, args := range [][]string{
		{"host", "list"},
		{"host", "list", "--json"},
		{"list"},
		{"list", "--json"},
		{"check"},
		{"host", "plan-drain", names[hosts/2]},
		{"reconcile", "--wait"},
	} {
		clis := []string{s.cli}
		if baseline := os.Getenv("PINFLOW_BENCH_WALK_BASELINE"); baseline != "" {
			clis = append(clis, baseline)
		}
		for i, cli := range clis {
			cmd := exec.Command(cli, args...)
			cmd.Env = s.env
			var out countingWriter
			cmd.Stdout = &out
			t0 := time.Now()
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			// The child's rusage would count this process's memory at the
			// fork, so its own high-water mark is sampled while it runs.
			var peak atomic.Int64
			done := make(chan struct{})
			go func() {
				for {
					select {
					case <-done:
						return
					case <-time.After(10 * time.Millisecond):
						peak.Store(max(peak.Load(), residentHighWater(cmd.Process.Pid)))
					}
				}
			}()
			err := cmd.Wait()
			close(done)
			if err != nil {
				b.Fatalf("%s %v: %v", cli, args, err)
			}
			took := time.Since(t0)
			rss := peak.Load() // KiB
			which := "this build"
			if i > 0 {
				which = "baseline"
			}
			fmt.Printf("pinflow %-30s %-10s %8s, peak RSS %5d MiB, printed %6.1f MiB\n", fmt.Sprint(args), which,
				took.Round(10*time.Millisecond), rss/1024, float64(out.n)/(1<<20))
		}
	}
}

// residentHighWater is the peak resident memory of process pid in KiB
// (VmHWM), 0 once it is gone.
func residentHighWater(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb
		}
	}
	return 0
}

// countingWriter counts the bytes written to it and keeps none.
type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}
