package sim

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/numa"
)

// testTopo is a two-cell host: cpus 0-1 and 4-5 shared, 2-3 and 6-7
// dedicated, 4 GiB per cell.
func testTopo(t testing.TB) *numa.Host {
	t.Helper()
	spec := numa.HostSpec{
		Cells: []numa.CellSpec{
			{ID: 0, CPUs: []int{0, 1, 2, 3}, MemoryMB: 4096, MemPages: []numa.PagePool{{SizeKB: 4, Total: 1048576}}},
			{ID: 1, CPUs: []int{4, 5, 6, 7}, MemoryMB: 4096, MemPages: []numa.PagePool{{SizeKB: 4, Total: 1048576}}},
		},
		CPUDedicatedSet: "2-3,6-7",
		CPUSharedSet:    "0-1,4-5",
	}
	h, err := spec.Host(nil)
	if err != nil {
		t.Fatalf("testTopo: %v", err)
	}
	return h
}

const (
	uuidA = "0f8fad5b-d9cb-469f-a165-70867728950e"
	uuidB = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
)

// domainXML is a one-vCPU guest of 512 MiB pinned to cpu and memory node
// node.
func domainXML(uuid, name string, cpu, node int) string {
	return fmt.Sprintf(`<domain type='qemu'>
  <name>%s</name>
  <uuid>%s</uuid>
  <memory unit='MiB'>512</memory>
  <vcpu placement='static'>1</vcpu>
  <cputune>
    <vcpupin vcpu='0' cpuset='%d'/>
    <emulatorpin cpuset='0-1'/>
  </cputune>
  <numatune>
    <memory mode='strict' nodeset='%d'/>
  </numatune>
  <devices><disk type='file' device='disk'><source file='/var/lib/%s.qcow2'/></disk></devices>
</domain>
`, name, uuid, cpu, node, name)
}

// migrateReq is an unfenced migration of uuid from src to dst with destXML.
func migrateReq(src, dst, uuid, destXML string) hypervisor.MigrateRequest {
	return hypervisor.MigrateRequest{UUID: uuid, Source: src, Dest: dst, DestXML: destXML}
}

// env is a driver on a fresh redis-server with hosts h1 and h2.
type env struct {
	t   *testing.T
	r   *testenv.Redis
	rdb *redis.Client
	d   *Driver
	ctx context.Context
}

func newEnv(t *testing.T, opts Options) *env {
	t.Helper()
	r := testenv.StartRedis(t)
	e := &env{t: t, r: r, ctx: context.Background()}
	e.rdb = e.client()
	e.d = New(e.rdb, opts)
	for _, h := range []string{"h1", "h2"} {
		if err := e.d.AddHost(e.ctx, h, testTopo(t)); err != nil {
			t.Fatalf("AddHost(%s): %v", h, err)
		}
	}
	return e
}

// client returns a new connection to the env's Redis, closed when the test
// ends.
func (e *env) client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: e.r.Addr})
	e.t.Cleanup(func() { c.Close() })
	return c
}

// restart returns a driver with a new client on the same Redis, as a new
// worker process would build.
func (e *env) restart(opts Options) *Driver {
	return New(e.client(), opts)
}

// running defines and starts domain uuid on host.
func (e *env) running(host, uuid, name string, cpu, node int) string {
	e.t.Helper()
	x := domainXML(uuid, name, cpu, node)
	if err := e.d.Define(e.ctx, host, x); err != nil {
		e.t.Fatalf("Define(%s, %s): %v", host, name, err)
	}
	if err := e.d.Start(e.ctx, host, uuid); err != nil {
		e.t.Fatalf("Start(%s, %s): %v", host, uuid, err)
	}
	return x
}

// where is a domain's presence on one host, for comparisons.
type where struct {
	State hypervisor.State
	XML   string
}

// placement returns where domain uuid is, host by host; a host without it
// is absent from the map.
func (e *env) placement(d *Driver, uuid string) map[string]where {
	e.t.Helper()
	out := map[string]where{}
	for _, h := range []string{"h1", "h2"} {
		dom, err := d.Lookup(e.ctx, h, uuid)
		if errors.Is(err, hypervisor.ErrNotFound) {
			continue
		}
		if err != nil {
			e.t.Fatalf("Lookup(%s, %s): %v", h, uuid, err)
		}
		out[h] = where{dom.State, dom.XML}
	}
	return out
}

// recordingSleep sleeps for real and records every wait it was asked for.
type recordingSleep struct {
	waits chan time.Duration
}

func newRecordingSleep() *recordingSleep {
	return &recordingSleep{waits: make(chan time.Duration, 10000)}
}

func (s *recordingSleep) sleep(ctx context.Context, d time.Duration) error {
	s.waits <- d
	return sleepCtx(ctx, d)
}

// drain returns the waits recorded since the last drain.
func (s *recordingSleep) drain() []time.Duration {
	var out []time.Duration
	for {
		select {
		case d := <-s.waits:
			out = append(out, d)
		default:
			return out
		}
	}
}
