package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/numa"
)

// TestConcurrentClaimsKeepOneOwnerPerCPU has 64 goroutines, over two
// Ledgers (two processes, as far as the ledger can tell), claim and
// release on one host of 8 pCPUs while a sampler checks every snapshot: no
// pCPU in two claims, pins exactly the live claims' pCPUs, usage the sum of
// the live claims.
func TestConcurrentClaimsKeepOneOwnerPerCPU(t *testing.T) {
	ctx := context.Background()
	l, rdb, srv := newLedger(t)
	rdb2 := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	t.Cleanup(func() { _ = rdb2.Close() })
	l2, err := New(rdb2, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := testHost(1, 8)
	h.Cells[0].MemoryMB = 3000
	register(t, l, "h1", h)
	requests := []*numa.Request{
		dedicated(t, 1, 256),
		dedicated(t, 2, 512),
		dedicated(t, 2, 256, "hw:cpu_thread_policy", "isolate"),
		dedicated(t, 1, 256, "hw:mem_page_size", "2048"),
	}

	// The race runs until it has been exercised, however fast the
	// machine: enough claims landed and a snapshot saw several at once.
	wantClaims := int64(100)
	if testing.Short() {
		wantClaims = 20
	}
	var claimed, released, nofit, conflicts, samples, busy atomic.Int64
	enough := func() bool { return claimed.Load() >= wantClaims && busy.Load() > 0 }
	stop := make(chan struct{})
	var workers sync.WaitGroup
	for w := range 64 {
		lw := l
		if w%2 == 1 {
			lw = l2
		}
		workers.Add(1)
		go func() {
			defer workers.Done()
			for i := 0; !enough(); i++ {
				select {
				case <-stop:
					return
				default:
				}
				s := spec(fmt.Sprintf("w%d-%d", w, i), "h1", requests[(w+i)%len(requests)])
				_, err := lw.Claim(ctx, s)
				var nf *numa.NoFitError
				switch {
				case errors.As(err, &nf):
					nofit.Add(1)
					continue
				case errors.Is(err, ErrConflict):
					conflicts.Add(1)
					continue
				case err != nil:
					t.Errorf("Claim(%s): %v", s.ID, err)
					return
				}
				claimed.Add(1)
				if i%3 == 0 {
					if _, err := lw.Commit(ctx, "h1", s.ID); err != nil {
						t.Errorf("Commit(%s): %v", s.ID, err)
						return
					}
				}
				if err := lw.Release(ctx, "h1", s.ID); err != nil {
					t.Errorf("Release(%s): %v", s.ID, err)
					return
				}
				released.Add(1)
			}
		}()
	}
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			s, err := l.Snapshot(ctx, "h1")
			if err != nil {
				t.Errorf("Snapshot: %v", err)
				return
			}
			if err := s.Verify(); err != nil {
				t.Errorf("snapshot %d with %d claims: %v", samples.Load(), len(s.Claims), err)
				return
			}
			samples.Add(1)
			if len(s.Claims) > 1 {
				busy.Add(1)
			}
		}
	}()
	// Only a hang reaches this deadline.
	hang := time.AfterFunc(2*time.Minute, func() { close(stop) })
	workers.Wait()
	if hang.Stop() {
		close(stop)
	}
	sampler.Wait()

	t.Logf("%d claims, %d releases, %d no fit, %d conflicts after %d tries; %d snapshots, %d with several claims",
		claimed.Load(), released.Load(), nofit.Load(), conflicts.Load(), DefaultMaxAttempts, samples.Load(), busy.Load())
	if !enough() {
		t.Errorf("only %d claims succeeded and %d of %d snapshots saw several claims at once: the race was not exercised", claimed.Load(), busy.Load(), samples.Load())
	}
	end := snapshot(t, l, "h1")
	if len(end.Claims) != 0 || len(end.Pins) != 0 || len(end.Usage) != 0 {
		t.Errorf("ledger after every claim was released: claims %v, pins %v, usage %v; want empty", end.Claims, end.Pins, end.Usage)
	}
	keys, err := rdb.Keys(ctx, "pinflow:host:{h1}:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "pinflow:host:{h1}:topo" {
		t.Errorf("keys left for h1: %v, want only its topology", keys)
	}
}

// TestVerifyFindsCorruption breaks a consistent ledger in the ways Verify
// must see, to show the invariant checks the race test relies on can fail.
func TestVerifyFindsCorruption(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	register(t, l, "h1", testHost(1, 8))
	c1, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, spec("c2", "h1", dedicated(t, 2, 512))); err != nil {
		t.Fatal(err)
	}
	k := l.hostKeys("h1")
	cpu := c1.Usage[0].PinnedCPUs.Min()
	for _, tc := range []struct {
		name   string
		break_ func(p redis.Pipeliner)
	}{
		{"pin owned by the wrong claim", func(p redis.Pipeliner) { p.HSet(ctx, k.pins, cpu, "c2") }},
		{"pin of no claim", func(p redis.Pipeliner) { p.HSet(ctx, k.pins, 7, "ghost") }},
		{"claimed pCPU not pinned", func(p redis.Pipeliner) { p.HDel(ctx, k.pins, itoa(cpu)) }},
		{"memory counter off", func(p redis.Pipeliner) { p.HIncrBy(ctx, k.usage, "0:mem", 1) }},
		{"page counter off", func(p redis.Pipeliner) { p.HIncrBy(ctx, k.usage, "0:pages:2048", 3) }},
		{"usage on a cell without claims", func(p redis.Pipeliner) { p.HSet(ctx, k.usage, "5:mem", 10) }},
		{"undo entry frees other pCPUs", func(p redis.Pipeliner) { p.HSet(ctx, k.undo, "c1", c1.Token+"|6,7|0:mem,512") }},
		{"undo entry with another token", func(p redis.Pipeliner) {
			p.HSet(ctx, k.undo, "c1", "other|"+c1.Usage[0].PinnedCPUs.String()+"|0:mem,512,0:pages:4,"+itoa(int(c1.Usage[0].Pages)))
		}},
		{"undo entry of no claim", func(p redis.Pipeliner) { p.HSet(ctx, k.undo, "ghost", "t|6|0:mem,1") }},
		{"claim without its undo entry", func(p redis.Pipeliner) { p.HDel(ctx, k.undo, "c1") }},
		{"two claims on one pCPU", func(p redis.Pipeliner) {
			c := *c1
			c.ID = "c3"
			rec, _ := jsonClaim(&c)
			p.HSet(ctx, k.claims, "c3", rec)
			p.HIncrBy(ctx, k.usage, "0:mem", 512)
			p.HIncrBy(ctx, k.usage, "0:pages:4", c.Usage[0].Pages)
		}},
	} {
		saved := map[string][]byte{}
		for _, key := range []string{k.pins, k.usage, k.claims, k.undo} {
			d, err := rdb.Dump(ctx, key).Bytes()
			if err != nil {
				t.Fatal(err)
			}
			saved[key] = d
		}
		if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error { tc.break_(p); return nil }); err != nil {
			t.Fatal(err)
		}
		s, err := l.Snapshot(ctx, "h1")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Verify(); err == nil {
			t.Errorf("Verify with %s: no error, want one", tc.name)
		} else {
			t.Logf("Verify with %s: %v", tc.name, err)
		}
		for key, d := range saved {
			if err := rdb.RestoreReplace(ctx, key, 0, string(d)).Err(); err != nil {
				t.Fatal(err)
			}
		}
		snapshot(t, l, "h1")
	}
}

func jsonClaim(c *Claim) (string, error) {
	b, err := json.Marshal(c)
	return string(b), err
}
