package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// hostIn registers host and moves it to state through the moves allowed.
func hostIn(t *testing.T, l *Ledger, host string, state HostState) {
	t.Helper()
	ctx := context.Background()
	register(t, l, host, testHost(1, 8))
	switch state {
	case HostUp:
		return
	case HostDisabled:
		if _, err := l.SetHostDisabled(ctx, host, "first"); err != nil {
			t.Fatalf("SetHostDisabled(%s): %v", host, err)
		}
		return
	}
	if _, err := l.SetHostDown(ctx, host, "power supply failed"); err != nil {
		t.Fatalf("SetHostDown(%s): %v", host, err)
	}
	if state == HostReturning {
		if _, err := l.SetHostReturning(ctx, host); err != nil {
			t.Fatalf("SetHostReturning(%s): %v", host, err)
		}
	}
}

func TestHostStateMoves(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	set := map[HostState]func(host string) (HostStatus, error){
		HostDown:      func(h string) (HostStatus, error) { return l.SetHostDown(ctx, h, "power supply failed") },
		HostReturning: func(h string) (HostStatus, error) { return l.SetHostReturning(ctx, h) },
		HostUp:        func(h string) (HostStatus, error) { return l.SetHostUp(ctx, h) },
	}
	for i, tc := range []struct {
		from, to HostState
		wantErr  error
		in       string
	}{
		{HostUp, HostDown, nil, ""},
		{HostUp, HostReturning, ErrConflict, "the host is up; only a host that is down can be returning"},
		{HostUp, HostUp, nil, ""},
		{HostDown, HostDown, nil, ""},
		{HostDown, HostReturning, nil, ""},
		{HostDown, HostUp, ErrConflict, "the host is down; it must be returning before it is up"},
		{HostReturning, HostDown, nil, ""},
		{HostReturning, HostReturning, nil, ""},
		{HostReturning, HostUp, nil, ""},
	} {
		host := fmt.Sprintf("h%d", i)
		name := fmt.Sprintf("set host %s to %s", tc.from, tc.to)
		hostIn(t, l, host, tc.from)
		before, err := l.HostStatus(ctx, host)
		if err != nil {
			t.Fatalf("HostStatus(%s): %v", host, err)
		}
		got, err := set[tc.to](host)
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) || !strings.Contains(fmt.Sprint(err), tc.in) {
				t.Errorf("%s: error = %v, want %v saying %q", name, err, tc.wantErr, tc.in)
			}
			if after, _ := l.HostStatus(ctx, host); after != before {
				t.Errorf("%s refused changed the status from %+v to %+v", name, before, after)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if stored, _ := l.HostStatus(ctx, host); stored != got {
			t.Errorf("%s returned %+v, HostStatus says %+v", name, got, stored)
		}
		if got.Host != host || got.State != tc.to {
			t.Errorf("%s = %+v, want host %s in state %s", name, got, host, tc.to)
		}
		switch {
		case tc.from == tc.to:
			// A retry: nothing changes, not even the time.
			if got != before {
				t.Errorf("%s (a retry) = %+v, want it unchanged: %+v", name, got, before)
			}
		case tc.to == HostDown:
			if len(got.Token) != 32 || got.Token == before.Token || got.Reason != "power supply failed" || !got.Since.After(before.Since) {
				t.Errorf("%s = %+v, want a new 32-digit token, the reason and a new time (was %+v)", name, got, before)
			}
		case tc.to == HostReturning:
			// The fencing it returns from is still named.
			if got.Token != before.Token || got.Reason != before.Reason || !got.Since.After(before.Since) {
				t.Errorf("%s = %+v, want the token and reason of %+v and a new time", name, got, before)
			}
		case tc.to == HostUp:
			if got.Token != "" || got.Reason != "" || got.Since.IsZero() {
				t.Errorf("%s = %+v, want no token nor reason, and the time", name, got)
			}
		}
	}

	// A host already down keeps the token and reason of its first fencing.
	hostIn(t, l, "again", HostUp)
	first, err := l.SetHostDown(ctx, "again", "first reason")
	if err != nil {
		t.Fatal(err)
	}
	second, err := l.SetHostDown(ctx, "again", "second reason")
	if err != nil || second != first {
		t.Errorf("SetHostDown(down host, another reason) = %+v, %v; want the first status %+v", second, err, first)
	}
	if first.Since.IsZero() || time.Since(first.Since) > time.Minute {
		t.Errorf("SetHostDown since = %v, want about now", first.Since)
	}
	hostIn(t, l, "never", HostUp)
	if st, err := l.HostStatus(ctx, "never"); err != nil || st != (HostStatus{Host: "never", State: HostUp}) {
		t.Errorf("HostStatus(host never marked) = %+v, %v; want up with nothing else", st, err)
	}
}

// TestHostStateBadInput: bad input and unknown hosts are refused and
// write nothing at all.
func TestHostStateBadInput(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	hostIn(t, l, "h1", HostUp)
	keysBefore, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		do   func() error
		want error
		in   string
	}{
		{"empty reason", func() error { _, err := l.SetHostDown(ctx, "h1", ""); return err }, ErrInvalid, `reason "": invalid input: reasons are 1-200 printable characters`},
		{"blank reason", func() error { _, err := l.SetHostDown(ctx, "h1", "   "); return err }, ErrInvalid, `reason "   "`},
		{"reason of 201 characters", func() error { _, err := l.SetHostDown(ctx, "h1", strings.Repeat("é", 201)); return err }, ErrInvalid, "1-200 printable"},
		{"reason with a newline", func() error { _, err := l.SetHostDown(ctx, "h1", "psu\nfailed"); return err }, ErrInvalid, `reason "psu\nfailed"`},
		{"reason not UTF-8", func() error { _, err := l.SetHostDown(ctx, "h1", "psu \xff"); return err }, ErrInvalid, "1-200 printable"},
		{"down: unknown host", func() error { _, err := l.SetHostDown(ctx, "h9", "gone"); return err }, ErrUnknownHost, `"h9" is not registered`},
		{"returning: unknown host", func() error { _, err := l.SetHostReturning(ctx, "h9"); return err }, ErrUnknownHost, `"h9" is not registered`},
		{"up: unknown host", func() error { _, err := l.SetHostUp(ctx, "h9"); return err }, ErrUnknownHost, `"h9" is not registered`},
		{"status: unknown host", func() error { _, err := l.HostStatus(ctx, "h9"); return err }, ErrUnknownHost, `"h9" is not registered`},
		{"down: bad host name", func() error { _, err := l.SetHostDown(ctx, "h{1}", "x"); return err }, ErrInvalid, `host name "h{1}"`},
		{"up: bad host name", func() error { _, err := l.SetHostUp(ctx, "h 1"); return err }, ErrInvalid, `host name "h 1"`},
		{"statuses: bad host name", func() error { _, err := l.HostStatuses(ctx, []string{"h1", "h{1}"}); return err }, ErrInvalid, `host name "h{1}"`},
		{"disable: empty reason", func() error { _, err := l.SetHostDisabled(ctx, "h1", ""); return err }, ErrInvalid, `reason "": invalid input: reasons are 1-200 printable characters`},
		{"disable: reason with a newline", func() error { _, err := l.SetHostDisabled(ctx, "h1", "bios\nupdate"); return err }, ErrInvalid, `reason "bios\nupdate"`},
		{"disable: reason of 201 characters", func() error { _, err := l.SetHostDisabled(ctx, "h1", strings.Repeat("x", 201)); return err }, ErrInvalid, "1-200 printable"},
		{"disable: unknown host", func() error { _, err := l.SetHostDisabled(ctx, "h9", "update"); return err }, ErrUnknownHost, `"h9" is not registered`},
		{"enable: unknown host", func() error { _, err := l.SetHostEnabled(ctx, "h9"); return err }, ErrUnknownHost, `"h9" is not registered`},
		{"disable: bad host name", func() error { _, err := l.SetHostDisabled(ctx, "h{1}", "x"); return err }, ErrInvalid, `host name "h{1}"`},
		{"enable: bad host name", func() error { _, err := l.SetHostEnabled(ctx, "h 1"); return err }, ErrInvalid, `host name "h 1"`},
	} {
		err := tc.do()
		msg := fmt.Sprint(err)
		if !errors.Is(err, tc.want) || !strings.Contains(msg, tc.in) || strings.Count(msg, "ledger:") != 1 {
			t.Errorf("%s: error = %v, want %v with one \"ledger:\" and %q", tc.name, err, tc.want, tc.in)
		}
	}
	keysAfter, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sorted(keysBefore), sorted(keysAfter)); diff != "" {
		t.Errorf("refused host state changes made or removed keys (-before +after):\n%s", diff)
	}
	if st, _ := l.HostStatus(ctx, "h1"); st.State != HostUp {
		t.Errorf("h1 after refused changes is %s, want up", st.State)
	}
	// 200 characters of any script are fine.
	if _, err := l.SetHostDown(ctx, "h1", strings.Repeat("é", 200)); err != nil {
		t.Errorf("SetHostDown(reason of 200 characters): %v", err)
	}
}

func TestClaimsRefusedOnHostNotUp(t *testing.T) {
	ctx := context.Background()
	l, _, srv := newLedger(t)
	for _, state := range []HostState{HostDown, HostReturning} {
		host := "h-" + string(state)
		register(t, l, host, testHost(2, 8))
		// Made while the host was up: a retry of it still gets it back, and
		// the operations on claims that exist keep working.
		made, err := l.Claim(ctx, spec("made", host, dedicated(t, 2, 512)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Claim(ctx, spec("resident", host, dedicated(t, 2, 512))); err != nil {
			t.Fatal(err)
		}
		hostIn(t, l, host+"-other", HostUp) // an up host beside it takes claims
		if _, err := l.SetHostDown(ctx, host, "cut off"); err != nil {
			t.Fatal(err)
		}
		if state == HostReturning {
			if _, err := l.SetHostReturning(ctx, host); err != nil {
				t.Fatal(err)
			}
		}
		before := snapshot(t, l, host)
		// This ledger has the host cached and fits without reading; a second
		// one reads first; concurrent claims go in one batch.
		cold := secondLedger(t, srv.Addr)
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				led := l
				if i%2 == 1 {
					led = cold
				}
				_, errs[i] = led.Claim(ctx, spec(fmt.Sprintf("new-%d", i), host, dedicated(t, 1, 64)))
			}()
		}
		wg.Wait()
		for i, err := range errs {
			want := fmt.Sprintf("ledger: claim new-%d on %s: host is down: host %s is %s and takes no new claims", i, host, host, state)
			if !errors.Is(err, ErrHostDown) || errors.Is(err, ErrConflict) || fmt.Sprint(err) != want {
				t.Errorf("Claim(new-%d) on a host %s: error = %v, want %q", i, state, err, want)
			}
		}
		if diff := diffSnapshots(before, snapshot(t, l, host)); diff != "" {
			t.Errorf("claims refused on a host %s changed the ledger (-before +after):\n%s", state, diff)
		}
		if again, err := l.Claim(ctx, spec("made", host, dedicated(t, 2, 512))); err != nil || again.Token != made.Token {
			t.Errorf("Claim(made) retried on a host %s = %v, %v; want the claim made before", state, again, err)
		}
		if _, err := l.Commit(ctx, host, "resident"); err != nil {
			t.Errorf("Commit on a host %s: %v", state, err)
		}
		// No guest starts there: a step's fence and a revert's reinstated
		// hold are refused; a hold whose guest never left becomes resident.
		if _, err := l.Fence(ctx, host, "made", made.Token, time.Second); !errors.Is(err, ErrHostDown) {
			t.Errorf("Fence on a host %s: error = %v, want ErrHostDown", state, err)
		}
		if _, err := l.Hold(ctx, host, "resident"); err != nil {
			t.Errorf("Hold on a host %s: %v", state, err)
		}
		if _, err := l.Reinstate(ctx, host, "resident"); !errors.Is(err, ErrHostDown) {
			t.Errorf("Reinstate on a host %s: error = %v, want ErrHostDown", state, err)
		}
		if _, err := l.Unhold(ctx, host, "resident"); err != nil {
			t.Errorf("Unhold on a host %s: %v", state, err)
		}
		if ok, err := l.ReleasePending(ctx, host, "made"); err != nil || !ok {
			t.Errorf("ReleasePending on a host %s = %v, %v; want true, nil", state, ok, err)
		}
		if _, err := l.Claim(ctx, spec("beside", host+"-other", dedicated(t, 1, 64))); err != nil {
			t.Errorf("Claim on an up host beside a host %s: %v", state, err)
		}
	}
	// Up again, the host takes claims.
	if _, err := l.SetHostUp(ctx, "h-returning"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, spec("after", "h-returning", dedicated(t, 1, 64))); err != nil {
		t.Errorf("Claim on a host up again: %v", err)
	}
	if _, err := l.Hold(ctx, "h-returning", "resident"); err != nil {
		t.Fatal(err)
	}
	if c, err := l.Reinstate(ctx, "h-returning", "resident"); err != nil || c.State != StateCommitted {
		t.Errorf("Reinstate on a host up again = %v, %v; want the claim committed", c, err)
	}
}

// TestHostUpWaitsForTombstones: a returning host goes up only once its
// tombstones are released, since the guests left there may still run.
func TestHostUpWaitsForTombstones(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	register(t, l, "h1", testHost(2, 8))
	for _, id := range []string{"dead-1", "dead-2", "alive"} {
		if _, err := l.Claim(ctx, spec(id, "h1", dedicated(t, 1, 64))); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Commit(ctx, "h1", id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.SetHostDown(ctx, "h1", "cut off"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"dead-1", "dead-2"} {
		if _, err := l.Tombstone(ctx, "h1", id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.SetHostReturning(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	// alive is committed, not a tombstone (its guest was not evacuated):
	// it does not keep the host from going up.
	for _, tc := range []struct {
		release string
		left    int
	}{{"", 2}, {"dead-1", 1}, {"dead-2", 0}} {
		if tc.release != "" {
			if err := l.Release(ctx, "h1", tc.release); err != nil {
				t.Fatal(err)
			}
		}
		st, _ := l.HostStatus(ctx, "h1")
		before := snapshot(t, l, "h1")
		up, err := l.SetHostUp(ctx, "h1")
		if tc.left == 0 {
			if err != nil || up.State != HostUp {
				t.Errorf("SetHostUp with no tombstone left = %+v, %v; want up", up, err)
			}
			if s := snapshot(t, l, "h1"); s.Status != up {
				t.Errorf("Snapshot(h1).Status = %+v, want %+v", s.Status, up)
			}
			continue
		}
		want := fmt.Sprintf("still holds %d tombstone claims", tc.left)
		if !errors.Is(err, ErrConflict) || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("SetHostUp with %d tombstones: error = %v, want ErrConflict saying %q", tc.left, err, want)
		}
		if got, _ := l.HostStatus(ctx, "h1"); got != st {
			t.Errorf("refused SetHostUp changed the status from %+v to %+v", st, got)
		}
		if diff := diffSnapshots(before, snapshot(t, l, "h1")); diff != "" {
			t.Errorf("refused SetHostUp changed the ledger (-before +after):\n%s", diff)
		}
	}
}

// TestHostStatusesAndSnapshot: the statuses of many hosts in one read,
// and each snapshot's own.
func TestHostStatusesAndSnapshot(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	states := map[string]HostState{"a": HostUp, "b": HostDown, "c": HostReturning, "d": HostDisabled}
	want := map[string]HostStatus{}
	for h, st := range states {
		hostIn(t, l, h, st)
		s, err := l.HostStatus(ctx, h)
		if err != nil || s.State != st {
			t.Fatalf("HostStatus(%s) = %+v, %v; want %s", h, s, err, st)
		}
		want[h] = s
		if snap := snapshot(t, l, h); snap.Status != s {
			t.Errorf("Snapshot(%s).Status = %+v, want %+v", h, snap.Status, s)
		}
	}
	got, err := l.HostStatuses(ctx, []string{"a", "b", "c", "d", "not-registered"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("HostStatuses(a, b, c, d, not-registered) (-want +got):\n%s", diff)
	}
	if got, err := l.HostStatuses(ctx, nil); err != nil || len(got) != 0 {
		t.Errorf("HostStatuses(none) = %v, %v; want empty", got, err)
	}
	// host show prints a host never marked without the zero time.
	b, err := json.Marshal(got["a"])
	if err != nil || string(b) != `{"host":"a","state":"up"}` {
		t.Errorf("json.Marshal(status of a host never marked) = %s, %v; want {\"host\":\"a\",\"state\":\"up\"}", b, err)
	}
}

// TestHostDisableMoves: an up host is disabled and enabled again; a down or
// returning one is neither, and a disabled one is fenced like any other.
func TestHostDisableMoves(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	do := map[string]func(host string) (HostStatus, error){
		"disable":   func(h string) (HostStatus, error) { return l.SetHostDisabled(ctx, h, "firmware update") },
		"enable":    func(h string) (HostStatus, error) { return l.SetHostEnabled(ctx, h) },
		"down":      func(h string) (HostStatus, error) { return l.SetHostDown(ctx, h, "power supply failed") },
		"returning": func(h string) (HostStatus, error) { return l.SetHostReturning(ctx, h) },
		"up":        func(h string) (HostStatus, error) { return l.SetHostUp(ctx, h) },
	}
	const mustBeUp = "only an up or disabled host is disabled or enabled: it must be brought up first"
	for i, tc := range []struct {
		from    HostState
		move    string
		want    HostState
		wantErr error
		in      string
	}{
		{HostUp, "disable", HostDisabled, nil, ""},
		{HostUp, "enable", HostUp, nil, ""},
		{HostDisabled, "enable", HostUp, nil, ""},
		{HostDisabled, "down", HostDown, nil, ""},
		{HostDisabled, "returning", "", ErrConflict, "the host is disabled; only a host that is down can be returning"},
		{HostDisabled, "up", "", ErrConflict, "the host is disabled, not returning; enabling it brings it up"},
		{HostDown, "disable", "", ErrConflict, "the host is down; " + mustBeUp},
		{HostDown, "enable", "", ErrConflict, "the host is down; " + mustBeUp},
		{HostReturning, "disable", "", ErrConflict, "the host is returning; " + mustBeUp},
		{HostReturning, "enable", "", ErrConflict, "the host is returning; " + mustBeUp},
	} {
		host := fmt.Sprintf("h%d", i)
		name := fmt.Sprintf("%s a host %s", tc.move, tc.from)
		hostIn(t, l, host, tc.from)
		before, err := l.HostStatus(ctx, host)
		if err != nil {
			t.Fatalf("HostStatus(%s): %v", host, err)
		}
		got, err := do[tc.move](host)
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) || !strings.Contains(fmt.Sprint(err), tc.in) {
				t.Errorf("%s: error = %v, want %v saying %q", name, err, tc.wantErr, tc.in)
			}
			if after, _ := l.HostStatus(ctx, host); after != before {
				t.Errorf("%s refused changed the status from %+v to %+v", name, before, after)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if stored, _ := l.HostStatus(ctx, host); stored != got {
			t.Errorf("%s returned %+v, HostStatus says %+v", name, got, stored)
		}
		switch {
		case got.Host != host || got.State != tc.want:
			t.Errorf("%s = %+v, want host %s %s", name, got, host, tc.want)
		case tc.from == tc.want:
			if got != before {
				t.Errorf("%s (a retry) = %+v, want it unchanged: %+v", name, got, before)
			}
		case tc.want == HostDisabled:
			if got.Reason != "firmware update" || got.Token != "" || got.Since.IsZero() {
				t.Errorf("%s = %+v, want the reason, no token and the time", name, got)
			}
		case tc.want == HostUp:
			if got.Reason != "" || got.Token != "" || !got.Since.After(before.Since) {
				t.Errorf("%s = %+v, want no reason nor token and a new time (was %+v)", name, got, before)
			}
		case tc.want == HostDown:
			if len(got.Token) != 32 || got.Reason != "power supply failed" || !got.Since.After(before.Since) {
				t.Errorf("%s = %+v, want a new token, the fencing's reason and a new time (was %+v)", name, got, before)
			}
		}
	}

	// Disabling again takes the new reason and keeps the time it started.
	hostIn(t, l, "again", HostUp)
	first, err := l.SetHostDisabled(ctx, "again", "first reason")
	if err != nil {
		t.Fatal(err)
	}
	second, err := l.SetHostDisabled(ctx, "again", "second reason")
	want := first
	want.Reason = "second reason"
	if err != nil || second != want {
		t.Errorf("SetHostDisabled(disabled host, another reason) = %+v, %v; want %+v", second, err, want)
	}
	// A disabled host fenced and brought back comes up enabled.
	for _, move := range []string{"down", "returning", "up"} {
		if _, err := do[move]("again"); err != nil {
			t.Fatalf("%s the disabled host: %v", move, err)
		}
	}
	if st, _ := l.HostStatus(ctx, "again"); st.State != HostUp || st.Reason != "" || st.Token != "" {
		t.Errorf("a disabled host fenced and brought back is %+v, want up with no reason nor token", st)
	}
}

// TestClaimsOnDisabledHost: a disabled host takes the claims that name it,
// and refuses them once it is fenced.
func TestClaimsOnDisabledHost(t *testing.T) {
	ctx := context.Background()
	l, _, srv := newLedger(t)
	register(t, l, "h1", testHost(2, 8))
	resident, err := l.Claim(ctx, spec("resident", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Commit(ctx, "h1", "resident"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SetHostDisabled(ctx, "h1", "kernel update"); err != nil {
		t.Fatal(err)
	}
	// Cached and cold ledgers, concurrent claims in one batch, as above.
	cold := secondLedger(t, srv.Addr)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			led := l
			if i%2 == 1 {
				led = cold
			}
			_, errs[i] = led.Claim(ctx, spec(fmt.Sprintf("new-%d", i), "h1", dedicated(t, 1, 64)))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Claim(new-%d) on a disabled host: %v", i, err)
		}
	}
	s := snapshot(t, l, "h1")
	if len(s.Claims) != 9 || len(s.Pins) != 10 || s.Status.State != HostDisabled {
		t.Errorf("disabled host after the claims: %d claims, %d pins, %s; want 9, 10, disabled", len(s.Claims), len(s.Pins), s.Status.State)
	}
	// The guest that was there stays, and its claim works as before.
	if err := l.Release(ctx, "h1", resident.ID); err != nil {
		t.Errorf("Release on a disabled host: %v", err)
	}
	if _, err := l.SetHostDown(ctx, "h1", "it died during the update"); err != nil {
		t.Fatal(err)
	}
	_, err = l.Claim(ctx, spec("late", "h1", dedicated(t, 1, 64)))
	if !errors.Is(err, ErrHostDown) {
		t.Errorf("Claim on a disabled host fenced since: error = %v, want ErrHostDown", err)
	}
}

// TestHostAutoEvacuate turns a down host's automatic evacuation on and
// off: only a down host has it, a retry of down keeps it, and leaving
// down (returning, then up) drops it, so a host fenced again starts
// without it.
func TestHostAutoEvacuate(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLedger(t)
	hostIn(t, l, "h1", HostUp)
	hostIn(t, l, "h2", HostDisabled)
	for _, h := range []string{"h1", "h2"} {
		if _, err := l.SetHostAutoEvacuate(ctx, h, true); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "only a host fenced down is evacuated") {
			t.Errorf("automatic evacuation of %s, not down: %v, want ErrConflict", h, err)
		}
	}
	if _, err := l.SetHostAutoEvacuate(ctx, "nowhere", true); !errors.Is(err, ErrUnknownHost) {
		t.Errorf("automatic evacuation of an unknown host: %v, want ErrUnknownHost", err)
	}
	auto := func(want bool) {
		t.Helper()
		st, err := l.HostStatus(ctx, "h1")
		if err != nil {
			t.Fatal(err)
		}
		if st.AutoEvacuate != want {
			t.Fatalf("h1 %s: automatic evacuation %v, want %v", st.State, st.AutoEvacuate, want)
		}
	}
	auto(false)
	down, err := l.SetHostDown(ctx, "h1", "psu")
	if err != nil {
		t.Fatal(err)
	}
	st, err := l.SetHostAutoEvacuate(ctx, "h1", true)
	if err != nil || !st.AutoEvacuate || st.State != HostDown || st.Token != down.Token || st.Reason != "psu" {
		t.Fatalf("turning it on: %+v, %v; want down with the same token and reason, evacuated automatically", st, err)
	}
	auto(true)
	if st, err := l.SetHostDown(ctx, "h1", "again"); err != nil || !st.AutoEvacuate || st.Token != down.Token {
		t.Fatalf("host down again: %+v, %v; want the retry to keep token and automatic evacuation", st, err)
	}
	if st, err := l.SetHostAutoEvacuate(ctx, "h1", false); err != nil || st.AutoEvacuate {
		t.Fatalf("turning it off: %+v, %v", st, err)
	}
	auto(false)
	if _, err := l.SetHostAutoEvacuate(ctx, "h1", true); err != nil {
		t.Fatal(err)
	}
	if st, err := l.SetHostReturning(ctx, "h1"); err != nil || st.AutoEvacuate {
		t.Fatalf("returning: %+v, %v; want automatic evacuation dropped", st, err)
	}
	auto(false)
	if _, err := l.SetHostUp(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	if st, err := l.SetHostDown(ctx, "h1", "psu again"); err != nil || st.AutoEvacuate {
		t.Fatalf("fenced again: %+v, %v; want no automatic evacuation until asked", st, err)
	}
	snap, err := l.Snapshot(ctx, "h1")
	if err != nil || snap.Status.AutoEvacuate {
		t.Fatalf("snapshot status %+v, %v", snap.Status, err)
	}
}
