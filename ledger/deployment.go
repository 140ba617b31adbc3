package ledger

import (
	"context"
	"encoding/json"
	"fmt"
)

// Deployment is the Temporal deployment a ledger serves. The ledger's
// claims name workflows of that deployment, and only its workers can tell
// whether those workflows still run: a worker of another namespace sees
// none of them.
type Deployment struct {
	// Namespace is the Temporal namespace the workflows run in. The
	// frontend addresses are no part of it: they differ between the nodes
	// of one cluster.
	Namespace string `json:"namespace"`
	// NamespaceID is the namespace's id, which tells apart namespaces of
	// one name on two Temporal clusters (staging's "default" and
	// production's) and stays the same when a replicated namespace fails
	// over. A process that cannot ask Temporal binds by name alone.
	NamespaceID string `json:"namespace_id,omitempty"`
}

// serves says whether a ledger bound to d may serve want: the same
// namespace, and the same id when both know it.
func (d Deployment) serves(want Deployment) bool {
	return d.Namespace == want.Namespace && (d.NamespaceID == "" || want.NamespaceID == "" || d.NamespaceID == want.NamespaceID)
}

// OtherDeploymentError is Bind's refusal of a ledger that serves another
// deployment.
type OtherDeploymentError struct {
	Bound, Want Deployment
	// Unbound: no deployment key bound the ledger, but its claims name
	// Bound's namespace.
	Unbound bool
}

func (e *OtherDeploymentError) Error() string {
	if e.Unbound {
		return fmt.Sprintf("the ledger's deployment key is gone, and its claims name Temporal namespace %q, not %q: "+
			"it serves that namespace; run a worker or CLI of it to bind the ledger again", e.Bound.Namespace, e.Want.Namespace)
	}
	if e.Bound.Namespace == e.Want.Namespace {
		return fmt.Sprintf("the ledger serves Temporal namespace %q with id %s, of another cluster than this one's (id %s)",
			e.Bound.Namespace, e.Bound.NamespaceID, e.Want.NamespaceID)
	}
	return fmt.Sprintf("the ledger serves Temporal namespace %q, not %q", e.Bound.Namespace, e.Want.Namespace)
}

// Is makes the refusal an ErrConflict, one of the ledger's answers.
func (e *OtherDeploymentError) Is(target error) bool { return target == ErrConflict }

// Bind binds the ledger to deployment want if nothing bound it yet, in
// one atomic step, and fails with an *OtherDeploymentError, changing
// nothing, when another deployment bound it first. A binding by name alone
// learns want's namespace id. Every process that acts on the ledger binds
// before it acts, and before it uses l: l's claims then record the
// namespace.
func (l *Ledger) Bind(ctx context.Context, want Deployment) error {
	if want.Namespace == "" {
		return fmt.Errorf("ledger: bind: %w: no Temporal namespace to bind to", ErrInvalid)
	}
	arg, err := json.Marshal(want)
	if err != nil {
		return fmt.Errorf("ledger: bind: %w", err)
	}
	// A ledger with no binding may have lost its key (deleted, or lost
	// with its node): its claims still name the namespace it serves, and
	// a process of another may not take it.
	n, err := l.rdb.Exists(ctx, l.deploymentKey()).Result()
	if err != nil {
		return fmt.Errorf("ledger: bind to Temporal namespace %q: %w", want.Namespace, err)
	}
	if n == 0 {
		other, err := l.claimsNamespace(ctx, want.Namespace)
		if err != nil {
			return fmt.Errorf("ledger: bind to Temporal namespace %q: %w", want.Namespace, err)
		}
		if other != "" {
			return &OtherDeploymentError{Bound: Deployment{Namespace: other}, Want: want, Unbound: true}
		}
	}
	reply, err := l.change(ctx, bindScript, []string{l.deploymentKey()}, arg).Text()
	if err != nil {
		return fmt.Errorf("ledger: bind to Temporal namespace %q: %w", want.Namespace, err)
	}
	var bound Deployment
	if err := json.Unmarshal([]byte(reply), &bound); err != nil {
		return fmt.Errorf("ledger: bind: the deployment bound, %q: %w", reply, err)
	}
	if !bound.serves(want) {
		return &OtherDeploymentError{Bound: bound, Want: want}
	}
	l.namespace = want.Namespace
	return nil
}

// claimsNamespace returns a namespace other than ns that a claim of a
// registered host records ("" when none does): read only when the ledger
// has no binding, which is rare.
func (l *Ledger) claimsNamespace(ctx context.Context, ns string) (string, error) {
	hosts, err := l.Hosts(ctx)
	if err != nil {
		return "", err
	}
	for _, h := range hosts {
		claims, err := l.Claims(ctx, h)
		if err != nil {
			return "", err
		}
		for _, c := range claims {
			if c.Namespace != "" && c.Namespace != ns {
				return c.Namespace, nil
			}
		}
	}
	return "", nil
}

// Namespace is the Temporal namespace the ledger's process serves: its
// claims record it as their owners' namespace.
func (l *Ledger) Namespace() string { return l.namespace }
