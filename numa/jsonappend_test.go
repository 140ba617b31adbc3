package numa

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
	"time"
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

func TestAppendJSONStringAndTime(t *testing.T) {
	for _, s := range []string{"", "plain-id_1.2:3/4@5+6=7", `quote"back\slash`, "<tag>&amp;", "tab\tnl\n", "é ü \u2028", "\xff bad utf-8"} {
		want, _ := json.Marshal(s)
		if got := AppendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Errorf("AppendJSONString(%q) = %s, want %s", s, got, want)
		}
	}
	for _, tm := range []time.Time{time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC), time.Date(2026, 1, 2, 3, 4, 5, 600700800, time.UTC), time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600)), {}} {
		want, _ := json.Marshal(tm)
		if got := AppendJSONTime(nil, tm); !bytes.Equal(got, want) {
			t.Errorf("AppendJSONTime(%v) = %s, want %s", tm, got, want)
		}
	}
}

func TestCPUSetStringRanges(t *testing.T) {
	for _, s := range []string{"", "0", "0-3", "0-3,8", "1,3,5", "0-63,64-127,130", "63-64", "5,7-9,200"} {
		c, err := Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		var want []byte
		ids := c.List()
		for i := 0; i < len(ids); {
			j := i
			for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
				j++
			}
			if len(want) > 0 {
				want = append(want, ',')
			}
			want = strconv.AppendInt(want, int64(ids[i]), 10)
			if j > i {
				want = append(append(want, '-'), strconv.Itoa(ids[j])...)
			}
			i = j + 1
		}
		if got := c.String(); got != string(want) {
			t.Errorf("Parse(%q).String() = %q, want %q", s, got, want)
		}
	}
}
