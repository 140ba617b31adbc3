package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestBind: the first process binds the ledger to its namespace; one of
// the same namespace is let in, one of another is refused and changes
// nothing, and claims record the namespace bound.
func TestBind(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	if err := l.Bind(ctx, Deployment{Namespace: "default"}); err != nil {
		t.Fatalf("Bind(default) on an empty ledger: %v", err)
	}
	again, err := New(rdb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Bind(ctx, Deployment{Namespace: "default"}); err != nil {
		t.Errorf("Bind(default) on a ledger bound to default: %v", err)
	}
	other, err := New(rdb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = other.Bind(ctx, Deployment{Namespace: "other"})
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
	if err := l.Bind(ctx, Deployment{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Bind(\"\") = %v, want ErrInvalid", err)
	}
}

// TestBindNamespaceID: a binding by name learns the namespace id of the
// first process that knows it; a process of the same name on another
// cluster (another id) is refused and changes nothing, and one that knows
// no id is checked by name.
func TestBindNamespaceID(t *testing.T) {
	ctx := context.Background()
	_, rdb, _ := newLedger(t)
	bind := func(d Deployment) error {
		t.Helper()
		l, err := New(rdb, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Bind(ctx, d)
	}
	key := func() string {
		t.Helper()
		l, _ := New(rdb, Options{})
		got, err := rdb.Get(ctx, l.deploymentKey()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if err := bind(Deployment{Namespace: "default"}); err != nil {
		t.Fatal(err)
	}
	if err := bind(Deployment{Namespace: "default", NamespaceID: "id-prod"}); err != nil {
		t.Fatalf("Bind with an id on a ledger bound by name: %v", err)
	}
	bound := key()
	if !strings.Contains(bound, `"namespace_id":"id-prod"`) {
		t.Errorf("deployment key = %s, want it to have learnt id-prod", bound)
	}
	err := bind(Deployment{Namespace: "default", NamespaceID: "id-staging"})
	var refused *OtherDeploymentError
	if !errors.As(err, &refused) || refused.Bound.NamespaceID != "id-prod" || refused.Want.NamespaceID != "id-staging" ||
		!strings.Contains(err.Error(), "another cluster") {
		t.Errorf("Bind of default on another cluster = %v, want an *OtherDeploymentError naming both ids", err)
	}
	if got := key(); got != bound {
		t.Errorf("deployment key after the refusal = %s, want %s", got, bound)
	}
	if err := bind(Deployment{Namespace: "default"}); err != nil {
		t.Errorf("Bind by name alone on a ledger bound with an id: %v", err)
	}
	if err := bind(Deployment{Namespace: "default", NamespaceID: "id-prod"}); err != nil {
		t.Errorf("Bind with the bound id: %v", err)
	}
}

// TestBindAfterTheKeyIsLost: a ledger whose deployment key was deleted
// still serves the namespace its claims name: a process of another
// namespace is refused and binds nothing, and one of the namespace the
// claims name binds it again.
func TestBindAfterTheKeyIsLost(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	if err := l.Bind(ctx, Deployment{Namespace: "default"}); err != nil {
		t.Fatal(err)
	}
	register(t, l, "h1", testHost(1, 4))
	if _, err := l.Claim(ctx, spec("c1", "h1", dedicated(t, 2, 512))); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, l.deploymentKey()).Err(); err != nil {
		t.Fatal(err)
	}
	other, err := New(rdb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = other.Bind(ctx, Deployment{Namespace: "other"})
	var refused *OtherDeploymentError
	if !errors.As(err, &refused) || !refused.Unbound || !strings.Contains(err.Error(), `its claims name Temporal namespace "default", not "other"`) {
		t.Fatalf("Bind(other) on a ledger whose key is gone and whose claims name default = %v, want refused naming both", err)
	}
	if n, _ := rdb.Exists(ctx, l.deploymentKey()).Result(); n != 0 {
		t.Errorf("a refused Bind(other) wrote the deployment key")
	}
	again, err := New(rdb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Bind(ctx, Deployment{Namespace: "default"}); err != nil {
		t.Errorf("Bind(default) on a ledger whose claims name default: %v", err)
	}
	if err := other.Bind(ctx, Deployment{Namespace: "other"}); !errors.As(err, &refused) || refused.Unbound {
		t.Errorf("Bind(other) once default bound the ledger again = %v, want the plain refusal", err)
	}
}
