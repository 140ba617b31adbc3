package ledger

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv"
)

// client is a client of one server for a test's own commands.
func client(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// info returns one field of a server's INFO section.
func info(t testing.TB, c *redis.Client, section, field string) string {
	t.Helper()
	s, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatalf("INFO %s on %s: %v", section, c.Options().Addr, err)
	}
	return infoField(s, field)
}

// hasWAITAOF says whether the server knows WAITAOF (Redis 7.2 and later).
func hasWAITAOF(t testing.TB, addr string) bool {
	t.Helper()
	err := client(t, addr).Do(context.Background(), "waitaof", 0, 0, 0).Err()
	return err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown command")
}

// pidOf returns the process id of a running server.
func pidOf(t testing.TB, srv *testenv.Redis) int {
	t.Helper()
	pid, err := strconv.Atoi(info(t, client(t, srv.Addr), "server", "process_id"))
	if err != nil {
		t.Fatalf("process_id of %s: %v", srv.Addr, err)
	}
	return pid
}

// killServer kills a redis-server with SIGKILL, as a crash would, and
// leaves it dead (testenv's KillAndRestart starts it again at once).
func killServer(t testing.TB, srv *testenv.Redis) {
	t.Helper()
	pid := pidOf(t, srv)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d (%s): %v", pid, srv.Addr, err)
	}
	for deadline := time.Now().Add(5 * time.Second); syscall.Kill(pid, 0) == nil; {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server %d on %s still runs 5s after SIGKILL", pid, srv.Addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// replicate makes r a replica of m and waits until its link is up.
func replicate(t testing.TB, r, m *testenv.Redis) {
	t.Helper()
	rc := client(t, r.Addr)
	if err := rc.Do(context.Background(), "replicaof", "127.0.0.1", m.Port).Err(); err != nil {
		t.Fatalf("REPLICAOF on %s: %v", r.Addr, err)
	}
	// The master counts the replica for WAIT once it is online and has
	// acknowledged what it has, a moment after its link is up.
	mc := client(t, m.Addr)
	waitUntil(t, 15*time.Second, "replica "+r.Addr+" acknowledging "+m.Addr, func() bool {
		if err := mc.Set(context.Background(), "replicated", r.Addr, 0).Err(); err != nil {
			t.Fatal(err)
		}
		n, err := mc.Do(context.Background(), "wait", 1, 100).Int64()
		return err == nil && n == 1
	})
	if err := mc.Del(context.Background(), "replicated").Err(); err != nil {
		t.Fatal(err)
	}
}

// caughtUp waits until replica r has everything master m wrote.
func caughtUp(t testing.TB, r, m *testenv.Redis) {
	t.Helper()
	mc, rc := client(t, m.Addr), client(t, r.Addr)
	waitUntil(t, 15*time.Second, "replica "+r.Addr+" caught up", func() bool {
		return info(t, rc, "replication", "master_repl_offset") == info(t, mc, "replication", "master_repl_offset")
	})
}

// cutOff drops replica r's link to its master, as a partition would: r
// keeps its data, stays a replica and receives nothing more.
func cutOff(t testing.TB, r *testenv.Redis) {
	t.Helper()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := dead.Addr().(*net.TCPAddr).Port
	dead.Close()
	if err := client(t, r.Addr).Do(context.Background(), "replicaof", "127.0.0.1", port).Err(); err != nil {
		t.Fatalf("REPLICAOF (cut off) on %s: %v", r.Addr, err)
	}
}

// promote makes replica r a master: the failover.
func promote(t testing.TB, r *testenv.Redis) {
	t.Helper()
	if err := client(t, r.Addr).Do(context.Background(), "replicaof", "no", "one").Err(); err != nil {
		t.Fatalf("REPLICAOF NO ONE on %s: %v", r.Addr, err)
	}
}

// stall has srv sleep for d (DEBUG SLEEP: it answers nothing, reads
// nothing from its master), from about now on; the channel receives when
// it wakes.
func stall(t testing.TB, srv *testenv.Redis, d time.Duration) <-chan error {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: d + 10*time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Do(context.Background(), "debug", "sleep", d.Seconds()).Err() }()
	time.Sleep(100 * time.Millisecond)
	return done
}

func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ackLog records, per object, what the last call on it that succeeded
// acknowledged: a claim held or released, an instance's vm_state. An
// object whose last call failed may be either way and is not judged.
type ackLog struct {
	mu         sync.Mutex
	claims     map[string]bool
	states     map[string]guest.VMState
	unsure     map[string]bool
	acks       int
	calls      int
	notDurable int
}

func newAckLog() *ackLog {
	return &ackLog{claims: map[string]bool{}, states: map[string]guest.VMState{}, unsure: map[string]bool{}}
}

func (a *ackLog) record(obj string, err error, ack func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	if err != nil {
		a.unsure[obj] = true
		if errors.Is(err, ErrNotDurable) {
			a.notDurable++
		}
		return
	}
	a.acks++
	delete(a.unsure, obj)
	ack()
}

func (a *ackLog) counts() (acks, calls, notDurable int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.acks, a.calls, a.notDurable
}

const loadHost = "h"

// debuggable lets a test stall a server with DEBUG SLEEP (Redis 7 turns
// DEBUG off by default).
var debuggable = testenv.RedisConfigLines("enable-debug-command local")

// startLoad has workers claim and release on loadHost, and move their
// instance u<w> between vm_states, through l until stop is closed,
// recording every outcome in log. Errors are expected: the server dies
// under them.
func startLoad(t testing.TB, l *Ledger, workers int, log *ackLog, stop <-chan struct{}) *sync.WaitGroup {
	ctx := context.Background()
	req := dedicated(t, 1, 64)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			uuid := fmt.Sprintf("u%d", w)
			var held []string
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("w%d-%d", w, i)
				_, err := l.Claim(ctx, spec(id, loadHost, req))
				log.record(id, err, func() { log.claims[id] = true })
				if err == nil {
					held = append(held, id)
				}
				if len(held) > 2 {
					gone := held[0]
					held = held[1:]
					err := l.Release(ctx, loadHost, gone)
					log.record(gone, err, func() { log.claims[gone] = false })
				}
				state := []guest.VMState{guest.VMActive, guest.VMStopped}[i%2]
				err = l.SetState(ctx, uuid, Transition{VM: state})
				log.record(uuid, err, func() { log.states[uuid] = state })
			}
		}()
	}
	return &wg
}

// loadLedger is a ledger for startLoad on addr: its client gives up on a
// dead server after one retry, so that the load stops soon after a kill.
func loadLedger(t testing.TB, addr string, d Durability) *Ledger {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, MaxRetries: 1, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := New(rdb, Options{Durability: d})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// setUpLoad registers loadHost and creates the workers' instances.
func setUpLoad(t testing.TB, l *Ledger, workers int) {
	t.Helper()
	register(t, l, loadHost, testHost(2, 16))
	for w := range workers {
		if _, err := l.CreateInstance(context.Background(), fmt.Sprintf("u%d", w), "vm", flavor, guest.VMBuilding, ""); err != nil {
			t.Fatal(err)
		}
	}
}

// lost lists the acknowledged changes that l does not find.
func (a *ackLog) lost(t testing.TB, l *Ledger, workers int) []string {
	t.Helper()
	ctx := context.Background()
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	hosts, err := l.Hosts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(hosts, loadHost) {
		out = append(out, "the registration of host "+loadHost)
	}
	for id, held := range a.claims {
		if a.unsure[id] {
			continue
		}
		_, err := l.GetClaim(ctx, loadHost, id)
		if err != nil && !errors.Is(err, ErrUnknownClaim) {
			t.Fatal(err)
		}
		if found := err == nil; found != held {
			out = append(out, fmt.Sprintf("claim %s: acknowledged held=%t, found held=%t", id, held, found))
		}
	}
	for w := range workers {
		uuid := fmt.Sprintf("u%d", w)
		if a.unsure[uuid] {
			continue
		}
		want, ok := a.states[uuid]
		if !ok {
			want = guest.VMBuilding // its creation
		}
		in, err := l.Instance(ctx, uuid)
		switch {
		case errors.Is(err, ErrUnknownInstance):
			out = append(out, fmt.Sprintf("instance %s: acknowledged %s, found no record", uuid, want))
		case err != nil:
			t.Fatal(err)
		case in.VMState != want:
			out = append(out, fmt.Sprintf("instance %s: acknowledged %s, found %s", uuid, want, in.VMState))
		}
	}
	slices.Sort(out)
	return out
}

// waitForCalls waits until the log holds n more calls than it did (n more
// acknowledged ones when acks is set), or d passes.
func waitForCalls(log *ackLog, n int, acks bool, d time.Duration) {
	count := func() int {
		a, c, _ := log.counts()
		if acks {
			return a
		}
		return c
	}
	want := count() + n
	for deadline := time.Now().Add(d); count() < want && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

func summary(lost []string) string {
	if len(lost) > 5 {
		return strings.Join(lost[:5], "; ") + fmt.Sprintf("; and %d more", len(lost)-5)
	}
	return strings.Join(lost, "; ")
}

// TestAcknowledgedChangesSurviveKill kills redis-server with SIGKILL
// under a load of claims, releases and instance record changes, restarts
// it and looks for every change a call acknowledged. With durable
// acknowledgements (appendfsync always, or WAITAOF where the server has
// it) none is missing. Without (no append-only file, no waits) the same
// check finds the acknowledged changes lost, so it can fail.
func TestAcknowledgedChangesSurviveKill(t *testing.T) {
	const workers = 8
	for _, tc := range []struct {
		name     string
		opts     []testenv.RedisOption
		d        Durability
		wantLoss bool
	}{
		{"appendfsync always", []testenv.RedisOption{testenv.AppendOnly()}, Durability{}, false},
		{"appendfsync always and WAITAOF", []testenv.RedisOption{testenv.WithWAITAOF(), testenv.AppendOnly()}, Durability{Local: true}, false},
		{"appendfsync everysec and WAITAOF", []testenv.RedisOption{testenv.WithWAITAOF(), testenv.RedisConfigLines("appendonly yes", "appendfsync everysec")}, Durability{Local: true}, false},
		{"no append-only file and no waits", nil, Durability{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testenv.StartRedis(t, tc.opts...)
			if tc.d.Local && !hasWAITAOF(t, srv.Addr) {
				t.Fatalf("the server testenv.WithWAITAOF started (%s) has no WAITAOF", info(t, client(t, srv.Addr), "server", "redis_version"))
			}
			l := loadLedger(t, srv.Addr, tc.d)
			if err := l.CheckDurability(context.Background()); err != nil {
				t.Fatal(err)
			}
			setUpLoad(t, l, workers)
			log := newAckLog()
			stop := make(chan struct{})
			wg := startLoad(t, l, workers, log, stop)
			waitForCalls(log, 300, true, 20*time.Second)
			srv.KillAndRestart(t)
			// Calls go on against the restarted server.
			waitForCalls(log, 50, false, 3*time.Second)
			close(stop)
			wg.Wait()

			check := ledgerOn(t, srv.Addr, Options{})
			lost := log.lost(t, check, workers)
			acks, calls, _ := log.counts()
			t.Logf("%d calls, %d acknowledged; after kill -9 and restart %d acknowledged changes are missing: %s", calls, acks, len(lost), summary(lost))
			switch {
			case tc.wantLoss && len(lost) == 0:
				t.Errorf("no acknowledged change lost without durability: the check cannot tell a loss")
			case !tc.wantLoss && len(lost) > 0:
				t.Errorf("%d acknowledged changes lost: %s", len(lost), summary(lost))
			}
			if !tc.wantLoss {
				snapshot(t, check, loadHost)
			}
		})
	}
}

// TestAcknowledgedChangesSurviveFailover runs the load against a master
// with one replica, kills the master with SIGKILL and promotes the
// replica (REPLICAOF NO ONE), then looks on the replica for every change
// a call acknowledged. With WAIT 1 none is missing, also when the replica
// was cut off before the failover (the calls after that fail with
// ErrNotDurable instead). Without WAIT the changes the master
// acknowledged after the cut are lost.
func TestAcknowledgedChangesSurviveFailover(t *testing.T) {
	const workers = 8
	for _, tc := range []struct {
		name     string
		replicas int
		cut      bool
		wantLoss bool
	}{
		{"WAIT 1, master killed", 1, false, false},
		{"WAIT 1, replica cut off, then master killed", 1, true, false},
		{"no WAIT, replica cut off, then master killed", 0, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testenv.StartRedis(t, testenv.RedisConfigLines("repl-diskless-sync-delay 0"))
			r := testenv.StartRedis(t)
			replicate(t, r, m)
			l := loadLedger(t, m.Addr, Durability{Replicas: tc.replicas, Timeout: 200 * time.Millisecond})
			// The set-up must not fail on a busy machine: it waits longer.
			setUpLoad(t, loadLedger(t, m.Addr, Durability{Replicas: tc.replicas, Timeout: 5 * time.Second}), workers)
			caughtUp(t, r, m)
			log := newAckLog()
			stop := make(chan struct{})
			wg := startLoad(t, l, workers, log, stop)
			waitForCalls(log, 300, true, 20*time.Second)
			if tc.cut {
				cutOff(t, r)
				waitForCalls(log, 40, false, 20*time.Second)
			}
			killServer(t, m)
			close(stop)
			wg.Wait()
			promote(t, r)

			check := ledgerOn(t, r.Addr, Options{})
			lost := log.lost(t, check, workers)
			acks, calls, notDurable := log.counts()
			t.Logf("%d calls, %d acknowledged, %d not durable; after the failover %d acknowledged changes are missing: %s",
				calls, acks, notDurable, len(lost), summary(lost))
			switch {
			case tc.wantLoss && len(lost) == 0:
				t.Errorf("no acknowledged change lost without WAIT: the check cannot tell a loss")
			case !tc.wantLoss && len(lost) > 0:
				t.Errorf("%d acknowledged changes lost: %s", len(lost), summary(lost))
			}
			if tc.replicas > 0 && tc.cut && notDurable == 0 {
				t.Errorf("no call failed with ErrNotDurable after the replica was cut off")
			}
			if !tc.wantLoss {
				snapshot(t, check, loadHost)
			}
		})
	}
}

// TestRetryWaitsForTheFirstTry: a change made on one connection whose
// wait timed out (the replica is stalled) and retried on another, which
// finds it made already. From Redis 7.2 a wait counts its connection's
// writes only, so each retry writes to count from, or it would
// acknowledge a change the replica does not have (on 7.0 any command of
// the connection moves the point the wait counts to): every retry fails
// with ErrNotDurable while the replica stalls, and succeeds once it has
// caught up.
//
// It runs on the installed redis-server and on a server with Redis 7.2's
// semantics (testenv.WithWAITAOF), so both ways of counting are tried.
func TestRetryWaitsForTheFirstTry(t *testing.T) {
	for _, sv := range []struct {
		name string
		opt  testenv.RedisOption
	}{
		{"installed redis-server", testenv.RedisConfigLines()},
		{"a server with WAITAOF", testenv.WithWAITAOF()},
	} {
		t.Run(sv.name, func(t *testing.T) { retryWaitsForTheFirstTry(t, sv.opt) })
	}
}

func retryWaitsForTheFirstTry(t *testing.T, server testenv.RedisOption) {
	ctx := context.Background()
	m := testenv.StartRedis(t, server, testenv.RedisConfigLines("repl-diskless-sync-delay 0"))
	r := testenv.StartRedis(t, server, debuggable)
	replicate(t, r, m)
	// The calls under test time out in 100ms so that all of them fit in
	// the replica's sleep; the setup, and the retries once it is awake,
	// wait as long as a loaded machine needs.
	d := Options{Durability: Durability{Replicas: 1, Timeout: 100 * time.Millisecond}}
	first, retry, cold := ledgerOn(t, m.Addr, d), ledgerOn(t, m.Addr, d), ledgerOn(t, m.Addr, d)
	setup := ledgerOn(t, m.Addr, Options{Durability: Durability{Replicas: 1, Timeout: 10 * time.Second}})
	register(t, setup, "h", testHost(1, 8))
	req := dedicated(t, 1, 64)
	for _, id := range []string{"held", "gone"} {
		if _, err := setup.Claim(ctx, spec(id, "h", req)); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range []string{"u1", "u3", "inst-held", "u4", "u5", "u6"} {
		if _, err := setup.CreateInstance(ctx, u, "vm", flavor, guest.VMBuilding, ""); err != nil {
			t.Fatal(err)
		}
	}
	// Claims for the state changes: one to hold, one to unhold, one to
	// move u4 to, one u5 is attached to with resize info to clear, one to
	// move u6 to with the XML staged for it; and a host to fence with a
	// claim to make a tombstone of.
	register(t, setup, "f", testHost(1, 8))
	for _, c := range []struct{ id, host, uuid string }{
		{"to-hold", "h", "inst-to-hold"}, {"to-unhold", "h", "inst-to-unhold"}, {"mv", "h", "u4"}, {"rs", "h", "u5"}, {"sx", "h", "u6"}, {"dead", "f", "inst-dead"},
	} {
		s := spec(c.id, c.host, req)
		s.InstanceUUID = c.uuid
		if _, err := setup.Claim(ctx, s); err != nil {
			t.Fatal(err)
		}
		if _, err := setup.Commit(ctx, c.host, c.id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := setup.Hold(ctx, "h", "to-unhold"); err != nil {
		t.Fatal(err)
	}
	rec := &ResizeRecord{SourceHost: "h", SourceClaimID: "to-unhold", OldFlavor: flavor}
	if err := setup.MoveInstance(ctx, "u5", Move{Host: "h", ClaimID: "rs", Resize: rec}); err != nil {
		t.Fatal(err)
	}
	if err := setup.StageDomainXML(ctx, "u6", "sx", "<staged/>"); err != nil {
		t.Fatal(err)
	}
	// A host to disable, and one disabled to enable.
	register(t, setup, "m", testHost(1, 2))
	register(t, setup, "e", testHost(1, 2))
	if _, err := setup.SetHostDisabled(ctx, "e", "maintenance"); err != nil {
		t.Fatal(err)
	}
	// Each call below waits up to 0.2s (Redis times waits out on its
	// 100ms clock), twice for a script the server has not seen yet: the
	// replica sleeps long enough for all of them.
	// retry's cache fits the claim without reading, so its retry reaches
	// the claim script; cold has no cache and finds the claim by reading.
	for _, l := range []*Ledger{first, retry} {
		if _, err := l.Host(ctx, "h"); err != nil {
			t.Fatal(err)
		}
	}
	caughtUp(t, r, m)

	stalled := stall(t, r, 14*time.Second)
	steps := []struct {
		name string
		do   func(l *Ledger) error
	}{
		{"Claim", func(l *Ledger) error { _, err := l.Claim(ctx, spec("new", "h", req)); return err }},
		{"Release", func(l *Ledger) error { return l.Release(ctx, "h", "gone") }},
		{"Commit", func(l *Ledger) error { _, err := l.Commit(ctx, "h", "held"); return err }},
		{"AttachInstance", func(l *Ledger) error { return l.AttachInstance(ctx, "inst-held", "h", "held", "") }},
		{"SetState", func(l *Ledger) error { return l.SetState(ctx, "u1", Transition{VM: guest.VMActive}) }},
		{"CreateInstance", func(l *Ledger) error {
			_, err := l.CreateInstance(ctx, "u2", "vm", flavor, guest.VMBuilding, "")
			return err
		}},
		{"DeleteInstance", func(l *Ledger) error { return l.DeleteInstance(ctx, "u3") }},
		{"RegisterHost", func(l *Ledger) error { _, err := l.RegisterHost(ctx, "h2", testHost(1, 2)); return err }},
		{"Hold", func(l *Ledger) error { _, err := l.Hold(ctx, "h", "to-hold"); return err }},
		{"Unhold", func(l *Ledger) error { _, err := l.Unhold(ctx, "h", "to-unhold"); return err }},
		{"MoveInstance", func(l *Ledger) error {
			return l.MoveInstance(ctx, "u4", Move{Host: "h", ClaimID: "mv", Flavor: &flavor, Resize: rec})
		}},
		{"ClearResize", func(l *Ledger) error { return l.ClearResize(ctx, "u5") }},
		{"StageDomainXML", func(l *Ledger) error { return l.StageDomainXML(ctx, "u1", "st", "<u1/>") }},
		{"MoveInstance taking the staged XML", func(l *Ledger) error {
			return l.MoveInstance(ctx, "u6", Move{Host: "h", ClaimID: "sx", StagedXML: true})
		}},
		{"SetHostUp of a host never marked", func(l *Ledger) error { _, err := l.SetHostUp(ctx, "h"); return err }},
		{"SetHostDown", func(l *Ledger) error { _, err := l.SetHostDown(ctx, "f", "fenced"); return err }},
		{"Tombstone", func(l *Ledger) error { _, err := l.Tombstone(ctx, "f", "dead"); return err }},
		{"SetHostReturning", func(l *Ledger) error { _, err := l.SetHostReturning(ctx, "f"); return err }},
		{"SetHostDisabled", func(l *Ledger) error { _, err := l.SetHostDisabled(ctx, "m", "maintenance"); return err }},
		{"SetHostEnabled", func(l *Ledger) error { _, err := l.SetHostEnabled(ctx, "e"); return err }},
	}
	for _, s := range steps {
		for _, try := range []struct {
			who string
			l   *Ledger
		}{{"first try", first}, {"retry on another connection", retry}} {
			if err := s.do(try.l); !errors.Is(err, ErrNotDurable) {
				t.Errorf("%s, %s, with the replica asleep = %v, want ErrNotDurable", s.name, try.who, err)
			}
		}
	}
	if _, err := cold.Claim(ctx, spec("new", "h", req)); !errors.Is(err, ErrNotDurable) {
		t.Errorf("Claim retried by a ledger that reads the claim made = %v, want ErrNotDurable", err)
	}
	if err := <-stalled; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	for _, s := range steps {
		if err := s.do(setup); err != nil {
			t.Errorf("%s retried once the replica is awake: %v", s.name, err)
		}
	}
	caughtUp(t, r, m)
	promote(t, r)
	promoted := ledgerOn(t, r.Addr, Options{})
	states := map[string]ClaimState{}
	for _, h := range []string{"h", "f"} {
		for _, c := range snapshot(t, promoted, h).Claims {
			states[c.ID] = c.State
		}
	}
	want := map[string]ClaimState{"held": StateCommitted, "new": StatePending, "to-hold": StateHeld, "to-unhold": StateCommitted,
		"mv": StateCommitted, "rs": StateCommitted, "sx": StateCommitted, "dead": StateTombstone}
	if diff := cmp.Diff(want, states); diff != "" {
		t.Errorf("claim states on the replica (-want +got):\n%s", diff)
	}
	if st, err := promoted.HostStatus(ctx, "f"); err != nil || st.State != HostReturning {
		t.Errorf("HostStatus(f) on the replica = %+v, %v; want returning", st, err)
	}
	for h, want := range map[string]HostState{"m": HostDisabled, "e": HostUp} {
		if st, err := promoted.HostStatus(ctx, h); err != nil || st.State != want {
			t.Errorf("HostStatus(%s) on the replica = %+v, %v; want %s", h, st, err, want)
		}
	}
	if xml, err := promoted.StagedDomainXML(ctx, "u1", "st"); err != nil || xml != "<u1/>" {
		t.Errorf("u1's staged XML on the replica = %q, %v; want <u1/>", xml, err)
	}
	if in, err := promoted.Instance(ctx, "u6"); err != nil || in.DomainXML != "<staged/>" || in.ClaimID != "sx" {
		t.Errorf("u6 on the replica = %+v, %v; want attached to sx with the staged XML", in, err)
	}
	for _, u := range []string{"u4", "u5"} {
		in, err := promoted.Instance(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		if wantResize := u == "u4"; (in.Resize != nil) != wantResize {
			t.Errorf("instance %s on the replica has resize info %+v, want some: %v", u, in.Resize, wantResize)
		}
	}
}

// TestOpenChecksDurability: Open refuses, with one line that says what to
// change, a durability the server cannot give, and bad values.
func TestOpenChecksDurability(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	noAOF := testenv.StartRedis(t, testenv.WithWAITAOF())
	local := "appendonly yes"
	if !hasWAITAOF(t, srv.Addr) {
		local = "has no WAITAOF (Redis 7.2 and later)"
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"replicas the master lacks", Config{URL: srv.URL(), WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond}, "REDIS_WAIT_REPLICAS=1, but only 0 replicas acknowledged"},
		{"local fsync", Config{URL: srv.URL(), WaitLocal: true}, local},
		{"local fsync without an append-only file", Config{URL: noAOF.URL(), WaitLocal: true}, "appendonly yes"},
		{"negative replicas", Config{URL: srv.URL(), WaitReplicas: -1}, "wait replicas -1: invalid input"},
		{"negative timeout", Config{URL: srv.URL(), WaitReplicas: 1, WaitTimeout: -time.Second}, "wait timeout -1s: invalid input"},
		{"sub-millisecond timeout", Config{URL: srv.URL(), WaitReplicas: 1, WaitTimeout: time.Microsecond}, "wait timeout 1µs: invalid input"},
	} {
		l, rdb, err := Open(ctx, tc.cfg)
		if err == nil {
			_ = rdb.Close()
			t.Errorf("Open with %s = ledger %p, want an error naming %q", tc.name, l, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Open with %s: error %q, want one line naming %q", tc.name, err, tc.want)
		}
	}
	if l, rdb, err := Open(ctx, Config{URL: srv.URL()}); err != nil {
		t.Errorf("Open without waits: %v", err)
	} else {
		_ = rdb.Close()
		_ = l
	}
	aof := testenv.StartRedis(t, testenv.WithWAITAOF(), testenv.AppendOnly())
	if _, rdb, err := Open(ctx, Config{URL: aof.URL(), WaitLocal: true}); err != nil {
		t.Errorf("Open with WAITAOF on a server with it and an append-only file: %v", err)
	} else {
		_ = rdb.Close()
	}
}

// startReplicatedCluster starts a Redis Cluster of three masters with one
// replica each (testenv's clusters have no replicas) and returns the
// masters' addresses and each master's replica by master address.
func startReplicatedCluster(t *testing.T) (masters []string, replicaOf map[string]*testenv.Redis) {
	masters, replicaOf, _ = startReplicatedClusterNodes(t)
	return masters, replicaOf
}

// startReplicatedClusterNodes is startReplicatedCluster that also returns
// every node by address, for a test that kills one.
func startReplicatedClusterNodes(t *testing.T) (masters []string, replicaOf, nodeAt map[string]*testenv.Redis) {
	t.Helper()
	cli := testenv.RequireProgram(t, testenv.RedisCLIBin)
	var nodes []*testenv.Redis
	for range 6 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		bus := l.Addr().(*net.TCPAddr).Port
		l.Close()
		nodes = append(nodes, testenv.StartRedis(t, testenv.RedisConfigLines("cluster-enabled yes", "cluster-port "+strconv.Itoa(bus),
			"cluster-config-file nodes.conf", "cluster-node-timeout 5000", "repl-diskless-sync-delay 0"), debuggable))
	}
	args := []string{"--cluster", "create"}
	for _, n := range nodes {
		args = append(args, n.Addr)
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	replicaOf, nodeAt = map[string]*testenv.Redis{}, map[string]*testenv.Redis{}
	for _, n := range nodes {
		nodeAt[n.Addr] = n
		c := client(t, n.Addr)
		waitUntil(t, 30*time.Second, "cluster node "+n.Addr+" ok", func() bool {
			s, err := c.ClusterInfo(context.Background()).Result()
			return err == nil && strings.Contains(s, "cluster_state:ok")
		})
		if info(t, c, "replication", "role") == "master" {
			masters = append(masters, n.Addr)
			continue
		}
		waitUntil(t, 30*time.Second, "replica "+n.Addr+" linked", func() bool {
			return info(t, c, "replication", "master_link_status") == "up"
		})
		replicaOf["127.0.0.1:"+info(t, c, "replication", "master_port")] = n
	}
	if len(masters) != 3 || len(replicaOf) != 3 {
		t.Fatalf("cluster of %d masters and %d replicas, want 3 and 3", len(masters), len(replicaOf))
	}
	return masters, replicaOf, nodeAt
}

// TestAcknowledgedChangesSurviveClusterFailover runs the load against a
// Redis Cluster of three masters with a replica each, cuts the replica of
// the master that holds the load's host off for a moment, kills that
// master with SIGKILL and lets the cluster promote the replica by itself.
// With WAIT 1 no acknowledged change is missing afterwards: the changes
// made while the replica was cut off failed with ErrNotDurable instead. Without WAIT the
// master acknowledged them and the failover loses them, so the check can
// fail.
func TestAcknowledgedChangesSurviveClusterFailover(t *testing.T) {
	const workers = 8
	for _, tc := range []struct {
		name     string
		replicas int
		wantLoss bool
	}{
		{"WAIT 1", 1, false},
		{"no WAIT", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			masters, replicaOf, nodeAt := startReplicatedClusterNodes(t)
			clusterLedger := func(d Durability) *Ledger {
				rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: masters, PoolSize: 64, MaxRetries: 1, DialerRetries: 1})
				t.Cleanup(func() { _ = rdb.Close() })
				l, err := New(rdb, Options{Durability: d})
				if err != nil {
					t.Fatal(err)
				}
				return l
			}
			l := clusterLedger(Durability{Replicas: tc.replicas, Timeout: 200 * time.Millisecond})
			setUpLoad(t, clusterLedger(Durability{Replicas: tc.replicas, Timeout: 5 * time.Second}), workers)
			cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: masters})
			t.Cleanup(func() { _ = cc.Close() })
			node, err := cc.MasterForKey(ctx, l.hostKeys(loadHost).topo)
			if err != nil {
				t.Fatal(err)
			}
			m := nodeAt[node.Options().Addr]
			r := replicaOf[m.Addr]
			caughtUp(t, r, m)

			log := newAckLog()
			stop := make(chan struct{})
			wg := startLoad(t, l, workers, log, stop)
			waitForCalls(log, 300, true, 20*time.Second)
			// The replica is stopped (SIGSTOP) and the master drops its
			// link, so the replica cannot make it again: the master
			// acknowledges what the replica never receives (or, with
			// WAIT, refuses to). Then the master dies and the replica
			// goes on.
			replicaPID := pidOf(t, r)
			if err := syscall.Kill(replicaPID, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			if err := client(t, m.Addr).Do(ctx, "client", "kill", "type", "replica").Err(); err != nil {
				t.Fatalf("CLIENT KILL TYPE replica on %s: %v", m.Addr, err)
			}
			waitForCalls(log, 40, false, 2*time.Second)
			killServer(t, m)
			if err := syscall.Kill(replicaPID, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, 60*time.Second, "the cluster promotes "+r.Addr, func() bool {
				return info(t, client(t, r.Addr), "replication", "role") == "master"
			})
			// The load goes on against the promoted replica.
			waitForCalls(log, 50, true, 20*time.Second)
			close(stop)
			wg.Wait()

			check := clusterLedger(Durability{})
			lost := log.lost(t, check, workers)
			acks, calls, notDurable := log.counts()
			t.Logf("%d calls, %d acknowledged, %d not durable; after the cluster's failover %d acknowledged changes are missing: %s",
				calls, acks, notDurable, len(lost), summary(lost))
			switch {
			case tc.wantLoss && len(lost) == 0:
				t.Errorf("no acknowledged change lost without WAIT: the check cannot tell a loss")
			case !tc.wantLoss && len(lost) > 0:
				t.Errorf("%d acknowledged changes lost: %s", len(lost), summary(lost))
			}
			if tc.replicas > 0 && notDurable == 0 {
				t.Errorf("no call failed with ErrNotDurable while the replica was cut off")
			}
			if !tc.wantLoss {
				snapshot(t, check, loadHost)
			}
		})
	}
}

// TestClusterWaitsOnTheSlotsMaster runs WAIT 1 on a cluster of three
// masters with a replica each: every change waits on its own slot's
// master, in the pipeline that carried it. With one master's replica
// stalled, claims on that master's host fail with ErrNotDurable while
// claims on the others, sent at the same time (and batched together),
// succeed.
func TestClusterWaitsOnTheSlotsMaster(t *testing.T) {
	ctx := context.Background()
	masters, replicaOf := startReplicatedCluster(t)
	l, rdb, err := Open(ctx, Config{Addrs: masters, KeyPrefix: "pf", WaitReplicas: 1, WaitTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("Open(cluster, WAIT 1): %v", err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	cc := rdb.(*redis.ClusterClient)
	masterOf, seen := map[string]string{}, map[string]bool{}
	var hosts []string
	for i := 0; len(hosts) < 3 && i < 200; i++ {
		h := fmt.Sprintf("host-%d", i)
		node, err := cc.MasterForKey(ctx, l.hostKeys(h).topo)
		if err != nil {
			t.Fatal(err)
		}
		if addr := node.Options().Addr; !seen[addr] {
			seen[addr] = true
			masterOf[h] = addr
			hosts = append(hosts, h)
		}
	}
	if len(hosts) != 3 {
		t.Fatalf("found hosts on %d masters, want 3", len(hosts))
	}
	for _, h := range hosts {
		// Replicas just synced acknowledge a moment later: ErrNotDurable
		// says to retry.
		waitUntil(t, 15*time.Second, "RegisterHost("+h+") acknowledged by the replica", func() bool {
			_, err := l.RegisterHost(ctx, h, testHost(1, 16))
			if err != nil && !errors.Is(err, ErrNotDurable) {
				t.Fatalf("RegisterHost(%s): %v", h, err)
			}
			return err == nil
		})
	}
	// claimAll claims on every host at once, n each, and returns each
	// host's errors.
	claimAll := func(round string, n int) map[string][]error {
		var mu sync.Mutex
		errs := map[string][]error{}
		var wg sync.WaitGroup
		for _, h := range hosts {
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := spec(fmt.Sprintf("%s-%s-%d", round, h, i), h, dedicated(t, 1, 64))
					_, err := l.Claim(ctx, s)
					mu.Lock()
					errs[h] = append(errs[h], err)
					mu.Unlock()
				}()
			}
		}
		wg.Wait()
		return errs
	}
	for h, errs := range claimAll("a", 4) {
		for _, err := range errs {
			if err != nil {
				t.Errorf("Claim on %s with every replica up: %v", h, err)
			}
		}
	}
	done := stall(t, replicaOf[masterOf[hosts[0]]], 2*time.Second)
	for h, errs := range claimAll("b", 4) {
		for _, err := range errs {
			switch {
			case h == hosts[0] && !errors.Is(err, ErrNotDurable):
				t.Errorf("Claim on %s, whose master's replica is asleep: %v, want ErrNotDurable", h, err)
			case h != hosts[0] && err != nil:
				t.Errorf("Claim on %s, whose master's replica is up: %v", h, err)
			}
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		id := fmt.Sprintf("b-%s-%d", hosts[0], i)
		if _, err := l.Claim(ctx, spec(id, hosts[0], dedicated(t, 1, 64))); err != nil {
			t.Errorf("Claim(%s) retried once the replica is awake: %v", id, err)
		}
	}
	for _, h := range hosts {
		if s := snapshot(t, l, h); len(s.Claims) != 8 {
			t.Errorf("Snapshot(%s): %d claims, want 8", h, len(s.Claims))
		}
	}
}

// TestConfigReadTimeoutFitsWaits: a config that waits for durability
// reads replies long enough for a change and both its waits.
func TestConfigReadTimeoutFitsWaits(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want time.Duration
	}{
		{Config{}, 0}, // go-redis's default
		{Config{WaitReplicas: 1, WaitTimeout: 2 * time.Second}, defaultReadTimeout + 4*time.Second},
		{Config{WaitLocal: true}, defaultReadTimeout + 2*DefaultWaitTimeout},
	} {
		opts, err := tc.cfg.options()
		if err != nil {
			t.Fatal(err)
		}
		if opts.ReadTimeout != tc.want {
			t.Errorf("options() of %+v: read timeout %s, want %s", tc.cfg.durability(), opts.ReadTimeout, tc.want)
		}
	}
}

// TestOpenRefusesEviction: Open refuses, with one line naming the server,
// its policy and noeviction, a server that may evict keys, and on a
// cluster every master is asked; the volatile policies, which evict only
// keys with a TTL, are kept.
func TestOpenRefusesEviction(t *testing.T) {
	ctx := context.Background()
	refuse := func(what string, cfg Config, addr, policy string) {
		t.Helper()
		l, rdb, err := Open(ctx, cfg)
		if err == nil {
			_ = rdb.Close()
			t.Errorf("Open on %s = ledger %p, want an error", what, l)
			return
		}
		for _, want := range []string{addr, policy, "noeviction"} {
			if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Open on %s: error %q, want one line naming %q", what, err, want)
			}
		}
	}
	lru := testenv.StartRedis(t, testenv.RedisConfigLines("maxmemory-policy allkeys-lru"))
	refuse("a server with allkeys-lru", Config{URL: lru.URL()}, lru.Addr, "allkeys-lru")
	volatile := testenv.StartRedis(t, testenv.RedisConfigLines("maxmemory-policy volatile-lru"))
	if _, rdb, err := Open(ctx, Config{URL: volatile.URL()}); err != nil {
		t.Errorf("Open on a server with volatile-lru: %v", err)
	} else {
		_ = rdb.Close()
	}
	cluster := testenv.StartRedisCluster(t, 3)
	last := cluster.Nodes[len(cluster.Nodes)-1].Addr
	if err := client(t, last).ConfigSet(ctx, "maxmemory-policy", "allkeys-random").Err(); err != nil {
		t.Fatal(err)
	}
	refuse("a cluster with one master on allkeys-random", Config{Addrs: cluster.Addrs()}, last, "allkeys-random")
}
