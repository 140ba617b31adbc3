package libvirt

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/hypervisor"
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

// TestCheckDestXML: a destination XML for another domain, or whose pins
// do not read, is refused before any host is asked; one that reads gives
// its pins for hypervisor.PinsFit and its memory for the completion
// timeout.
func TestCheckDestXML(t *testing.T) {
	const domain = `<domain type='qemu'><name>t</name><uuid>` + testUUID + `</uuid><memory unit='MiB'>1536</memory><vcpu>2</vcpu>%s</domain>`
	tests := []struct {
		name, xml, wantErr string
	}{
		{"pins read", fmt.Sprintf(domain, `<cputune><vcpupin vcpu='1' cpuset='5'/></cputune>`), ""},
		{"bad cpuset", fmt.Sprintf(domain, `<cputune><vcpupin vcpu='0' cpuset='x'/></cputune>`), `cpuset='x'`},
		{"vcpupin past the vcpus", fmt.Sprintf(domain, `<cputune><vcpupin vcpu='2' cpuset='0'/></cputune>`), `vcpu='2'`},
		{"another domain", strings.Replace(fmt.Sprintf(domain, ""), testUUID, "a1b2c3d4-0000-4000-8000-0000000000bb", 1), "destination XML has uuid a1b2c3d4-0000-4000-8000-0000000000bb"},
		{"not xml", "<domain", "does not parse"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, pins, err := checkDestXML(testUUID, tt.xml)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("checkDestXML(%s) = %v, want nil", tt.xml, err)
				}
				if got := pins.VCPUPins[1].String(); got != "5" {
					t.Errorf("checkDestXML(%s) pins of vCPU 1 = %q, want \"5\"", tt.xml, got)
				}
				if got := id.MemoryBytes; got != 1536<<20 {
					t.Errorf("checkDestXML(%s) memory = %d bytes, want %d", tt.xml, got, 1536<<20)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, hypervisor.ErrRejected) {
				t.Fatalf("checkDestXML(%s) = %v; want ErrRejected containing %q", tt.xml, err, tt.wantErr)
			}
		})
	}
}
