package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/ledger"
)

// TestWriteGroupNamesMovers: the members spending a group's budget are
// named as the operator named them, a member without a name by uuid.
func TestWriteGroupNamesMovers(t *testing.T) {
	g := &client.GroupView{
		Group: ledger.Group{Name: "web", Policy: ledger.PolicyAntiAffinity, MaxPerHost: 1, MaxUnavailable: 2,
			Members: []string{"u-1", "u-2", "u-3"}},
		Guests: []client.GroupMember{{UUID: "u-1", Name: "web1", Host: "a"}, {UUID: "u-2", Host: "b"}, {UUID: "u-3", Name: "web3"}},
		Holds:  true,
		Moving: []string{"u-1", "u-2"},
	}
	var out bytes.Buffer
	if err := writeGroup(&out, g, false); err != nil {
		t.Fatal(err)
	}
	if want := "moving: 2 of 2 (web1, u-2)\n"; !strings.Contains(out.String(), want) {
		t.Errorf("writeGroup printed\n%s\nwant the line %q", out.String(), want)
	}
}
