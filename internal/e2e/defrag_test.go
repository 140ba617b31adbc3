package e2e

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDefrag: a host fragmented by deletes cannot take a flavor that
// needs whole cores, and a boot of it says which defrag would help; the
// host's defrag plan names the re-pins that make the room,
// the defrag makes it, and the flavor then boots there. A flavor no plan
// makes room for, and bad flags, are refused, changing nothing.
func TestDefrag(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	// One cell of four cores of two threads: pCPUs 0-7, cores 0-1, 2-3,
	// 4-5 and 6-7.
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4", "--threads", "2", "--memory-mb", "16384")
	var uuids []string
	for _, name := range []string{"g0", "g1", "g2", "g3", "g4", "g5"} {
		uuids = append(uuids, s.boot(name, "a", 1))
	}
	// The fit spreads one-vCPU guests of thread policy prefer over the
	// cores (0, 2, 4, 6, then 1, 3), as Nova's does: deleting those on 1
	// and 3 leaves one thread of every core pinned, no whole core free.
	var kept []string
	for _, uuid := range uuids {
		if p := s.guest(uuid).pcpus(); p == "1" || p == "3" {
			s.ok("delete", uuid, "--wait")
		} else {
			kept = append(kept, p)
		}
	}
	if got := strings.Join(kept, " "); got != "0 2 4 6" {
		t.Fatalf("the guests left on a are pinned to %s, want 0 2 4 6", got)
	}
	require := []string{"--vcpus", "4", "--memory-mb", "1024", "--spec", "hw:cpu_policy=dedicated", "--spec", "hw:cpu_thread_policy=require"}
	boot := append([]string{"boot", "--name", "wide", "--host", "a", "--wait"}, require...)
	s.refused("require needs 4 vCPUs on cores with 2 or more free threads", boot...)
	// Left to choose, the boot is refused naming the defrag that helps.
	s.refused("host a would take it after a defrag of 2 re-pins and 0 migrations",
		append([]string{"boot", "--name", "wide", "--wait"}, require...)...)

	// Whole cores: two re-pins pack the four threads onto two cores.
	var plan struct {
		Repins []struct {
			UUID string `json:"uuid"`
			To   string `json:"to"`
		} `json:"repins"`
		After []struct {
			FreeCores int `json:"free_cores"`
		} `json:"after"`
		Fits bool `json:"fits"`
	}
	s.jsonOf(&plan, "host", "plan-defrag", "a")
	if len(plan.Repins) != 2 || plan.After[0].FreeCores != 2 {
		t.Errorf("plan without a flavor: %+v, want two re-pins leaving 2 whole cores", plan)
	}
	// For the flavor: the same two, after which it fits.
	out := s.ok(append([]string{"host", "plan-defrag", "a"}, require...)...)
	if !strings.Contains(out, "2 re-pins, 0 migrations") || !strings.Contains(out, "then it fits") {
		t.Errorf("plan-defrag for the flavor:\n%s", out)
	}
	before := s.ok("host", "show", "a")
	s.refused("no defragmentation makes room for the flavor", "host", "plan-defrag", "a", "--vcpus", "8", "--memory-mb", "1024",
		"--spec", "hw:cpu_policy=dedicated", "--spec", "hw:cpu_thread_policy=require")
	s.refused("no defragmentation of a makes room for 8 vCPUs", "host", "defrag", "a", "--vcpus", "8", "--memory-mb", "1024",
		"--spec", "hw:cpu_policy=dedicated", "--spec", "hw:cpu_thread_policy=require", "--wait")
	s.refused("--memory-mb without --vcpus", "host", "defrag", "a", "--memory-mb", "1024")
	s.refused("defrag parallel 0", "host", "defrag", "a", "--parallel", "0")
	s.refused("hw:cpu_thread_policy", "host", "plan-defrag", "a", "--vcpus", "2", "--memory-mb", "1024", "--spec", "hw:cpu_thread_policy=sometimes")
	if after := s.ok("host", "show", "a"); after != before {
		t.Errorf("a refused defrag changed host a:\n%s\nthen\n%s", before, after)
	}

	var res struct {
		Repins []struct {
			UUID  string `json:"uuid"`
			State string `json:"state"`
		} `json:"repins"`
		Failed int `json:"failed"`
	}
	s.jsonOf(&res, append([]string{"host", "defrag", "a", "--wait"}, require...)...)
	if len(res.Repins) != 2 || res.Repins[1].State != "repinned" || res.Failed != 0 {
		t.Fatalf("defrag: %+v, want two re-pins done", res)
	}
	s.ok("check")
	s.noDoublePins("a")
	var st struct {
		Done bool `json:"done"`
	}
	if err := json.Unmarshal([]byte(s.ok("host", "defrag", "status", "a", "--json")), &st); err != nil || !st.Done {
		t.Errorf("defrag status after it ended: done %v (%v)", st.Done, err)
	}
	s.ok(boot...)
	s.ok("check")
	s.noDoublePins("a")
	s.refused("no defrag of a is running", "host", "defrag", "pause", "a")
}
