package placement

import (
	"context"
	"errors"
	"testing"

	"github.com/pinflow/pinflow/numa"
)

// TestChooseSeesHostLevelUsage: a host whose memory a guest without a NUMA
// topology took, its cells still empty, is passed by for a guest that
// needs that memory, and a guest larger than every host fits none.
func TestChooseSeesHostLevelUsage(t *testing.T) {
	ctx := context.Background()
	mine, other, _ := newLedgers(t)
	for _, h := range []string{"a", "b"} {
		host, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: 4, Threads: 1, MemoryMB: 16384,
			Shared: numa.Range(0, 1), Dedicated: numa.Range(2, 3)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.RegisterHost(ctx, h, host); err != nil {
			t.Fatal(err)
		}
	}
	floating, err := numa.NewRequest(2, 12288, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &cloud{led: other}
	if _, err := c.claim(ctx, "a", floating); err != nil {
		t.Fatal(err)
	}
	ix := NewIndex(mine, Options{})
	if err := ix.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	r := Request{UUID: "g1", Request: floating}
	if got, err := ix.Choose(ctx, r); err != nil || got != "b" {
		t.Errorf("Choose(12288 MiB without NUMA) = %q, %v; want b, as a's 16384 MiB hold 12288 already", got, err)
	}
	if got, err := Exhaustive(ctx, mine, r); err != nil || got != "b" {
		t.Errorf("Exhaustive(12288 MiB without NUMA) = %q, %v; want b", got, err)
	}
	huge, err := numa.NewRequest(2, 1<<30, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var nofit *numa.NoFitError
	if got, err := ix.Choose(ctx, Request{UUID: "g2", Request: huge}); !errors.As(err, &nofit) {
		t.Errorf("Choose(1 TiB without NUMA) = %q, %v; want a *numa.NoFitError", got, err)
	}
}
