package xmlpatch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pinflow/pinflow/numa"
)

// fuzzPlacements are the placements FuzzPatch applies, picked by index.
func fuzzPlacements(t testing.TB) []*numa.Placement {
	single := &numa.Placement{Cells: []numa.PlacedCell{
		{GuestCell: 0, HostCell: 1, DedicatedVCPUs: set("0-1"), Pins: map[int]int{0: 5, 1: 6}, MemoryMB: 128},
	}}
	mixed := &numa.Placement{Cells: []numa.PlacedCell{
		{GuestCell: 0, HostCell: 0, SharedVCPUs: set("0"), HostCPUs: set("0-1"), MemoryMB: 64},
		{GuestCell: 1, HostCell: 2, DedicatedVCPUs: set("1"), Pins: map[int]int{1: 17}, MemoryMB: 64},
	}}
	return []*numa.Placement{
		placementFile(t, "dest-fit.jsonl"),
		twoCells(),
		withRealtime(twoCells(), set("1"), 5),
		single,
		placed2x2(),
		mixed,
	}
}

// FuzzPatch checks that any document either gives a clean error or a
// patched document that parses, keeps everything outside <cputune> and
// <numatune>, reads back the placement's pins and patches to itself again.
func FuzzPatch(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.xml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		for i := range 6 {
			f.Add(string(data), uint8(i))
		}
	}
	f.Add(minimal(4, "  <cputune/>\n  <iothreads>2</iothreads>\n", cells2x2), uint8(4))
	f.Add(minimal(2, "<cputune><shares>5</shares><!--x--><vcpupin vcpu='0' cpuset='1'/></cputune>", ""), uint8(3))
	placements := fuzzPlacements(f)
	f.Fuzz(func(t *testing.T, doc string, pick uint8) {
		p := placements[int(pick)%len(placements)]
		got, err := Patch(doc, p)
		if err != nil {
			msg := err.Error()
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrMismatch) && !errors.Is(err, ErrPlacement) {
				t.Fatalf("Patch error %q wraps no sentinel", msg)
			}
			if !strings.HasPrefix(msg, "xmlpatch: ") || strings.Contains(msg, "\n") || got != "" {
				t.Fatalf("Patch error %q: want one line starting \"xmlpatch: \" and no output", msg)
			}
			return
		}
		if _, err := canonical(doc); err != nil {
			t.Fatalf("Patch accepted a document encoding/xml rejects (%v):\n%q", err, doc)
		}
		checkUntouched(t, "fuzz input", doc, got)
		if pins, err := Read(got); err == nil {
			want, err := PinsFor(p)
			if err != nil {
				t.Fatalf("PinsFor: %v", err)
			}
			if diff := cmp.Diff(want.VCPUPins, pins.VCPUPins); diff != "" {
				t.Errorf("Read(Patch(doc)).VCPUPins (-want +got):\n%s", diff)
			}
			// With realtime from the domain rather than the placement, the
			// emulator also avoids the domain's realtime vCPUs.
			rtFromDomain := p.RealtimeVCPUs.IsEmpty() && !pins.RealtimeVCPUs.IsEmpty()
			if !rtFromDomain && !pins.EmulatorPins.Equal(want.EmulatorPins) {
				t.Errorf("Read(Patch(doc)).EmulatorPins = %s, want %s", pins.EmulatorPins, want.EmulatorPins)
			}
			if !pins.Memory.Nodeset.Equal(want.Memory.Nodeset) {
				t.Errorf("Read(Patch(doc)).Memory.Nodeset = %s, want %s", pins.Memory.Nodeset, want.Memory.Nodeset)
			}
		}
		again, err := Patch(got, p)
		if err != nil {
			t.Fatalf("Patch(Patch(doc)): %v", err)
		}
		if again != got {
			t.Errorf("Patch is not idempotent:\nonce:  %q\ntwice: %q", got, again)
		}
	})
}
