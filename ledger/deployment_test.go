package ledger

import (
	"context"
	"errors"
	"testing"
)

// TestBind: the first process binds the ledger to its namespace; one of
// the same namespace is let in, one of another is refused and changes
// nothing, and claims record the namespace bound.
func TestBind(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	if err := l.Bind(ctx, "default"); err != nil {
		t.Fatalf("Bind(default) on an empty ledger: %v", err)
	}
	again, err := New(rdb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Bind(ctx, "default"); err != nil {
		t.Errorf("Bind(default) on a ledger bound to default: %v", err)
	}
	other, err := New(rdb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = other.Bind(ctx, "other")
	var refused *OtherDeploymentError
	if !errors.As(err, &refused) || !errors.Is(err, ErrConflict) || refused.Bound.Namespace != "default" || refused.Want.Namespace != "other" {
		t.Fatalf("Bind(other) on a ledger bound to default = %v, want an *OtherDeploymentError naming both", err)
	}
	if got := other.Namespace(); got != "" {
		t.Errorf("after a refused Bind(other), Namespace() = %q, want none", got)
	}
	if got, err := rdb.Get(ctx, l.deploymentKey()).Result(); err != nil || got != `{"namespace":"default"}` {
		t.Errorf("deployment key after the refusal = %q, %v; want the binding to default", got, err)
	}
	register(t, l, "h1", testHost(1, 4))
	c, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512)))
	if err != nil {
		t.Fatal(err)
	}
	stored, err := l.GetClaim(ctx, "h1", c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Namespace != "default" {
		t.Errorf("claim made after Bind(default) records namespace %q, want default", stored.Namespace)
	}
	if err := l.Bind(ctx, ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("Bind(\"\") = %v, want ErrInvalid", err)
	}
}
