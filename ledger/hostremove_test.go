package ledger

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestRemoveHost(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	for _, tc := range []struct {
		name      string
		host      string
		claim     ClaimState // "" none
		hostState HostState
		wantErr   error
		in        string
		wantGone  int
	}{
		{"an empty host", "empty", "", HostUp, nil, "", 0},
		{"a dead host's tombstones", "dead", StateTombstone, HostDown, nil, "", 1},
		{"a guest still there", "busy", StateCommitted, HostUp, ErrConflict, "is committed; evacuate, migrate or delete", 0},
		{"a source hold", "held", StateHeld, HostDown, ErrConflict, "is held", 0},
		{"an operation's claim", "pending", StatePending, HostUp, ErrConflict, "is pending", 0},
		{"tombstones of a host that came back", "back", StateTombstone, HostReturning, ErrConflict, "is returning", 0},
	} {
		claimIn(t, l, tc.host, "c-"+tc.host, tc.claim, tc.hostState)
		n, err := l.RemoveHost(ctx, tc.host)
		hosts, lerr := l.Hosts(ctx)
		if lerr != nil {
			t.Fatal(lerr)
		}
		listed := slices.Contains(hosts, tc.host)
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.in) {
				t.Errorf("RemoveHost(%s) = %v, want %v saying %q", tc.name, err, tc.wantErr, tc.in)
			}
			if _, herr := l.Host(ctx, tc.host); herr != nil || !listed {
				t.Errorf("RemoveHost(%s) refused but changed the host: read %v, listed %v", tc.name, herr, listed)
			}
			continue
		}
		if err != nil || n != tc.wantGone {
			t.Errorf("RemoveHost(%s) = %d, %v; want %d tombstones removed", tc.name, n, err, tc.wantGone)
		}
		keys, _ := rdb.Keys(ctx, "*{"+tc.host+"}*").Result()
		if listed || len(keys) > 0 {
			t.Errorf("after RemoveHost(%s) the host is listed %v with keys %v, want neither", tc.name, listed, keys)
		}
		if _, err := l.RemoveHost(ctx, tc.host); !errors.Is(err, ErrUnknownHost) {
			t.Errorf("RemoveHost(%s) again = %v, want ErrUnknownHost", tc.name, err)
		}
	}
}
