package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/numa"
)

func TestPortFlags(t *testing.T) {
	var ports []numa.Port
	f := portFlags{&ports}
	for _, s := range []string{"name=data,physnet=physnet1,vnic=direct,policy=required,trusted=true", "name=mgmt"} {
		if err := f.Set(s); err != nil {
			t.Fatalf("Set(%q) = %v", s, err)
		}
	}
	yes := true
	want := []numa.Port{
		{Name: "data", Physnet: "physnet1", VNICType: numa.VNICDirect, Policy: "required", Trusted: &yes},
		{Name: "mgmt", VNICType: numa.VNICNormal},
	}
	if diff := cmp.Diff(want, ports); diff != "" {
		t.Errorf("ports (-want +got):\n%s", diff)
	}
	for in, msg := range map[string]string{
		"physnet=p":            `a port needs name=NAME`,
		"name=a,speed=fast":    `unknown key "speed"`,
		"name=a,trusted=maybe": `trusted="maybe": allowed are true or false`,
		"name=a,physnet":       `"physnet": each field is KEY=VALUE`,
		"name=":                `"name=": each field is KEY=VALUE`,
	} {
		if err := f.Set(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("Set(%q) = %v, want an error containing %q", in, err, msg)
		}
	}
	if len(ports) != 2 {
		t.Errorf("refused ports were kept: %+v", ports)
	}
}
