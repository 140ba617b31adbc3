package xmlpatch

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/numa"
)

func TestRead(t *testing.T) {
	smallCells := []GuestCell{{ID: 0, VCPUs: set("0"), MemoryKiB: 65536}, {ID: 1, VCPUs: set("1"), MemoryKiB: 65536}}
	small := func() *Pins {
		return &Pins{
			VCPUs:            2,
			VCPUPins:         map[int]numa.CPUSet{0: set("0"), 1: set("1")},
			EmulatorPins:     set("0-1"),
			Memory:           &MemoryPolicy{Mode: "strict", Nodeset: set("0")},
			MemNodes:         map[int]MemoryPolicy{0: {Mode: "strict", Nodeset: set("0")}, 1: {Mode: "preferred", Nodeset: set("0")}},
			Sched:            map[int]Sched{0: fifo(1), 1: fifo(1)},
			RealtimeVCPUs:    set("0-1"),
			RealtimePriority: 1,
			GuestCells:       smallCells,
		}
	}
	pinned := small()
	pinned.DefaultCPUs = set("0-1")
	tcg := small()
	tcg.Sched, tcg.RealtimeVCPUs, tcg.RealtimePriority = nil, numa.CPUSet{}, 0
	tests := []struct {
		name string
		doc  string
		want *Pins
	}{
		{"pinned-domain.xml", readFile(t, "pinned-domain.xml"), pinned},
		{"rt-vm.xml", readFile(t, "rt-vm.xml"), small()},
		{"tcg-vm.xml", readFile(t, "tcg-vm.xml"), tcg},
		{"domain-src.xml", readFile(t, "domain-src.xml"), &Pins{
			VCPUs:            4,
			VCPUPins:         map[int]numa.CPUSet{0: set("2"), 1: set("34"), 2: set("18"), 3: set("50")},
			EmulatorPins:     set("3"),
			Memory:           &MemoryPolicy{Mode: "strict", Nodeset: set("0-1")},
			MemNodes:         map[int]MemoryPolicy{0: {Mode: "strict", Nodeset: set("0")}, 1: {Mode: "strict", Nodeset: set("1")}},
			Sched:            map[int]Sched{1: fifo(1), 2: fifo(1), 3: fifo(1)},
			RealtimeVCPUs:    set("1-3"),
			RealtimePriority: 1,
			GuestCells:       []GuestCell{{ID: 0, VCPUs: set("0-1"), MemoryKiB: 4194304}, {ID: 1, VCPUs: set("2-3"), MemoryKiB: 4194304}},
		}},
		// libvirt writes one vcpusched per vCPU after it has read a range:
		// both forms read the same, and mixed priorities leave no common one.
		{"per-vCPU vcpusched", minimal(4, `  <cputune>
    <vcpusched vcpus='0' scheduler='batch'/>
    <vcpusched vcpus='1' scheduler='fifo' priority='2'/>
    <vcpusched vcpus='2-3,^2' scheduler='rr' priority='3'/>
  </cputune>
`, cells2x2), &Pins{
			VCPUs:         4,
			Sched:         map[int]Sched{0: {Scheduler: "batch"}, 1: fifo(2), 3: {Scheduler: "rr", Priority: 3}},
			RealtimeVCPUs: set("1,3"),
			GuestCells:    []GuestCell{{ID: 0, VCPUs: set("0-1"), MemoryKiB: 1048576}, {ID: 1, VCPUs: set("2-3"), MemoryKiB: 1048576}},
		}},
		{"iothreads and placement auto", minimal(2, `  <iothreads>2</iothreads>
  <cputune>
    <iothreadpin iothread='1' cpuset='4-5'/>
    <iothreadpin iothread='2' cpuset='6'/>
  </cputune>
  <numatune>
    <memory mode='strict' placement='auto'/>
  </numatune>
`, ""), &Pins{
			VCPUs:        2,
			IOThreadPins: map[int]numa.CPUSet{1: set("4-5"), 2: set("6")},
			IOThreads:    []int{1, 2},
			Memory:       &MemoryPolicy{Mode: "strict", Placement: "auto"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Read(tt.doc)
			if err != nil {
				t.Fatalf("Read(%s): %v", tt.name, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Read(%s) (-want +got):\n%s", tt.name, diff)
			}
		})
	}
}

// TestReadJSON checks the JSON form the CLI prints.
func TestReadJSON(t *testing.T) {
	got, err := Read(readFile(t, "rt-vm.xml"))
	if err != nil {
		t.Fatalf("Read(rt-vm.xml): %v", err)
	}
	data, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"vcpus":2,"vcpu_pins":{"0":"0","1":"1"},"emulator_pins":"0-1","memory":{"mode":"strict","nodeset":"0"},` +
		`"memnodes":{"0":{"mode":"strict","nodeset":"0"},"1":{"mode":"preferred","nodeset":"0"}},` +
		`"vcpu_sched":{"0":{"scheduler":"fifo","priority":1},"1":{"scheduler":"fifo","priority":1}},` +
		`"realtime_vcpus":"0-1","realtime_priority":1,` +
		`"guest_cells":[{"id":0,"vcpus":"0","memory_kib":65536},{"id":1,"vcpus":"1","memory_kib":65536}]}`
	if string(data) != want {
		t.Errorf("json.Marshal(Read(rt-vm.xml)) =\n%s\nwant\n%s", data, want)
	}
	if hc := got.HostCPUs(); !hc.Equal(set("0-1")) {
		t.Errorf("Read(rt-vm.xml).HostCPUs() = %s, want 0-1", hc)
	}
}

func TestReadErrors(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"invalid-domain.xml", readFile(t, "invalid-domain.xml"), "<memory mode='wrong'>"},
		{"vcpupin out of range", minimal(2, "  <cputune><vcpupin vcpu='2' cpuset='1'/></cputune>\n", ""), "<vcpupin vcpu='2'>: must be a whole number 0-1"},
		{"duplicate vcpupin", minimal(2, "  <cputune><vcpupin vcpu='1' cpuset='1'/><vcpupin vcpu='1' cpuset='2'/></cputune>\n", ""), "two <vcpupin> for vCPU 1"},
		{"bad cpuset", minimal(2, "  <cputune><emulatorpin cpuset='1-x'/></cputune>\n", ""), "<emulatorpin cpuset='1-x'>"},
		{"overlapping vcpusched", minimal(2, "  <cputune><vcpusched vcpus='0-1' scheduler='fifo' priority='1'/><vcpusched vcpus='1' scheduler='batch'/></cputune>\n", ""), "vCPU 1 is in two <vcpusched>"},
		{"scheduler", minimal(2, "  <cputune><vcpusched vcpus='0' scheduler='deadline'/></cputune>\n", ""), "allowed schedulers are batch, idle, fifo, rr"},
		{"not XML", "pinned-domain.xml", "text outside the root element"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Read(tt.doc)
			if err == nil {
				t.Fatalf("Read(%s) = %+v, want an error containing %q", tt.name, got, tt.want)
			}
			if msg := err.Error(); !errors.Is(err, ErrMalformed) || !strings.HasPrefix(msg, "xmlpatch: ") || !strings.Contains(msg, tt.want) {
				t.Errorf("Read(%s) error = %q, want ErrMalformed containing %q", tt.name, msg, tt.want)
			}
		})
	}
}

// twoCellHost is a two-cell SMT host: cell 0 CPUs 0-7, cell 1 CPUs 8-15,
// siblings n and n+4, with the given cpu_dedicated_set and cpu_shared_set.
func twoCellHost(t *testing.T, dedicated, shared string) *numa.Host {
	t.Helper()
	spec := numa.HostSpec{CPUDedicatedSet: dedicated, CPUSharedSet: shared}
	for c := range 2 {
		cell := numa.CellSpec{ID: c, MemoryMB: 16384, MemPages: []numa.PagePool{{SizeKB: 4, Total: 8192 * 256}, {SizeKB: 2048, Total: 4096}}}
		for i := range 8 {
			cell.CPUs = append(cell.CPUs, 8*c+i)
		}
		for i := range 4 {
			cell.Siblings = append(cell.Siblings, []int{8*c + i, 8*c + i + 4})
		}
		spec.Cells = append(spec.Cells, cell)
	}
	h, err := spec.Host(nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// domainFor writes a schema-valid domain whose guest cells are those of p,
// with stale pins from another host and the given extra elements.
func domainFor(p *numa.Placement, extra string) string {
	var cells strings.Builder
	vcpus := 0
	for _, c := range p.Cells {
		all := c.SharedVCPUs.Union(c.DedicatedVCPUs)
		vcpus += all.Len()
		fmt.Fprintf(&cells, "      <cell id='%d' cpus='%s' memory='%d' unit='MiB'/>\n", c.GuestCell, all, c.MemoryMB)
	}
	stale := "  <cputune>\n    <shares>1024</shares>\n    <vcpupin vcpu='0' cpuset='63'/>\n    <emulatorpin cpuset='62'/>\n  </cputune>\n" +
		"  <numatune>\n    <memory mode='preferred' nodeset='3'/>\n  </numatune>\n"
	return minimal(vcpus, extra+stale, cells.String())
}

// TestRoundTrip checks Read(Patch(x, p)) against PinsFor(p) for placements
// found by numa.Fit.
func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		vcpus int
		// legacy hosts have no cpu_dedicated_set or cpu_shared_set.
		legacy bool
		specs  map[string]string
		extra  string
		// iothreads are the I/O thread ids extra declares.
		iothreads []int
	}{
		{"dedicated", 4, false, map[string]string{"hw:cpu_policy": "dedicated"}, "", nil},
		{"mixed", 4, false, map[string]string{"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "^0-1"}, "", nil},
		{"isolate emulator", 3, true, map[string]string{"hw:cpu_policy": "dedicated", "hw:emulator_threads_policy": "isolate", "hw:cpu_thread_policy": "isolate"}, "", nil},
		{"share emulator with iothreads", 2, false, map[string]string{"hw:cpu_policy": "dedicated", "hw:emulator_threads_policy": "share"}, "  <iothreads>1</iothreads>\n  <iothreadids>\n    <iothread id='3'/>\n  </iothreadids>\n", []int{3}},
		{"realtime", 4, false, map[string]string{"hw:cpu_policy": "dedicated", "hw:cpu_realtime": "yes", "hw:cpu_realtime_mask": "^0", "hw:mem_page_size": "2048"}, "", nil},
		{"multi-cell", 6, false, map[string]string{"hw:cpu_policy": "dedicated", "hw:numa_nodes": "2", "hw:numa_cpus.0": "0-1", "hw:numa_cpus.1": "2-5", "hw:numa_mem.0": "1024", "hw:numa_mem.1": "3072"}, "  <iothreads>2</iothreads>\n", []int{1, 2}},
		{"multi-cell mixed realtime", 6, false, map[string]string{"hw:cpu_policy": "mixed", "hw:numa_nodes": "2", "hw:cpu_realtime_mask": "^0,3", "hw:cpu_realtime": "yes"}, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := numa.NewRequest(tt.vcpus, 4096, tt.specs, nil)
			if err != nil {
				t.Fatalf("NewRequest(%d, %v): %v", tt.vcpus, tt.specs, err)
			}
			host := twoCellHost(t, "2-7,10-15", "0-1,8-9")
			if tt.legacy {
				host = twoCellHost(t, "", "")
			}
			p, err := numa.Fit(host, req)
			if err != nil {
				t.Fatalf("Fit(%v): %v", tt.specs, err)
			}
			t.Logf("Fit(%v) = %s, emulator %s, realtime %s", tt.specs, p, p.EmulatorPCPUs(), p.RealtimeVCPUs)
			src := domainFor(p, tt.extra)
			testenv.ValidateDomainXML(t, tt.name+" source", src)
			got, err := Patch(src, p)
			if err != nil {
				t.Fatalf("Patch(%s, %s): %v", tt.name, p, err)
			}
			checkUntouched(t, tt.name, src, got)
			testenv.ValidateDomainXML(t, "Patch("+tt.name+")", got)
			read, err := Read(got)
			if err != nil {
				t.Fatalf("Read(Patch(%s)): %v", tt.name, err)
			}
			want, err := PinsFor(p)
			if err != nil {
				t.Fatalf("PinsFor(%s): %v", p, err)
			}
			// What the domain, not the placement, decides: modes kept or
			// defaulted, I/O threads pinned with the emulator.
			want.Memory.Mode = "preferred"
			for id, mn := range want.MemNodes {
				mn.Mode = "strict"
				want.MemNodes[id] = mn
			}
			for _, id := range tt.iothreads {
				if want.IOThreadPins == nil {
					want.IOThreadPins = map[int]numa.CPUSet{}
				}
				want.IOThreadPins[id] = want.EmulatorPins
				want.IOThreads = append(want.IOThreads, id)
			}
			if diff := cmp.Diff(want, read); diff != "" {
				t.Errorf("Read(Patch(%s, %s)) differs from PinsFor (-want +got):\n%s", tt.name, p, diff)
			}
			checkPlacementShape(t, tt.name, p, read)
		})
	}
}

// checkPlacementShape checks the rules behind PinsFor independently: each
// dedicated vCPU on its own pinned pCPU, shared vCPUs on the host cell's
// shared CPUs, no realtime vCPU's pCPU under the emulator.
func checkPlacementShape(t *testing.T, name string, p *numa.Placement, got *Pins) {
	t.Helper()
	var rtPCPUs numa.CPUSet
	for _, c := range p.Cells {
		for _, v := range c.DedicatedVCPUs.List() {
			if want := numa.NewCPUSet(c.Pins[v]); !got.VCPUPins[v].Equal(want) {
				t.Errorf("%s: vCPU %d pinned to %s, want %s", name, v, got.VCPUPins[v], want)
			}
			if p.RealtimeVCPUs.Contains(v) {
				rtPCPUs = rtPCPUs.Union(numa.NewCPUSet(c.Pins[v]))
			}
		}
		for _, v := range c.SharedVCPUs.List() {
			if !got.VCPUPins[v].Equal(c.HostCPUs) {
				t.Errorf("%s: shared vCPU %d pinned to %s, want host cell %d's shared CPUs %s", name, v, got.VCPUPins[v], c.HostCell, c.HostCPUs)
			}
		}
	}
	if got.EmulatorPins.Intersects(rtPCPUs) {
		t.Errorf("%s: emulator pinned to %s, which holds realtime pCPUs %s", name, got.EmulatorPins, rtPCPUs)
	}
	ids := make([]int, 0, len(got.MemNodes))
	for id := range got.MemNodes {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	if len(ids) != len(p.Cells) {
		t.Errorf("%s: memnodes for guest cells %v, want one per placed cell (%d)", name, ids, len(p.Cells))
	}
}
