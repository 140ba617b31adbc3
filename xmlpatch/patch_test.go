package xmlpatch

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/numa"
)

// TestPatchNovaReference patches the source domain of the live-migration
// reference with Nova's own fit (dest-fit.jsonl, which carries no realtime
// fields, so the source's vcpusched is kept) and with pinflow's fit of the
// same case (which names realtime vCPUs 1-3 at priority 1, so vcpusched is
// rewritten). Both must give Nova's <cputune> and <numatune>. The
// comparison keeps child order strict: Patch writes the pins where the
// first pin was, which for this domain is also where Nova's appended
// vcpusched lands.
func TestPatchNovaReference(t *testing.T) {
	src := readFile(t, "domain-src.xml")
	want := mustCanonical(t, "domain-dst.xml", readFile(t, "domain-dst.xml"))
	_, wantTunes := split(want, "cputune", "numatune")
	for _, tt := range []struct {
		name string
		p    *numa.Placement
	}{
		{"dest-fit.jsonl", placementFile(t, "dest-fit.jsonl")},
		{"pinflow fit of dest-host-case.json", pinflowFit(t)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Patch(src, tt.p)
			if err != nil {
				t.Fatalf("Patch(domain-src.xml, %s): %v", tt.name, err)
			}
			_, gotTunes := split(mustCanonical(t, "output", got), "cputune", "numatune")
			if diff := cmp.Diff(wantTunes, gotTunes); diff != "" {
				t.Errorf("Patch(domain-src.xml, %s): <cputune>/<numatune> differ from domain-dst.xml (-want +got):\n%s", tt.name, diff)
			}
			checkUntouched(t, "domain-src.xml", src, got)
			testenv.ValidateDomainXML(t, "Patch(domain-src.xml, "+tt.name+")", got)
		})
	}
}

// twoCells places the two one-vCPU, 64 MiB guest cells of the small
// fixtures: cell 0 on host cell 1 (vCPU 0 -> pCPU 9, emulator reserved on
// pCPU 10), cell 1 on host cell 0 (vCPU 1 -> pCPU 3).
func twoCells() *numa.Placement {
	return &numa.Placement{
		EmulatorPolicy: numa.EmulatorPolicyIsolate,
		Cells: []numa.PlacedCell{
			{GuestCell: 0, HostCell: 1, DedicatedVCPUs: numa.NewCPUSet(0), Pins: map[int]int{0: 9},
				Reserved: numa.NewCPUSet(10), MemoryMB: 64, CPUPolicy: numa.CPUPolicyDedicated},
			{GuestCell: 1, HostCell: 0, DedicatedVCPUs: numa.NewCPUSet(1), Pins: map[int]int{1: 3},
				MemoryMB: 64, CPUPolicy: numa.CPUPolicyDedicated},
		},
	}
}

func withRealtime(p *numa.Placement, vcpus numa.CPUSet, prio int) *numa.Placement {
	q := *p
	q.RealtimeVCPUs, q.RealtimePriority = vcpus, prio
	return &q
}

func set(s string) numa.CPUSet { return numa.MustParse(s) }

func fifo(prio int) Sched { return Sched{Scheduler: "fifo", Priority: prio} }

// TestPatchFixtures patches the small fixture domains and reads them back.
func TestPatchFixtures(t *testing.T) {
	smallCells := []GuestCell{{ID: 0, VCPUs: set("0"), MemoryKiB: 65536}, {ID: 1, VCPUs: set("1"), MemoryKiB: 65536}}
	pinned := func(sched map[int]Sched, rt string, prio int) *Pins {
		return &Pins{
			VCPUs:            2,
			VCPUPins:         map[int]numa.CPUSet{0: set("9"), 1: set("3")},
			EmulatorPins:     set("10"),
			Memory:           &MemoryPolicy{Mode: "strict", Nodeset: set("0-1")},
			MemNodes:         map[int]MemoryPolicy{0: {Mode: "strict", Nodeset: set("1")}, 1: {Mode: "preferred", Nodeset: set("0")}},
			Sched:            sched,
			RealtimeVCPUs:    set(rt),
			RealtimePriority: prio,
			GuestCells:       smallCells,
		}
	}
	withDefault := func(p *Pins) *Pins { p.DefaultCPUs = set("0-1"); return p }
	tests := []struct {
		file string
		p    *numa.Placement
		want *Pins
	}{
		// No realtime in the placement: the source's vcpusched stays.
		{"pinned-domain.xml", twoCells(), withDefault(pinned(map[int]Sched{0: fifo(1), 1: fifo(1)}, "0-1", 1))},
		{"rt-vm.xml", twoCells(), pinned(map[int]Sched{0: fifo(1), 1: fifo(1)}, "0-1", 1)},
		{"tcg-vm.xml", twoCells(), pinned(nil, "", 0)},
		// Realtime in the placement replaces every vcpusched.
		{"rt-vm.xml", withRealtime(twoCells(), set("1"), 7), pinned(map[int]Sched{1: fifo(7)}, "1", 7)},
		{"tcg-vm.xml", withRealtime(twoCells(), set("0-1"), 0), pinned(map[int]Sched{0: fifo(1), 1: fifo(1)}, "0-1", 1)},
		// Priority 0 keeps the domain's priority of each realtime vCPU.
		{"pinned-domain.xml", withRealtime(twoCells(), set("1"), 0), withDefault(pinned(map[int]Sched{1: fifo(1)}, "1", 1))},
	}
	for _, tt := range tests {
		name := fmt.Sprintf("%s/%s rt=%s/%d", tt.file, tt.p, tt.p.RealtimeVCPUs, tt.p.RealtimePriority)
		t.Run(name, func(t *testing.T) {
			src := readFile(t, tt.file)
			got, err := Patch(src, tt.p)
			if err != nil {
				t.Fatalf("Patch(%s): %v", name, err)
			}
			checkUntouched(t, tt.file, src, got)
			testenv.ValidateDomainXML(t, "Patch("+name+")", got)
			pins, err := Read(got)
			if err != nil {
				t.Fatalf("Read(Patch(%s)): %v", name, err)
			}
			if diff := cmp.Diff(tt.want, pins); diff != "" {
				t.Errorf("Read(Patch(%s)) (-want +got):\n%s", name, diff)
			}
		})
	}
}

// minimal is a small schema-valid domain; body goes after <vcpu>, cells
// into <cpu><numa> (none: no <numa>).
func minimal(vcpus int, body, cells string) string {
	cpu := "  <cpu mode='host-passthrough'/>\n"
	if cells != "" {
		cpu = "  <cpu mode='host-passthrough'>\n    <numa>\n" + cells + "    </numa>\n  </cpu>\n"
	}
	return fmt.Sprintf(`<domain type='kvm'>
  <name>t</name>
  <memory unit='MiB'>2048</memory>
  <vcpu placement='static'>%d</vcpu>
%s  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
  </os>
%s  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
  </devices>
</domain>
`, vcpus, body, cpu)
}

const cells2x2 = "      <cell id='0' cpus='0-1' memory='1024' unit='MiB'/>\n      <cell id='1' cpus='2-3' memory='1048576'/>\n"

// placed2x2 puts guest cells 0 (vCPUs 0-1) and 1 (vCPUs 2-3), 1 GiB each,
// on host cells 1 and 0.
func placed2x2() *numa.Placement {
	return &numa.Placement{
		Cells: []numa.PlacedCell{
			{GuestCell: 0, HostCell: 1, DedicatedVCPUs: set("0-1"), Pins: map[int]int{0: 9, 1: 10}, MemoryMB: 1024},
			{GuestCell: 1, HostCell: 0, DedicatedVCPUs: set("2-3"), Pins: map[int]int{2: 1, 3: 2}, MemoryMB: 1024},
		},
	}
}

// TestPatchLayout covers where Patch writes: missing, empty and
// self-closing elements, compact documents, kept tuning children.
func TestPatchLayout(t *testing.T) {
	onCell := &numa.Placement{Cells: []numa.PlacedCell{
		{GuestCell: 0, HostCell: 1, DedicatedVCPUs: set("0-1"), Pins: map[int]int{0: 5, 1: 6}, MemoryMB: 2048},
	}}
	tests := []struct {
		name string
		src  string
		p    *numa.Placement
		// want are strings the output must contain.
		want []string
	}{
		{"no cputune, no numatune", minimal(4, "", cells2x2), placed2x2(),
			[]string{"<vcpu placement='static'>4</vcpu>\n  <cputune>\n    <vcpupin vcpu='0' cpuset='9'/>", "</cputune>\n  <numatune>\n    <memory mode='strict' nodeset='0-1'/>\n    <memnode cellid='0' mode='strict' nodeset='1'/>"}},
		{"self-closing cputune", minimal(4, "  <cputune/>\n", cells2x2), placed2x2(),
			[]string{"<cputune>\n    <vcpupin vcpu='0' cpuset='9'/>", "<emulatorpin cpuset='1-2,9-10'/>\n  </cputune>\n  <numatune>"}},
		{"empty cputune", minimal(4, "  <cputune></cputune>\n", cells2x2), placed2x2(),
			[]string{"<cputune>\n    <vcpupin vcpu='0' cpuset='9'/>", "<emulatorpin cpuset='1-2,9-10'/>\n  </cputune>\n  <numatune>"}},
		{"numatune before cputune, placement auto", minimal(4, "  <numatune>\n    <memory mode='interleave' placement='auto'/>\n  </numatune>\n  <iothreads>2</iothreads>\n", cells2x2), placed2x2(),
			[]string{"<memory mode='interleave' nodeset='0-1'/>", "<iothreads>2</iothreads>\n  <cputune>", "<iothreadpin iothread='2' cpuset='1-2,9-10'/>"}},
		{"kept tuning children", minimal(4, `  <cputune>
    <shares>2048</shares>
    <!-- operator note -->
    <period>100000</period>
    <vcpupin vcpu='0' cpuset='0'/>
    <quota>-1</quota>
    <emulatorsched scheduler='batch'/>
    <cachetune vcpus='0-1'>
      <cache id='0' level='3' type='both' size='3' unit='MiB'/>
    </cachetune>
  </cputune>
  <numatune>
    <memnode cellid='1' mode='preferred' nodeset='3'/>
    <memnode cellid='7' mode='strict' nodeset='0'/>
  </numatune>
`, cells2x2), placed2x2(),
			[]string{"<shares>2048</shares>\n    <!-- operator note -->\n    <period>100000</period>\n    <vcpupin vcpu='0' cpuset='9'/>", "<quota>-1</quota>\n    <emulatorsched scheduler='batch'/>\n    <cachetune vcpus='0-1'>",
				"<memory mode='strict' nodeset='0-1'/>\n    <memnode cellid='0' mode='strict' nodeset='1'/>\n    <memnode cellid='1' mode='preferred' nodeset='0'/>\n  </numatune>"}},
		{"compact document", strings.Join(strings.Fields(strings.ReplaceAll(minimal(2, "<cputune><vcpupin vcpu='1' cpuset='3'/></cputune>", ""), "placement='static'", "")), " "), onCell,
			[]string{"<cputune><vcpupin vcpu='0' cpuset='5'/><vcpupin vcpu='1' cpuset='6'/><emulatorpin cpuset='5-6'/></cputune><numatune><memory mode='strict' nodeset='1'/></numatune>"}},
		{"implicit guest cell", minimal(2, "  <numatune>\n    <memory nodeset='0'/>\n    <memnode cellid='0' mode='strict' nodeset='0'/>\n  </numatune>\n", ""), onCell,
			[]string{"<numatune>\n    <memory nodeset='1'/>\n  </numatune>"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testenv.ValidateDomainXML(t, tt.name+" source", tt.src)
			got, err := Patch(tt.src, tt.p)
			if err != nil {
				t.Fatalf("Patch(%s): %v", tt.name, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("Patch(%s) lacks %q; got:\n%s", tt.name, w, got)
				}
			}
			checkUntouched(t, tt.name, tt.src, got)
			checkKeptChildren(t, tt.name, tt.src, got)
			testenv.ValidateDomainXML(t, "Patch("+tt.name+")", got)
		})
	}
}

// checkKeptChildren fails unless the children of <cputune> and <numatune>
// that Patch does not own come out as they went in, in order.
func checkKeptChildren(t *testing.T, name, src, got string) {
	t.Helper()
	owned := map[string]bool{" vcpupin": true, " emulatorpin": true, " iothreadpin": true, " vcpusched": true, " memory": true, " memnode": true}
	kept := func(doc string) []*canon {
		_, tunes := split(mustCanonical(t, name, doc), "cputune", "numatune")
		var out []*canon
		for _, n := range []string{"cputune", "numatune"} {
			for _, el := range tunes[n] {
				for _, k := range el.Kids {
					if !owned[k.Name] {
						out = append(out, k)
					}
				}
			}
		}
		return out
	}
	if diff := cmp.Diff(kept(src), kept(got)); diff != "" {
		t.Errorf("Patch(%s): kept children of <cputune>/<numatune> changed (-source +got):\n%s", name, diff)
	}
}

// TestPatchErrors checks that every refusal is one line, prefixed, wraps
// its sentinel and names the bad value.
func TestPatchErrors(t *testing.T) {
	src := minimal(4, "", cells2x2)
	mod := func(f func(p *numa.Placement)) *numa.Placement {
		p := placed2x2()
		f(p)
		return p
	}
	tests := []struct {
		name    string
		doc     string
		p       *numa.Placement
		wantErr error
		want    string
	}{
		{"vcpu count", minimal(5, "", "      <cell id='0' cpus='0-1' memory='1024' unit='MiB'/>\n      <cell id='1' cpus='2-4' memory='1024' unit='MiB'/>\n"), placed2x2(), ErrMismatch, "<vcpu> is 5 (vCPUs 0-4) but the placement places vCPUs \"0-3\""},
		{"cell vcpus", minimal(4, "", "      <cell id='0' cpus='0' memory='1024' unit='MiB'/>\n      <cell id='1' cpus='1-3' memory='1024' unit='MiB'/>\n"), placed2x2(), ErrMismatch, "guest cell 0: the placement gives it vCPUs \"0-1\" but the domain's <cell cpus='0'>"},
		{"cell memory", minimal(4, "", "      <cell id='0' cpus='0-1' memory='1' unit='GiB'/>\n      <cell id='1' cpus='2-3' memory='512' unit='MiB'/>\n"), placed2x2(), ErrMismatch, "guest cell 1: the placement gives it 1024 MiB but the domain's cell has 524288 KiB"},
		{"cell count", minimal(4, "", "      <cell id='0' cpus='0-3' memory='2048' unit='MiB'/>\n"), placed2x2(), ErrMismatch, "the placement has 2 guest cells (0,1) but the domain 1"},
		{"guest cell without host cell", minimal(4, "", "      <cell id='0' cpus='0-1' memory='1024' unit='MiB'/>\n      <cell id='2' cpus='2-3' memory='1024' unit='MiB'/>\n"), placed2x2(), ErrMismatch, "guest cell 2 of the domain has no host cell in the placement"},
		{"negative host cell", src, mod(func(p *numa.Placement) { p.Cells[1].HostCell = -1 }), ErrPlacement, "guest cell 1 has no host cell (host_cell -1)"},
		{"pCPU out of range", src, mod(func(p *numa.Placement) { p.Cells[1].Pins[2] = 1 << 40 }), ErrPlacement, "pin vCPU 2 -> pCPU 1099511627776"},
		{"shared without host cpus", src, mod(func(p *numa.Placement) {
			p.Cells[0].DedicatedVCPUs, p.Cells[0].SharedVCPUs, p.Cells[0].Pins = set("1"), set("0"), map[int]int{1: 10}
		}), ErrPlacement, "shared vCPUs 0 need the host cell's shared CPUs"},
		{"nil placement", src, nil, ErrPlacement, "no placement given"},
		{"realtime outside", src, withRealtime(placed2x2(), set("3-4"), 1), ErrMismatch, "realtime vCPUs \"3-4\""},
		{"priority", src, withRealtime(placed2x2(), set("3"), 100), ErrPlacement, "realtime priority 100: allowed priorities are 1-99"},
		{"no vcpu", strings.Replace(src, "<vcpu placement='static'>4</vcpu>", "", 1), placed2x2(), ErrMalformed, "the domain has no <vcpu> element"},
		{"bad vcpu", strings.Replace(src, ">4</vcpu>", ">four</vcpu>", 1), placed2x2(), ErrMalformed, "<vcpu>four</vcpu>: the vCPU count must be a whole number 1-8192"},
		{"two cputune", minimal(4, "  <cputune/>\n  <cputune/>\n", cells2x2), placed2x2(), ErrMalformed, "<domain> has 2 <cputune> elements"},
		{"not a domain", "<network><name>n</name></network>", placed2x2(), ErrMalformed, "root element is <network>"},
		{"unclosed", src[:len(src)-10], placed2x2(), ErrMalformed, "malformed domain XML: document ends inside <domain>"},
		{"mismatched tag", strings.Replace(src, "</os>", "</so>", 1), placed2x2(), ErrMalformed, "end tag </so> on line 7 closes <os>"},
		{"empty", "", placed2x2(), ErrMalformed, "no root element"},
		{"two roots", src + src, placed2x2(), ErrMalformed, "second root element <domain>"},
		{"repeated attribute", strings.Replace(src, "<domain type='kvm'>", "<domain type='kvm' type='qemu'>", 1), placed2x2(), ErrMalformed, "<domain> repeats attribute type"},
		{"bad memnode mode (invalid-domain.xml)", readFile(t, "invalid-domain.xml"), twoCells(), ErrMalformed, "<memory mode='wrong'>: allowed modes are strict, preferred, interleave, restrictive"},
		{"bad vcpusched", minimal(4, "  <cputune><vcpusched vcpus='0-9' scheduler='fifo' priority='1'/></cputune>\n", cells2x2), placed2x2(), ErrMalformed, "<vcpusched vcpus='0-9'>: the domain has vCPUs 0-3"},
		{"bad cell unit", minimal(4, "", strings.Replace(cells2x2, "unit='MiB'", "unit='MiBs'", 1)), placed2x2(), ErrMalformed, "unit \"MiBs\": allowed units are"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Patch(tt.doc, tt.p)
			if err == nil {
				t.Fatalf("Patch(%s) = no error, want %v; output:\n%s", tt.name, tt.wantErr, got)
			}
			msg := err.Error()
			if !errors.Is(err, tt.wantErr) || !strings.HasPrefix(msg, "xmlpatch: ") || strings.Contains(msg, "\n") || !strings.Contains(msg, tt.want) {
				t.Errorf("Patch(%s) error = %q, want one line starting \"xmlpatch: \", wrapping %q, containing %q", tt.name, msg, tt.wantErr, tt.want)
			}
			if got != "" {
				t.Errorf("Patch(%s) returned output with an error", tt.name)
			}
		})
	}
}

// TestPatchRealtimePriority checks where a realtime vCPU's priority comes
// from: the placement when it names one, else the domain's for that vCPU,
// else the default.
func TestPatchRealtimePriority(t *testing.T) {
	src := strings.Replace(readFile(t, "rt-vm.xml"), "<vcpusched vcpus='0-1' scheduler='fifo' priority='1'/>",
		"<vcpusched vcpus='0' scheduler='batch'/><vcpusched vcpus='1' scheduler='rr' priority='5'/>", 1)
	tests := []struct {
		rt   string
		prio int
		want map[int]Sched
	}{
		{"0-1", 9, map[int]Sched{0: fifo(9), 1: fifo(9)}},
		{"0-1", 0, map[int]Sched{0: fifo(numa.DefaultRealtimePriority), 1: fifo(5)}},
		{"", 0, map[int]Sched{0: {Scheduler: "batch"}, 1: {Scheduler: "rr", Priority: 5}}},
	}
	for _, tt := range tests {
		got, err := Patch(src, withRealtime(twoCells(), set(tt.rt), tt.prio))
		if err != nil {
			t.Fatalf("Patch(rt-vm.xml, realtime %q priority %d): %v", tt.rt, tt.prio, err)
		}
		testenv.ValidateDomainXML(t, "Patch(rt-vm.xml)", got)
		pins, err := Read(got)
		if err != nil {
			t.Fatalf("Read(Patch(rt-vm.xml, realtime %q priority %d)): %v", tt.rt, tt.prio, err)
		}
		if diff := cmp.Diff(tt.want, pins.Sched); diff != "" {
			t.Errorf("Read(Patch(rt-vm.xml, realtime %q priority %d)).Sched (-want +got):\n%s", tt.rt, tt.prio, diff)
		}
	}
}
