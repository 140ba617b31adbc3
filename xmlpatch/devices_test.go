package xmlpatch

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/numa"
)

// withDevices is a two-cell domain passing through three host devices:
// two pinflow wrote (a VF as a network interface for request 0, a whole
// device for request 1) and one an operator added by hand.
func withDevices() string {
	doc := minimal(4, "", cells2x2)
	return strings.Replace(doc, "  </devices>", `    <interface type='hostdev' managed='yes'>
      <mac address='52:54:00:6d:90:02'/>
      <source>
        <address type='pci' domain='0x0000' bus='0x81' slot='0x10' function='0x1'/>
      </source>
      <alias name='ua-pci-0-0'/>
    </interface>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source>
        <address domain="0" bus="130" slot="0" function="0"/>
      </source>
      <alias name='ua-pci-1-0'/>
    </hostdev>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address domain='0x0000' bus='0x03' slot='0x00' function='0x0'/></source>
    </hostdev>
    <hostdev mode='subsystem' type='usb'>
      <source><vendor id='0x1234'/><product id='0xbeef'/></source>
    </hostdev>
  </devices>`, 1)
}

func devicePlacement(p *numa.Placement, takes ...numa.DeviceTake) *numa.Placement {
	for i := range takes {
		takes[i].Count = len(takes[i].Addresses)
		takes[i].VendorID, takes[i].ProductID = "8086", "154c"
	}
	p.Devices = takes
	return p
}

func TestReadDevices(t *testing.T) {
	pins, err := Read(withDevices())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"0000:81:10.1", "0000:82:00.0", "0000:03:00.0"}
	if !slices.Equal(pins.Devices, want) {
		t.Errorf("Read devices = %q, want %q (PCI hostdevs and hostdev interfaces in document order, USB left out)", pins.Devices, want)
	}
}

// TestPatchDevices rewrites exactly the addresses of the elements pinflow
// wrote, on a NUMA placement and on one without cells, and nothing else.
func TestPatchDevices(t *testing.T) {
	src := withDevices()
	moved := func(p *numa.Placement) *numa.Placement {
		return devicePlacement(p, numa.DeviceTake{Request: 1, Addresses: []string{"0000:05:00.0"}},
			numa.DeviceTake{Request: 0, Addresses: []string{"0000:81:11.3"}})
	}
	for name, p := range map[string]*numa.Placement{"numa": moved(placed2x2()), "no numa": moved(&numa.Placement{VCPUs: 4, MemoryMB: 2048})} {
		t.Run(name, func(t *testing.T) {
			got, err := Patch(src, p)
			if err != nil {
				t.Fatal(err)
			}
			pins, err := Read(got)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"0000:81:11.3", "0000:05:00.0", "0000:03:00.0"}
			if !slices.Equal(pins.Devices, want) {
				t.Errorf("patched devices = %q, want %q", pins.Devices, want)
			}
			if !strings.Contains(got, "<address type='pci' domain='0x0000' bus='0x81' slot='0x11' function='0x3'/>") ||
				!strings.Contains(got, "<address domain='0x0000' bus='0x05' slot='0x00' function='0x0'/>") {
				t.Errorf("addresses not rewritten in place with their attributes in order:\n%s", got)
			}
			// Everything outside the two addresses (and the pins) is as it was.
			rest := func(doc string) string {
				if p.HasNUMA() {
					doc = doc[strings.Index(doc, "<os>"):]
				}
				for _, a := range []string{"bus='0x81' slot='0x10' function='0x1'", "bus='0x81' slot='0x11' function='0x3'",
					`domain="0" bus="130" slot="0" function="0"`, "domain='0x0000' bus='0x05' slot='0x00' function='0x0'"} {
					doc = strings.ReplaceAll(doc, a, "ADDR")
				}
				return doc
			}
			if rest(got) != rest(src) {
				t.Errorf("Patch changed more than the device addresses:\n%s", got)
			}
			if !p.HasNUMA() && strings.Contains(got, "<cputune>") {
				t.Errorf("a placement without cells wrote pins:\n%s", got)
			}
		})
	}
	t.Run("same devices", func(t *testing.T) {
		p := devicePlacement(&numa.Placement{VCPUs: 4, MemoryMB: 2048}, numa.DeviceTake{Request: 0, Addresses: []string{"0000:81:10.1"}},
			numa.DeviceTake{Request: 1, Addresses: []string{"0000:82:00.0"}})
		if got, err := Patch(src, p); err != nil || got != src {
			t.Errorf("Patch to the devices the domain has = %v, changed: %v", err, got != src)
		}
	})
}

func TestPatchDeviceErrors(t *testing.T) {
	src := withDevices()
	two := func() *numa.Placement {
		return devicePlacement(placed2x2(), numa.DeviceTake{Request: 0, Addresses: []string{"0000:81:11.3"}},
			numa.DeviceTake{Request: 1, Addresses: []string{"0000:05:00.0"}})
	}
	tests := []struct {
		name    string
		doc     string
		p       *numa.Placement
		wantErr error
		want    string
	}{
		{"placement takes more", src, devicePlacement(placed2x2(), numa.DeviceTake{Request: 0, Addresses: []string{"0000:81:11.3"}},
			numa.DeviceTake{Request: 1, Addresses: []string{"0000:05:00.0", "0000:06:00.0"}}), ErrMismatch, "the placement takes 3 PCI devices but the domain has 2 elements"},
		{"placement takes fewer", src, devicePlacement(placed2x2(), numa.DeviceTake{Request: 0, Addresses: []string{"0000:81:11.3"}}), ErrMismatch,
			"passes through device 0000:82:00.0 as ua-pci-1-0, but the placement takes 0 devices for PCI request 1"},
		{"no devices placed", src, placed2x2(), ErrMismatch, "the placement takes 0 devices for PCI request 0"},
		{"bad alias", strings.Replace(src, "ua-pci-1-0", "ua-pci-x", 1), two(), ErrMalformed, `device alias "ua-pci-x": pinflow's are ua-pci-REQUEST-INDEX`},
		{"same address twice", strings.Replace(src, `domain="0" bus="130" slot="0" function="0"`, "domain='0x0000' bus='0x81' slot='0x10' function='0x1'", 1), two(), ErrMalformed,
			"PCI device 0000:81:10.1 is passed through twice"},
		{"bus too big", strings.Replace(src, `bus="130"`, `bus="0x100"`, 1), two(), ErrMalformed, "<source><address bus='0x100'>: allowed are 0-0xff"},
		{"no function", strings.Replace(src, ` function="0"`, "", 1), two(), ErrMalformed, "<source><address> has no function"},
		{"no source", strings.Replace(src, "<source><address domain='0x0000' bus='0x03' slot='0x00' function='0x0'/></source>", "", 1), two(), ErrMalformed,
			"<hostdev type='pci'> has no <source>"},
		{"bad placed address", src, devicePlacement(placed2x2(), numa.DeviceTake{Request: 0, Addresses: []string{"0000:81:11.3"}},
			numa.DeviceTake{Request: 1, Addresses: []string{"0000:05:00.9"}}), ErrPlacement, "0000:05:00.9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Patch(tt.doc, tt.p)
			if err == nil {
				t.Fatalf("Patch(%s) = no error, want %v; output:\n%s", tt.name, tt.wantErr, got)
			}
			msg := err.Error()
			if !errors.Is(err, tt.wantErr) || strings.Contains(msg, "\n") || !strings.Contains(msg, tt.want) {
				t.Errorf("Patch(%s) error = %q, want one line wrapping %q, containing %q", tt.name, msg, tt.wantErr, tt.want)
			}
		})
	}
}
