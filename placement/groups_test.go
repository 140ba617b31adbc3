package placement

import (
	"slices"
	"testing"

	"github.com/pinflow/pinflow/ledger"
)

func TestServerGroupNarrow(t *testing.T) {
	on := map[string][]string{"a": {"m1", "m2"}, "b": {"m3"}, "c": {"self"}}
	for _, tt := range []struct {
		name        string
		g           ServerGroup
		soft        bool
		wantExclude []string
		wantOnly    []string
	}{
		{"anti-affinity, 2 per host", ServerGroup{Policy: ledger.PolicyAntiAffinity, MaxPerHost: 2, On: on}, true, []string{"a"}, nil},
		{"anti-affinity, 1 per host: its own host does not count it", ServerGroup{Policy: ledger.PolicyAntiAffinity, MaxPerHost: 1, On: on}, true, []string{"a", "b"}, nil},
		{"affinity bound", ServerGroup{Policy: ledger.PolicyAffinity, Host: "b", On: on}, true, nil, []string{"b"}},
		{"affinity free", ServerGroup{Policy: ledger.PolicyAffinity}, true, nil, nil},
		{"soft anti-affinity", ServerGroup{Policy: ledger.PolicySoftAntiAffinity, On: on}, true, []string{"a", "b"}, nil},
		{"soft anti-affinity given way", ServerGroup{Policy: ledger.PolicySoftAntiAffinity, On: on}, false, nil, nil},
		{"soft affinity", ServerGroup{Policy: ledger.PolicySoftAffinity, On: on}, true, nil, []string{"a", "b"}},
		{"soft affinity, no other member", ServerGroup{Policy: ledger.PolicySoftAffinity, On: map[string][]string{"c": {"self"}}}, true, nil, nil},
	} {
		var r Request
		tt.g.Name = "g"
		tt.g.Narrow(&r, "self", tt.soft)
		if !slices.Equal(r.Exclude, tt.wantExclude) || !slices.Equal(r.Only, tt.wantOnly) {
			t.Errorf("Narrow(%s) = exclude %v only %v, want %v and %v", tt.name, r.Exclude, r.Only, tt.wantExclude, tt.wantOnly)
		}
	}
}
