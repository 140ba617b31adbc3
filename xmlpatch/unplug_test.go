package xmlpatch

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestUnplugAndPlugBack takes pinflow's device elements out of a domain
// and puts them back: the operator's own devices stay, the round trip
// gives the same devices, and each step repeated changes nothing.
func TestUnplugAndPlugBack(t *testing.T) {
	src := withDevices()
	devs, err := Devices(src)
	if err != nil {
		t.Fatal(err)
	}
	var aliases, elements []string
	for _, d := range devs {
		aliases = append(aliases, d.Alias)
		elements = append(elements, d.Element)
	}
	if want := []string{"ua-pci-0-0", "ua-pci-1-0"}; !slices.Equal(aliases, want) {
		t.Fatalf("Devices aliases = %q, want %q (pinflow's, in document order)", aliases, want)
	}
	if !strings.HasPrefix(devs[0].Element, "<interface type='hostdev'") || !strings.HasSuffix(devs[0].Element, "</interface>") || devs[0].Address != "0000:81:10.1" {
		t.Errorf("device 0 = %+v, want the whole <interface> element of 0000:81:10.1", devs[0])
	}

	bare, err := WithoutDevices(src, aliases)
	if err != nil {
		t.Fatal(err)
	}
	pins, err := Read(bare)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0000:03:00.0"}; !slices.Equal(pins.Devices, want) {
		t.Errorf("devices after unplugging = %q, want only the operator's %q", pins.Devices, want)
	}
	if again, err := WithoutDevices(bare, aliases); err != nil || again != bare {
		t.Errorf("unplugging again changed the document (err %v)", err)
	}

	back, err := WithDevices(bare, elements)
	if err != nil {
		t.Fatal(err)
	}
	pins, err = Read(back)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0000:03:00.0", "0000:81:10.1", "0000:82:00.0"}; !slices.Equal(pins.Devices, want) {
		t.Errorf("devices after plugging back = %q, want %q", pins.Devices, want)
	}
	if again, err := WithDevices(back, elements); err != nil || again != back {
		t.Errorf("plugging again changed the document (err %v)", err)
	}
	if !strings.Contains(back, "    </hostdev>\n    <interface type='hostdev'") || !strings.Contains(back, "</hostdev>\n  </devices>") {
		t.Errorf("plugged elements are not indented as their siblings:\n%s", back)
	}
}

func TestPlugRefusesOtherElements(t *testing.T) {
	for name, el := range map[string]string{
		"no alias":       `<hostdev mode='subsystem' type='pci'><source><address domain='0' bus='1' slot='0' function='0'/></source></hostdev>`,
		"operator alias": `<hostdev mode='subsystem' type='pci'><source><address domain='0' bus='1' slot='0' function='0'/></source><alias name='ua-mine'/></hostdev>`,
		"a disk":         `<disk type='file'><alias name='ua-pci-0-0'/></disk>`,
		"not XML":        `<hostdev`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := WithDevices(withDevices(), []string{el}); !errors.Is(err, ErrMalformed) {
				t.Errorf("WithDevices(%s) = %v, want ErrMalformed", name, err)
			}
		})
	}
}
