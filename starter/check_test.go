package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// TestCheckFindsALostHost: `pinflow check` fails, naming the host, when a
// registered host's topology key is gone while its claims remain.
func TestCheckFindsALostHost(t *testing.T) {
	ctx := context.Background()
	r := testenv.StartRedis(t)
	t.Setenv("PINFLOW_REDIS_URL", r.URL())
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	led, err := ledger.New(rdb, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	spec := numa.HostSpec{Cells: []numa.CellSpec{{ID: 0, CPUs: []int{0, 1, 2, 3}, MemoryMB: 4096}}}
	topo, err := spec.Host(nil)
	if err != nil {
		t.Fatal(err)
	}
	req, err := numa.NewRequest(2, 512, map[string]string{"hw:cpu_policy": "dedicated"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"h1", "h2"} {
		if _, err := led.RegisterHost(ctx, h, topo); err != nil {
			t.Fatal(err)
		}
		if _, err := led.Claim(ctx, ledger.ClaimSpec{ID: "boot-" + h, Host: h, InstanceUUID: "vm-" + h, Kind: ledger.KindBoot,
			OwnerWorkflowID: "instance-vm-" + h, OwnerRunID: "run-1", Request: req}); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := dispatch([]string{"check"}, &out); err != nil {
		t.Fatalf("check on an intact ledger = %v\n%s", err, out.String())
	}
	if err := rdb.Del(ctx, ledger.DefaultKeyPrefix+":host:{h2}:topo").Err(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = dispatch([]string{"check"}, &out)
	if err == nil || !strings.Contains(out.String(), "PROBLEM: host h2 has no topology key") {
		t.Fatalf("check with h2's topology gone = %v, want a problem naming h2:\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "host h1") {
		t.Errorf("check names the intact host h1:\n%s", out.String())
	}
}
