package audit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// Size of the benchmark's cloud.
const (
	benchHosts       = 1000
	benchPerHost     = 20
	benchOpenOwners  = 500
	benchConcurrency = 8 // api.DefaultReconcileConcurrency
)

// BenchmarkReconcileAudit audits 1,000 simulated hosts of 20 resident
// guests each, plus 500 pending claims owned by 500 workflows open on a
// real Temporal dev server (asked with DescribeWorkflow), 8 hosts at a
// time as the Reconcile workflow does. Next to it, the floor: the same
// Redis keys read with the same commands and concurrency, with no
// decoding, no question to Temporal and no decision. It reports both and
// their ratio.
func BenchmarkReconcileAudit(b *testing.B) {
	ctx := context.Background()
	srv := testenv.StartRedis(b, testenv.RedisConfigLines("maxclients 10000"))
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	b.Cleanup(func() { _ = rdb.Close() })
	tmp := testenv.StartTemporal(b)
	led, err := ledger.New(rdb, ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	drv := sim.New(rdb, sim.Options{})
	acts := &activities.Activities{Ledger: led, Driver: drv}
	auditor := &audit.Auditor{Ledger: led, Driver: drv, Owners: audit.TemporalOwners{Client: tmp.Client}}

	setup := time.Now()
	hosts, guests := benchCloud(b, acts)
	owners := benchOpenWorkflows(b, tmp.Client)
	// One pending migration-destination claim per open workflow, on the
	// first 500 hosts, for a guest of the next host.
	for i, o := range owners {
		h := hosts[i]
		g := guests[(i+1)%len(hosts)][0]
		req, _ := simcloud.Flavor().Request()
		if _, err := led.Claim(ctx, ledger.ClaimSpec{ID: "migration-dest-" + o.FirstRunID, Host: h, InstanceUUID: g,
			Kind: ledger.KindMigrationDest, OwnerWorkflowID: o.WorkflowID, OwnerRunID: o.FirstRunID, Request: req}); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("setup: %d hosts, %d guests, %d open workflows in %s", len(hosts), len(hosts)*benchPerHost, len(owners), time.Since(setup).Round(time.Millisecond))

	zero := time.Duration(0)
	var auditTime, floor time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		var total audit.Tally
		var mu sync.Mutex
		eachHost(hosts, func(h string) {
			res, err := auditor.AuditHost(ctx, audit.AuditHostInput{Host: h, Grace: &zero})
			if err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			total.Add(res.Tally)
			mu.Unlock()
		})
		auditTime += time.Since(start)

		b.StopTimer()
		want := audit.Tally{Claims: benchHosts*benchPerHost + benchOpenOwners,
			Kept: audit.ReasonCounts{{Reason: audit.KeptOwnerRunning, Count: benchOpenOwners}, {Reason: audit.KeptResident, Count: benchHosts * benchPerHost}}}
		if total.Claims != want.Claims || total.Kept.Of(audit.KeptResident) != benchHosts*benchPerHost ||
			total.Kept.Of(audit.KeptOwnerRunning) != benchOpenOwners || total.Freed.Total() != 0 || total.Drift.Total() != 0 || total.Errors != 0 {
			b.Fatalf("audit tally %+v, want %+v and nothing freed, no drift, no error", total, want)
		}
		start = time.Now()
		eachHost(hosts, func(h string) { benchFloor(ctx, b, rdb, h, guests[hostIndex(h)]) })
		floor += time.Since(start)
		b.StartTimer()
	}
	b.StopTimer()
	perAudit := auditTime.Seconds() / float64(b.N)
	perFloor := floor.Seconds() / float64(b.N)
	b.ReportMetric(perAudit, "audit-s")
	b.ReportMetric(perFloor, "floor-s")
	b.ReportMetric(perAudit/perFloor, "audit/floor")
	fmt.Printf("reconcile audit of %d hosts x %d guests + %d open workflows: %.2fs; floor (same Redis reads, no decisions): %.2fs; ratio %.2f (target <= 3)\n",
		benchHosts, benchPerHost, benchOpenOwners, perAudit, perFloor, perAudit/perFloor)
}

func benchHostName(i int) string { return fmt.Sprintf("bench-%04d", i) }

func hostIndex(h string) int {
	var i int
	fmt.Sscanf(h, "bench-%04d", &i)
	return i
}

// eachHost runs f for every host, benchConcurrency at a time.
func eachHost(hosts []string, f func(h string)) { eachHostN(hosts, benchConcurrency, f) }

// benchCloud registers the hosts and boots the guests on them the way the
// Boot workflow's activities do, with owners that closed long ago.
func benchCloud(b *testing.B, acts *activities.Activities) (hosts []string, guests [][]string) {
	ctx := context.Background()
	topo, err := numa.Uniform(numa.UniformSpec{Cells: 2, Cores: 24, Threads: 1, MemoryMB: 65536})
	if err != nil {
		b.Fatal(err)
	}
	hosts = make([]string, benchHosts)
	guests = make([][]string, benchHosts)
	for i := range hosts {
		hosts[i] = benchHostName(i)
		guests[i] = make([]string, benchPerHost)
	}
	var failed atomic.Bool
	eachHostN(hosts, 16, func(h string) {
		i := hostIndex(h)
		if err := acts.Driver.(*sim.Driver).AddHost(ctx, h, topo); err != nil {
			b.Error(err)
			failed.Store(true)
			return
		}
		if _, err := acts.Ledger.RegisterHost(ctx, h, topo); err != nil {
			b.Error(err)
			failed.Store(true)
			return
		}
		for j := range benchPerHost {
			u := fmt.Sprintf("%08x-0000-4000-8000-%012x", i, j)
			guests[i][j] = u
			if err := benchBoot(ctx, acts, h, u); err != nil {
				b.Error(err)
				failed.Store(true)
				return
			}
		}
	})
	if failed.Load() {
		b.FailNow()
	}
	return hosts, guests
}

// eachHostN runs f for every host, n at a time.
func eachHostN(hosts []string, n int, f func(h string)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(hosts) {
					return
				}
				f(hosts[i])
			}
		}()
	}
	wg.Wait()
}

func benchBoot(ctx context.Context, acts *activities.Activities, host, u string) error {
	if _, err := acts.CreateInstance(ctx, activities.CreateInstanceInput{UUID: u, Name: "g-" + u[:8] + u[len(u)-4:], Flavor: simcloud.Flavor()}); err != nil {
		return err
	}
	c, err := acts.Claim(ctx, activities.ClaimInput{Host: host, ClaimID: "boot-" + u, UUID: u, Kind: ledger.KindBoot,
		Owner: activities.Owner{WorkflowID: guest.InstanceWorkflowID(u), FirstRunID: "closed-" + u}, Flavor: simcloud.Flavor()})
	if err != nil {
		return err
	}
	if err := acts.Spawn(ctx, activities.SpawnInput{UUID: u, Host: host, Placement: c.Placement, ClaimID: c.ClaimID, Token: c.Token}); err != nil {
		return err
	}
	return acts.Attach(ctx, activities.AttachInput{UUID: u, Host: host, ClaimID: c.ClaimID})
}

// benchOpenWorkflows starts workflows on a task queue no worker polls, so
// they stay open, and returns their ids and first run ids.
func benchOpenWorkflows(b *testing.B, c client.Client) []activities.Owner {
	ctx := context.Background()
	out := make([]activities.Owner, benchOpenOwners)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(out) {
					return
				}
				id := fmt.Sprintf("instance-bench-open-%03d", i)
				run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: "bench-nobody-polls"}, "LiveMigration", nil)
				if err != nil {
					b.Error(err)
					return
				}
				out[i] = activities.Owner{WorkflowID: id, FirstRunID: run.GetRunID()}
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return out
}

// benchFloor reads what AuditHost reads for host h, with the same
// commands, and decides nothing: the host's four ledger hashes in one
// transaction, each guest's instance record, and the simulator's domain
// set and domains.
func benchFloor(ctx context.Context, b *testing.B, rdb *redis.Client, h string, guests []string) {
	base := ledger.DefaultKeyPrefix + ":host:{" + h + "}:"
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range []string{"topo", "pins", "usage", "claims"} {
			p.HGetAll(ctx, base+k)
		}
		return nil
	}); err != nil {
		b.Error(err)
		return
	}
	for _, u := range guests {
		if err := rdb.HMGet(ctx, ledger.DefaultKeyPrefix+":inst:{"+u+"}", "uuid", "host", "claim_id", "domain_digest").Err(); err != nil {
			b.Error(err)
			return
		}
	}
	simBase := sim.DefaultPrefix + ":host:{" + h + "}:"
	p := rdb.Pipeline()
	p.Exists(ctx, simBase+"topo")
	members := p.SMembers(ctx, simBase+"domains")
	if _, err := p.Exec(ctx); err != nil {
		b.Error(err)
		return
	}
	p = rdb.Pipeline()
	for _, u := range members.Val() {
		p.HGetAll(ctx, simBase+"dom:"+u)
	}
	if _, err := p.Exec(ctx); err != nil {
		b.Error(err)
	}
}
