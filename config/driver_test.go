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
