package libvirt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/go-cmp/cmp"
	"libvirt.org/go/libvirtxml"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/numa"
)

// These tests run real libvirtd daemons (deploy/libvirt-host.sh) and real
// QEMU guests under software emulation (TCG), so they need root, libvirtd
// and qemu-system-x86_64. Guests are small: 128 MiB, 2 vCPUs, no disk.

// opTimeout bounds one driver call in these tests. The first call on a
// fresh daemon probes QEMU for several seconds; a migration takes a few.
const opTimeout = 2 * time.Minute

// guest is a test domain: a diskless TCG guest with two vCPUs in two guest
// NUMA cells, pinned as given.
type guest struct {
	name, uuid string
	vcpuPins   [2]string
	emulator   string
	nodeset    string
	// kernel is a multiboot kernel file the guest boots (see
	// dirtyingKernel); empty, it idles in the BIOS.
	kernel string
	// devices are more elements of its <devices>.
	devices string
}

func (g guest) xml() string {
	kernel := ""
	if g.kernel != "" {
		kernel = "<kernel>" + g.kernel + "</kernel>"
	}
	return fmt.Sprintf(`<domain type='qemu'>
  <name>%s</name>
  <uuid>%s</uuid>
  <memory unit='MiB'>128</memory>
  <vcpu placement='static'>2</vcpu>
  <cputune>
    <vcpupin vcpu='0' cpuset='%s'/>
    <vcpupin vcpu='1' cpuset='%s'/>
    <emulatorpin cpuset='%s'/>
  </cputune>
  <numatune>
    <memory mode='strict' nodeset='%s'/>
    <memnode cellid='0' mode='strict' nodeset='%[6]s'/>
    <memnode cellid='1' mode='strict' nodeset='%[6]s'/>
  </numatune>
  <os><type arch='x86_64' machine='pc'>hvm</type>%[7]s</os>
  <cpu mode='custom' match='exact'>
    <model fallback='forbid'>qemu64</model>
    <topology sockets='2' dies='1' cores='1' threads='1'/>
    <numa>
      <cell id='0' cpus='0' memory='64' unit='MiB'/>
      <cell id='1' cpus='1' memory='64' unit='MiB'/>
    </numa>
  </cpu>
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <serial type='pty'><target port='0'/></serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <memballoon model='none'/>%[8]s
  </devices>
</domain>`, g.name, g.uuid, g.vcpuPins[0], g.vcpuPins[1], g.emulator, g.nodeset, kernel, g.devices)
}

// newGuest returns a guest named after n with a UUID of its own, pinned to
// host CPU 0 and NUMA node 0.
func newGuest(n int) guest {
	return guest{
		name:     fmt.Sprintf("pinflow-test-%d", n),
		uuid:     fmt.Sprintf("a1b2c3d4-0000-4000-8000-%012d", n),
		vcpuPins: [2]string{"0", "0"},
		emulator: "0",
		nodeset:  "0",
	}
}

// repin rewrites the pinning of a domain XML as a destination placement
// would: the vCPU pins, the emulator pin and every numatune node set.
func repin(t *testing.T, domainXML string, vcpuPins [2]string, emulator, nodeset string) string {
	t.Helper()
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(domainXML); err != nil {
		t.Fatalf("repin: %v", err)
	}
	dom.CPUTune.VCPUPin = []libvirtxml.DomainCPUTuneVCPUPin{{VCPU: 0, CPUSet: vcpuPins[0]}, {VCPU: 1, CPUSet: vcpuPins[1]}}
	dom.CPUTune.EmulatorPin = &libvirtxml.DomainCPUTuneEmulatorPin{CPUSet: emulator}
	dom.NUMATune.Memory.Nodeset = nodeset
	for i := range dom.NUMATune.MemNodes {
		dom.NUMATune.MemNodes[i].Nodeset = nodeset
	}
	out, err := dom.Marshal()
	if err != nil {
		t.Fatalf("repin: %v", err)
	}
	return out
}

// migration is an unfenced migration of uuid from src to dst with destXML.
func migration(src, dst, uuid, destXML string) hypervisor.MigrateRequest {
	return hypervisor.MigrateRequest{UUID: uuid, Source: src, Dest: dst, DestXML: destXML}
}

func opContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

// newTestDriver returns a driver for the given hosts with a migrate URI on
// loopback and a short progress interval.
func newTestDriver(t *testing.T, hosts ...*testenv.LibvirtHost) *Driver {
	t.Helper()
	cfg := Config{Hosts: HostMap{}, MigrateURIs: HostMap{}, ProgressInterval: 50 * time.Millisecond}
	for _, h := range hosts {
		cfg.Hosts[h.Name] = h.URI
		cfg.MigrateURIs[h.Name] = "tcp://127.0.0.1"
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// readSys reads a /sys file, trimmed.
func readSys(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return strings.TrimSpace(string(b))
}

func TestCapabilitiesMatchSys(t *testing.T) {
	h := testenv.StartLibvirtHost(t, "caps")
	d := newTestDriver(t, h)
	host, err := d.Capabilities(opContext(t), "caps")
	if err != nil {
		t.Fatalf("Capabilities(caps): %v", err)
	}
	if err := host.Validate(); err != nil {
		t.Fatalf("Capabilities(caps) = %+v; Validate: %v", host, err)
	}
	online := numa.MustParse(readSys(t, "/sys/devices/system/cpu/online"))
	var all numa.CPUSet
	for _, c := range host.Cells {
		all = all.Union(c.CPUs).Union(c.PCPUs)
		if !c.CPUs.Equal(c.PCPUs) {
			t.Errorf("cell %d: cpuset %s, pcpuset %s; without cpu sets configured both are every online cpu", c.ID, c.CPUs, c.PCPUs)
		}
		for _, g := range c.Siblings {
			for _, cpu := range g.List() {
				path := fmt.Sprintf("/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", cpu)
				if want := numa.MustParse(readSys(t, path)).Intersection(online); !g.Equal(want) {
					t.Errorf("cell %d: sibling group %s; %s says %s", c.ID, g, path, want)
				}
			}
		}
		socketPath := fmt.Sprintf("/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c.CPUs.Min())
		if want := readSys(t, socketPath); strconv.Itoa(c.Socket) != want {
			t.Errorf("cell %d: socket %d; %s says %s", c.ID, c.Socket, socketPath, want)
		}
		if len(c.Pages) == 0 || c.Pages[0].SizeKB != 4 || c.Pages[0].Total <= 0 {
			t.Errorf("cell %d: page pools %+v; want the 4 KiB pool first", c.ID, c.Pages)
		}
		node := fmt.Sprintf("/sys/devices/system/node/node%d", c.ID)
		if _, err := os.Stat(node); err != nil {
			continue // a kernel without NUMA: libvirt reports one cell
		}
		if want := numa.MustParse(readSys(t, node+"/cpulist")).Intersection(online); !c.CPUs.Equal(want) {
			t.Errorf("cell %d: cpus %s; %s/cpulist says %s", c.ID, c.CPUs, node, want)
		}
		if want := sysNodeMemMiB(t, node+"/meminfo"); c.MemoryMB != want {
			t.Errorf("cell %d: memory %d MiB; %s/meminfo says %d MiB", c.ID, c.MemoryMB, node, want)
		}
		for _, p := range c.Pages[1:] {
			path := fmt.Sprintf("%s/hugepages/hugepages-%dkB/nr_hugepages", node, p.SizeKB)
			if want := readSys(t, path); strconv.FormatInt(p.Total, 10) != want {
				t.Errorf("cell %d: %d KiB pages %d; %s says %s", c.ID, p.SizeKB, p.Total, path, want)
			}
		}
	}
	if !all.Equal(online) {
		t.Errorf("cells hold cpus %s; /sys/devices/system/cpu/online says %s", all, online)
	}
	if len(host.PCIDevices) != 0 {
		t.Errorf("a host without a device_spec offers devices %+v", host.PCIDevices)
	}
	checkDevicesMatchSys(t, d, h, host)

	// cpu_dedicated_set and cpu_shared_set split the CPUs as in Nova.
	if online.Len() < 2 {
		return
	}
	first, rest := numa.NewCPUSet(online.Min()), online.Difference(numa.NewCPUSet(online.Min()))
	if err := d.RegisterHost("caps-split", libvirthost.Config{URI: h.URI, CPUDedicatedSet: rest.String(), CPUSharedSet: first.String()}); err != nil {
		t.Fatal(err)
	}
	split, err := d.Capabilities(opContext(t), "caps-split")
	if err != nil {
		t.Fatalf("Capabilities(caps-split): %v", err)
	}
	var shared, dedicated numa.CPUSet
	for _, c := range split.Cells {
		shared, dedicated = shared.Union(c.CPUs), dedicated.Union(c.PCPUs)
	}
	if !shared.Equal(first) || !dedicated.Equal(rest) || !split.SharedSet.Equal(first) {
		t.Errorf("Capabilities(caps-split with dedicated %s, shared %s): cpusets %s, pcpusets %s, shared set %s",
			rest, first, shared, dedicated, split.SharedSet)
	}
}

// checkDevicesMatchSys registers the host again with a device_spec that
// offers every PCI device of one vendor, tagged, and checks the devices
// against /sys/bus/pci: addresses, ids, NUMA node and SR-IOV kind.
func checkDevicesMatchSys(t *testing.T, d *Driver, h *testenv.LibvirtHost, host *numa.Host) {
	t.Helper()
	const sysPCI = "/sys/bus/pci/devices"
	entries, err := os.ReadDir(sysPCI)
	if err != nil || len(entries) == 0 {
		t.Fatalf("this machine lists no PCI devices in %s (%v)", sysPCI, err)
	}
	vendor := strings.TrimPrefix(readSys(t, filepath.Join(sysPCI, entries[0].Name(), "vendor")), "0x")
	var want []numa.PCIDevice
	for _, e := range entries {
		dir := filepath.Join(sysPCI, e.Name())
		if strings.TrimPrefix(readSys(t, filepath.Join(dir, "vendor")), "0x") != vendor {
			continue
		}
		dev := numa.PCIDevice{Address: e.Name(), VendorID: vendor, ProductID: strings.TrimPrefix(readSys(t, filepath.Join(dir, "device")), "0x"),
			DevType: numa.DeviceTypePCI, Tags: map[string]string{"physical_network": "physnet1"}}
		if b, err := os.ReadFile(filepath.Join(dir, "numa_node")); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 && host.Cell(n) != nil {
				dev.NUMANode = &n
			}
		}
		if b, err := os.ReadFile(filepath.Join(dir, "sriov_totalvfs")); err == nil && strings.TrimSpace(string(b)) != "0" {
			dev.DevType = numa.DeviceTypePF
		}
		if pf, err := os.Readlink(filepath.Join(dir, "physfn")); err == nil {
			dev.DevType, dev.PhysFunction = numa.DeviceTypeVF, filepath.Base(pf)
			// A VF's network interface names it.
			if nets, err := os.ReadDir(filepath.Join(dir, "net")); err == nil && len(nets) == 1 {
				dev.DevName = nets[0].Name()
			}
		}
		want = append(want, dev)
	}
	spec := fmt.Sprintf(`[{"vendor_id": %q, "physical_network": "physnet1"}]`, vendor)
	if err := d.RegisterHost("caps-devices", libvirthost.Config{URI: h.URI, DeviceSpec: spec}); err != nil {
		t.Fatal(err)
	}
	got, err := d.Capabilities(opContext(t), "caps-devices")
	if err != nil {
		t.Fatalf("Capabilities(caps-devices): %v", err)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("Capabilities(caps-devices): Validate: %v", err)
	}
	if diff := cmp.Diff(want, got.PCIDevices); diff != "" {
		t.Errorf("devices offered by %s, against %s (-sys +libvirt):\n%s", spec, sysPCI, diff)
	}
}

// sysNodeMemMiB reads "Node N MemTotal: X kB" from a node's meminfo.
func sysNodeMemMiB(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 4 && fields[2] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[3], 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", path, sc.Text(), err)
			}
			return kb / 1024
		}
	}
	t.Fatalf("%s has no MemTotal line", path)
	return 0
}

func TestLifecycle(t *testing.T) {
	h := testenv.StartLibvirtHost(t, "life")
	d := newTestDriver(t, h)
	g := newGuest(1)
	ctx := opContext(t)

	state := func(step string, want hypervisor.State) {
		t.Helper()
		dom, err := d.Lookup(ctx, "life", g.uuid)
		if err != nil {
			t.Fatalf("after %s: Lookup(life, %s): %v", step, g.uuid, err)
		}
		if dom.State != want || dom.UUID != g.uuid || dom.Name != g.name || !strings.Contains(dom.XML, g.uuid) {
			t.Fatalf("after %s: Lookup(life, %s) = {%s %s %s}; want {%s %s %s} with its XML", step, g.uuid, dom.UUID, dom.Name, dom.State, g.uuid, g.name, want)
		}
	}
	steps := []struct {
		name string
		do   func() error
		want hypervisor.State
	}{
		{"Define", func() error { return d.Define(ctx, "life", g.xml()) }, hypervisor.StateShutoff},
		{"Define again", func() error { return d.Define(ctx, "life", g.xml()) }, hypervisor.StateShutoff},
		{"Stop while shut off", func() error { return d.Stop(ctx, "life", g.uuid) }, hypervisor.StateShutoff},
		{"Start", func() error { return d.Start(ctx, "life", g.uuid) }, hypervisor.StateRunning},
		{"Start again", func() error { return d.Start(ctx, "life", g.uuid) }, hypervisor.StateRunning},
		{"Define while running", func() error { return d.Define(ctx, "life", g.xml()) }, hypervisor.StateRunning},
		{"Stop", func() error { return d.Stop(ctx, "life", g.uuid) }, hypervisor.StateShutoff},
		{"Stop again", func() error { return d.Stop(ctx, "life", g.uuid) }, hypervisor.StateShutoff},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s(life, %s): %v", s.name, g.uuid, err)
		}
		state(s.name, s.want)
	}

	if err := d.Start(ctx, "life", g.uuid); err != nil {
		t.Fatal(err)
	}
	if err := d.Undefine(ctx, "life", g.uuid); err == nil || !strings.Contains(err.Error(), "stop it first") {
		t.Errorf("Undefine(life, %s) while running = %v; want an error saying to stop it first", g.uuid, err)
	}
	doms, err := d.Domains(ctx, "life")
	if err != nil || len(doms) != 1 || doms[0].UUID != g.uuid || doms[0].State != hypervisor.StateRunning {
		t.Errorf("Domains(life) = %+v, %v; want just %s running", doms, err, g.uuid)
	}
	for _, step := range []string{"Stop", "Undefine", "Undefine again"} {
		var err error
		if step == "Stop" {
			err = d.Stop(ctx, "life", g.uuid)
		} else {
			err = d.Undefine(ctx, "life", g.uuid)
		}
		if err != nil {
			t.Fatalf("%s(life, %s): %v", step, g.uuid, err)
		}
	}
	notFound := map[string]error{
		"Lookup": func() error { _, err := d.Lookup(ctx, "life", g.uuid); return err }(),
		"Start":  d.Start(ctx, "life", g.uuid),
		"Stop":   d.Stop(ctx, "life", g.uuid),
	}
	for name, err := range notFound {
		if !errors.Is(err, hypervisor.ErrNotFound) || !strings.Contains(err.Error(), g.uuid) || !strings.Contains(err.Error(), "host life (") {
			t.Errorf("%s(life, %s) after Undefine = %v; want ErrNotFound naming the domain and host", name, g.uuid, err)
		}
	}
	if doms, err := d.Domains(ctx, "life"); err != nil || len(doms) != 0 {
		t.Errorf("Domains(life) after Undefine = %+v, %v; want none", doms, err)
	}
}

func TestDefineRejected(t *testing.T) {
	h := testenv.StartLibvirtHost(t, "rej")
	d := newTestDriver(t, h)
	ctx := opContext(t)
	g := newGuest(2)
	other := g
	other.name = "pinflow-test-other-name"
	if err := d.Define(ctx, "rej", g.xml()); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, xml string
	}{
		{"not XML", "<domain"},
		{"no uuid", strings.Replace(g.xml(), "<uuid>"+g.uuid+"</uuid>", "", 1)},
		{"schema violation", strings.Replace(g.xml(), "<vcpu placement='static'>2</vcpu>", "<vcpu placement='static'>two</vcpu>", 1)},
		{"guest cells cover more cpus than it has", strings.Replace(g.xml(), "cpus='1' memory='64'", "cpus='1-3' memory='64'", 1)},
		{"same uuid, other name", other.xml()},
	}
	for _, tt := range tests {
		err := d.Define(ctx, "rej", tt.xml)
		if !errors.Is(err, hypervisor.ErrRejected) || !strings.HasPrefix(err.Error(), "libvirt: ") || strings.Contains(err.Error(), "\n") {
			t.Errorf("Define(rej, %s) = %v; want one line starting \"libvirt: \" wrapping ErrRejected", tt.name, err)
		}
	}
	if err := d.Undefine(ctx, "rej", g.uuid); err != nil {
		t.Fatal(err)
	}
}

// migrationEnv is two libvirtd hosts, "src" and "dst", and a driver for
// both.
type migrationEnv struct {
	d     *Driver
	hosts map[string]*testenv.LibvirtHost
	cpus  numa.CPUSet // the machine's online CPUs
	nodes numa.CPUSet // its NUMA nodes
}

func startMigrationEnv(t *testing.T) *migrationEnv {
	t.Helper()
	src, dst := testenv.StartLibvirtHost(t, "src"), testenv.StartLibvirtHost(t, "dst")
	e := &migrationEnv{d: newTestDriver(t, src, dst), hosts: map[string]*testenv.LibvirtHost{"src": src, "dst": dst}}
	host, err := e.d.Capabilities(opContext(t), "dst")
	if err != nil {
		t.Fatalf("Capabilities(dst): %v", err)
	}
	for _, c := range host.Cells {
		e.cpus = e.cpus.Union(c.CPUs).Union(c.PCPUs)
		e.nodes = e.nodes.Union(numa.NewCPUSet(c.ID))
	}
	if e.cpus.Len() < 2 {
		t.Fatalf("the migration tests move vCPUs between two host CPUs; this machine has only cpus %s", e.cpus)
	}
	return e
}

// boot defines and starts g on host and removes it from both hosts when
// the test ends.
func (e *migrationEnv) boot(t *testing.T, host string, g guest) {
	t.Helper()
	ctx := opContext(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		for name := range e.hosts {
			if err := e.d.Stop(ctx, name, g.uuid); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
				t.Errorf("cleanup: Stop(%s, %s): %v", name, g.uuid, err)
			}
			if err := e.d.Undefine(ctx, name, g.uuid); err != nil {
				t.Errorf("cleanup: Undefine(%s, %s): %v", name, g.uuid, err)
			}
		}
	})
	if err := e.d.Define(ctx, host, g.xml()); err != nil {
		t.Fatalf("Define(%s, %s): %v", host, g.name, err)
	}
	if err := e.d.Start(ctx, host, g.uuid); err != nil {
		t.Fatalf("Start(%s, %s): %v", host, g.name, err)
	}
}

// runsOn checks that g runs on host only, with its vCPU and emulator
// threads allowed exactly on the given CPUs.
func (e *migrationEnv) runsOn(t *testing.T, host string, g guest, vcpuPins [2]string, emulator string) {
	t.Helper()
	ctx := opContext(t)
	dom, err := e.d.Lookup(ctx, host, g.uuid)
	if err != nil {
		t.Fatalf("Lookup(%s, %s): %v", host, g.name, err)
	}
	if dom.State != hypervisor.StateRunning {
		t.Fatalf("Lookup(%s, %s).State = %s, want running", host, g.name, dom.State)
	}
	var x libvirtxml.Domain
	if err := x.Unmarshal(dom.XML); err != nil {
		t.Fatalf("Lookup(%s, %s).XML: %v", host, g.name, err)
	}
	for _, p := range x.CPUTune.VCPUPin {
		if p.CPUSet != vcpuPins[p.VCPU] {
			t.Errorf("%s: domain XML pins vcpu %d to %q, want %q", host, p.VCPU, p.CPUSet, vcpuPins[p.VCPU])
		}
	}
	if x.CPUTune.EmulatorPin == nil || x.CPUTune.EmulatorPin.CPUSet != emulator {
		t.Errorf("%s: domain XML emulatorpin %+v, want cpuset %q", host, x.CPUTune.EmulatorPin, emulator)
	}
	vcpus, emu, err := e.hosts[host].VCPUAffinity(g.name)
	if err != nil {
		t.Fatalf("%s: %v", host, err)
	}
	for i, want := range vcpuPins {
		if vcpus[i] != want {
			t.Errorf("%s: QEMU thread \"CPU %d/TCG\" may run on cpus %q, want %q (all vCPU threads: %v)", host, i, vcpus[i], want, vcpus)
		}
	}
	if emu != emulator {
		t.Errorf("%s: QEMU main thread may run on cpus %q, want %q", host, emu, emulator)
	}
	for other := range e.hosts {
		if other == host {
			continue
		}
		if _, err := e.d.Lookup(ctx, other, g.uuid); !errors.Is(err, hypervisor.ErrNotFound) {
			t.Errorf("Lookup(%s, %s) = %v; want ErrNotFound, the guest runs on %s only", other, g.name, err, host)
		}
	}
}

func TestMigration(t *testing.T) {
	if testing.Short() {
		t.Skip("boots QEMU guests on two libvirtd hosts and live-migrates them; slow, skipped with -short")
	}
	e := startMigrationEnv(t)

	t.Run("rewritten pins there and back", func(t *testing.T) {
		g := newGuest(10)
		g.vcpuPins, g.emulator = [2]string{"0", "1"}, "0"
		e.boot(t, "src", g)
		e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
		ctx := opContext(t)

		src, err := e.d.Lookup(ctx, "src", g.uuid)
		if err != nil {
			t.Fatal(err)
		}
		destPins, destEmulator := [2]string{"1", "0"}, "1"
		destXML := repin(t, src.XML, destPins, destEmulator, "0")
		if err := e.d.PrepareMigration(ctx, "dst", g.uuid, destXML); err != nil {
			t.Fatalf("PrepareMigration(dst, %s): %v", g.name, err)
		}
		var reports []hypervisor.Progress
		if err := e.d.Migrate(ctx, migration("src", "dst", g.uuid, destXML), func(p hypervisor.Progress) { reports = append(reports, p) }); err != nil {
			t.Fatalf("Migrate(src, dst, %s): %v", g.name, err)
		}
		e.runsOn(t, "dst", g, destPins, destEmulator)
		t.Logf("progress reports: %+v", reports)
		// How much data a report shows depends on where the polls land in
		// a copy this short; the phases do not.
		if len(reports) < 2 {
			t.Errorf("Migrate reported progress %d times (%+v); want reports while it ran and one at the end", len(reports), reports)
		} else if last := reports[len(reports)-1]; last.Phase != PhaseCompleted || last.Percent != 100 || last.DataRemaining != 0 {
			t.Errorf("Migrate's last progress report = %+v; want phase %s, 100%%, nothing remaining", last, PhaseCompleted)
		}
		for _, p := range reports[:len(reports)-1] {
			if p.Phase != PhaseSetup && p.Phase != PhaseMigrating || p.Percent > 99 || p.DataProcessed > p.DataTotal {
				t.Errorf("Migrate progress report %+v while running; want phase setup or migrating, at most 99%%, processed within the total", p)
			}
		}

		// A worker that crashed after the migration retries it.
		if err := e.d.Migrate(ctx, migration("src", "dst", g.uuid, destXML), nil); err != nil {
			t.Errorf("Migrate(src, dst, %s) again after it completed = %v, want nil", g.name, err)
		}
		if err := e.d.PrepareMigration(ctx, "dst", g.uuid, destXML); err != nil {
			t.Errorf("PrepareMigration(dst, %s) after it completed = %v, want nil", g.name, err)
		}
		if err := e.d.Rollback(ctx, "src", "dst", g.uuid); err == nil || !strings.Contains(err.Error(), "completed") {
			t.Errorf("Rollback(src, dst, %s) after it completed = %v; want an error saying the migration completed", g.name, err)
		}
		e.runsOn(t, "dst", g, destPins, destEmulator)

		dst, err := e.d.Lookup(ctx, "dst", g.uuid)
		if err != nil {
			t.Fatal(err)
		}
		back := repin(t, dst.XML, g.vcpuPins, g.emulator, "0")
		if err := e.d.Migrate(ctx, migration("dst", "src", g.uuid, back), nil); err != nil {
			t.Fatalf("Migrate(dst, src, %s): %v", g.name, err)
		}
		e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
	})

	missingCPU := strconv.Itoa(e.cpus.Max() + 4)
	missingNode := strconv.Itoa(e.nodes.Max() + 1)
	rejected := []struct {
		name        string
		guest       int
		dest        func(srcXML string) string
		wantPrepare string // in PrepareMigration's error; empty: it passes
		wantMigrate string // in Migrate's error
	}{
		{
			name:  "vcpupin to a missing host cpu",
			guest: 11,
			dest: func(x string) string {
				return repin(t, x, [2]string{missingCPU, "0"}, "0", "0")
			},
			wantPrepare: "cpus " + missingCPU + " the host does not have",
			wantMigrate: "cannot set CPU affinity",
		},
		{
			name:  "numatune to a missing host node",
			guest: 12,
			dest: func(x string) string {
				return repin(t, x, [2]string{"1", "0"}, "1", missingNode)
			},
			wantPrepare: "NUMA nodes " + missingNode + " the host does not have",
			wantMigrate: "NUMA node " + missingNode + " is unavailable",
		},
		{
			name:  "guest NUMA cells changed",
			guest: 17,
			dest: func(x string) string {
				x = strings.Replace(x, "<cell id='0' cpus='0'", "<cell id='0' cpus='@'", 1)
				x = strings.Replace(x, "<cell id='1' cpus='1'", "<cell id='1' cpus='0'", 1)
				return strings.Replace(x, "cpus='@'", "cpus='1'", 1)
			},
			wantMigrate: "doesn't match source",
		},
	}
	for _, tt := range rejected {
		t.Run(tt.name, func(t *testing.T) {
			g := newGuest(tt.guest)
			e.boot(t, "src", g)
			ctx := opContext(t)
			src, err := e.d.Lookup(ctx, "src", g.uuid)
			if err != nil {
				t.Fatal(err)
			}
			destXML := tt.dest(src.XML)
			if destXML == src.XML {
				t.Fatalf("the destination XML for %s is the source XML; the test edits nothing", tt.name)
			}
			err = e.d.PrepareMigration(ctx, "dst", g.uuid, destXML)
			if tt.wantPrepare == "" && err != nil {
				t.Errorf("PrepareMigration(dst, %s with %s) = %v, want nil", g.name, tt.name, err)
			}
			if tt.wantPrepare != "" && (!errors.Is(err, hypervisor.ErrRejected) || !strings.Contains(err.Error(), tt.wantPrepare)) {
				t.Errorf("PrepareMigration(dst, %s with %s) = %v; want ErrRejected containing %q", g.name, tt.name, err, tt.wantPrepare)
			}
			err = e.d.Migrate(ctx, migration("src", "dst", g.uuid, destXML), nil)
			t.Logf("Migrate(src, dst, %s with %s) = %v", g.name, tt.name, err)
			if !errors.Is(err, hypervisor.ErrRejected) || !strings.Contains(err.Error(), tt.wantMigrate) {
				t.Errorf("Migrate(src, dst, %s with %s) = %v; want ErrRejected containing %q", g.name, tt.name, err, tt.wantMigrate)
			}
			e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
			if err := e.d.Rollback(ctx, "src", "dst", g.uuid); err != nil {
				t.Errorf("Rollback(src, dst, %s) = %v", g.name, err)
			}
			e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
		})
	}

	t.Run("a retry takes over the migration already running", func(t *testing.T) {
		g := newGuest(18)
		e.boot(t, "src", g)
		ctx := opContext(t)
		src, err := e.d.Lookup(ctx, "src", g.uuid)
		if err != nil {
			t.Fatal(err)
		}
		destPins := [2]string{"1", "1"}
		destXML := repin(t, src.XML, destPins, "1", "0")
		// An earlier attempt whose worker went away: its migration runs in
		// the source libvirtd, slowed down so the retry sees it.
		earlier := e.startEarlier(t, g, destXML, 1)
		var phases []string
		if err := e.d.Migrate(ctx, migration("src", "dst", g.uuid, destXML), func(p hypervisor.Progress) { phases = append(phases, p.Phase) }); err != nil {
			t.Fatalf("Migrate(src, dst, %s) while an earlier migration runs = %v, want nil", g.name, err)
		}
		t.Logf("progress phases of the retry: %v", phases)
		if len(phases) == 0 || phases[len(phases)-1] != PhaseCompleted {
			t.Errorf("Migrate retry progress phases %v; want them to end with %s", phases, PhaseCompleted)
		}
		if err := <-earlier; err != nil {
			t.Errorf("the earlier migration: %v", err)
		}
		e.runsOn(t, "dst", g, destPins, "1")
	})

	t.Run("cancel", func(t *testing.T) {
		g := newGuest(13)
		e.boot(t, "src", g)
		src, err := e.d.Lookup(opContext(t), "src", g.uuid)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := e.hosts["src"].QEMUPid(g.name)
		if err != nil {
			t.Fatal(err)
		}
		destXML := repin(t, src.XML, [2]string{"1", "1"}, "1", "0")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Cancel at the first progress report, while libvirt has the
		// migration job running.
		var reports []hypervisor.Progress
		err = e.d.Migrate(ctx, migration("src", "dst", g.uuid, destXML), func(p hypervisor.Progress) {
			reports = append(reports, p)
			cancel()
		})
		t.Logf("Migrate cancelled = %v; progress %+v", err, reports)
		if !errors.Is(err, context.Canceled) || errors.Is(err, hypervisor.ErrRejected) {
			t.Fatalf("Migrate(src, dst, %s) cancelled = %v; want context.Canceled", g.name, err)
		}
		if len(reports) == 0 || reports[len(reports)-1].Phase != PhaseAborting {
			t.Errorf("Migrate cancelled: progress %+v; want the last report in phase %s", reports, PhaseAborting)
		}
		e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
		if now, err := e.hosts["src"].QEMUPid(g.name); err != nil || now != pid {
			t.Errorf("after the cancelled migration the guest's QEMU pid on src is %d (%v), want %d: it must keep running", now, err, pid)
		}
		for i := range 2 {
			if err := e.d.Rollback(opContext(t), "src", "dst", g.uuid); err != nil {
				t.Errorf("Rollback(src, dst, %s) #%d after the cancelled migration = %v, want nil", g.name, i+1, err)
			}
		}
		e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
	})

	t.Run("a fence failing before the start leaves the guest on the source", func(t *testing.T) {
		g := newGuest(19)
		e.boot(t, "src", g)
		ctx := opContext(t)
		src, err := e.d.Lookup(ctx, "src", g.uuid)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := e.hosts["src"].QEMUPid(g.name)
		if err != nil {
			t.Fatal(err)
		}
		destXML := repin(t, src.XML, [2]string{"1", "1"}, "1", "0")
		calls := 0
		req := migration("src", "dst", g.uuid, destXML)
		req.Fence = func(context.Context) error { calls++; return errClaimGone }
		var reports []hypervisor.Progress
		err = e.d.Migrate(ctx, req, func(p hypervisor.Progress) { reports = append(reports, p) })
		if !errors.Is(err, hypervisor.ErrFenced) || !errors.Is(err, errClaimGone) || !strings.HasPrefix(err.Error(), "libvirt: migrate ") {
			t.Fatalf("Migrate(src, dst, %s) with a failing fence = %v; want a 'libvirt: migrate' error wrapping ErrFenced and the fence's error", g.name, err)
		}
		if calls != 1 || len(reports) != 0 {
			t.Errorf("Migrate with a failing fence: %d fence calls, progress %+v; want 1 call and no progress", calls, reports)
		}
		e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
		if now, err := e.hosts["src"].QEMUPid(g.name); err != nil || now != pid {
			t.Errorf("after the fenced migration the guest's QEMU pid on src is %d (%v), want %d: it must keep running", now, err, pid)
		}
		// Nothing was left behind that blocks the migration.
		if err := e.d.Migrate(ctx, migration("src", "dst", g.uuid, destXML), nil); err != nil {
			t.Fatalf("Migrate(src, dst, %s) after a fenced attempt = %v, want nil", g.name, err)
		}
		e.runsOn(t, "dst", g, [2]string{"1", "1"}, "1")
	})

	t.Run("a fence failing while copying aborts the job", func(t *testing.T) {
		g := newGuest(20)
		e.boot(t, "src", g)
		src, err := e.d.Lookup(opContext(t), "src", g.uuid)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := e.hosts["src"].QEMUPid(g.name)
		if err != nil {
			t.Fatal(err)
		}
		destXML := repin(t, src.XML, [2]string{"1", "1"}, "1", "0")
		// The claim holds at the start and is gone at the first poll,
		// while libvirt has the migration job running, as in the cancel
		// test.
		calls := 0
		req := migration("src", "dst", g.uuid, destXML)
		req.Fence = func(context.Context) error {
			if calls++; calls > 1 {
				return errClaimGone
			}
			return nil
		}
		var reports []hypervisor.Progress
		err = e.d.Migrate(opContext(t), req, func(p hypervisor.Progress) { reports = append(reports, p) })
		t.Logf("Migrate fenced while copying = %v; progress %+v", err, reports)
		if !errors.Is(err, hypervisor.ErrFenced) || !errors.Is(err, errClaimGone) || errors.Is(err, context.Canceled) {
			t.Fatalf("Migrate(src, dst, %s) whose fence fails at the first poll = %v; want ErrFenced and the fence's error", g.name, err)
		}
		if calls != 2 {
			t.Errorf("Migrate whose fence fails at the first poll called it %d times, want 2", calls)
		}
		if len(reports) == 0 || reports[len(reports)-1].Phase != PhaseAborting {
			t.Errorf("Migrate fenced while copying: progress %+v; want the last report in phase %s", reports, PhaseAborting)
		}
		e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
		if now, err := e.hosts["src"].QEMUPid(g.name); err != nil || now != pid {
			t.Errorf("after the fenced migration the guest's QEMU pid on src is %d (%v), want %d: it must keep running", now, err, pid)
		}
	})

	t.Run("rollback cleans the destination and resumes the source", func(t *testing.T) {
		g := newGuest(14)
		e.boot(t, "src", g)
		ctx := opContext(t)
		// What a failed migration can leave: a definition on dst and a
		// paused guest on src.
		if err := e.d.Define(ctx, "dst", g.xml()); err != nil {
			t.Fatal(err)
		}
		if err := e.d.PrepareMigration(ctx, "dst", g.uuid, g.xml()); err == nil || !strings.Contains(err.Error(), "already defined") {
			t.Errorf("PrepareMigration(dst, %s) with a definition on dst = %v; want an error saying it is already defined", g.name, err)
		}
		c, err := e.d.connect(ctx, "src")
		if err != nil {
			t.Fatal(err)
		}
		dom, err := c.lookup(ctx, g.uuid)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.l.DomainSuspend(dom); err != nil {
			t.Fatalf("suspending %s on src: %v", g.name, err)
		}
		if d, err := e.d.Lookup(ctx, "src", g.uuid); err != nil || d.State != hypervisor.StatePaused {
			t.Fatalf("Lookup(src, %s) after suspend = %v, %v; want paused", g.name, d, err)
		}
		for i := range 2 {
			if err := e.d.Rollback(ctx, "src", "dst", g.uuid); err != nil {
				t.Fatalf("Rollback(src, dst, %s) #%d = %v, want nil", g.name, i+1, err)
			}
			e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
		}
	})

	t.Run("bad requests", func(t *testing.T) {
		g := newGuest(15)
		e.boot(t, "src", g)
		ctx := opContext(t)
		other := newGuest(16)
		tests := []struct {
			name    string
			err     error
			wantErr string
			wantIs  error
		}{
			{"same host", e.d.Migrate(ctx, migration("src", "src", g.uuid, g.xml()), nil), "same host", nil},
			{"other uuid in the XML", e.d.Migrate(ctx, migration("src", "dst", g.uuid, other.xml()), nil), "destination XML has uuid " + other.uuid, hypervisor.ErrRejected},
			{"prepare with another uuid", e.d.PrepareMigration(ctx, "dst", g.uuid, other.xml()), "destination XML has uuid " + other.uuid, hypervisor.ErrRejected},
			{"domain on neither host", e.d.Migrate(ctx, migration("src", "dst", other.uuid, other.xml()), nil), "neither on", hypervisor.ErrNotFound},
			{"rollback of a domain on neither host", e.d.Rollback(ctx, "src", "dst", other.uuid), "neither on", hypervisor.ErrNotFound},
			{"unknown destination", e.d.Migrate(ctx, migration("src", "nowhere", g.uuid, g.xml()), nil), `"nowhere"`, hypervisor.ErrUnknownHost},
		}
		for _, tt := range tests {
			if tt.err == nil || !strings.Contains(tt.err.Error(), tt.wantErr) || (tt.wantIs != nil && !errors.Is(tt.err, tt.wantIs)) {
				t.Errorf("%s: error = %v; want one containing %q (wrapping %v)", tt.name, tt.err, tt.wantErr, tt.wantIs)
			}
		}
		e.runsOn(t, "src", g, g.vcpuPins, g.emulator)
	})
}

var errClaimGone = errors.New("claim gone")

// startEarlier starts g's migration to dst as an attempt whose worker then
// went away would have: straight through libvirt, capped at bandwidth
// MiB/s (after a switch to post-copy too), with no Migrate following it,
// with extra flags besides the driver's. It returns once the job shows on src; the channel gets the
// migration call's result.
func (e *migrationEnv) startEarlier(t *testing.T, g guest, destXML string, bandwidth uint64, extra ...golibvirt.DomainMigrateFlags) <-chan error {
	t.Helper()
	ctx := opContext(t)
	c, err := e.d.connect(ctx, "src")
	if err != nil {
		t.Fatal(err)
	}
	dom, err := c.lookup(ctx, g.uuid)
	if err != nil {
		t.Fatal(err)
	}
	params := []golibvirt.TypedParam{
		{Field: golibvirt.MigrateParamDestXML, Value: *golibvirt.NewTypedParamValueString(destXML)},
		{Field: golibvirt.MigrateParamPersistXML, Value: *golibvirt.NewTypedParamValueString(destXML)},
		{Field: golibvirt.MigrateParamURI, Value: *golibvirt.NewTypedParamValueString("tcp://127.0.0.1")},
		{Field: golibvirt.MigrateParamBandwidth, Value: *golibvirt.NewTypedParamValueUllong(bandwidth)},
	}
	flags := migrateFlags
	for _, f := range extra {
		flags |= f
	}
	if flags&golibvirt.MigratePostcopy != 0 {
		params = append(params, golibvirt.TypedParam{Field: golibvirt.MigrateParamBandwidthPostcopy, Value: *golibvirt.NewTypedParamValueUllong(bandwidth)})
	}
	earlier := make(chan error, 1)
	go func() {
		_, err := c.l.DomainMigratePerform3Params(dom, golibvirt.OptString{e.hosts["dst"].URI}, params, nil, flags)
		earlier <- err
	}()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		j, err := c.job(ctx, dom)
		if err == nil && j.active {
			return earlier
		}
		if time.Now().After(deadline) {
			t.Fatalf("the earlier migration's job never showed on src (last: %+v, %v)", j, err)
		}
	}
}

func TestShutdown(t *testing.T) {
	h := testenv.StartLibvirtHost(t, "down")
	d := newTestDriver(t, h)
	g := newGuest(4)
	ctx := opContext(t)
	state := func(step string) hypervisor.State {
		t.Helper()
		dom, err := d.Lookup(ctx, "down", g.uuid)
		if err != nil {
			t.Fatalf("after %s: Lookup(down, %s): %v", step, g.uuid, err)
		}
		return dom.State
	}
	if err := d.Define(ctx, "down", g.xml()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		d.Stop(ctx, "down", g.uuid)
		d.Undefine(ctx, "down", g.uuid)
	})
	if err := d.Shutdown(ctx, "down", g.uuid); err != nil {
		t.Errorf("Shutdown(down, %s) while shut off = %v, want nil", g.uuid, err)
	}
	if err := d.Start(ctx, "down", g.uuid); err != nil {
		t.Fatal(err)
	}
	pid, err := h.QEMUPid(g.name)
	if err != nil {
		t.Fatal(err)
	}
	// The test guest boots no operating system, so nothing in it answers
	// the ACPI power button: libvirt accepts the request, and the guest
	// ignores it and keeps running, as such a guest does on a real host.
	if err := d.Shutdown(ctx, "down", g.uuid); err != nil {
		t.Fatalf("Shutdown(down, %s) = %v, want nil", g.uuid, err)
	}
	if st := state("Shutdown"); st != hypervisor.StateRunning {
		t.Errorf("after Shutdown of a guest without an OS: state %s, want running (it ignores ACPI)", st)
	}
	// Not just slow: a while later it still runs, in the same QEMU.
	time.Sleep(time.Second)
	if st := state("Shutdown and a pause"); st != hypervisor.StateRunning {
		t.Errorf("a second after Shutdown of a guest without an OS: state %s, want running", st)
	}
	if now, err := h.QEMUPid(g.name); err != nil || now != pid {
		t.Errorf("after Shutdown the guest's QEMU pid is %d (%v), want %d", now, err, pid)
	}
	if err := d.Stop(ctx, "down", g.uuid); err != nil {
		t.Fatalf("Stop(down, %s) after an ignored Shutdown = %v", g.uuid, err)
	}
	if st := state("Stop"); st != hypervisor.StateShutoff {
		t.Errorf("after Stop following an ignored Shutdown: state %s, want shutoff", st)
	}
	if err := d.Shutdown(ctx, "down", g.uuid); err != nil {
		t.Errorf("Shutdown(down, %s) after Stop = %v, want nil", g.uuid, err)
	}
	if err := d.Undefine(ctx, "down", g.uuid); err != nil {
		t.Fatal(err)
	}
	if err := d.Shutdown(ctx, "down", g.uuid); !errors.Is(err, hypervisor.ErrNotFound) || !strings.Contains(err.Error(), g.uuid) {
		t.Errorf("Shutdown(down, %s) after Undefine = %v; want ErrNotFound naming the domain", g.uuid, err)
	}
}

func TestReconnectAfterDaemonRestart(t *testing.T) {
	h := testenv.StartLibvirtHost(t, "again")
	d := newTestDriver(t, h)
	g := newGuest(3)
	ctx := opContext(t)
	if err := d.Define(ctx, "again", g.xml()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Undefine(context.Background(), "again", g.uuid) })
	h.Restart(t)
	// The first call may still see the old connection break; the driver
	// must dial again by itself.
	var err error
	for i := range 3 {
		var dom *hypervisor.Domain
		if dom, err = d.Lookup(ctx, "again", g.uuid); err == nil {
			if dom.State != hypervisor.StateShutoff {
				t.Errorf("Lookup(again, %s) after the restart: state %s, want shutoff", g.uuid, dom.State)
			}
			if i > 0 {
				t.Logf("Lookup after the restart needed %d attempts", i+1)
			}
			break
		}
		t.Logf("Lookup(again, %s) attempt %d after the restart: %v", g.uuid, i+1, err)
	}
	if err != nil {
		t.Fatalf("Lookup(again, %s) after the daemon restarted: %v; want the driver to reconnect", g.uuid, err)
	}
}
