package numa

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
)

// reflectedPlacement is the placement's wire form built as a struct, for
// encoding/json to write: what the hand-written encoder must reproduce.
func reflectedPlacement(p Placement) placementJSON {
	out := placementJSON{
		EmulatorPolicy:   strOrNil(string(p.EmulatorPolicy)),
		Cells:            make([]cellJSON, len(p.Cells)),
		RealtimeVCPUs:    listOrNil(p.RealtimeVCPUs),
		RealtimePriority: p.RealtimePriority,
		HostSharedSet:    listOrNil(p.HostSharedSet),
	}
	for i, c := range p.Cells {
		pins := make(map[string]int, len(c.Pins))
		for v, pc := range c.Pins {
			pins[strconv.Itoa(v)] = pc
		}
		if c.Pins == nil {
			pins = nil
		}
		cj := cellJSON{
			GuestCell: c.GuestCell, HostCell: c.HostCell,
			CPUSet: c.SharedVCPUs.List(), PCPUSet: c.DedicatedVCPUs.List(),
			MemoryMB: c.MemoryMB, CPUPinning: pins, PinnedPCPUs: c.PinnedPCPUs().List(),
			Reserved:  listOrNil(c.Reserved),
			CPUPolicy: strOrNil(string(c.CPUPolicy)), ThreadPolicy: strOrNil(string(c.ThreadPolicy)),
			HostCPUs: listOrNil(c.HostCPUs),
		}
		if c.PageSizeKB != 0 {
			ps := c.PageSizeKB
			cj.PageSize = &ps
		}
		out.Cells[i] = cj
	}
	return out
}

// TestAppendJSONMatchesEncodingJSON writes every placement and usage that
// the shipped cases produce both ways: byte for byte the same.
func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	n := 0
	for _, family := range []string{"anchors", "core-seed1", "core-seed2", "core-seed3", "core-seed4", "big-seed5", "small-seed6", "perm", "quirks"} {
		cases, _ := loadFamily(t, family)
		for i := range cases {
			c := &cases[i]
			host, err := c.Host.Host(c.Limits)
			if err != nil {
				continue
			}
			req, err := c.Instance.Request()
			if err != nil {
				continue
			}
			p, err := Fit(host, req)
			if err != nil {
				continue
			}
			n++
			want, err := json.Marshal(reflectedPlacement(*p))
			if err != nil {
				t.Fatal(err)
			}
			if got := p.AppendJSON(nil); !bytes.Equal(got, want) {
				t.Fatalf("%s case %s: AppendJSON =\n%s\nencoding/json =\n%s", family, c.ID, got, want)
			}
			us, err := Usage(host, p)
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range us {
				want, err := json.Marshal(u) // by reflection: CellUsage has no MarshalJSON
				if err != nil {
					t.Fatal(err)
				}
				if got := u.AppendJSON(nil); !bytes.Equal(got, want) {
					t.Fatalf("%s case %s: usage AppendJSON =\n%s\nencoding/json =\n%s", family, c.ID, got, want)
				}
			}
		}
	}
	if n < 500 {
		t.Fatalf("only %d cases fitted; the test needs many placements", n)
	}
}

// TestCPUSetStringRanges: String writes each run of consecutive CPUs as
// lo-hi and a lone CPU as itself, ascending, across the 64-bit words the
// set is stored in.
func TestCPUSetStringRanges(t *testing.T) {
	// seq is lo, lo+1, ..., hi.
	seq := func(lo, hi int) []int {
		var out []int
		for id := lo; id <= hi; id++ {
			out = append(out, id)
		}
		return out
	}
	tests := []struct {
		name string
		ids  []int
		want string
	}{
		{"empty", nil, ""},
		{"cpu 0", []int{0}, "0"},
		{"last cpu", []int{MaxCPU}, "8191"},
		{"two adjacent", []int{4, 5}, "4-5"},
		{"two apart", []int{1, 3}, "1,3"},
		{"one run", seq(0, 3), "0-3"},
		{"run then single", []int{0, 1, 2, 3, 8}, "0-3,8"},
		{"singles", []int{5, 3, 1}, "1,3,5"},
		{"run across a word boundary", []int{63, 64}, "63-64"},
		{"run ending at a word's end", []int{62, 63, 65}, "62-63,65"},
		{"two full words and one more", append(seq(0, 127), 130), "0-127,130"},
		{"empty word between runs", []int{0, 1, 128, 129}, "0-1,128-129"},
		{"mixed", []int{200, 9, 8, 7, 5}, "5,7-9,200"},
		{"first and last", []int{0, MaxCPU}, "0,8191"},
		{"last two", []int{8190, 8191}, "8190-8191"},
		{"every cpu", seq(0, MaxCPU), "0-8191"},
	}
	for _, tt := range tests {
		if got := NewCPUSet(tt.ids...).String(); got != tt.want {
			t.Errorf("NewCPUSet(%s).String() = %q, want %q", tt.name, got, tt.want)
		}
	}
}
