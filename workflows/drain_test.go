package workflows

import (
	"strings"
	"testing"
	"time"
)

func TestDrainInputCheck(t *testing.T) {
	longest := strings.Repeat("é", 193)
	for _, c := range []struct {
		name string
		in   DrainInput
		want string // "" accepted
	}{
		{"defaults", DrainInput{Host: "h"}, ""},
		{"longest reason", DrainInput{Host: "h", Reason: longest}, ""},
		{"reason too long", DrainInput{Host: "h", Reason: longest + "x"}, "it must be 1-193 printable characters on one line"},
		{"reason of two lines", DrainInput{Host: "h", Reason: "kernel\nupgrade"}, `drain reason "kernel\nupgrade"`},
		{"blank reason", DrainInput{Host: "h", Reason: "  "}, "printable characters"},
		{"bad policy", DrainInput{Host: "h", Policy: "fast"}, `drain policy "fast": policies are live, cold and live-then-cold`},
		{"negative parallel", DrainInput{Host: "h", Parallel: -1}, "drain parallel -1: it must be at least 1"},
		{"negative settle", DrainInput{Host: "h", Settle: -time.Second}, "drain settle -1s: it must not be negative"},
	} {
		got, err := c.in.Check()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: Check(%+v): %v, want it accepted", c.name, c.in, err)
		case c.want == "" && (got.Parallel != DefaultDrainParallel || got.Settle != DefaultDrainSettle || got.Policy != DrainLive):
			t.Errorf("%s: Check(%+v) = %+v, want the defaults filled in", c.name, c.in, got)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: Check(%+v): %v, want an error with %q", c.name, c.in, err, c.want)
		}
	}
}
