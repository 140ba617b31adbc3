package libvirt

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"libvirt.org/go/libvirtxml"

	"github.com/pinflow/pinflow/numa"
)

func intp(i int) *int { return &i }

func TestParseCapabilities(t *testing.T) {
	b, err := os.ReadFile("testdata/caps-2socket-smt.xml")
	if err != nil {
		t.Fatal(err)
	}
	pages := func(small, huge2M, huge1G int64) []numa.PagePool {
		return []numa.PagePool{{SizeKB: 4, Total: small}, {SizeKB: 2048, Total: huge2M}, {SizeKB: 1048576, Total: huge1G}}
	}
	tests := []struct {
		name   string
		online numa.CPUSet
		want   numa.HostSpec
	}{
		{
			name: "every listed cpu online",
			want: numa.HostSpec{Cells: []numa.CellSpec{
				{ID: 0, CPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}, Siblings: [][]int{{0, 4}, {1, 5}, {2, 6}, {3, 7}},
					MemoryMB: 15997, MemPages: pages(3571605, 1024, 0), Socket: intp(0)},
				// cpu 11 has no socket_id: libvirt lists it offline.
				{ID: 1, CPUs: []int{8, 9, 10, 12, 13, 14, 15}, Siblings: [][]int{{8, 12}, {9, 13}, {10, 14}, {15}},
					MemoryMB: 16122, MemPages: pages(4127248, 0, 2), Socket: intp(1)},
			}},
		},
		{
			name:   "offline threads leave their sibling groups",
			online: numa.MustParse("0-6,8-10,12-15"),
			want: numa.HostSpec{Cells: []numa.CellSpec{
				{ID: 0, CPUs: []int{0, 1, 2, 3, 4, 5, 6}, Siblings: [][]int{{0, 4}, {1, 5}, {2, 6}, {3}},
					MemoryMB: 15997, MemPages: pages(3571605, 1024, 0), Socket: intp(0)},
				{ID: 1, CPUs: []int{8, 9, 10, 12, 13, 14, 15}, Siblings: [][]int{{8, 12}, {9, 13}, {10, 14}, {15}},
					MemoryMB: 16122, MemPages: pages(4127248, 0, 2), Socket: intp(1)},
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCapabilities(string(b), tt.online)
			if err != nil {
				t.Fatalf("ParseCapabilities(caps-2socket-smt.xml, %s): %v", tt.online, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseCapabilities(caps-2socket-smt.xml, %s) mismatch (-want +got):\n%s", tt.online, diff)
			}
		})
	}
}

func TestParseCapabilitiesCPUSets(t *testing.T) {
	b, err := os.ReadFile("testdata/caps-2socket-smt.xml")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := ParseCapabilities(string(b), numa.CPUSet{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, dedicated, shared string
		wantCPUs, wantPCPUs     []string // per cell
	}{
		{name: "neither set: every cpu both", wantCPUs: []string{"0-7", "8-10,12-15"}, wantPCPUs: []string{"0-7", "8-10,12-15"}},
		{name: "dedicated only", dedicated: "2-7,10-15", wantCPUs: []string{"", ""}, wantPCPUs: []string{"2-7", "10,12-15"}},
		{name: "both", dedicated: "2-7,10-15", shared: "0-1,8-9", wantCPUs: []string{"0-1", "8-9"}, wantPCPUs: []string{"2-7", "10,12-15"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := spec
			s.CPUDedicatedSet, s.CPUSharedSet = tt.dedicated, tt.shared
			h, err := s.Host(nil)
			if err != nil {
				t.Fatalf("HostSpec{dedicated %q, shared %q}.Host: %v", tt.dedicated, tt.shared, err)
			}
			for i, c := range h.Cells {
				if c.CPUs.String() != tt.wantCPUs[i] || c.PCPUs.String() != tt.wantPCPUs[i] {
					t.Errorf("dedicated %q shared %q: cell %d cpuset %q pcpuset %q; want %q %q",
						tt.dedicated, tt.shared, c.ID, c.CPUs, c.PCPUs, tt.wantCPUs[i], tt.wantPCPUs[i])
				}
			}
		})
	}
}

func TestParseCapabilitiesErrors(t *testing.T) {
	tests := []struct {
		name, xml, wantErr string
	}{
		{"not xml", "<capabilities", "does not parse"},
		{"no topology", "<capabilities><host></host></capabilities>", "no <host><topology><cells>"},
		{"no memory", `<capabilities><host><topology><cells num='1'><cell id='0'><cpus num='1'><cpu id='0' socket_id='0' core_id='0' siblings='0'/></cpus></cell></cells></topology></host></capabilities>`,
			"cell 0 has no <memory>"},
		{"bad page unit", `<capabilities><host><topology><cells num='1'><cell id='0'><memory unit='KiB'>1048576</memory><pages unit='parsec' size='4'>1</pages></cell></cells></topology></host></capabilities>`,
			"page size 4 parsec is invalid"},
		{"bad siblings", `<capabilities><host><topology><cells num='1'><cell id='0'><memory unit='KiB'>1048576</memory><cpus num='1'><cpu id='0' socket_id='0' core_id='0' siblings='zero'/></cpus></cell></cells></topology></host></capabilities>`,
			`siblings "zero"`},
		{"only memoryless cells", `<capabilities><host><topology><cells num='1'><cell id='0'><memory unit='KiB'>0</memory></cell></cells></topology></host></capabilities>`,
			"no NUMA cell has memory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCapabilities(tt.xml, numa.CPUSet{})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "libvirt: ") {
				t.Fatalf("ParseCapabilities(%s) error = %v; want one starting \"libvirt: \" containing %q", tt.name, err, tt.wantErr)
			}
		})
	}
}

func TestFitsHost(t *testing.T) {
	spec := numa.HostSpec{Cells: []numa.CellSpec{{ID: 0, CPUs: []int{0, 1}, MemoryMB: 1024}}}
	tests := []struct {
		name, xml, wantErr string
	}{
		{"fits", `<domain><vcpu cpuset='0-1'>2</vcpu><cputune><vcpupin vcpu='0' cpuset='1'/><emulatorpin cpuset='0'/></cputune><numatune><memory mode='strict' nodeset='0'/><memnode cellid='0' mode='strict' nodeset='0'/></numatune></domain>`, ""},
		{"vcpupin to a missing cpu", `<domain><cputune><vcpupin vcpu='1' cpuset='5'/></cputune></domain>`, `<vcpupin vcpu='1'> cpuset "5" names cpus 5 the host does not have; its online cpus are 0-1`},
		{"emulatorpin to a missing cpu", `<domain><cputune><emulatorpin cpuset='0-2'/></cputune></domain>`, `<emulatorpin> cpuset "0-2" names cpus 2`},
		{"iothreadpin to a missing cpu", `<domain><cputune><iothreadpin iothread='1' cpuset='7'/></cputune></domain>`, `<iothreadpin iothread='1'> cpuset "7"`},
		{"vcpu cpuset", `<domain><vcpu cpuset='3'>1</vcpu></domain>`, `<vcpu> cpuset "3"`},
		{"memory on a missing node", `<domain><numatune><memory mode='strict' nodeset='1'/></numatune></domain>`, `<numatune><memory> nodeset "1" names NUMA nodes 1 the host does not have; its nodes are 0`},
		{"memnode on a missing node", `<domain><numatune><memnode cellid='1' mode='strict' nodeset='0-1'/></numatune></domain>`, `<memnode cellid='1'> nodeset "0-1"`},
		{"bad cpuset", `<domain><cputune><vcpupin vcpu='0' cpuset='x'/></cputune></domain>`, `cpuset "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var dom libvirtxml.Domain
			if err := dom.Unmarshal(tt.xml); err != nil {
				t.Fatal(err)
			}
			err := fitsHost(&dom, spec)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("fitsHost(%s) = %v, want nil", tt.xml, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("fitsHost(%s) = %v, want an error containing %q", tt.xml, err, tt.wantErr)
			}
		})
	}
}
