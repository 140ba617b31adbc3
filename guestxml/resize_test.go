package guestxml

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"libvirt.org/go/libvirtxml"

	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

const (
	testName = "guest-1"
	testUUID = "8c9ab8b4-1b7b-4a34-9d2f-9e2f0d3b1c11"
)

// testHost has two cells of four pCPUs without SMT, 4 GiB and a 2 MiB page
// pool each.
func testHost() *numa.Host {
	h := &numa.Host{}
	for i := range 2 {
		cpus := numa.Range(4*i, 4*i+3)
		c := numa.Cell{ID: i, CPUs: cpus, PCPUs: cpus, MemoryMB: 4096, Socket: i,
			Pages: []numa.PagePool{{SizeKB: 4, Total: 4096 * 256}, {SizeKB: 2048, Total: 1024}}}
		for _, id := range cpus.List() {
			c.Siblings = append(c.Siblings, numa.NewCPUSet(id))
		}
		h.Cells = append(h.Cells, c)
	}
	return h
}

// flavorSpec is a flavor: vCPUs, memory and extra specs.
type flavorSpec struct {
	vcpus    int
	memoryMB int64
	specs    map[string]string
}

// fit returns the request of f and its placement on a fresh testHost.
func fit(t *testing.T, f flavorSpec) (*numa.Request, *numa.Placement) {
	t.Helper()
	req, err := numa.NewRequest(f.vcpus, f.memoryMB, f.specs, nil)
	if err != nil {
		t.Fatalf("NewRequest(%d, %d, %v): %v", f.vcpus, f.memoryMB, f.specs, err)
	}
	p, err := numa.Fit(testHost(), req)
	if err != nil {
		t.Fatalf("Fit(%v): %v", f.specs, err)
	}
	return req, p
}

func parse(t *testing.T, what, doc string) *libvirtxml.Domain {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(doc); err != nil {
		t.Fatalf("%s does not parse: %v\n%s", what, err, doc)
	}
	return &d
}

// What a guest gains after New: the devices and metadata Resize must keep.
const (
	extraMetadata = `<metadata><pf:instance xmlns:pf="https://pinflow.example/instance/1">web</pf:instance></metadata>`
	extraDevices  = `<disk type="file" device="disk"><driver name="qemu" type="qcow2"></driver>` +
		`<source file="/var/lib/pinflow/guest-1.qcow2"></source><target dev="vda" bus="virtio"></target></disk>` +
		`<interface type="network"><mac address="52:54:00:12:34:56"></mac><source network="default"></source>` +
		`<model type="virtio"></model></interface>`
)

// TestResize resizes a guest New made for one flavor, with a disk, an
// interface, metadata and the old placement's pins, to another flavor.
func TestResize(t *testing.T) {
	plain := flavorSpec{2, 1024, nil}
	pinned := flavorSpec{2, 1024, map[string]string{"hw:cpu_policy": "dedicated"}}
	pinnedHuge := flavorSpec{2, 1024, map[string]string{"hw:cpu_policy": "dedicated", "hw:mem_page_size": "2048"}}
	twoCellsHuge := flavorSpec{4, 2048, map[string]string{"hw:cpu_policy": "dedicated", "hw:numa_nodes": "2", "hw:mem_page_size": "2048"}}
	tests := []struct {
		name     string
		from, to flavorSpec
		typ      string
	}{
		{"no NUMA to 2 cells with huge pages", plain, twoCellsHuge, ""},
		{"2 cells to 1", twoCellsHuge, pinned, ""},
		{"2 cells to 1 on kvm", twoCellsHuge, pinned, "kvm"},
		{"huge pages added", pinned, pinnedHuge, ""},
		{"huge pages removed", pinnedHuge, pinned, ""},
		{"NUMA removed", pinnedHuge, plain, ""},
		{"grown, 1 cell to 3 vCPUs", pinned, flavorSpec{3, 3072, pinned.specs}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := Options{Type: tt.typ}
			fromReq, fromP := fit(t, tt.from)
			src, err := New(testName, testUUID, fromReq, fromP, o)
			if err != nil {
				t.Fatalf("New(%v): %v", tt.from, err)
			}
			src = strings.Replace(src, "<memory ", extraMetadata+"<memory ", 1)
			src = strings.Replace(src, "</devices>", extraDevices+"</devices>", 1)
			if fromP.HasNUMA() {
				if src, err = xmlpatch.Patch(src, fromP); err != nil {
					t.Fatalf("Patch(New(%v)): %v", tt.from, err)
				}
			}
			req, p := fit(t, tt.to)
			out, err := Resize(src, req, p, o)
			if err != nil {
				t.Fatalf("Resize(%v -> %v): %v", tt.from, tt.to, err)
			}
			fresh, err := New(testName, testUUID, req, p, o)
			if err != nil {
				t.Fatalf("New(%v): %v", tt.to, err)
			}
			got, want, old := parse(t, "Resize", out), parse(t, "New", fresh), parse(t, "source", src)

			// What the flavor decides is what New writes for it.
			type flavorFields struct {
				Memory    *libvirtxml.DomainMemory
				VCPU      *libvirtxml.DomainVCPU
				Cells     *libvirtxml.DomainNuma
				Hugepages *libvirtxml.DomainMemoryHugepages
			}
			fields := func(d *libvirtxml.Domain) flavorFields {
				f := flavorFields{Memory: d.Memory, VCPU: d.VCPU}
				if d.CPU != nil {
					f.Cells = d.CPU.Numa
				}
				if d.MemoryBacking != nil {
					f.Hugepages = d.MemoryBacking.MemoryHugePages
				}
				return f
			}
			if diff := cmp.Diff(fields(want), fields(got)); diff != "" {
				t.Errorf("Resize(%v -> %v) flavor fields differ from New(%v) (-want +got):\n%s", tt.from, tt.to, tt.to, diff)
			}
			if got.CPU != nil && got.CPU.Topology != nil {
				if tp := got.CPU.Topology; tp.Sockets*tp.Dies*tp.Cores*tp.Threads != tt.to.vcpus {
					t.Errorf("Resize(%v -> %v) topology %+v does not multiply out to %d vCPUs", tt.from, tt.to, *tp, tt.to.vcpus)
				}
			}
			// What the guest was given after New is kept.
			type keptFields struct {
				Name, UUID string
				Metadata   *libvirtxml.DomainMetadata
				Disks      []libvirtxml.DomainDisk
				Interfaces []libvirtxml.DomainInterface
			}
			kept := func(d *libvirtxml.Domain) keptFields {
				return keptFields{d.Name, d.UUID, d.Metadata, d.Devices.Disks, d.Devices.Interfaces}
			}
			if len(old.Devices.Disks) != 1 || len(old.Devices.Interfaces) != 1 || old.Metadata == nil {
				t.Fatalf("source lacks the added disk, interface or metadata:\n%s", src)
			}
			if diff := cmp.Diff(kept(old), kept(got)); diff != "" {
				t.Errorf("Resize(%v -> %v) lost what the guest held (-source +got):\n%s", tt.from, tt.to, diff)
			}

			testenv.ValidateDomainXML(t, "Resize("+tt.name+")", out)
			if !p.HasNUMA() {
				// Nothing to patch: the result must carry no pins at all.
				pins, err := xmlpatch.Read(out)
				if err != nil {
					t.Fatalf("Read(Resize(%v -> %v)): %v", tt.from, tt.to, err)
				}
				if len(pins.VCPUPins) != 0 || !pins.EmulatorPins.IsEmpty() || pins.Memory != nil || len(pins.MemNodes) != 0 {
					t.Errorf("Resize(%v -> %v) kept old pins: %+v", tt.from, tt.to, pins)
				}
				return
			}
			patched, err := xmlpatch.Patch(out, p)
			if err != nil {
				t.Fatalf("Patch(Resize(%v -> %v), %s): %v", tt.from, tt.to, p, err)
			}
			testenv.ValidateDomainXML(t, "Patch(Resize("+tt.name+"))", patched)
			pins, err := xmlpatch.Read(patched)
			if err != nil {
				t.Fatalf("Read(Patch(Resize(%v -> %v))): %v", tt.from, tt.to, err)
			}
			wantPins, err := xmlpatch.PinsFor(p)
			if err != nil {
				t.Fatalf("PinsFor(%s): %v", p, err)
			}
			// The old <numatune> is gone, so Patch writes strict throughout.
			wantPins.Memory.Mode = "strict"
			for id, mn := range wantPins.MemNodes {
				mn.Mode = "strict"
				wantPins.MemNodes[id] = mn
			}
			if diff := cmp.Diff(wantPins, pins); diff != "" {
				t.Errorf("Read(Patch(Resize(%v -> %v))) differs from PinsFor (-want +got):\n%s", tt.from, tt.to, diff)
			}
		})
	}
}

// oldGuest carries what an old flavor and placement left: pins, a numatune,
// a vCPU enable list and count, a balloon target, huge pages. The disk and
// every non-pin tuning must survive a resize.
const oldGuest = `<domain type="kvm" id="7">
  <name>old</name>
  <uuid>0f6d9f1e-2a43-4d0c-9a4e-7d3c2b1a0f99</uuid>
  <memory unit="KiB">4194304</memory>
  <currentMemory unit="KiB">4194304</currentMemory>
  <memoryBacking>
    <hugepages><page size="1048576" unit="KiB" nodeset="0-1"/></hugepages>
    <nosharepages/>
  </memoryBacking>
  <vcpu placement="static" cpuset="0-7" current="2">4</vcpu>
  <vcpus>
    <vcpu id="0" enabled="yes" hotpluggable="no"/>
    <vcpu id="1" enabled="yes" hotpluggable="yes"/>
    <vcpu id="2" enabled="no" hotpluggable="yes"/>
    <vcpu id="3" enabled="no" hotpluggable="yes"/>
  </vcpus>
  <cputune>
    <shares>2048</shares>
    <vcpupin vcpu="0" cpuset="4"/>
    <vcpupin vcpu="1" cpuset="5"/>
    <vcpupin vcpu="2" cpuset="6"/>
    <vcpupin vcpu="3" cpuset="7"/>
    <emulatorpin cpuset="4-7"/>
    <iothreadpin iothread="1" cpuset="4-7"/>
    <vcpusched vcpus="1-3" scheduler="fifo" priority="1"/>
  </cputune>
  <numatune>
    <memory mode="strict" nodeset="0-1"/>
    <memnode cellid="0" mode="strict" nodeset="0"/>
    <memnode cellid="1" mode="strict" nodeset="1"/>
  </numatune>
  <os><type arch="x86_64" machine="q35">hvm</type></os>
  <features><acpi/></features>
  <cpu mode="host-model" check="partial">
    <topology sockets="2" dies="1" cores="2" threads="1"/>
    <numa>
      <cell id="0" cpus="0-1" memory="2097152" unit="KiB"/>
      <cell id="1" cpus="2-3" memory="2097152" unit="KiB"/>
    </numa>
  </cpu>
  <devices>
    <disk type="file" device="disk"><source file="/var/lib/old.qcow2"/><target dev="vda" bus="virtio"/></disk>
  </devices>
</domain>`

// TestResizeDropsOldPins: the old pins, numatune, vCPU list and balloon
// target go; shares, other memoryBacking children, the CPU mode, type,
// os, features and the disk stay.
func TestResizeDropsOldPins(t *testing.T) {
	req, p := fit(t, flavorSpec{2, 1024, map[string]string{"hw:cpu_policy": "dedicated"}})
	out, err := Resize(oldGuest, req, p, Options{Type: "kvm"})
	if err != nil {
		t.Fatalf("Resize(oldGuest): %v", err)
	}
	testenv.ValidateDomainXML(t, "Resize(oldGuest)", out)
	got, old := parse(t, "Resize(oldGuest)", out), parse(t, "oldGuest", oldGuest)
	zero := uint(0)
	want := *old
	want.XMLName = got.XMLName
	want.Memory = &libvirtxml.DomainMemory{Value: 1024, Unit: "MiB"}
	want.CurrentMemory = nil
	want.MemoryBacking = &libvirtxml.DomainMemoryBacking{MemoryNosharepages: &libvirtxml.DomainMemoryNosharepages{}}
	want.VCPU = &libvirtxml.DomainVCPU{Placement: "static", Value: 2}
	want.VCPUs = nil
	want.CPUTune = &libvirtxml.DomainCPUTune{Shares: old.CPUTune.Shares}
	want.NUMATune = nil
	want.CPU = &libvirtxml.DomainCPU{XMLName: got.CPU.XMLName, Mode: "host-model", Check: "partial",
		Topology: &libvirtxml.DomainCPUTopology{Sockets: 1, Dies: 1, Cores: 2, Threads: 1},
		Numa:     &libvirtxml.DomainNuma{Cell: []libvirtxml.DomainCell{{ID: &zero, CPUs: "0-1", Memory: 1024, Unit: "MiB"}}}}
	if diff := cmp.Diff(&want, got); diff != "" {
		t.Errorf("Resize(oldGuest, 2 vCPUs 1 cell) (-want +got):\n%s", diff)
	}
}

func TestResizeErrors(t *testing.T) {
	req, p := fit(t, flavorSpec{2, 1024, nil})
	tests := []struct {
		name, doc string
		o         Options
		want      string
	}{
		{"empty", "", Options{}, "does not parse"},
		{"not XML", "vcpus: 4", Options{}, "does not parse"},
		{"unclosed", "<domain><name>g</name>", Options{}, "does not parse"},
		{"not a domain", "<network><name>default</name></network>", Options{}, "does not parse"},
		{"no name", `<domain type="kvm"><uuid>` + testUUID + `</uuid></domain>`, Options{}, "has no <name>"},
		{"blank name", `<domain type="kvm"><name> </name><uuid>` + testUUID + `</uuid></domain>`, Options{}, "has no <name>"},
		{"no uuid", `<domain type="kvm"><name>g</name></domain>`, Options{}, `guest "g" has no <uuid>`},
		{"bad type", `<domain type="kvm"><name>g</name><uuid>` + testUUID + `</uuid></domain>`, Options{Type: "xen"}, `type "xen": allowed are qemu or kvm`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := Resize(tt.doc, req, p, tt.o)
			if err == nil {
				t.Fatalf("Resize(%q) = %q, want an error containing %q", tt.doc, out, tt.want)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "domain: resize: ") || !strings.Contains(msg, tt.want) {
				t.Errorf("Resize(%q) error = %q, want one starting %q containing %q", tt.doc, msg, "domain: resize: ", tt.want)
			}
		})
	}
}
