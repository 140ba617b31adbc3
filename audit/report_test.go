package audit

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestReasonCounts(t *testing.T) {
	var rc ReasonCounts
	for _, r := range []string{"b", "a", "c", "a"} {
		rc.Add(r, 1)
	}
	want := ReasonCounts{{"a", 2}, {"b", 1}, {"c", 1}}
	if diff := cmp.Diff(want, rc); diff != "" {
		t.Errorf("ReasonCounts.Add(b, a, c, a) (-want +got):\n%s", diff)
	}
	if got := rc.Total(); got != 4 {
		t.Errorf("ReasonCounts.Total() = %d, want 4", got)
	}
}
