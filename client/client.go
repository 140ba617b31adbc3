// Package client is the way into pinflow for a program: it starts each
// operation on a guest with the checks the pinflow CLI makes, follows it
// to where the operator's next decision is, runs each change of a host
// (register, disable, enable, down, up, remove, evacuate), and reads
// guests, hosts and the history of operations. The CLI is built on it.
//
// The package example is a control plane that boots a pinned guest and
// live-migrates it.
//
// Every guest is named by its UUID, a unique prefix of it, or its unique
// name. Every refusal is an error of one line naming what was wrong, and
// matches with errors.Is one of the kinds in errors.go: ErrInvalid for a
// request wrong in itself, ErrUnknownGuest, ErrUnknownHost and
// ErrUnknownGroup for a name that names nothing, ErrBusy, ErrState,
// ErrHostDown, ErrGroupRule and ErrNoHost for the state of the cloud. An
// operation that failed on the workers is an *OperationError, which
// matches the same kinds. A wait cut by the caller's context is that
// context's error: the operation goes on.
package client

import (
	tclient "go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// Client starts and follows pinflow's operations and reads its state. It
// is safe for concurrent use.
type Client struct {
	led       *ledger.Ledger
	temporal  tclient.Client
	taskQueue string
	// Notify, when set, receives notes that do not stop a request, such
	// as a disabled host taking a guest because it was named.
	Notify func(note string)
	// closers close the connections its maker handed it (CloseWith).
	closers []func()
	// aliases resolve the flavors' pci_passthrough:alias.
	aliases numa.PCIAliases
}

// New makes a client of a ledger and a Temporal client that the caller
// opened and closes; taskQueue is the workers' task queue.
func New(led *ledger.Ledger, temporal tclient.Client, taskQueue string) *Client {
	return &Client{led: led, temporal: temporal, taskQueue: taskQueue}
}

// CloseWith hands c the closing of connections opened for it alone
// (config.Config.Client does): Close calls each f.
func (c *Client) CloseWith(f ...func()) { c.closers = append(c.closers, f...) }

// Close closes the connections handed over with CloseWith; those given
// to New stay open.
func (c *Client) Close() {
	for _, f := range c.closers {
		f()
	}
}

// Ledger is the ledger the client reads.
func (c *Client) Ledger() *ledger.Ledger { return c.led }

// Temporal is the Temporal client the client starts workflows with.
func (c *Client) Temporal() tclient.Client { return c.temporal }
