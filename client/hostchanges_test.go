package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// TestHostChangesRefused: a request the client refuses starts nothing (its
// client has no Temporal to start with) and is one line naming the value;
// request mistakes wrap ErrInvalid, an unknown host ErrUnknownHost.
func TestHostChangesRefused(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	led, err := ledger.New(rdb, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	topo, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: 4, Threads: 1, MemoryMB: 8192})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"a", "b", "c"} {
		if _, err := led.RegisterHost(ctx, h, topo); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := led.SetHostDown(ctx, "b", "psu"); err != nil {
		t.Fatal(err)
	}
	if _, err := led.SetHostDisabled(ctx, "c", "bios"); err != nil {
		t.Fatal(err)
	}
	c := client.New(led, nil, "q")
	lv := &libvirthost.Config{URI: "qemu+tcp://d.example/system"}
	noCells := &numa.Host{}
	for _, tt := range []struct {
		name string
		do   func() error
		want string
		is   error
	}{
		{"add: bad name", func() error { _, err := c.AddHost(ctx, client.AddHostRequest{Name: "d:1", Topology: topo}); return err },
			`host name "d:1": invalid input`, client.ErrInvalid},
		{"add: topology and libvirt", func() error {
			_, err := c.AddHost(ctx, client.AddHostRequest{Name: "d", Topology: topo, Libvirt: lv})
			return err
		}, "not both", client.ErrInvalid},
		{"add: neither", func() error { _, err := c.AddHost(ctx, client.AddHostRequest{Name: "d"}); return err },
			"give a topology or a libvirt configuration", client.ErrInvalid},
		{"add: limits beside a topology", func() error {
			_, err := c.AddHost(ctx, client.AddHostRequest{Name: "d", Topology: topo, Limits: &numa.Limits{CPUAllocationRatio: 1, RAMAllocationRatio: 1}})
			return err
		}, "a topology carries its own limits", client.ErrInvalid},
		{"add: no cells", func() error {
			_, err := c.AddHost(ctx, client.AddHostRequest{Name: "d", Topology: noCells})
			return err
		},
			"host has 0 cells", client.ErrInvalid},
		{"add: bad libvirt uri", func() error {
			_, err := c.AddHost(ctx, client.AddHostRequest{Name: "d", Libvirt: &libvirthost.Config{URI: "d.example"}})
			return err
		}, `"d.example"`, client.ErrInvalid},
		{"add: bad libvirt limits", func() error {
			_, err := c.AddHost(ctx, client.AddHostRequest{Name: "d", Libvirt: lv, Limits: &numa.Limits{CPUAllocationRatio: 0, RAMAllocationRatio: 1}})
			return err
		}, "cpu_allocation_ratio 0 must be a positive number", client.ErrInvalid},
		{"disable: bad reason", func() error { _, err := c.DisableHost(ctx, "a", "two\nlines"); return err },
			`host disable a: reason "two\nlines": invalid input: reasons are 1-200 printable characters`, client.ErrInvalid},
		{"disable: unknown host", func() error { _, err := c.DisableHost(ctx, "nowhere", "x"); return err },
			`unknown host "nowhere"; registered hosts are a, b, c`, client.ErrUnknownHost},
		{"disable: down host", func() error { _, err := c.DisableHost(ctx, "b", "x"); return err },
			"host disable b: the host is down; only an up host is disabled", client.ErrState},
		{"enable: down host", func() error { _, err := c.EnableHost(ctx, "b"); return err },
			"host enable b: the host is down, not disabled", client.ErrState},
		{"down: blank reason", func() error { _, err := c.DownHost(ctx, "a", "  ", false); return err },
			"reasons are 1-200 printable characters, not all blank", client.ErrInvalid},
		{"down: unknown host", func() error { _, err := c.DownHost(ctx, "nowhere", "x", false); return err },
			`unknown host "nowhere"`, client.ErrUnknownHost},
		{"up: up host", func() error { _, err := c.UpHost(ctx, "a"); return err }, "host up a: the host is up already", client.ErrState},
		{"up: disabled host", func() error { _, err := c.UpHost(ctx, "c"); return err },
			"the host is disabled, not down; enable it to let pinflow choose it again", client.ErrState},
		{"remove: unknown host", func() error { _, err := c.RemoveHost(ctx, "nowhere"); return err },
			`unknown host "nowhere"`, client.ErrUnknownHost},
		{"evacuate: disabled host", func() error { _, err := c.EvacuateHost(ctx, "c"); return err },
			"host evacuate c: the host is disabled; pinflow evacuates only from a host marked down", client.ErrState},
		{"auto-evacuate: up host", func() error { _, err := c.AutoEvacuateHost(ctx, "a", true); return err },
			"host evacuate a: the host is up; pinflow evacuates only from a host marked down", client.ErrState},
		{"auto-evacuate: unknown host", func() error { _, err := c.AutoEvacuateHost(ctx, "nowhere", true); return err },
			`unknown host "nowhere"`, client.ErrUnknownHost},
	} {
		err := tt.do()
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %v, want one line containing %q", tt.name, err, tt.want)
		}
		if tt.is != nil && !errors.Is(err, tt.is) {
			t.Errorf("%s: error %v does not wrap %v", tt.name, err, tt.is)
		}
	}
}
