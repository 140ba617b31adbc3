package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/ledger"
)

// checkReport is what `pinflow check --json` prints.
type checkReport struct {
	Hosts     int      `json:"hosts"`
	Claims    int      `json:"claims"`
	Pending   int      `json:"pending"`
	Held      int      `json:"held"`
	Tombstone int      `json:"tombstones"`
	Instances int      `json:"instances"`
	Problems  []string `json:"problems"`
}

func checkCommand() *cobra.Command {
	c := &cobra.Command{Use: "check", Short: "verify the ledger's invariants on every host", Args: noArgs,
		Long: `Verify, host by host, that no pCPU or PCI device has two owners, that usage
equals the claims, that every committed claim is its instance's placement,
and that every host the ledger names has its topology. It exits 1 on a
problem.`}
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, _ []string) error { return check(asJSON, c.OutOrStdout()) }
	return c
}

// check verifies, host by host, that no pCPU or PCI device has two owners and the
// usage counters equal the claims' sum (Snapshot.Verify), and that every
// committed claim is the one its instance's record names, with the same
// placement. Pending claims belong to operations in flight, source holds
// to resizes and tombstones to evacuated guests of fenced hosts. A host
// the ledger names (registry, keys, instance records) without a topology
// is a problem too (ledger.LostHosts): its snapshot cannot be read.
func check(asJSON *bool, stdout io.Writer) error {
	return withApp(func(a *app) error {
		led, err := a.ledger()
		if err != nil {
			return err
		}
		hosts, err := sortedHosts(a, led)
		if err != nil {
			return err
		}
		r := checkReport{Hosts: len(hosts), Problems: []string{}}
		instances := map[string]bool{}
		err = walkFleet(a.ctx, hosts, func(ctx context.Context, h string) (*hostCheck, error) {
			return checkHost(ctx, led, h)
		}, func(_ string, hc *hostCheck) error {
			if hc == nil {
				return nil
			}
			r.Claims += hc.claims
			r.Pending += hc.pending
			r.Held += hc.held
			r.Tombstone += hc.tombstones
			r.Problems = append(r.Problems, hc.problems...)
			for _, u := range hc.instances {
				instances[u] = true
			}
			return nil
		})
		if err != nil {
			return err
		}
		lost, err := led.LostHosts(a.ctx)
		if err != nil {
			return err
		}
		for _, h := range lost {
			r.Problems = append(r.Problems, h.String())
		}
		r.Instances = len(instances)
		if *asJSON {
			if err := writeJSON(stdout, r); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(stdout, "%d hosts, %d claims (%d pending: operations in flight; %d source holds; %d tombstones), %d placed instances\n",
				r.Hosts, r.Claims, r.Pending, r.Held, r.Tombstone, r.Instances)
			for _, p := range r.Problems {
				fmt.Fprintln(stdout, "  PROBLEM: "+p)
			}
			if len(r.Problems) == 0 {
				fmt.Fprintln(stdout, "ok: every host named has its topology, no pCPU or PCI device has two owners, usage equals the claims, and every committed claim is its instance's placement")
			}
		}
		if len(r.Problems) > 0 {
			return fmt.Errorf("check found %d problems", len(r.Problems))
		}
		return nil
	})
}

// hostCheck is what check found on one host.
type hostCheck struct {
	claims, pending, held, tombstones int
	instances                         []string // of its committed claims
	problems                          []string
}

// checkHost checks one host's snapshot and that each committed claim is
// the one its instance's record names; nil when the host is gone.
func checkHost(ctx context.Context, led *ledger.Ledger, h string) (*hostCheck, error) {
	snap, err := led.Snapshot(ctx, h)
	if errors.Is(err, ledger.ErrUnknownHost) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	hc := &hostCheck{}
	if err := snap.Verify(); err != nil {
		hc.problems = append(hc.problems, fmt.Sprintf("host %s: %v", h, err))
	}
	for _, c := range snap.Claims {
		hc.claims++
		switch c.State {
		case ledger.StatePending:
			hc.pending++
			continue
		case ledger.StateHeld:
			// A resize's source hold: its record names the destination.
			hc.held++
			continue
		case ledger.StateTombstone:
			hc.tombstones++
			continue
		}
		hc.instances = append(hc.instances, c.InstanceUUID)
		inst, err := led.Instance(ctx, c.InstanceUUID)
		switch {
		case errors.Is(err, ledger.ErrUnknownInstance):
			hc.problems = append(hc.problems, fmt.Sprintf("host %s: committed claim %s belongs to instance %s, which has no record", h, c.ID, c.InstanceUUID))
		case err != nil:
			return nil, err
		case inst.Host != h || inst.ClaimID != c.ID:
			hc.problems = append(hc.problems, fmt.Sprintf("host %s: committed claim %s of %s, but its record names claim %q on %q", h, c.ID, inst.Name, inst.ClaimID, inst.Host))
		case inst.Placement == nil || c.Placement == nil || inst.Placement.String() != c.Placement.String():
			hc.problems = append(hc.problems, fmt.Sprintf("host %s: instance %s's placement differs from its claim %s", h, inst.Name, c.ID))
		}
	}
	return hc, nil
}
