package activities_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv/simcloud"
	"github.com/pinflow/pinflow/ledger"
)

// setOwners answers from a map of workflow ids to states; others are
// not found.
type setOwners struct {
	mu sync.Mutex
	st map[string]audit.OwnerState
}

func (o *setOwners) set(id string, s audit.OwnerState) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.st[id] = s
}

func (o *setOwners) OwnerStatus(_ context.Context, id string) (audit.OwnerStatus, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, ok := o.st[id]
	if !ok {
		return audit.OwnerStatus{State: audit.OwnerNotFound}, nil
	}
	return audit.OwnerStatus{State: s, FirstRunID: "run-1", Since: time.Now().Add(-time.Hour)}, nil
}

func (o *setOwners) Retention(context.Context) (time.Duration, error) { return 24 * time.Hour, nil }

// TestBudgetSlotOutlivesItsLease: the slot of a member whose move is
// still open counts however long its workers were away (its lease ran
// out unrenewed), so a second member of a budget of one waits; once the
// move is known to have ended, its slot goes and the second takes it.
func TestBudgetSlotOutlivesItsLease(t *testing.T) {
	ctx := context.Background()
	w := simcloud.New(t)
	owners := &setOwners{st: map[string]audit.OwnerState{}}
	w.Acts.Audit = &audit.Auditor{Ledger: w.Ledger, Driver: w.Driver, Owners: owners}
	if err := w.Ledger.CreateGroup(ctx, ledger.Group{Name: "db", Policy: ledger.PolicyAntiAffinity, MaxPerHost: 1, MaxUnavailable: 1}); err != nil {
		t.Fatal(err)
	}
	m1, m2 := simcloud.UUID(90), simcloud.UUID(91)
	for _, u := range []string{m1, m2} {
		if _, err := w.Ledger.CreateMember(ctx, u, "vm-"+u[:8], simcloud.Flavor(), guest.VMActive, "", "db"); err != nil {
			t.Fatal(err)
		}
	}
	// m1's move took its slot, then its only worker went away for longer
	// than the lease.
	if _, err := w.Ledger.TakeGroupSlot(ctx, m1, time.Millisecond, false); err != nil {
		t.Fatal(err)
	}
	owners.set(guest.InstanceWorkflowID(m1), audit.OwnerRunning)
	waitExpired(t, w, m2)
	slot, err := w.Acts.TakeGroupSlot(ctx, activities.GroupSlotInput{UUID: m2})
	if err != nil {
		t.Fatal(err)
	}
	if slot.Taken || !slices.Equal(slot.Moving, []string{m1}) {
		t.Fatalf("m2's take while m1's move is open = %+v, want refused naming m1", slot)
	}
	if moving, err := w.Ledger.GroupMoving(ctx, "db"); err != nil || !slices.Equal(moving, []string{m1}) {
		t.Errorf("GroupMoving = %v, %v; want m1", moving, err)
	}
	// Its lease runs out again, and now its move has ended.
	if _, err := w.Ledger.RenewGroupSlot(ctx, m1, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	owners.set(guest.InstanceWorkflowID(m1), audit.OwnerClosed)
	waitExpired(t, w, m2)
	if slot, err := w.Acts.TakeGroupSlot(ctx, activities.GroupSlotInput{UUID: m2}); err != nil || !slot.Taken {
		t.Errorf("m2's take once m1's move ended = %+v, %v; want taken", slot, err)
	}
	if moving, _ := w.Ledger.GroupMoving(ctx, "db"); !slices.Equal(moving, []string{m2}) {
		t.Errorf("GroupMoving = %v, want m2 alone", moving)
	}
}

// waitExpired waits until u's take finds a slot whose lease ran out.
func waitExpired(t *testing.T, w *simcloud.World, u string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := w.Ledger.TakeGroupSlot(context.Background(), u, time.Minute, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Expired) > 0 {
			return
		}
		if b.Taken || time.Now().After(deadline) {
			t.Fatalf("no slot's lease ran out: %+v", b)
		}
		time.Sleep(time.Millisecond)
	}
}
