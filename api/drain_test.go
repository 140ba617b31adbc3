package api

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
		{"negative parallel", DrainInput{Host: "h", Parallel: -1}, "drain parallel -1: it must be 1 to 64"},
		{"most parallel", DrainInput{Host: "h", Parallel: MaxDrainParallel}, ""},
		{"too parallel", DrainInput{Host: "h", Parallel: 1000000}, "drain parallel 1000000: it must be 1 to 64"},
		{"too many per target", DrainInput{Host: "h", PerTarget: 65}, "drain per-target 65: it must be 1 to 64"},
		{"too many attempts", DrainInput{Host: "h", Attempts: 11}, "drain attempts 11: it must be 1 to 10"},
		{"negative settle", DrainInput{Host: "h", Settle: -time.Second}, "drain settle -1s: it must be more than 0s and at most 24h0m0s"},
		{"settle of a week", DrainInput{Host: "h", Settle: 7 * 24 * time.Hour}, "drain settle 168h0m0s"},
	} {
		got := c.in.WithDefaults()
		err := got.Check()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: Check(%+v): %v, want it accepted", c.name, got, err)
		case c.want == "" && c.in.Parallel == 0 && (got.Parallel != DefaultDrainParallel || got.Settle != DefaultDrainSettle || got.Policy != DrainLive):
			t.Errorf("%s: WithDefaults(%+v) = %+v, want the defaults filled in", c.name, c.in, got)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: Check(%+v): %v, want an error with %q", c.name, got, err, c.want)
		}
	}
	if err := (DrainInput{Host: "h"}).Check(); err == nil {
		t.Error("Check of a drain input without its defaults filled in = nil, want the zero limits refused (the CLI passes every value)")
	}
}

func TestReadableDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		2 * time.Minute: "2m", 90 * time.Second: "1m30s", time.Hour: "1h", 24 * time.Hour: "24h",
		90 * time.Minute: "1h30m", 3*time.Hour + 5*time.Second: "3h0m5s", 1500 * time.Millisecond: "1.5s", 0: "0s",
	} {
		if got := readable(d); got != want {
			t.Errorf("readable(%v) = %q, want %q", d, got, want)
		}
	}
}
