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
}

// OtherDeploymentError is Bind's refusal of a ledger that serves another
// deployment.
type OtherDeploymentError struct {
	Bound, Want Deployment
}

func (e *OtherDeploymentError) Error() string {
	return fmt.Sprintf("the ledger serves Temporal namespace %q, not %q", e.Bound.Namespace, e.Want.Namespace)
}

// Is makes the refusal an ErrConflict, one of the ledger's answers.
func (e *OtherDeploymentError) Is(target error) bool { return target == ErrConflict }

// Bind binds the ledger to the deployment of namespace if nothing bound it
// yet, in one atomic step, and fails with an *OtherDeploymentError,
// changing nothing, when another deployment bound it first. Every process
// that acts on the ledger binds before it acts, and before it uses l:
// l's claims then record namespace (Options.Namespace).
func (l *Ledger) Bind(ctx context.Context, namespace string) error {
	want := Deployment{Namespace: namespace}
	if want.Namespace == "" {
		return fmt.Errorf("ledger: bind: %w: no Temporal namespace to bind to", ErrInvalid)
	}
	arg, err := json.Marshal(want)
	if err != nil {
		return fmt.Errorf("ledger: bind: %w", err)
	}
	reply, err := l.change(ctx, bindScript, []string{l.deploymentKey()}, arg).Text()
	if err != nil {
		return fmt.Errorf("ledger: bind to Temporal namespace %q: %w", want.Namespace, err)
	}
	var bound Deployment
	if err := json.Unmarshal([]byte(reply), &bound); err != nil {
		return fmt.Errorf("ledger: bind: the deployment bound, %q: %w", reply, err)
	}
	if bound != want {
		return &OtherDeploymentError{Bound: bound, Want: want}
	}
	l.namespace = namespace
	return nil
}

// Namespace is the Temporal namespace the ledger's process serves: its
// claims record it as their owners' namespace.
func (l *Ledger) Namespace() string { return l.namespace }
