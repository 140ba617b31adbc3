package placement

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// benchSizes are the fleets BenchmarkChooseHost chooses among, with how
// many choices it times of each chooser: Exhaustive reads every host per
// choice, so at 100,000 hosts only a handful.
var benchSizes = []struct {
	hosts, indexCalls, exhaustiveCalls int
}{
	{1_000, 1000, 100},
	{10_000, 1000, 20},
	{100_000, 1000, 5},
}

// BenchmarkChooseHost times choices among 1,000, 10,000 and 100,000 hosts
// of 2 sockets x 24 cores x 2 threads on one redis-server, each filled to
// a random fraction with guests of 4 to 32 pinned vCPUs, 2% of them down:
// the index's Choose next to Exhaustive on the same requests and the same
// data, p50 and p99, and fails if the two ever choose differently. It
// also times the index's first sweep and a sweep with nothing changed
// (what each SweepInterval costs a worker), and prints a table.
func BenchmarkChooseHost(b *testing.B) {
	var rows []benchRow
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("hosts=%d", size.hosts), func(b *testing.B) {
			for range b.N {
				rows = append(rows, benchChoose(b, size.hosts, size.indexCalls, size.exhaustiveCalls))
			}
		})
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "hosts\tindex p50\tindex p99\texhaustive p50\texhaustive p99\tcalls (index/exhaustive)\tfirst sweep\tsweep, no change\tsetup\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t\n", r.hosts, ms(r.index.p50), ms(r.index.p99),
			ms(r.exhaustive.p50), ms(r.exhaustive.p99), r.index.n, r.exhaustive.n, r.sweep.Round(time.Millisecond),
			r.resweep.Round(time.Millisecond), r.setup.Round(time.Second))
	}
	fmt.Println("ChooseHost: the placement index against the exhaustive scan, on the same fleet and requests")
	_ = tw.Flush()
}

type benchRow struct {
	hosts             int
	index, exhaustive timings
	sweep, resweep    time.Duration
	setup             time.Duration
}

type timings struct {
	n        int
	p50, p99 time.Duration
}

func timingsOf(d []time.Duration) timings {
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return timings{n: len(d), p50: at(0.5), p99: at(0.99)}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func benchChoose(b *testing.B, hosts, indexCalls, exhaustiveCalls int) benchRow {
	ctx := context.Background()
	srv := testenv.StartRedis(b, testenv.RedisConfigLines("maxclients 10000", `save ""`))
	setup := time.Now()
	names := benchFleet(b, ledgerOn(b, srv.Addr), hosts)
	row := benchRow{hosts: hosts, setup: time.Since(setup)}
	b.Logf("%d hosts registered and filled in %s", hosts, row.setup.Round(time.Millisecond))

	led := ledgerOn(b, srv.Addr)
	ix := NewIndex(led, Options{})
	start := time.Now()
	if err := ix.Sweep(ctx); err != nil {
		b.Fatal(err)
	}
	row.sweep = time.Since(start)
	// What every SweepInterval costs a worker when nothing changed.
	start = time.Now()
	if err := ix.Sweep(ctx); err != nil {
		b.Fatal(err)
	}
	row.resweep = time.Since(start)

	rng := rand.New(rand.NewPCG(uint64(hosts), 2))
	reqs := make([]Request, indexCalls)
	for i := range reqs {
		reqs[i] = Request{UUID: fmt.Sprintf("guest-%d", i), Request: benchRequest(b, rng)}
		if rng.IntN(3) == 0 {
			reqs[i].Exclude = []string{names[rng.IntN(len(names))]}
		}
	}
	b.ResetTimer()
	chosen := make([]string, len(reqs))
	var took []time.Duration
	for i, r := range reqs {
		start := time.Now()
		h, err := ix.Choose(ctx, r)
		took = append(took, time.Since(start))
		chosen[i] = outcome(h, err)
	}
	row.index = timingsOf(took)
	took = nil
	for i, r := range reqs[:exhaustiveCalls] {
		start := time.Now()
		h, err := Exhaustive(ctx, led, r)
		took = append(took, time.Since(start))
		if got := outcome(h, err); got != chosen[i] {
			b.Fatalf("request %d %+v: index chose %s, Exhaustive %s", i, *r.Request, chosen[i], got)
		}
	}
	row.exhaustive = timingsOf(took)
	b.StopTimer()
	b.ReportMetric(float64(row.index.p50.Microseconds())/1000, "index-p50-ms")
	b.ReportMetric(float64(row.index.p99.Microseconds())/1000, "index-p99-ms")
	b.ReportMetric(float64(row.exhaustive.p50.Microseconds())/1000, "exhaustive-p50-ms")
	return row
}

// benchRequest is a guest of the kinds a cloud asks for: mostly pinned,
// of 2 to 16 vCPUs and 4 GiB each, some isolated, mixed, on huge pages or
// on two NUMA cells, a few shared.
func benchRequest(b testing.TB, rng *rand.Rand) *numa.Request {
	vcpus := []int{2, 4, 4, 8, 8, 16}[rng.IntN(6)]
	specs := map[string]string{"hw:cpu_policy": "dedicated"}
	switch rng.IntN(10) {
	case 0:
		specs["hw:cpu_thread_policy"] = "isolate"
	case 1:
		specs["hw:cpu_policy"] = "mixed"
		specs["hw:cpu_dedicated_mask"] = "^0"
	case 2:
		specs["hw:mem_page_size"] = "2048"
	case 3:
		specs["hw:numa_nodes"] = "2"
	case 4:
		specs["hw:cpu_policy"] = "shared"
		specs["hw:numa_nodes"] = "1"
	}
	r, err := numa.NewRequest(vcpus, int64(vcpus)*4096, specs, nil)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// benchFleet registers hosts and fills each to a random fraction of its
// pCPUs, through a ledger used for nothing else (its caches of every host
// go with it), and marks 2% of them down.
func benchFleet(b testing.TB, led *ledger.Ledger, hosts int) []string {
	ctx := context.Background()
	// A few models, so that the fleet has a few topologies; the first core
	// of each cell is shared, for the guests that float.
	var models []*numa.Host
	shared := numa.NewCPUSet(0, 1, 48, 49)
	for _, s := range []numa.UniformSpec{
		{Cells: 2, Cores: 24, Threads: 2, MemoryMB: 196608},
		{Cells: 2, Cores: 24, Threads: 2, MemoryMB: 393216},
		{Cells: 2, Cores: 24, Threads: 2, MemoryMB: 393216, HugePages: map[int64]int64{2048: 65536}},
	} {
		s.Shared, s.Dedicated = shared, numa.Range(0, 95).Difference(shared)
		h, err := numa.Uniform(s)
		if err != nil {
			b.Fatal(err)
		}
		models = append(models, h)
	}
	names := make([]string, hosts)
	for i := range names {
		names[i] = fmt.Sprintf("compute-%06d", i)
	}
	var failed sync.Once
	each(names, 128, func(i int, h string) {
		if _, err := led.RegisterHost(ctx, h, models[i%len(models)]); err != nil {
			failed.Do(func() { b.Error(err) })
		}
	})
	guests := []*numa.Request{}
	for _, v := range []int{4, 8, 16, 32} {
		r, err := numa.NewRequest(v, int64(v)*4096, map[string]string{"hw:cpu_policy": "dedicated"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		guests = append(guests, r)
	}
	c := &cloud{led: led}
	each(names, 128, func(i int, h string) {
		rng := rand.New(rand.NewPCG(uint64(i), 3))
		want := rng.IntN(97) // pCPUs to take, of 96
		for taken := 0; taken < want; {
			g := guests[rng.IntN(len(guests))]
			cl, err := c.claim(ctx, h, g)
			if err != nil {
				break // full enough
			}
			for _, u := range cl.Usage {
				taken += u.PinnedCPUs.Len()
			}
		}
		if i%50 == 7 {
			if _, err := led.SetHostDown(ctx, h, "bench"); err != nil {
				failed.Do(func() { b.Error(err) })
			}
		}
	})
	if b.Failed() {
		b.FailNow()
	}
	return names
}

// each runs f for every name, n at a time.
func each(names []string, n int, f func(i int, name string)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range n {
		wg.Go(func() {
			for i := range next {
				f(i, names[i])
			}
		})
	}
	for i := range names {
		next <- i
	}
	close(next)
	wg.Wait()
}
