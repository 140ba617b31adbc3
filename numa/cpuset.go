package numa

import (
	"encoding/json"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// MaxCPU is the largest CPU id a CPUSet holds. It bounds the memory a
// hostile cpuset-list such as "0-4000000000" could make a parser allocate.
const MaxCPU = 8191

// CPUSet is an immutable set of CPU ids (host pCPUs or guest vCPUs). The zero
// value is the empty set. Methods never modify their receiver, so a CPUSet
// can be shared freely.
type CPUSet struct {
	words []uint64 // bit i of words[i/64]; no trailing zero words
}

// NewCPUSet returns the set of the given ids. It panics on an id outside
// 0..MaxCPU; use Parse for untrusted input.
func NewCPUSet(ids ...int) CPUSet {
	var b cpuSetBuilder
	for _, id := range ids {
		if id < 0 || id > MaxCPU {
			panic(fmt.Sprintf("numa: cpu id %d out of range 0-%d", id, MaxCPU))
		}
		b.add(id)
	}
	return b.set()
}

// Range returns the set {lo, ..., hi}; empty when hi < lo.
func Range(lo, hi int) CPUSet {
	var b cpuSetBuilder
	for id := lo; id <= hi; id++ {
		b.add(id)
	}
	return b.set()
}

// Parse reads a Linux cpuset-list ("0-3,8,10-11") with Nova's exclusions:
// an element "^N" or "^N-M" removes ids from the union of the others, so
// "0-5,^2" is {0,1,3,4,5}. Empty elements and surrounding blanks are ignored.
func Parse(s string) (CPUSet, error) {
	var add, del cpuSetBuilder
	for _, elem := range strings.Split(s, ",") {
		elem = strings.TrimSpace(elem)
		if elem == "" {
			continue
		}
		target := &add
		body := elem
		if strings.HasPrefix(body, "^") {
			target = &del
			body = strings.TrimSpace(body[1:])
		}
		lo, hi, err := parseRange(body)
		if err != nil {
			return CPUSet{}, fmt.Errorf("numa: cpuset %q: element %q: %w", s, elem, err)
		}
		for id := lo; id <= hi; id++ {
			target.add(id)
		}
	}
	return add.set().Difference(del.set()), nil
}

// MustParse is Parse for literals in tests and tables; it panics on error.
func MustParse(s string) CPUSet {
	c, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return c
}

func parseRange(body string) (lo, hi int, err error) {
	first, second, isRange := strings.Cut(body, "-")
	if lo, err = parseID(first); err != nil {
		return 0, 0, err
	}
	if !isRange {
		return lo, lo, nil
	}
	if hi, err = parseID(second); err != nil {
		return 0, 0, err
	}
	if lo > hi {
		return 0, 0, fmt.Errorf("range start %d is above its end %d", lo, hi)
	}
	return lo, hi, nil
}

func parseID(s string) (int, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.Atoi(s)
	if err != nil || s == "" || s[0] == '+' {
		return 0, fmt.Errorf("%q is not a cpu id (a whole number 0-%d)", s, MaxCPU)
	}
	if n < 0 || n > MaxCPU {
		return 0, fmt.Errorf("cpu id %d out of range 0-%d", n, MaxCPU)
	}
	return n, nil
}

// String prints the set in canonical cpuset-list form: ascending ranges
// joined by commas, "" for the empty set. Parse(s.String()) equals s.
func (c CPUSet) String() string { return string(c.appendList(nil)) }

// List returns the ids in ascending order.
func (c CPUSet) List() []int {
	out := make([]int, 0, c.Len())
	for wi, w := range c.words {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			out = append(out, wi*64+b)
			w &= w - 1
		}
	}
	return out
}

// Len returns the number of ids in the set.
func (c CPUSet) Len() int {
	n := 0
	for _, w := range c.words {
		n += bits.OnesCount64(w)
	}
	return n
}

// IsEmpty reports whether the set has no ids.
func (c CPUSet) IsEmpty() bool { return len(c.words) == 0 }

// Contains reports whether id is in the set.
func (c CPUSet) Contains(id int) bool {
	if id < 0 || id/64 >= len(c.words) {
		return false
	}
	return c.words[id/64]&(1<<(id%64)) != 0
}

// Min returns the smallest id, or -1 for the empty set.
func (c CPUSet) Min() int {
	for wi, w := range c.words {
		if w != 0 {
			return wi*64 + bits.TrailingZeros64(w)
		}
	}
	return -1
}

// Max returns the largest id, or -1 for the empty set.
func (c CPUSet) Max() int {
	if len(c.words) == 0 {
		return -1
	}
	wi := len(c.words) - 1
	return wi*64 + 63 - bits.LeadingZeros64(c.words[wi])
}

// Equal reports whether both sets hold the same ids.
func (c CPUSet) Equal(o CPUSet) bool {
	if len(c.words) != len(o.words) {
		return false
	}
	for i := range c.words {
		if c.words[i] != o.words[i] {
			return false
		}
	}
	return true
}

// IsSubsetOf reports whether every id of c is in o.
func (c CPUSet) IsSubsetOf(o CPUSet) bool {
	if len(c.words) > len(o.words) {
		return false
	}
	for i, w := range c.words {
		if w&^o.words[i] != 0 {
			return false
		}
	}
	return true
}

// Intersects reports whether c and o share an id.
func (c CPUSet) Intersects(o CPUSet) bool {
	n := min(len(c.words), len(o.words))
	for i := 0; i < n; i++ {
		if c.words[i]&o.words[i] != 0 {
			return true
		}
	}
	return false
}

// Union returns c ∪ o.
func (c CPUSet) Union(o CPUSet) CPUSet {
	long, short := c.words, o.words
	if len(short) > len(long) {
		long, short = short, long
	}
	if len(short) == 0 {
		return CPUSet{words: long}
	}
	out := make([]uint64, len(long))
	copy(out, long)
	for i, w := range short {
		out[i] |= w
	}
	return CPUSet{words: out}
}

// With returns c ∪ {ids}. It panics on an id outside 0..MaxCPU.
func (c CPUSet) With(ids ...int) CPUSet {
	b := cpuSetBuilder{words: append([]uint64(nil), c.words...)}
	for _, id := range ids {
		if id < 0 || id > MaxCPU {
			panic(fmt.Sprintf("numa: cpu id %d out of range 0-%d", id, MaxCPU))
		}
		b.add(id)
	}
	return b.set()
}

// Without returns c \ {ids}.
func (c CPUSet) Without(ids ...int) CPUSet {
	out := append([]uint64(nil), c.words...)
	for _, id := range ids {
		if id >= 0 && id/64 < len(out) {
			out[id/64] &^= 1 << (id % 64)
		}
	}
	return trim(out)
}

// Intersection returns c ∩ o.
func (c CPUSet) Intersection(o CPUSet) CPUSet {
	n := min(len(c.words), len(o.words))
	out := make([]uint64, n)
	for i := 0; i < n; i++ {
		out[i] = c.words[i] & o.words[i]
	}
	return trim(out)
}

// Difference returns c − o.
func (c CPUSet) Difference(o CPUSet) CPUSet {
	if len(o.words) == 0 || len(c.words) == 0 {
		return c
	}
	out := make([]uint64, len(c.words))
	copy(out, c.words)
	for i := 0; i < len(out) && i < len(o.words); i++ {
		out[i] &^= o.words[i]
	}
	return trim(out)
}

func trim(w []uint64) CPUSet {
	for len(w) > 0 && w[len(w)-1] == 0 {
		w = w[:len(w)-1]
	}
	if len(w) == 0 {
		return CPUSet{}
	}
	return CPUSet{words: w}
}

// MarshalJSON writes the set as its cpuset-list string, e.g. "0-3,8".
func (c CPUSet) MarshalJSON() ([]byte, error) {
	b := append(c.appendList([]byte{'"'}), '"')
	return b, nil
}

// UnmarshalJSON accepts a cpuset-list string or an array of ids.
func (c *CPUSet) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		parsed, err := Parse(s)
		if err != nil {
			return err
		}
		*c = parsed
		return nil
	}
	var ids []int
	if err := json.Unmarshal(data, &ids); err != nil {
		return fmt.Errorf("numa: cpuset must be a cpuset-list string or an array of cpu ids, got %s", truncate(data))
	}
	var b cpuSetBuilder
	for _, id := range ids {
		if id < 0 || id > MaxCPU {
			return fmt.Errorf("numa: cpu id %d out of range 0-%d", id, MaxCPU)
		}
		b.add(id)
	}
	*c = b.set()
	return nil
}

func truncate(data []byte) string {
	if len(data) > 40 {
		return string(data[:40]) + "..."
	}
	return string(data)
}

// cpuSetBuilder accumulates ids before freezing them into a CPUSet.
type cpuSetBuilder struct{ words []uint64 }

func (b *cpuSetBuilder) add(id int) {
	for id/64 >= len(b.words) {
		b.words = append(b.words, 0)
	}
	b.words[id/64] |= 1 << (id % 64)
}

func (b *cpuSetBuilder) set() CPUSet {
	s := trim(b.words)
	b.words = nil
	return s
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
