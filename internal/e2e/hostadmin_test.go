package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
)

// TestHostChangesAreOperations: every change of a host (add, disable,
// enable, down, up, remove) is a run that `pinflow ops --host` lists,
// a removed host's included, and a change the ledger refuses is a failed
// run saying why. Changes refused before they start (an unknown host, a
// bad reason, the disable of a down host) and those refused while
// another change of the host runs start nothing, and no refusal changes
// any host.
func TestHostChangesAreOperations(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	for _, h := range []string{"a", "b", "c"} {
		s.ok("host", "add", h, "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	}
	s.boot("A", "a", 2)
	vmB := s.boot("B", "b", 2)
	s.ok("host", "disable", "a", "--reason", "bios update")
	s.ok("host", "enable", "a")
	s.ok("sim", "power", "--host", "b", "--off")
	s.ok("host", "down", "b", "--fence", "--reason", "power supply failed")

	state := func() string {
		var hosts []json.RawMessage
		s.jsonOf(&hosts, "host", "list")
		out, _ := json.Marshal(hosts)
		return string(out)
	}
	before := state()
	s.refused(`unknown host "nowhere"; registered hosts are a, b, c`, "host", "disable", "nowhere", "--reason", "x")
	s.refused(`reason "two\nlines": invalid input: reasons are 1-200 printable characters`, "host", "disable", "a", "--reason", "two\nlines")
	s.refused("host disable b: the host is down; only an up host is disabled", "host", "disable", "b", "--reason", "x")
	s.refused("; evacuate, migrate or delete them first", "host", "remove", "a")
	if after := state(); after != before {
		t.Errorf("the refused host changes changed the hosts:\nbefore %s\nafter  %s", before, after)
	}

	// b comes back while its leftover of B is held at the simulator's
	// stop: every other change of b is refused meanwhile, naming it. The
	// worker is killed there, so that the held stop's own deadline cannot
	// end the host up before the refusals are done, however slow they are.
	s.ok("evacuate", vmB, "--host", "a", "--wait")
	s.ok("sim", "power", "--host", "b", "--on")
	s.ok("sim", "gate", "--at", "stop", "--guest", vmB, "--hold")
	s.ok("host", "up", "b")
	s.ok("sim", "gate", "--at", "stop", "--guest", vmB, "--wait-arrived", "1")
	s.killWorkers()
	returning := state()
	s.refused("host down b: it is coming back already (workflow host-b)", "host", "down", "b", "--fence", "--reason", "again")
	s.refused("host remove b: it is coming back already (workflow host-b)", "host", "remove", "b")
	s.refused("host up b: it is coming back already (workflow host-b)", "host", "up", "b")
	if after := state(); after != returning {
		t.Errorf("the changes refused while b came back changed the hosts:\nbefore %s\nafter  %s", returning, after)
	}
	s.startWorker()
	s.ok("sim", "gate", "--at", "stop", "--guest", vmB, "--release")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.tc.GetWorkflow(ctx, api.HostWorkflowID("b"), "").Get(ctx, nil); err != nil {
		t.Fatalf("host up b: %v", err)
	}
	if out := s.ok("host", "remove", "c"); !strings.Contains(out, "host c removed, with 0 tombstones") {
		t.Errorf("host remove c printed %q, want it removed", out)
	}

	// Each host's own runs, as operation/status, oldest first; the ops
	// list lags a little behind the runs. The removal of a, which holds
	// guests, was refused before it started.
	want := map[string][]string{
		"a": {"host-add/completed", "host-disable/completed", "host-enable/completed"},
		"b": {"host-add/completed", "host-down/completed", "host-up/completed"},
		"c": {"host-add/completed", "host-remove/completed"},
	}
	for _, host := range []string{"a", "b", "c"} {
		var recs []client.Record
		s.eventually("the changes of "+host+" in ops --host "+host, 2*time.Minute, func() bool {
			s.jsonOf(&recs, "ops", "--host", host)
			return slices.Equal(hostRuns(recs), want[host])
		})
		for _, r := range recs {
			if r.Operation == api.OpHostRemove && r.Status == "failed" && !strings.Contains(r.Reason, "evacuate, migrate or delete") {
				t.Errorf("ops --host %s: the refused removal's reason is %q, want the ledger's refusal", host, r.Reason)
			}
			if strings.HasPrefix(string(r.Operation), "host-") && r.Source != host {
				t.Errorf("ops --host %s: %s has source host %q, want %s", host, r.Operation, r.Source, host)
			}
		}
	}
	if out := s.ok("ops", "--host", "c"); !strings.Contains(out, "host-remove") {
		t.Errorf("ops --host c after c's removal printed %q, want its removal listed", out)
	}
	s.refused(`unknown host "nowhere"`, "ops", "--host", "nowhere")
}

// hostRuns are the runs of host changes among recs, as operation/status,
// oldest first.
func hostRuns(recs []client.Record) []string {
	var out []string
	for i := len(recs) - 1; i >= 0; i-- {
		if r := recs[i]; strings.HasPrefix(string(r.Operation), "host-") {
			out = append(out, fmt.Sprintf("%s/%s", r.Operation, r.Status))
		}
	}
	return out
}
