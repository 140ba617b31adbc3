package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

// listRow is one guest as `list --json` prints it.
type listRow struct {
	UUID      string  `json:"uuid"`
	Name      string  `json:"name"`
	Host      *string `json:"host"`
	VMState   string  `json:"vm_state"`
	TaskState *string `json:"task_state"`
	VCPUs     int     `json:"vcpus"`
	MemoryMB  int64   `json:"memory_mb"`
	// Pins is the pCPUs the guest is pinned to as a cpuset list ("2-5,8"),
	// PCPUs the same as a list; both empty without dedicated vCPUs.
	Pins    string       `json:"pins"`
	PCPUs   []int        `json:"pcpus"`
	ClaimID string       `json:"claim_id,omitempty"`
	Flavor  guest.Flavor `json:"flavor"`
	Group   string       `json:"group,omitempty"`
}

func listCommand() *cobra.Command {
	c := &cobra.Command{Use: "list", Short: "list the guests by host, then name", Args: noArgs}
	host := c.Flags().String("host", "", "only the guests on this host")
	state := c.Flags().String("state", "", "only the guests in this vm state or task state")
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, _ []string) error { return list(host, state, asJSON, c.OutOrStdout()) }
	return c
}

func list(host, state *string, asJSON *bool, stdout io.Writer) error {
	if *state != "" {
		if err := checkListState(*state); err != nil {
			return err
		}
	}
	return withApp(func(a *app) error {
		led, err := a.ledger()
		if err != nil {
			return err
		}
		if *host != "" {
			pf, err := a.ledgerClient()
			if err != nil {
				return err
			}
			if _, err := pf.HostStatus(a.ctx, *host); err != nil {
				return err
			}
		}
		insts, err := led.Instances(a.ctx)
		if err != nil {
			return err
		}
		rows := []listRow{}
		for _, in := range insts {
			if *host != "" && in.Host != *host {
				continue
			}
			if *state != "" && string(in.VMState) != *state && string(in.TaskState) != *state {
				continue
			}
			rows = append(rows, newListRow(in))
		}
		sortRows(rows)
		if *asJSON {
			return writeJSON(stdout, rows)
		}
		if len(rows) == 0 {
			fmt.Fprintln(stdout, "no guests"+listFilter(*host, *state))
			return nil
		}
		w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "UUID\tNAME\tHOST\tVM_STATE\tTASK_STATE\tVCPUS\tPINS\tGROUP")
		for _, r := range rows {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.UUID, r.Name, orDash(deref(r.Host)), r.VMState, orDash(deref(r.TaskState)), r.VCPUs, orDash(r.Pins), orDash(r.Group))
		}
		return w.Flush()
	})
}

// checkListState refuses a --state that is neither a vm state nor a task
// state, naming both lists as the ledger has them.
func checkListState(s string) error {
	var vms, tasks []string
	for _, v := range guest.VMStates() {
		if string(v) == s {
			return nil
		}
		vms = append(vms, string(v))
	}
	for _, t := range guest.TaskStates() {
		if t == guest.TaskNone {
			continue
		}
		if string(t) == s {
			return nil
		}
		tasks = append(tasks, string(t))
	}
	return fmt.Errorf("list: --state %q is not a state; allowed are the vm states %s and the task states %s: %w",
		s, strings.Join(vms, ", "), strings.Join(tasks, ", "), errUsage)
}

func newListRow(in *ledger.Instance) listRow {
	r := listRow{UUID: in.UUID, Name: in.Name, VMState: string(in.VMState), VCPUs: in.Request.VCPUs, MemoryMB: in.Request.MemoryMB,
		ClaimID: in.ClaimID, Flavor: in.Request, PCPUs: []int{}, Group: in.Group}
	if in.Host != "" {
		r.Host = &in.Host
	}
	if in.TaskState != guest.TaskNone {
		ts := string(in.TaskState)
		r.TaskState = &ts
	}
	if in.Placement != nil {
		pins := pinnedPCPUs(in.Placement)
		r.Pins, r.PCPUs = pins.String(), pins.List()
	}
	return r
}

// pinnedPCPUs is where the placement pins the guest: its vCPUs' pCPUs and
// an isolated emulator thread's. Siblings a claim keeps idle under thread
// policy isolate are not pins; host show lists them.
func pinnedPCPUs(p *numa.Placement) numa.CPUSet {
	var out numa.CPUSet
	for i := range p.Cells {
		c := &p.Cells[i]
		out = out.Union(c.PinnedPCPUs()).Union(c.Reserved)
	}
	return out
}

// sortRows orders guests by host, then name, then uuid; guests on no host
// come last.
func sortRows(rows []listRow) {
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if (a.Host == nil) != (b.Host == nil) {
			return b.Host == nil
		}
		if ha, hb := deref(a.Host), deref(b.Host); ha != hb {
			return ha < hb
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.UUID < b.UUID
	})
}

// listFilter says which filters an empty listing had.
func listFilter(host, state string) string {
	var parts []string
	if host != "" {
		parts = append(parts, "on host "+host)
	}
	if state != "" {
		parts = append(parts, "in state "+state)
	}
	if len(parts) == 0 {
		return ""
	}
	return " " + strings.Join(parts, " ")
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
