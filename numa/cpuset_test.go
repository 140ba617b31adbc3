package numa

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"single", "3", "3"},
		{"range", "0-3", "0-3"},
		{"list", "0-3,8,10-11", "0-3,8,10-11"},
		{"exclusion", "0-5,^2", "0-1,3-5"},
		{"exclusion range", "0-7,^2-3", "0-1,4-7"},
		{"exclusion first", "^2,0-3", "0-1,3"},
		{"only exclusion", "^2", ""},
		{"unsorted and overlapping", "8,0-3,2-4", "0-4,8"},
		{"blanks and empty elements", " 1 , ,2- 3,", "1-3"},
		{"merges adjacent", "0,1,2,4", "0-2,4"},
		{"high ids", "8190-8191", "8190-8191"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			if got.String() != tt.want {
				t.Errorf("Parse(%q) = %q, want %q", tt.in, got, tt.want)
			}
			again, err := Parse(got.String())
			if err != nil || !again.Equal(got) {
				t.Errorf("Parse(%q).String() = %q does not parse back to the same set", tt.in, got)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{"a", "1-", "-1", "3-1", "1-2-3", "^", "8192", "0-99999999", "1.5", "+1", "0x10"} {
		got, err := Parse(in)
		if err == nil {
			t.Errorf("Parse(%q) = %q, want an error", in, got)
			continue
		}
		if !strings.Contains(err.Error(), in) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Parse(%q) error %q should be one line naming the input", in, err)
		}
	}
}

func TestCPUSetOperations(t *testing.T) {
	a, b := MustParse("0-5,64,130"), MustParse("4-9,130")
	checks := []struct {
		name string
		got  CPUSet
		want string
	}{
		{"Union", a.Union(b), "0-9,64,130"},
		{"Intersection", a.Intersection(b), "4-5,130"},
		{"Difference", a.Difference(b), "0-3,64"},
		{"Difference to empty", b.Difference(b), ""},
	}
	for _, c := range checks {
		if c.got.String() != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	if a.Len() != 8 || a.Min() != 0 || a.Max() != 130 || !a.Contains(64) || a.Contains(63) || a.Contains(-1) {
		t.Errorf("Len/Min/Max/Contains of %q are wrong", a)
	}
	if !MustParse("4-5").IsSubsetOf(a) || b.IsSubsetOf(a) || !a.Intersects(b) || a.Intersects(MustParse("200")) {
		t.Errorf("IsSubsetOf/Intersects wrong for %q and %q", a, b)
	}
	if !b.Difference(b).Equal(CPUSet{}) || !(CPUSet{}).IsEmpty() || (CPUSet{}).Min() != -1 {
		t.Errorf("empty sets must be equal to the zero CPUSet")
	}
}

func TestCPUSetJSON(t *testing.T) {
	var s CPUSet
	if err := json.Unmarshal([]byte(`"0-3,^1"`), &s); err != nil || s.String() != "0,2-3" {
		t.Errorf(`Unmarshal("0-3,^1") = %q, %v`, s, err)
	}
	if err := json.Unmarshal([]byte(`[5,1,2]`), &s); err != nil || s.String() != "1-2,5" {
		t.Errorf(`Unmarshal([5,1,2]) = %q, %v`, s, err)
	}
	for _, bad := range []string{`[-1]`, `"x"`, `{}`, `[9000]`} {
		if err := json.Unmarshal([]byte(bad), &s); err == nil {
			t.Errorf("Unmarshal(%s) succeeded, want an error", bad)
		}
	}
	out, _ := json.Marshal(MustParse("1-3,7"))
	if string(out) != `"1-3,7"` {
		t.Errorf("Marshal = %s, want \"1-3,7\"", out)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"0-3,8,10-11", "^2", "0-5,^2-3", "", " 1 , 2", "3-1", "8191"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		set, err := Parse(in)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("Parse(%q) error has a newline: %q", in, err)
			}
			return
		}
		out := set.String()
		again, err := Parse(out)
		if err != nil || !again.Equal(set) || again.String() != out {
			t.Fatalf("Parse(%q) = %q does not round-trip: %q, %v", in, out, again, err)
		}
		if set.Len() != len(set.List()) {
			t.Fatalf("Parse(%q): Len %d but List has %d", in, set.Len(), len(set.List()))
		}
	})
}

func TestWithWithout(t *testing.T) {
	for _, tc := range []struct {
		set     string
		with    []int
		without []int
		want    string
	}{
		{"", []int{3}, nil, "3"},
		{"0-3", []int{64, 130}, []int{1}, "0,2-3,64,130"},
		{"0-3,64", nil, []int{64, 999}, "0-3"},
		{"5", []int{5}, []int{5}, ""},
	} {
		c, err := Parse(tc.set)
		if err != nil {
			t.Fatal(err)
		}
		got := c.With(tc.with...).Without(tc.without...)
		if got.String() != tc.want {
			t.Errorf("%q.With(%v).Without(%v) = %q, want %q", tc.set, tc.with, tc.without, got, tc.want)
		}
		if want, _ := Parse(tc.want); !got.Equal(want) {
			t.Errorf("%q.With(%v).Without(%v) is not equal to Parse(%q)", tc.set, tc.with, tc.without, tc.want)
		}
		if c.String() != func() string { d, _ := Parse(tc.set); return d.String() }() {
			t.Errorf("With/Without changed their receiver %q", tc.set)
		}
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
