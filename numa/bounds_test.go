package numa

import (
	"errors"
	"strings"
	"testing"
)

func TestUniformBounds(t *testing.T) {
	const wrap32 = 1 << 32 // cells × cores wraps a 64-bit int to 0
	tests := []struct {
		name string
		spec UniformSpec
		want string // in the error; "" for a host
	}{
		{"largest shape", UniformSpec{Cells: 2, Cores: 512, Threads: 8, MemoryMB: 1024}, ""},
		{"largest memory", UniformSpec{Cells: 1, Cores: 1, Threads: 1, MemoryMB: MaxCellMemoryMB}, ""},
		{"largest pages", UniformSpec{Cells: 1, Cores: 1, Threads: 1, MemoryMB: 16384, HugePages: map[int64]int64{MaxPageSizeKB: 1}}, ""},
		{"zero cores", UniformSpec{Cells: 1, Cores: 0, Threads: 1, MemoryMB: 1024}, "each must be at least 1"},
		{"product wraps", UniformSpec{Cells: wrap32, Cores: wrap32, Threads: 1, MemoryMB: 1024}, "at most 1024 cells"},
		{"cores times cells wraps", UniformSpec{Cells: 1024, Cores: 1 << 54, Threads: 4, MemoryMB: 1024}, "more than 8192 CPUs"},
		{"one CPU too many", UniformSpec{Cells: 2, Cores: 512, Threads: 8, MemoryMB: 1024}.with(func(s *UniformSpec) { s.Cores++ }), "more than 8192 CPUs"},
		{"too many threads", UniformSpec{Cells: 1, Cores: 1, Threads: 9, MemoryMB: 1024}, "at most 8 threads per core"},
		{"no memory", UniformSpec{Cells: 1, Cores: 1, Threads: 1}, "memory 0 MiB per cell: allowed are 1-1073741824 MiB"},
		{"too much memory", UniformSpec{Cells: 1, Cores: 1, Threads: 1, MemoryMB: 1<<63 - 1}, "memory 9223372036854775807 MiB per cell: allowed are 1-1073741824 MiB"},
		{"page count wraps", UniformSpec{Cells: 1, Cores: 1, Threads: 1, MemoryMB: 1024, HugePages: map[int64]int64{1 << 20: 1<<63 - 1}}, "9223372036854775807 huge pages of 1048576 KiB: allowed are 0-1"},
		{"page size wraps", UniformSpec{Cells: 1, Cores: 1, Threads: 1, MemoryMB: 1024, HugePages: map[int64]int64{1 << 62: 1}}, "huge page size 4611686018427387904 KiB: allowed are powers of two"},
		{"page size not a power of two", UniformSpec{Cells: 1, Cores: 1, Threads: 1, MemoryMB: 1024, HugePages: map[int64]int64{3000: 1}}, "huge page size 3000 KiB"},
		{"pools together too large", UniformSpec{Cells: 1, Cores: 1, Threads: 1, MemoryMB: 2048, HugePages: map[int64]int64{2048: 1024, 1 << 20: 1}}, "huge pages take 3072 MiB of a cell's 2048 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := Uniform(tt.spec)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Uniform(%+v) = %v, want a host", tt.spec, err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Uniform(%+v) = %v, %v; want an error containing %q", tt.spec, h, err, tt.want)
			}
		})
	}
}

func (s UniformSpec) with(f func(*UniformSpec)) UniformSpec { f(&s); return s }

func TestValidateBounds(t *testing.T) {
	cell := func(f func(*Cell)) *Host {
		c := Cell{ID: 0, CPUs: NewCPUSet(0), PCPUs: NewCPUSet(0), Siblings: []CPUSet{NewCPUSet(0)}, MemoryMB: 1024,
			Pages: []PagePool{{SizeKB: 4, Total: 262144}}}
		f(&c)
		return &Host{Cells: []Cell{c}}
	}
	tests := []struct {
		name string
		host *Host
		want string
	}{
		{"bounds", cell(func(c *Cell) { c.MemoryMB = MaxCellMemoryMB; c.Pages[0].Total = MaxCellMemoryMB * 256 }), ""},
		{"memory", cell(func(c *Cell) { c.MemoryMB = MaxCellMemoryMB + 1 }), "memory 1073741825 MiB per cell"},
		{"page total", cell(func(c *Cell) { c.Pages[0].Total = 1<<63 - 1 }), "page pool 4 KiB: counts 9223372036854775807/0/0"},
		{"page used", cell(func(c *Cell) { c.Pages[0].Used = 1 << 62 }), "allowed are 0-274877906944"},
		{"page size", cell(func(c *Cell) { c.Pages[0].SizeKB = 1 << 40 }), "page size 1099511627776 KiB: allowed are 1-16777216 KiB"},
		{"cells", &Host{Cells: make([]Cell, MaxCells+1)}, "host has 1025 cells; allowed are 1-1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.host.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestNewRequestBounds(t *testing.T) {
	tests := []struct {
		vcpus    int
		memoryMB int64
		want     string
	}{
		{MaxGuestVCPUs, MaxGuestMemoryMB, ""},
		{0, 1024, "vcpus 0: allowed are 1-8192"},
		{MaxGuestVCPUs + 1, 1024, "vcpus 8193: allowed are 1-8192"},
		{1, 0, "memory_mb 0: allowed are 1-1099511627776 MiB"},
		{1, 1<<63 - 1, "memory_mb 9223372036854775807: allowed are 1-1099511627776 MiB"},
	}
	for _, tt := range tests {
		_, err := NewRequest(tt.vcpus, tt.memoryMB, nil, nil)
		var inv *InvalidRequestError
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("NewRequest(%d, %d) = %v, want a request", tt.vcpus, tt.memoryMB, err)
		case tt.want != "" && (!errors.As(err, &inv) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("NewRequest(%d, %d) = %v, want an InvalidRequestError containing %q", tt.vcpus, tt.memoryMB, err, tt.want)
		}
	}
}
