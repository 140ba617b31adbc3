package defrag

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pinflow/pinflow/numa"
)

// BenchmarkDefragFleet: 1,000 hosts of two cells of 16 two-thread cores,
// fragmented by a random history of boots and deletes to about 70% of
// their pCPUs pinned, and a large flavor, 8 vCPUs of thread policy
// require on one cell (4 whole cores). It reports the share of hosts that
// refuse the flavor before and after each host's defrag plan (re-pins
// only: the hosts that would need a migration count as refusing), the
// re-pins the plans take, and the planning time per host.
func BenchmarkDefragFleet(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	const hosts = 1000
	type host struct {
		state  *numa.Host
		guests []Guest
	}
	fleet := make([]host, hosts)
	for i := range fleet {
		fleet[i].state, fleet[i].guests = fragmented(b, rng, 2, 16, 0.7)
	}
	large := siblings(b, 8)
	fits := func(h *numa.Host) bool { _, err := numa.Fit(h, large); return err == nil }
	b.ResetTimer()
	for range b.N {
		refusedBefore, refusedAfter, repins, migrations := 0, 0, 0, 0
		start := time.Now()
		for _, h := range fleet {
			if !fits(h.state) {
				refusedBefore++
			}
			plan := Make(Input{Host: "h", State: h.state, Guests: h.guests, For: large})
			switch {
			case plan.Fits:
				repins += len(plan.Repins)
			case len(plan.Unplaceable) > 0:
				migrations++
				refusedAfter++
			default:
				refusedAfter++
			}
		}
		elapsed := time.Since(start)
		b.ReportMetric(100*float64(refusedBefore)/hosts, "%refused-before")
		b.ReportMetric(100*float64(refusedAfter)/hosts, "%refused-after")
		b.ReportMetric(float64(repins)/float64(hosts-refusedAfter), "re-pins/host-made-to-fit")
		b.ReportMetric(float64(migrations), "hosts-needing-migrations")
		b.ReportMetric(float64(elapsed.Microseconds())/hosts, "µs/host-plan")
	}
}

// BenchmarkDefragVsBruteForce: on 300 small fragmented hosts (two cells
// of four two-thread cores), the re-pins the plans take against the
// fewest a search of every subset of the guests in every order finds.
func BenchmarkDefragVsBruteForce(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	type host struct {
		state  *numa.Host
		guests []Guest
		flavor *numa.Request
	}
	var small []host
	for range 300 {
		h, g := fragmented(b, rng, 2, 4, 0.5)
		small = append(small, host{h, g, siblings(b, 2*(2+rng.IntN(2)))})
	}
	b.ResetTimer()
	for range b.N {
		planned, fewest, solved, missed := 0, 0, 0, 0
		for _, h := range small {
			plan := Make(Input{Host: "h", State: h.state, Guests: h.guests, For: h.flavor})
			best, ok := bruteForce(h.state, h.guests, h.flavor, len(plan.Repins))
			switch {
			case ok && plan.Fits && len(plan.Migrations) == 0:
				solved++
				planned += len(plan.Repins)
				fewest += best
			case ok:
				missed++
			}
		}
		b.ReportMetric(float64(solved), "hosts-made-to-fit")
		b.ReportMetric(float64(planned), "re-pins-planned")
		b.ReportMetric(float64(fewest), "re-pins-fewest")
		b.ReportMetric(float64(missed), "hosts-the-plan-missed")
	}
}
