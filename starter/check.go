package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// checkReport is what `pinflow check --json` prints.
type checkReport struct {
	Hosts   int `json:"hosts"`
	Claims  int `json:"claims"`
	Pending int `json:"pending"`
	// Quarantined counts the quarantines: pending claims, but of no
	// operation; only an operator releases them.
	Quarantined int      `json:"quarantined"`
	Held        int      `json:"held"`
	Tombstone   int      `json:"tombstones"`
	Instances   int      `json:"instances"`
	Problems    []string `json:"problems"`
}

func checkCommand() *cobra.Command {
	c := &cobra.Command{Use: "check", Short: "verify the ledger's invariants and the pinning promise on every host", Args: noArgs,
		Long: `Verify, host by host, that no pCPU or PCI device has two owners, that usage
equals the claims, that every committed claim is its instance's placement,
and that every host the ledger names has its topology. Then read each
host's domains through the configured hypervisor driver and check the
promise itself: no running or paused guest may run (a vCPU, emulator or
I/O thread; a domain without a cpuset runs on the whole host) on pCPUs a
claim dedicates to another guest. A host whose domains cannot be read is
a problem too; a host fenced down is not read. --ledger-only reads no
hypervisor, for a machine that cannot reach them. It exits 1 on a
problem.`}
	asJSON := outputFlags(c.Flags())
	ledgerOnly := c.Flags().Bool("ledger-only", false, "check the ledger alone, reading no hypervisor")
	c.RunE = func(c *cobra.Command, _ []string) error { return check(asJSON, *ledgerOnly, c.OutOrStdout()) }
	return c
}

// check verifies, host by host, that no pCPU or PCI device has two owners and the
// usage counters equal the claims' sum (Snapshot.Verify), and that every
// committed claim is the one its instance's record names, with the same
// placement. Pending claims belong to operations in flight, quarantines
// to no operation (only an operator releases them), source holds to
// resizes and tombstones to evacuated guests of fenced hosts. A host the
// ledger names (registry, keys, instance records) without a topology is
// a problem too (ledger.LostHosts): its snapshot cannot be read. Unless
// ledgerOnly, each host's domains are checked against its claims
// (hypervisor.Breaches): the ledger can be sound while a guest started or
// edited outside pinflow, or defined before hosts kept their shared CPUs
// apart, runs on another guest's pCPUs.
func check(asJSON *bool, ledgerOnly bool, stdout io.Writer) error {
	return withApp(func(a *app) error {
		led, err := a.ledger()
		if err != nil {
			return err
		}
		var drv hypervisor.Driver
		if !ledgerOnly {
			d, err := a.cfg.NewDriver(a.rdb)
			if err != nil {
				return err
			}
			if c, ok := d.(io.Closer); ok {
				defer func() { _ = c.Close() }()
			}
			drv = d
			if a.tel != nil {
				drv = a.tel.Driver(d)
			}
		}
		hosts, err := sortedHosts(a, led)
		if err != nil {
			return err
		}
		r := checkReport{Hosts: len(hosts), Problems: []string{}}
		instances := map[string]bool{}
		err = walkFleet(a.ctx, hosts, func(ctx context.Context, h string) (*hostCheck, error) {
			return checkHost(ctx, led, drv, h)
		}, func(_ string, hc *hostCheck) error {
			if hc == nil {
				return nil
			}
			r.Claims += hc.claims
			r.Pending += hc.pending
			r.Quarantined += hc.quarantined
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
			fmt.Fprintf(stdout, "%s, %s (%d pending: operations in flight; %d quarantined; %d source holds; %d tombstones), %s\n",
				count(r.Hosts, "host", "hosts"), count(r.Claims, "claim", "claims"), r.Pending, r.Quarantined, r.Held, r.Tombstone, count(r.Instances, "placed instance", "placed instances"))
			for _, p := range r.Problems {
				fmt.Fprintln(stdout, "  PROBLEM: "+p)
			}
			if len(r.Problems) == 0 {
				promise := ", and no running guest may run on another guest's pinned pCPUs"
				if ledgerOnly {
					promise = " (the hypervisors were not read)"
				}
				fmt.Fprintln(stdout, "ok: every host named has its topology, no pCPU or PCI device has two owners, usage equals the claims, every committed claim is its instance's placement"+promise)
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
	claims, pending, quarantined, held, tombstones int
	instances                                      []string // of its committed claims
	problems                                       []string
}

// checkHost checks one host's snapshot, that each committed claim is the
// one its instance's record names, and, with a driver, the host's domains
// against its claims (unless the host is down); nil when the host is
// gone.
func checkHost(ctx context.Context, led *ledger.Ledger, drv hypervisor.Driver, h string) (*hostCheck, error) {
	snap, err := led.Snapshot(ctx, h)
	if errors.Is(err, ledger.ErrUnknownHost) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	hc := &hostCheck{}
	records := map[string]*ledger.Instance{} // of the committed claims their records name
	if err := snap.Verify(); err != nil {
		hc.problems = append(hc.problems, fmt.Sprintf("host %s: %v", h, err))
	}
	for _, c := range snap.Claims {
		hc.claims++
		switch {
		case c.Kind == ledger.KindQuarantine:
			// Pending, but of no operation: only an operator releases it.
			hc.quarantined++
			continue
		case c.State == ledger.StatePending:
			hc.pending++
			continue
		case c.State == ledger.StateHeld:
			// A resize's source hold: its record names the destination.
			hc.held++
			continue
		case c.State == ledger.StateTombstone:
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
		default:
			records[inst.UUID] = inst
		}
	}
	if drv == nil || snap.Status.State == ledger.HostDown {
		// A host fenced down: its hypervisor does not answer.
		return hc, nil
	}
	doms, err := drv.Domains(ctx, h)
	if err != nil {
		hc.problems = append(hc.problems, fmt.Sprintf("host %s: its domains cannot be read, so no guest's pins were checked: %v", h, err))
		return hc, nil
	}
	hc.problems = append(hc.problems, breachProblems(snap, doms)...)
	hc.problems = append(hc.problems, powerProblems(h, doms, records)...)
	return hc, nil
}

// powerProblems are the guests of records whose domain on host h is shut
// off while the record says active, or runs while it says stopped, with
// no operation's task under way (the audit records the state it sees),
// and those recorded active or stopped on h with no domain there at all.
func powerProblems(h string, doms []hypervisor.Domain, records map[string]*ledger.Instance) []string {
	var out []string
	seen := map[string]bool{}
	for _, d := range doms {
		seen[d.UUID] = true
	}
	for _, u := range slices.Sorted(maps.Keys(records)) {
		inst := records[u]
		if !seen[u] && inst.TaskState == guest.TaskNone && (inst.VMState == guest.VMActive || inst.VMState == guest.VMStopped) {
			out = append(out, fmt.Sprintf("host %s: instance %s is recorded %s there, but the host has no domain of it", h, inst.Name, inst.VMState))
		}
	}
	for _, d := range doms {
		inst := records[d.UUID]
		if inst == nil || inst.TaskState != guest.TaskNone {
			continue
		}
		if (inst.VMState == guest.VMActive && d.State == hypervisor.StateShutoff) || (inst.VMState == guest.VMStopped && d.State == hypervisor.StateRunning) {
			out = append(out, fmt.Sprintf("host %s: instance %s is recorded %s but its domain is %s; the audit records the state it sees",
				h, inst.Name, inst.VMState, d.State))
		}
	}
	return out
}

// breachProblems are the problem lines of the domains (doms) of the host
// of snap that may run on pCPUs a claim of snap dedicates to another
// guest (hypervisor.Breaches), on the whole host's CPUs, shared or
// pinnable.
func breachProblems(snap *ledger.Snapshot, doms []hypervisor.Domain) []string {
	guest := make(map[string]string, len(snap.Claims))
	for _, c := range snap.Claims {
		guest[c.ID] = c.InstanceUUID
	}
	owners := make(map[int]hypervisor.Owner, len(snap.Pins))
	for _, p := range snap.Pins {
		g, ok := guest[p.ClaimID]
		if !ok {
			// A pin of a missing claim, which Verify reports: still no
			// other guest's to run on.
			g = p.InstanceUUID
		}
		owners[p.CPU] = hypervisor.Owner{Claim: p.ClaimID, Guest: g}
	}
	var all numa.CPUSet
	for _, c := range snap.Topology.Cells {
		all = all.Union(c.CPUs).Union(c.PCPUs)
	}
	var out []string
	for _, b := range hypervisor.Breaches(doms, all, owners) {
		out = append(out, fmt.Sprintf("host %s: %s", snap.Host, b))
	}
	return out
}
