package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// listed is one row of `pinflow list --json`.
type listed struct {
	UUID      string  `json:"uuid"`
	Name      string  `json:"name"`
	Host      *string `json:"host"`
	VMState   string  `json:"vm_state"`
	TaskState *string `json:"task_state"`
	VCPUs     int     `json:"vcpus"`
	Pins      string  `json:"pins"`
	PCPUs     []int   `json:"pcpus"`
	ClaimID   string  `json:"claim_id"`
	Flavor    struct {
		VCPUs      int               `json:"vcpus"`
		MemoryMB   int64             `json:"memory_mb"`
		ExtraSpecs map[string]string `json:"extra_specs"`
	} `json:"flavor"`
}

// listRows runs `pinflow list ARGS`, checks its header and returns its
// rows, in order, each split into its columns.
func (s *stack) listRows(args ...string) [][]string {
	s.t.Helper()
	lines := strings.Split(strings.TrimSpace(s.ok(append([]string{"list"}, args...)...)), "\n")
	if len(lines) == 0 || strings.Join(strings.Fields(lines[0]), " ") != "UUID NAME HOST VM_STATE TASK_STATE VCPUS PINS GROUP" {
		s.t.Fatalf("pinflow list %s: header %q, want UUID NAME HOST VM_STATE TASK_STATE VCPUS PINS GROUP", strings.Join(args, " "), lines[0])
	}
	var rows [][]string
	for _, l := range lines[1:] {
		rows = append(rows, strings.Fields(l))
	}
	return rows
}

// TestList boots guests on two hosts, shelves one and lists them all, by
// host, by vm state and by task state, as text and as JSON.
func TestList(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "8", "--memory-mb", "8192")
	s.ok("host", "add", "b", "--cells", "1", "--cores", "8", "--memory-mb", "8192")
	db := s.boot("db", "b", 4)   // b 0-3
	web := s.boot("web", "a", 2) // a 0-1
	api := s.boot("api", "a", 3) // a 2-4
	old := s.boot("old", "b", 1) // b 4
	s.ok("shelve", old, "--offload", "--wait")

	want := [][]string{
		{api, "api", "a", "active", "-", "3", "2-4", "-"},
		{web, "web", "a", "active", "-", "2", "0-1", "-"},
		{db, "db", "b", "active", "-", "4", "0-3", "-"},
		{old, "old", "-", "shelved_offloaded", "-", "1", "-", "-"},
	}
	if diff := cmp.Diff(want, s.listRows()); diff != "" {
		t.Errorf("pinflow list (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want[:2], s.listRows("--host", "a")); diff != "" {
		t.Errorf("pinflow list --host a (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want[3:], s.listRows("--state", "shelved_offloaded")); diff != "" {
		t.Errorf("pinflow list --state shelved_offloaded (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want[:3], s.listRows("--state", "active")); diff != "" {
		t.Errorf("pinflow list --state active (-want +got):\n%s", diff)
	}
	if out := s.ok("list", "--host", "b", "--state", "stopped"); strings.TrimSpace(out) != "no guests on host b in state stopped" {
		t.Errorf("pinflow list --host b --state stopped = %q, want no guests", out)
	}

	var rows []listed
	s.jsonOf(&rows, "list")
	if len(rows) != 4 {
		t.Fatalf("pinflow list --json: %d rows, want 4", len(rows))
	}
	for i, r := range rows {
		g := s.guest(r.UUID)
		wantHost := hostOf(g)
		if r.UUID != want[i][0] || r.Name != g.Name || hostOf(shownGuest{Host: r.Host}) != wantHost || r.VMState != g.VMState || r.TaskState != nil ||
			r.Pins != g.pcpus() || cpuList(r.PCPUs) != g.pcpus() || r.VCPUs != r.Flavor.VCPUs || r.Flavor.MemoryMB != 1024 ||
			r.Flavor.ExtraSpecs["hw:cpu_policy"] != "dedicated" || (r.ClaimID != "") != (wantHost != "") {
			b, _ := json.Marshal(r)
			t.Errorf("pinflow list --json row %d = %s; want %s with show's host %q, state %s and pins %q", i, b, want[i][1], wantHost, g.VMState, g.pcpus())
		}
	}
	if rows[3].Host != nil || rows[3].PCPUs == nil || len(rows[3].PCPUs) != 0 {
		t.Errorf("pinflow list --json: the shelved guest has host %v, pcpus %v; want null and []", rows[3].Host, rows[3].PCPUs)
	}
	var onB []listed
	s.jsonOf(&onB, "list", "--host", "b")
	if len(onB) != 1 || onB[0].UUID != db {
		t.Errorf("pinflow list --host b --json = %+v, want db alone", onB)
	}

	// A task state filters too: web while it migrates.
	s.ok("sim", "gate", "--at", "switchover", "--hold")
	s.ok("migrate", web, "--dest", "b")
	s.ok("sim", "gate", "--at", "switchover", "--wait-arrived", "1")
	if rows := s.listRows("--state", "migrating"); len(rows) != 1 || rows[0][0] != web || rows[0][4] != "migrating" {
		t.Errorf("pinflow list --state migrating while web migrates = %v, want web alone", rows)
	}
	s.ok("sim", "gate", "--at", "switchover", "--release")
	s.eventually("web to land on b", 2*time.Minute, func() bool { return hostOf(s.guest(web)) == "b" && s.guest(web).TaskState == nil })
	if rows := s.listRows("--host", "b"); len(rows) != 2 || rows[0][1] != "db" || rows[1][1] != "web" {
		t.Errorf("pinflow list --host b after the migration = %v, want db then web", rows)
	}
}

// TestListBadInput: an unknown host or state, or an argument, is one line
// naming it and what is allowed, and a non-zero exit.
func TestListBadInput(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.ok("host", "add", "a", "--cells", "1", "--cores", "4", "--memory-mb", "8192")
	if out := s.ok("list"); strings.TrimSpace(out) != "no guests" {
		t.Errorf("pinflow list with no guests = %q, want \"no guests\"", out)
	}
	s.refused(`unknown host "nowhere"; registered hosts are a`, "list", "--host", "nowhere")
	line := s.refused(`--state "running" is not a state; allowed are the vm states building, active, stopped`, "list", "--state", "running")
	for _, want := range []string{"shelved_offloaded", "resized", "task states spawning, migrating", "rebuilding"} {
		if !strings.Contains(line, want) {
			t.Errorf("pinflow list --state running: %q, want it to name %q", line, want)
		}
	}
	s.refused("list takes no positional arguments", "list", "a")
	s.refused("unknown flag: --hots; 'pinflow list --help' lists the flags", "list", "--hots", "a")
}
