package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pinflow/pinflow/numa"
)

// claimIn registers host and makes claim id there in state from ("" makes
// none), then leaves the host in hostState. A tombstone needs its host
// down, so it is made with the host down, which then only returns.
func claimIn(t *testing.T, l *Ledger, host, id string, from ClaimState, hostState HostState) {
	t.Helper()
	ctx := context.Background()
	register(t, l, host, testHost(2, 8))
	step := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s on %s: %v", what, host, err)
		}
	}
	if from != "" {
		_, err := l.Claim(ctx, spec(id, host, dedicated(t, 2, 512)))
		step("Claim("+id+")", err)
	}
	if from == StateCommitted || from == StateHeld || from == StateTombstone {
		_, err := l.Commit(ctx, host, id)
		step("Commit("+id+")", err)
	}
	if from == StateHeld {
		_, err := l.Hold(ctx, host, id)
		step("Hold("+id+")", err)
	}
	if from == StateTombstone || hostState != HostUp {
		_, err := l.SetHostDown(ctx, host, "test fencing")
		step("SetHostDown", err)
	}
	if from == StateTombstone {
		_, err := l.Tombstone(ctx, host, id)
		step("Tombstone("+id+")", err)
	}
	if hostState == HostReturning {
		_, err := l.SetHostReturning(ctx, host)
		step("SetHostReturning", err)
	}
}

// withoutStates is a snapshot as pins and usage see it: claim states and
// commit times left out, which are all a state change may change.
func withoutStates(s *Snapshot) *Snapshot {
	c := *s
	c.Pins = append([]Pin(nil), s.Pins...)
	for i := range c.Pins {
		c.Pins[i].State = ""
	}
	c.Claims = append([]Claim(nil), s.Claims...)
	for i := range c.Claims {
		c.Claims[i].State, c.Claims[i].CommittedAt = "", nil
	}
	return &c
}

func TestClaimStateChanges(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	ops := map[string]func(host, id string) (*Claim, error){
		"Commit":    func(h, id string) (*Claim, error) { return l.Commit(ctx, h, id) },
		"Hold":      func(h, id string) (*Claim, error) { return l.Hold(ctx, h, id) },
		"Unhold":    func(h, id string) (*Claim, error) { return l.Unhold(ctx, h, id) },
		"Tombstone": func(h, id string) (*Claim, error) { return l.Tombstone(ctx, h, id) },
	}
	const unknown ClaimState = ""
	for i, tc := range []struct {
		op      string
		from    ClaimState // unknown: no such claim
		host    HostState
		want    ClaimState
		wantErr error
		// in is text a refusal must hold.
		in string
	}{
		{"Commit", StatePending, HostUp, StateCommitted, nil, ""},
		{"Commit", StateCommitted, HostUp, StateCommitted, nil, ""},
		{"Commit", StatePending, HostDown, StateCommitted, nil, ""},
		{"Commit", StateHeld, HostUp, "", ErrConflict, "the claim is held; only a claim that is pending can become committed"},
		{"Commit", StateTombstone, HostDown, "", ErrConflict, "the claim is tombstone"},
		{"Commit", unknown, HostUp, "", ErrUnknownClaim, `has no claim "c"`},

		{"Hold", StateCommitted, HostUp, StateHeld, nil, ""},
		{"Hold", StateHeld, HostUp, StateHeld, nil, ""},
		{"Hold", StateCommitted, HostDown, StateHeld, nil, ""},
		{"Hold", StatePending, HostUp, "", ErrConflict, "the claim is pending; only a claim that is committed can become held"},
		{"Hold", StateTombstone, HostDown, "", ErrConflict, "the claim is tombstone"},
		{"Hold", unknown, HostUp, "", ErrUnknownClaim, `has no claim "c"`},

		{"Unhold", StateHeld, HostUp, StateCommitted, nil, ""},
		{"Unhold", StateCommitted, HostUp, StateCommitted, nil, ""},
		{"Unhold", StateHeld, HostReturning, StateCommitted, nil, ""},
		{"Unhold", StatePending, HostUp, "", ErrConflict, "only a claim that is held can become committed"},
		{"Unhold", StateTombstone, HostDown, "", ErrConflict, "the claim is tombstone"},
		{"Unhold", unknown, HostUp, "", ErrUnknownClaim, `has no claim "c"`},

		{"Tombstone", StateCommitted, HostDown, StateTombstone, nil, ""},
		{"Tombstone", StateHeld, HostDown, StateTombstone, nil, ""},
		{"Tombstone", StateTombstone, HostDown, StateTombstone, nil, ""},
		{"Tombstone", StateTombstone, HostReturning, StateTombstone, nil, ""},
		{"Tombstone", StateCommitted, HostUp, "", ErrConflict, "host h-tombstone-"},
		{"Tombstone", StateHeld, HostReturning, "", ErrConflict, "is returning; only a claim on a host that is down becomes a tombstone"},
		{"Tombstone", StatePending, HostDown, "", ErrConflict, "only a claim that is committed or held can become tombstone"},
		{"Tombstone", unknown, HostDown, "", ErrUnknownClaim, `has no claim "c"`},
	} {
		host := fmt.Sprintf("h-%s-%d", strings.ToLower(tc.op), i)
		name := fmt.Sprintf("%s(claim %q on a host %s)", tc.op, tc.from, tc.host)
		claimIn(t, l, host, "c", tc.from, tc.host)
		before := snapshot(t, l, host)
		got, err := ops[tc.op](host, "c")
		after := snapshot(t, l, host)
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) || !strings.Contains(fmt.Sprint(err), tc.in) {
				t.Errorf("%s error = %v, want %v saying %q", name, err, tc.wantErr, tc.in)
			}
			if diff := diffSnapshots(before, after); diff != "" {
				t.Errorf("%s refused changed the ledger (-before +after):\n%s", name, diff)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got.State != tc.want {
			t.Errorf("%s = state %q, want %q", name, got.State, tc.want)
		}
		stored, err := l.GetClaim(ctx, host, "c")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(stored, got, snapOpts...); diff != "" {
			t.Errorf("%s returned another claim than it stored (-stored +returned):\n%s", name, diff)
		}
		// Only the state moves; the commit time stays the first commit's.
		if tc.from != StatePending {
			if bc := before.Claims[0].CommittedAt; bc == nil || got.CommittedAt == nil || !bc.Equal(*got.CommittedAt) {
				t.Errorf("%s committed_at = %v, want the first commit's %v", name, got.CommittedAt, bc)
			}
		} else if got.CommittedAt == nil {
			t.Errorf("%s of a pending claim has no committed_at", name)
		}
		if diff := diffSnapshots(withoutStates(before), withoutStates(after)); diff != "" {
			t.Errorf("%s changed more than the claim's state (-before +after):\n%s", name, diff)
		}
		for _, p := range after.Pins {
			if p.State != tc.want {
				t.Errorf("%s: Snapshot pin %d state %q, want %q", name, p.CPU, p.State, tc.want)
			}
		}
		// A retry finds the change made and changes nothing more.
		again, err := ops[tc.op](host, "c")
		if err != nil || again.State != tc.want {
			t.Errorf("%s retried = %v, %v; want state %q", name, again, err, tc.want)
		}
		if diff := diffSnapshots(after, snapshot(t, l, host)); diff != "" {
			t.Errorf("%s retried changed the ledger (-first +retry):\n%s", name, diff)
		}
	}
	for _, tc := range []struct{ name, host, id string }{
		{"bad host name", "h{1}", "c"},
		{"empty claim id", "h-commit-0", ""},
	} {
		for op, do := range ops {
			if _, err := do(tc.host, tc.id); !errors.Is(err, ErrInvalid) {
				t.Errorf("%s(%s) error = %v, want ErrInvalid", op, tc.name, err)
			}
		}
	}
}

// TestHoldKeepsPCPUs: a source hold keeps the claim's pCPUs owned from the
// hold to the unhold, with no instant in between at which another claim
// could take them, neither through the cache nor through the script.
func TestHoldKeepsPCPUs(t *testing.T) {
	ctx := context.Background()
	l, rdb, srv := newLedger(t)
	// One cell of four pCPUs, all of them the held claim's.
	register(t, l, "h1", testHost(1, 4))
	c, err := l.Claim(ctx, spec("src", "h1", dedicated(t, 4, 1024)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Commit(ctx, "h1", "src"); err != nil {
		t.Fatal(err)
	}
	start := snapshot(t, l, "h1")

	// Another process races for the pCPUs all through the holds: any
	// request at all, and the exact placement.
	other := secondLedger(t, srv.Addr)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var won []string
	tries := 0
	small := dedicated(t, 1, 64)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				s := spec(fmt.Sprintf("w%d-%d", w, i), "h1", small)
				if w%2 == 1 {
					s.Request, s.Placement = nil, c.Placement
				}
				got, err := other.Claim(ctx, s)
				mu.Lock()
				tries++
				if err == nil {
					won = append(won, fmt.Sprintf("%s pinned %s", got.ID, got.Usage[0].PinnedCPUs))
				}
				mu.Unlock()
			}
		}()
	}
	for i := range 40 {
		if _, err := l.Hold(ctx, "h1", "src"); err != nil {
			t.Fatalf("Hold #%d: %v", i, err)
		}
		if i == 0 {
			// The script itself refuses the pCPUs to a claim that thinks
			// them free (a stale view), whatever the caller's cache says.
			h := testHost(1, 4)
			x := &Claim{State: StatePending, ID: "stale", Host: "h1", InstanceUUID: "inst-stale", Kind: KindBoot, Generation: 1, Token: "t"}
			if x.Placement, err = numa.Fit(h, dedicated(t, 2, 64)); err != nil {
				t.Fatal(err)
			}
			if x.Usage, err = numa.Usage(h, x.Placement); err != nil {
				t.Fatal(err)
			}
			args, err := claimArgs(h, x)
			if err != nil {
				t.Fatal(err)
			}
			res, err := claimOne(ctx, rdb, l.hostKeys("h1"), args)
			if err != nil || len(res) != 6 || res[0] != "taken" || res[5] != "src" {
				t.Errorf("claim script claiming a held claim's pCPUs = %q, %v; want taken by src", res, err)
			}
		}
		if _, err := l.Unhold(ctx, "h1", "src"); err != nil {
			t.Fatalf("Unhold #%d: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
	if len(won) > 0 {
		t.Errorf("claims won pCPUs of a claim held and unheld meanwhile: %v", won)
	}
	if tries == 0 {
		t.Errorf("no claim raced the holds: the test proved nothing")
	}
	t.Logf("%d claims raced 40 holds and unholds", tries)
	end := snapshot(t, l, "h1")
	if diff := diffSnapshots(start, end); diff != "" {
		t.Errorf("40 holds and unholds changed the ledger (-before +after):\n%s", diff)
	}
}

// TestReleasesOfHoldsAndTombstones: the audit may free a hold no
// operation keeps, never a tombstone; a plain release frees either.
func TestReleasesOfHoldsAndTombstones(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	claimIn(t, l, "h1", "held", StateHeld, HostUp)
	held, err := l.GetClaim(ctx, "h1", "held")
	if err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, l, "h1")
	for _, state := range []ClaimState{StatePending, StateCommitted} {
		if ok, err := l.ReleaseIfUnchanged(ctx, "h1", "held", held.Token, state); err != nil || ok {
			t.Errorf("ReleaseIfUnchanged(held claim, %s) = %v, %v; want false, nil", state, ok, err)
		}
	}
	if ok, err := l.ReleasePending(ctx, "h1", "held"); err != nil || ok {
		t.Errorf("ReleasePending(held claim) = %v, %v; want false, nil", ok, err)
	}
	if diff := diffSnapshots(before, snapshot(t, l, "h1")); diff != "" {
		t.Errorf("refused releases of a held claim changed the ledger (-before +after):\n%s", diff)
	}
	if ok, err := l.ReleaseIfUnchanged(ctx, "h1", "held", held.Token, StateHeld); err != nil || !ok {
		t.Errorf("ReleaseIfUnchanged(held claim, held) = %v, %v; want true, nil", ok, err)
	}

	claimIn(t, l, "h2", "dead", StateTombstone, HostDown)
	dead, err := l.GetClaim(ctx, "h2", "dead")
	if err != nil {
		t.Fatal(err)
	}
	before = snapshot(t, l, "h2")
	if _, err := l.ReleaseIfUnchanged(ctx, "h2", "dead", dead.Token, StateTombstone); !errors.Is(err, ErrInvalid) {
		t.Errorf("ReleaseIfUnchanged(tombstone, tombstone) error = %v, want ErrInvalid", err)
	}
	if ok, err := l.ReleasePending(ctx, "h2", "dead"); err != nil || ok {
		t.Errorf("ReleasePending(tombstone) = %v, %v; want false, nil", ok, err)
	}
	if diff := diffSnapshots(before, snapshot(t, l, "h2")); diff != "" {
		t.Errorf("refused releases of a tombstone changed the ledger (-before +after):\n%s", diff)
	}
	// On the host that is still down: releases work there.
	if err := l.Release(ctx, "h2", "dead"); err != nil {
		t.Errorf("Release(tombstone) on a down host: %v", err)
	}
	for _, h := range []string{"h1", "h2"} {
		if s := snapshot(t, l, h); len(s.Claims) != 0 || len(s.Pins) != 0 || len(s.Usage) != 0 {
			t.Errorf("%s after the releases: claims %v pins %v usage %v, want none", h, s.Claims, s.Pins, s.Usage)
		}
	}
}

// TestVerifyChecksStates: Verify accepts every state and refuses an
// unknown one, and a tombstone on a host that is up.
func TestVerifyChecksStates(t *testing.T) {
	l, _, _ := newLedger(t)
	for _, st := range claimStates {
		host := "h-" + string(st)
		claimIn(t, l, host, "c", st, HostUp)
		if st == StateTombstone {
			continue // its host stays down
		}
		snapshot(t, l, host)
	}
	s := snapshot(t, l, "h-tombstone")
	up := *s
	up.Status.State = HostUp
	if err := up.Verify(); err == nil || !strings.Contains(err.Error(), "claim c is a tombstone on a host that is \"up\"") {
		t.Errorf("Verify(tombstone on an up host) = %v, want the tombstone named", err)
	}
	odd := *s
	odd.Claims = append([]Claim(nil), s.Claims...)
	odd.Claims[0].State = "resident"
	if err := odd.Verify(); err == nil || !strings.Contains(err.Error(), `claim c has state "resident"`) {
		t.Errorf("Verify(claim state resident) = %v, want the state named", err)
	}
}
