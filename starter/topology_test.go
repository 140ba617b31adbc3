package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTopologyRefusesUnknownKeys: a topology file with a misspelt or
// unknown key is refused with one line naming the key and the allowed
// ones, where it used to register the host without the setting.
func TestTopologyRefusesUnknownKeys(t *testing.T) {
	cell := `{"id":0,"cpus":[0,1,2,3],"memory_mb":4096}`
	dev := `{"address":"0000:81:00.1","vendor_id":"8086","product_id":"154d","dev_type":"type-VF","numa_node":0,"parent_addr":"0000:81:00.0",%s}`
	for _, tc := range []struct {
		name, file, key string
	}{
		{"plural set", `{"cells":[` + cell + `],"cpu_dedicated_sets":"1-3"}`, `"cpu_dedicated_sets"`},
		{"no underscore", `{"cells":[` + cell + `],"cpu_dedicatedset":"1-3"}`, `"cpu_dedicatedset"`},
		{"unknown", `{"cells":[` + cell + `],"bogus":1}`, `"bogus"`},
		{"in a cell", `{"cells":[{"id":0,"cpus":[0,1],"memory":4096}]}`, `"memory"`},
		{"tag for tags", `{"cells":[` + cell + `],"pci_devices":[` + strings.Replace(dev, "%s", `"tag":{"physical_network":"physnet1"}`, 1) + `]}`, `"tag"`},
	} {
		f := filepath.Join(t.TempDir(), "topo.json")
		if err := os.WriteFile(f, []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := readTopology(f)
		if err == nil || !strings.Contains(err.Error(), "unknown key "+tc.key+"; allowed are") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: readTopology = %v, want one line naming %s and the allowed keys", tc.name, err, tc.key)
		}
	}
	f := filepath.Join(t.TempDir(), "topo.json")
	good := `{"cells":[` + cell + `],"cpu_dedicated_set":"1-3","cpu_shared_set":"0","pci_devices":[` + strings.Replace(dev, "%s", `"tags":{"physical_network":"physnet1"}`, 1) + `]}`
	if err := os.WriteFile(f, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := readTopology(f)
	if err != nil {
		t.Fatalf("readTopology of a good file: %v", err)
	}
	if got := h.Cells[0].PCPUs.String(); got != "1-3" {
		t.Errorf("pinnable CPUs %q, want 1-3", got)
	}
}
