package config

import (
	"testing"
)

// TestDriverDefault: the Driver variable defaults to DriverSim, and Load
// takes the driver names and refuses any other, naming what is allowed.
func TestDriverDefault(t *testing.T) {
	if c, err := Load(); err != nil {
		t.Errorf("Load() with %s_DRIVER unset: %v, want nil", Prefix, err)
	} else if c.Driver != DriverSim {
		t.Errorf("Load() with %s_DRIVER unset: driver %q, want %q", Prefix, c.Driver, DriverSim)
	}
	for _, d := range []string{DriverSim, DriverLibvirt} {
		t.Setenv(Prefix+"_DRIVER", d)
		c, err := Load()
		if err != nil {
			t.Errorf("Load() with %s_DRIVER=%s: %v, want nil", Prefix, d, err)
		} else if c.Driver != d {
			t.Errorf("Load() with %s_DRIVER=%s: driver %q, want %q", Prefix, d, c.Driver, d)
		}
	}
	t.Setenv(Prefix+"_DRIVER", "xen")
	const want = `config: PINFLOW_DRIVER "xen": allowed are sim or libvirt`
	if _, err := Load(); err == nil || err.Error() != want {
		t.Errorf("Load() with PINFLOW_DRIVER=xen: %v, want %q", err, want)
	}
}

// TestLoadNamesBadValues: a variable whose value is not of its kind is
// refused naming the variable, the value and what it takes, not the Go
// field it fills.
func TestLoadNamesBadValues(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"RECONCILE_INTERVAL", "abc", `config: PINFLOW_RECONCILE_INTERVAL "abc": allowed is a duration such as 0, 90s, 2m or 1h30m`},
		{"DRAIN_MAX_MOVES", "many", `config: PINFLOW_DRAIN_MAX_MOVES "many": allowed is a whole number`},
		{"REDIS_TLS", "maybe", `config: PINFLOW_REDIS_TLS "maybe": allowed is true or false`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(Prefix+"_"+tc.name, tc.value)
			if _, err := Load(); err == nil || err.Error() != tc.want {
				t.Errorf("Load() with %s_%s=%s: %v, want %q", Prefix, tc.name, tc.value, err, tc.want)
			}
		})
	}
}
