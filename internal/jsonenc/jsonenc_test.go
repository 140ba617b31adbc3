package jsonenc

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

func TestAppendStringAndTime(t *testing.T) {
	for _, s := range []string{"", "plain-id_1.2:3/4@5+6=7", `quote"back\slash`, "<tag>&amp;", "tab\tnl\n", "é ü \u2028", "\xff bad utf-8"} {
		want, _ := json.Marshal(s)
		if got := AppendString(nil, s); !bytes.Equal(got, want) {
			t.Errorf("AppendString(%q) = %s, want %s", s, got, want)
		}
	}
	for _, tm := range []time.Time{time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC), time.Date(2026, 1, 2, 3, 4, 5, 600700800, time.UTC), time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600)), {}} {
		want, _ := json.Marshal(tm)
		if got := AppendTime(nil, tm); !bytes.Equal(got, want) {
			t.Errorf("AppendTime(%v) = %s, want %s", tm, got, want)
		}
	}
}
