package numa

import (
	"math/bits"
	"slices"
	"strconv"

	"github.com/pinflow/pinflow/internal/jsonenc"
)

// The JSON of placements and usages is written by hand: a claim record
// carries both, and encoding them by reflection cost a claim more than its
// fit. Each appender writes exactly what encoding/json would.

// AppendJSON appends the placement's JSON (see MarshalJSON) to b.
func (p Placement) AppendJSON(b []byte) []byte {
	b = append(b, `{"emulator_threads_policy":`...)
	b = appendStringOrNull(b, string(p.EmulatorPolicy))
	b = append(b, `,"cells":[`...)
	for i := range p.Cells {
		if i > 0 {
			b = append(b, ',')
		}
		b = p.Cells[i].appendJSON(b)
	}
	b = append(b, ']')
	if !p.RealtimeVCPUs.IsEmpty() {
		b = append(b, `,"realtime_vcpus":`...)
		b = appendIDs(b, p.RealtimeVCPUs)
	}
	if p.RealtimePriority != 0 {
		b = append(b, `,"realtime_priority":`...)
		b = strconv.AppendInt(b, int64(p.RealtimePriority), 10)
	}
	if !p.HostSharedSet.IsEmpty() {
		b = append(b, `,"host_shared_set":`...)
		b = appendIDs(b, p.HostSharedSet)
	}
	return append(b, '}')
}

func (c *PlacedCell) appendJSON(b []byte) []byte {
	b = append(b, `{"guest_cell":`...)
	b = strconv.AppendInt(b, int64(c.GuestCell), 10)
	b = append(b, `,"host_cell":`...)
	b = strconv.AppendInt(b, int64(c.HostCell), 10)
	b = append(b, `,"cpuset":`...)
	b = appendIDs(b, c.SharedVCPUs)
	b = append(b, `,"pcpuset":`...)
	b = appendIDs(b, c.DedicatedVCPUs)
	b = append(b, `,"memory_mb":`...)
	b = strconv.AppendInt(b, c.MemoryMB, 10)
	b = append(b, `,"cpu_pinning":`...)
	if c.Pins == nil {
		b = append(b, "null"...)
	} else {
		// encoding/json sorts map keys as strings: "10" before "2".
		keys := make([]string, 0, len(c.Pins))
		for v := range c.Pins {
			keys = append(keys, strconv.Itoa(v))
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			v, _ := strconv.Atoi(k)
			b = append(b, '"')
			b = append(b, k...)
			b = append(b, `":`...)
			b = strconv.AppendInt(b, int64(c.Pins[v]), 10)
		}
		b = append(b, '}')
	}
	b = append(b, `,"pinned_pcpus":`...)
	b = appendIDs(b, c.PinnedPCPUs())
	b = append(b, `,"cpuset_reserved":`...)
	b = appendIDsOrNull(b, c.Reserved)
	b = append(b, `,"pagesize":`...)
	if c.PageSizeKB != 0 {
		b = strconv.AppendInt(b, c.PageSizeKB, 10)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"cpu_policy":`...)
	b = appendStringOrNull(b, string(c.CPUPolicy))
	b = append(b, `,"cpu_thread_policy":`...)
	b = appendStringOrNull(b, string(c.ThreadPolicy))
	if !c.HostCPUs.IsEmpty() {
		b = append(b, `,"host_cpuset":`...)
		b = appendIDs(b, c.HostCPUs)
	}
	return append(b, '}')
}

// AppendJSON appends the usage's JSON (as encoding/json writes the struct)
// to b.
func (u CellUsage) AppendJSON(b []byte) []byte {
	b = append(b, `{"cell":`...)
	b = strconv.AppendInt(b, int64(u.Cell), 10)
	b = append(b, `,"pinned_cpus":"`...)
	b = u.PinnedCPUs.appendList(b)
	b = append(b, `","memory_mb":`...)
	b = strconv.AppendInt(b, u.MemoryMB, 10)
	b = append(b, `,"shared_cpus":`...)
	b = strconv.AppendInt(b, int64(u.SharedCPUs), 10)
	b = append(b, `,"page_size_kb":`...)
	b = strconv.AppendInt(b, u.PageSizeKB, 10)
	b = append(b, `,"pages":`...)
	b = strconv.AppendInt(b, u.Pages, 10)
	b = append(b, `,"dedicated":`...)
	b = strconv.AppendBool(b, u.Dedicated)
	b = append(b, `,"strict_pages":`...)
	b = strconv.AppendBool(b, u.StrictPages)
	return append(b, '}')
}

// ranges calls fn with each run of consecutive ids, in ascending order.
func (c CPUSet) ranges(fn func(lo, hi int)) {
	lo, hi := -1, -1
	for wi, w := range c.words {
		for w != 0 {
			id := wi*64 + bits.TrailingZeros64(w)
			w &= w - 1
			if id == hi+1 && lo >= 0 {
				hi = id
				continue
			}
			if lo >= 0 {
				fn(lo, hi)
			}
			lo, hi = id, id
		}
	}
	if lo >= 0 {
		fn(lo, hi)
	}
}

// appendList appends the set's cpuset-list form, e.g. 0-3,8.
func (c CPUSet) appendList(b []byte) []byte {
	first := true
	c.ranges(func(lo, hi int) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = strconv.AppendInt(b, int64(lo), 10)
		if hi > lo {
			b = append(b, '-')
			b = strconv.AppendInt(b, int64(hi), 10)
		}
	})
	return b
}

// appendIDs appends the set as a JSON array of ids.
func appendIDs(b []byte, c CPUSet) []byte {
	b = append(b, '[')
	first := true
	c.ranges(func(lo, hi int) {
		for id := lo; id <= hi; id++ {
			if !first {
				b = append(b, ',')
			}
			first = false
			b = strconv.AppendInt(b, int64(id), 10)
		}
	})
	return append(b, ']')
}

func appendIDsOrNull(b []byte, c CPUSet) []byte {
	if c.IsEmpty() {
		return append(b, "null"...)
	}
	return appendIDs(b, c)
}

func appendStringOrNull(b []byte, s string) []byte {
	if s == "" {
		return append(b, "null"...)
	}
	return jsonenc.AppendString(b, s)
}
