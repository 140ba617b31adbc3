package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

func TestCheckListState(t *testing.T) {
	for _, s := range []string{"active", "shelved_offloaded", "resized", "migrating", "resize_finish"} {
		if err := checkListState(s); err != nil {
			t.Errorf("checkListState(%q) = %v, want nil", s, err)
		}
	}
	for _, s := range []string{"running", "ACTIVE", " active", "none"} {
		err := checkListState(s)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		for _, want := range []string{`--state "` + s + `"`, "vm states building, active,", "task states spawning,", "rebuilding"} {
			if !strings.Contains(msg, want) {
				t.Errorf("checkListState(%q) = %q, want it to name %q", s, msg, want)
			}
		}
		if strings.Contains(msg, "\n") {
			t.Errorf("checkListState(%q) = %q, want one line", s, msg)
		}
	}
}

func TestSortRows(t *testing.T) {
	host := func(s string) *string { return &s }
	rows := []listRow{
		{UUID: "u1", Name: "web"},
		{UUID: "u2", Name: "db", Host: host("b")},
		{UUID: "u3", Name: "web", Host: host("a")},
		{UUID: "u4", Name: "db", Host: host("a")},
		{UUID: "u0", Name: "db", Host: host("a")},
		{UUID: "u5", Name: "api"},
	}
	sortRows(rows)
	var got []string
	for _, r := range rows {
		got = append(got, r.UUID)
	}
	want := []string{"u0", "u4", "u3", "u2", "u5", "u1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sortRows: order (-want +got):\n%s", diff)
	}
}

func TestNewListRow(t *testing.T) {
	in := &ledger.Instance{UUID: "u1", Name: "db", Host: "a", VMState: guest.VMActive, TaskState: guest.TaskMigrating, ClaimID: "c1",
		Request: guest.Flavor{VCPUs: 5, MemoryMB: 2048},
		Placement: &numa.Placement{Cells: []numa.PlacedCell{
			{HostCell: 0, Pins: map[int]int{0: 2, 1: 3}, Reserved: numa.NewCPUSet(8)},
			{HostCell: 1, Pins: map[int]int{2: 4, 3: 5, 4: 10}},
		}}}
	r := newListRow(in)
	if r.Pins != "2-5,8,10" || !cmp.Equal(r.PCPUs, []int{2, 3, 4, 5, 8, 10}) || deref(r.Host) != "a" || deref(r.TaskState) != "migrating" || r.VCPUs != 5 {
		t.Errorf("newListRow(%+v) = %+v, want pins 2-5,8,10 on a, migrating, 5 vCPUs", in, r)
	}
	off := newListRow(&ledger.Instance{UUID: "u2", Name: "shelved", VMState: guest.VMShelvedOffloaded})
	if off.Host != nil || off.TaskState != nil || off.Pins != "" || off.PCPUs == nil || len(off.PCPUs) != 0 {
		t.Errorf("newListRow(shelved) = %+v, want no host, no task, no pins and an empty pcpus list", off)
	}
}
