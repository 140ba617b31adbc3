package libvirt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"
)

// TestUnplugMigratePlug runs the device sequence of a live migration of
// a guest with an SR-IOV port on real QEMU: unplug the device on the
// source, migrate the guest without it, plug the destination's device in
// after the switchover. No VF can exist on these machines, so a USB disk
// stands in for it: it is hot-pluggable, and the guest lets it go without
// having to answer, as a guest idling in its BIOS could not answer a PCI
// unplug.
func TestUnplugMigratePlug(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a QEMU guest on two libvirtd hosts and live-migrates it; slow, skipped with -short")
	}
	e := startMigrationEnv(t)
	dir := t.TempDir()
	disk := func(name string) string {
		path := filepath.Join(dir, name+".img")
		if err := os.WriteFile(path, make([]byte, 1<<20), 0o644); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf(`<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='%s'/><target dev='sda' bus='usb'/><alias name='ua-pci-0-0'/></disk>`, path)
	}
	g := newGuest(40)
	g.devices = "\n    " + disk("src")
	e.boot(t, "src", g)
	ctx := opContext(t)

	e.hasDevice(t, ctx, "src", g, true)
	for range 2 { // again, as a retried attempt would
		if err := e.d.DetachDevices(ctx, "src", g.uuid, []string{"ua-pci-0-0"}); err != nil {
			t.Fatalf("DetachDevices(src, %s): %v", g.name, err)
		}
	}
	e.hasDevice(t, ctx, "src", g, false)

	src, err := e.d.Lookup(ctx, "src", g.uuid)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.d.PrepareMigration(ctx, "dst", g.uuid, src.XML); err != nil {
		t.Fatalf("PrepareMigration(dst, %s): %v", g.name, err)
	}
	if err := e.d.Migrate(ctx, migration("src", "dst", g.uuid, src.XML), nil); err != nil {
		t.Fatalf("Migrate(src, dst, %s): %v", g.name, err)
	}
	e.runsOn(t, "dst", g, g.vcpuPins, g.emulator)

	plug := disk("dst")
	for range 2 {
		if err := e.d.AttachDevices(ctx, "dst", g.uuid, []string{plug}); err != nil {
			t.Fatalf("AttachDevices(dst, %s): %v", g.name, err)
		}
	}
	e.hasDevice(t, ctx, "dst", g, true)

	if err := e.d.AttachDevices(ctx, "dst", g.uuid, []string{"<disk type='file' device='disk'/>"}); err == nil {
		t.Errorf("AttachDevices of an element without a user alias succeeded; want a refusal")
	}
}

// hasDevice checks whether the guest's running domain and its definition
// on host both have the device ua-pci-0-0, or both lack it.
func (e *migrationEnv) hasDevice(t *testing.T, ctx context.Context, host string, g guest, want bool) {
	t.Helper()
	c, err := e.d.connect(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	dom, err := c.lookup(ctx, g.uuid)
	if err != nil {
		t.Fatal(err)
	}
	for _, flags := range []golibvirt.DomainXMLFlags{0, golibvirt.DomainXMLInactive} {
		x, err := c.l.DomainGetXMLDesc(dom, flags)
		if err != nil {
			t.Fatal(err)
		}
		aliases, err := deviceAliases(x)
		if err != nil {
			t.Fatal(err)
		}
		if aliases["ua-pci-0-0"] != want {
			t.Errorf("%s: domain %s (XML flags %d) has device ua-pci-0-0: %v, want %v", host, g.name, flags, aliases["ua-pci-0-0"], want)
		}
	}
}
