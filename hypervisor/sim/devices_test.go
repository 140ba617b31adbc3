package sim

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

const vfElement = `<interface type='hostdev' managed='yes'>
      <source><address type='pci' domain='0x0000' bus='0x81' slot='0x10' function='0x0'/></source>
      <alias name='ua-pci-0-0'/>
    </interface>`

// TestUnplugAndPlug unplugs a running guest's VF and plugs it in again:
// each change takes effect once, repeats change nothing, and a device the
// host does not have is rejected with the domain unchanged.
func TestUnplugAndPlug(t *testing.T) {
	e := newEnv(t, Options{})
	topo := testTopo(t)
	node := 0
	topo.PCIDevices = []numa.PCIDevice{{Address: "0000:81:10.0", VendorID: "8086", ProductID: "154c", DevType: numa.DeviceTypeVF, NUMANode: &node}}
	if err := e.d.AddHost(e.ctx, "h3", topo); err != nil {
		t.Fatal(err)
	}
	x := strings.Replace(domainXML(uuidA, "a", 2, 0), "</disk></devices>", "</disk>\n    "+vfElement+"</devices>", 1)
	if err := e.d.Define(e.ctx, "h3", x); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Start(e.ctx, "h3", uuidA); err != nil {
		t.Fatal(err)
	}
	devices := func() []string {
		t.Helper()
		dom, err := e.d.Lookup(e.ctx, "h3", uuidA)
		if err != nil {
			t.Fatal(err)
		}
		if dom.State != hypervisor.StateRunning {
			t.Fatalf("domain is %s, want running", dom.State)
		}
		pins, err := xmlpatch.Read(dom.XML)
		if err != nil {
			t.Fatal(err)
		}
		return pins.Devices
	}
	for range 2 {
		if err := e.d.DetachDevices(e.ctx, "h3", uuidA, []string{"ua-pci-0-0"}); err != nil {
			t.Fatalf("DetachDevices: %v", err)
		}
		if got := devices(); len(got) != 0 {
			t.Fatalf("devices after DetachDevices = %v, want none", got)
		}
	}
	for range 2 {
		if err := e.d.AttachDevices(e.ctx, "h3", uuidA, []string{vfElement}); err != nil {
			t.Fatalf("AttachDevices: %v", err)
		}
		if got := devices(); !slices.Equal(got, []string{"0000:81:10.0"}) {
			t.Fatalf("devices after AttachDevices = %v, want the VF", got)
		}
	}
	missing := strings.ReplaceAll(strings.Replace(vfElement, "0x81", "0x99", 1), "ua-pci-0-0", "ua-pci-1-0")
	if err := e.d.AttachDevices(e.ctx, "h3", uuidA, []string{missing}); !errors.Is(err, hypervisor.ErrRejected) {
		t.Errorf("AttachDevices of a device h3 lacks = %v, want ErrRejected", err)
	}
	if got := devices(); !slices.Equal(got, []string{"0000:81:10.0"}) {
		t.Errorf("devices after a rejected plug = %v, want the VF only", got)
	}
	if err := e.d.DetachDevices(e.ctx, "h3", uuidB, []string{"ua-pci-0-0"}); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("DetachDevices of a missing domain = %v, want ErrNotFound", err)
	}
}
