package guestxml

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"libvirt.org/go/libvirtxml"

	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// TestDefaults: New gives a field left empty its Default constant.
func TestDefaults(t *testing.T) {
	want := Options{Type: DefaultType, Emulator: DefaultEmulator, Machine: DefaultMachine}
	if got := (Options{}).withDefaults(); got != want {
		t.Errorf("Options{}.withDefaults() = %+v, want %+v", got, want)
	}
}

// TestNewPinned builds a guest's domain XML from its request and
// placement as a boot does, New then xmlpatch.Patch, and reads back the
// exact memory, guest NUMA cells, huge pages and pins it carries. The
// placement crosses guest cells onto host cells, so a pin or nodeset
// taken from the guest cell's id instead of its host cell shows.
func TestNewPinned(t *testing.T) {
	twoCells := flavorSpec{4, 2048, map[string]string{"hw:cpu_policy": "dedicated", "hw:numa_nodes": "2", "hw:mem_page_size": "2048"}}
	oneCell := flavorSpec{2, 1024, map[string]string{"hw:cpu_policy": "dedicated"}}
	tests := []struct {
		name   string
		flavor flavorSpec
		p      *numa.Placement
		// What the XML must carry.
		memory    libvirtxml.DomainMemory
		cells     []libvirtxml.DomainCell
		hugepages []libvirtxml.DomainMemoryHugepage // nil: no <memoryBacking>
		pins      *xmlpatch.Pins
	}{{
		name:   "two cells crossed onto the host cells, 2 MiB pages",
		flavor: twoCells,
		p: &numa.Placement{Cells: []numa.PlacedCell{
			{GuestCell: 0, HostCell: 1, DedicatedVCPUs: numa.Range(0, 1), Pins: map[int]int{0: 5, 1: 7},
				MemoryMB: 1024, PageSizeKB: 2048, CPUPolicy: numa.CPUPolicyDedicated},
			{GuestCell: 1, HostCell: 0, DedicatedVCPUs: numa.Range(2, 3), Pins: map[int]int{2: 0, 3: 2},
				MemoryMB: 1024, PageSizeKB: 2048, CPUPolicy: numa.CPUPolicyDedicated},
		}},
		memory: libvirtxml.DomainMemory{Value: 2048, Unit: "MiB"},
		cells: []libvirtxml.DomainCell{
			{ID: uintp(0), CPUs: "0-1", Memory: 1024, Unit: "MiB"},
			{ID: uintp(1), CPUs: "2-3", Memory: 1024, Unit: "MiB"},
		},
		hugepages: []libvirtxml.DomainMemoryHugepage{
			{Size: 2048, Unit: "KiB", Nodeset: "0"},
			{Size: 2048, Unit: "KiB", Nodeset: "1"},
		},
		pins: &xmlpatch.Pins{
			VCPUs: 4,
			VCPUPins: map[int]numa.CPUSet{
				0: numa.NewCPUSet(5), 1: numa.NewCPUSet(7), 2: numa.NewCPUSet(0), 3: numa.NewCPUSet(2),
			},
			EmulatorPins: numa.NewCPUSet(0, 2, 5, 7),
			Memory:       &xmlpatch.MemoryPolicy{Mode: "strict", Nodeset: numa.Range(0, 1)},
			MemNodes: map[int]xmlpatch.MemoryPolicy{
				0: {Mode: "strict", Nodeset: numa.NewCPUSet(1)},
				1: {Mode: "strict", Nodeset: numa.NewCPUSet(0)},
			},
			GuestCells: []xmlpatch.GuestCell{
				{ID: 0, VCPUs: numa.Range(0, 1), MemoryKiB: 1024 << 10},
				{ID: 1, VCPUs: numa.Range(2, 3), MemoryKiB: 1024 << 10},
			},
		},
	}, {
		name:   "one cell on host cell 1, no huge pages",
		flavor: oneCell,
		p: &numa.Placement{Cells: []numa.PlacedCell{
			{GuestCell: 0, HostCell: 1, DedicatedVCPUs: numa.Range(0, 1), Pins: map[int]int{0: 6, 1: 4},
				MemoryMB: 1024, CPUPolicy: numa.CPUPolicyDedicated},
		}},
		memory: libvirtxml.DomainMemory{Value: 1024, Unit: "MiB"},
		cells:  []libvirtxml.DomainCell{{ID: uintp(0), CPUs: "0-1", Memory: 1024, Unit: "MiB"}},
		pins: &xmlpatch.Pins{
			VCPUs:        2,
			VCPUPins:     map[int]numa.CPUSet{0: numa.NewCPUSet(6), 1: numa.NewCPUSet(4)},
			EmulatorPins: numa.NewCPUSet(4, 6),
			Memory:       &xmlpatch.MemoryPolicy{Mode: "strict", Nodeset: numa.NewCPUSet(1)},
			MemNodes:     map[int]xmlpatch.MemoryPolicy{0: {Mode: "strict", Nodeset: numa.NewCPUSet(1)}},
			GuestCells:   []xmlpatch.GuestCell{{ID: 0, VCPUs: numa.Range(0, 1), MemoryKiB: 1024 << 10}},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := numa.NewRequest(tt.flavor.vcpus, tt.flavor.memoryMB, tt.flavor.specs, nil)
			if err != nil {
				t.Fatalf("NewRequest(%v): %v", tt.flavor, err)
			}
			base, err := New(testName, testUUID, req, tt.p, Options{})
			if err != nil {
				t.Fatalf("New(%v): %v", tt.flavor, err)
			}
			doc, err := xmlpatch.Patch(base, tt.p)
			if err != nil {
				t.Fatalf("Patch(New(%v)): %v", tt.flavor, err)
			}
			d := parse(t, "Patch(New)", doc)
			if d.Name != testName || d.UUID != testUUID {
				t.Errorf("Patch(New(%v)) name %q uuid %q, want %q %q", tt.flavor, d.Name, d.UUID, testName, testUUID)
			}
			if diff := cmp.Diff(&tt.memory, d.Memory); diff != "" {
				t.Errorf("Patch(New(%v)) <memory> (-want +got):\n%s", tt.flavor, diff)
			}
			if d.CPU == nil || d.CPU.Numa == nil {
				t.Fatalf("Patch(New(%v)) has no <cpu><numa>:\n%s", tt.flavor, doc)
			}
			if diff := cmp.Diff(tt.cells, d.CPU.Numa.Cell); diff != "" {
				t.Errorf("Patch(New(%v)) <numa> cells (-want +got):\n%s", tt.flavor, diff)
			}
			var pages []libvirtxml.DomainMemoryHugepage
			if d.MemoryBacking != nil && d.MemoryBacking.MemoryHugePages != nil {
				pages = d.MemoryBacking.MemoryHugePages.Hugepages
			}
			if diff := cmp.Diff(tt.hugepages, pages); diff != "" {
				t.Errorf("Patch(New(%v)) <hugepages> (-want +got):\n%s", tt.flavor, diff)
			}
			pins, err := xmlpatch.Read(doc)
			if err != nil {
				t.Fatalf("Read(Patch(New(%v))): %v", tt.flavor, err)
			}
			if diff := cmp.Diff(tt.pins, pins); diff != "" {
				t.Errorf("Read(Patch(New(%v))) pins (-want +got):\n%s", tt.flavor, diff)
			}
		})
	}
}

func uintp(n uint) *uint { return &n }
