package libvirthost

import (
	"strings"
	"testing"
)

func TestParseDeviceSpecsRefuses(t *testing.T) {
	for spec, want := range map[string]string{
		`{"vendor_id": "8086"}`:                      "not a JSON array of objects of strings",
		`[{"vendor_id": "808g"}]`:                    `device_spec[0]: vendor_id "808g": allowed are four hex digits or *`,
		`[{"vendor_id": "8086"}, {"address": "81"}]`: `device_spec[1]: address "81": allowed is DDDD:BB:SS.F`,
		`[{"physical_network": "physnet1"}]`:         "give vendor_id, product_id or address",
		`[{"vendor_id": "8086", "devname": "eth3"}]`: "devname: pinflow matches devices by vendor_id, product_id and address",
		`[{"vendor_id": "8086", "numa_node": "1"}]`:  "numa_node: pinflow matches devices",
		`[{"address": "0000:81:00.8"}]`:              `address "0000:81:00.8"`,
	} {
		_, err := ParseDeviceSpecs(spec)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseDeviceSpecs(%s) = %v, want one line containing %q", spec, err, want)
		}
		if err := (Config{URI: "qemu:///system", DeviceSpec: spec}).Validate(); err == nil {
			t.Errorf("Config with device_spec %s validated", spec)
		}
	}
}
