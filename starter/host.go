package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/client"
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
)

func hostCommand() *cobra.Command {
	return group("host", "register, inspect, drain, fence and restore hypervisor hosts",
		hostAddCommand(), hostListCommand(), hostShowCommand(), hostDisableCommand(), hostEnableCommand(),
		hostPlanDrainCommand(), hostDrainCommand(), hostUndrainCommand(), hostPlanDefragCommand(), hostDefragCommand(),
		hostDownCommand(), hostEvacuateCommand(), hostUpCommand(), hostRemoveCommand())
}

// hostCommandOf is a command on the registered host its one argument names.
func hostCommandOf(use, short, long string) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Long: long, Args: hostArg, ValidArgsFunction: hostNames}
}

func hostAddCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "add NAME",
		Short: "register a host, simulated or reached through libvirt",
		Long: `Register a host in three ways:

  host add NAME --cells N --cores N [--threads N] [--memory-mb N] [--hugepages 2M:N,1G:N]
      a uniform topology: N cells of N cores of N threads; --memory-mb and
      --hugepages are per NUMA cell, so a host of 2 cells and --memory-mb
      16384 has 32 GiB
  host add NAME --topology FILE
      a JSON host object of the reference case format (- reads standard input)
  host add NAME --libvirt URI [--migrate-uri URI]
      the topology libvirt reports for the host

--dedicated and --shared are Nova's cpu_dedicated_set and cpu_shared_set;
they must not overlap. Guests without pinned vCPUs float on the shared set
alone; with neither flag every CPU is for pinned guests and none is
shared, so such guests go elsewhere. The limit flags are Nova's allocation
ratios and reserved memory; with none of them the host takes Nova's
defaults.`,
		Args: hostArg,
	}
	fs := c.Flags()
	topology := fs.String("topology", "", "a JSON host object (the reference case format)")
	cells := fs.Int("cells", 0, "NUMA cells")
	cores := fs.Int("cores", 0, "cores per cell")
	threads := fs.Int("threads", 1, "threads per core")
	dedicated := fs.String("dedicated", "", "cpu_dedicated_set, e.g. 2-15")
	shared := fs.String("shared", "", "cpu_shared_set, e.g. 0-1")
	memory := fs.Int64("memory-mb", 16384, "memory of each NUMA cell, MiB (not of the host)")
	huge := fs.String("hugepages", "", "huge pages of each NUMA cell, e.g. 2M:512,1G:4")
	asJSON := outputFlags(fs)
	libvirtURI := fs.String("libvirt", "", "register a libvirt host by URI; its topology comes from libvirt")
	migrateURI := fs.String("migrate-uri", "", "with --libvirt: the migrate_uri for migrations to this host, e.g. tcp://10.0.0.2")
	deviceSpec := fs.String("device-spec", "", `with --libvirt: the PCI devices guests may take, a JSON array as Nova's [pci] device_spec`)
	cpuRatio := fs.Float64("cpu-allocation-ratio", 4, "shared vCPUs per shared CPU (Nova's cpu_allocation_ratio)")
	ramRatio := fs.Float64("ram-allocation-ratio", 1, "guest memory per MiB of host memory (Nova's ram_allocation_ratio)")
	reserved := fs.Int64("reserved-host-memory-mb", 0, "memory kept for the host, MiB (Nova's reserved_host_memory_mb)")
	c.RunE = func(c *cobra.Command, args []string) error {
		name, stdout := args[0], c.OutOrStdout()
		limits, err := hostLimits(fs, *cpuRatio, *ramRatio, *reserved)
		if err != nil {
			return err
		}
		req := client.AddHostRequest{Name: name}
		if *deviceSpec != "" && *libvirtURI == "" {
			return fmt.Errorf("host add: --device-spec picks devices libvirt reports; give --libvirt URI, or pci_devices in the --topology file: %w", errUsage)
		}
		if *libvirtURI != "" {
			if *topology != "" || *cells != 0 || *cores != 0 {
				return fmt.Errorf("host add: --libvirt reads the topology from libvirt; drop --topology/--cells/--cores: %w", errUsage)
			}
			req.Libvirt = &libvirthost.Config{URI: *libvirtURI, MigrateURI: *migrateURI, CPUDedicatedSet: *dedicated, CPUSharedSet: *shared,
				DeviceSpec: *deviceSpec}
			req.Limits = limits
		} else {
			var host *numa.Host
			switch {
			case *topology != "" && *cells != 0:
				return fmt.Errorf("host add: give --topology or --cells/--cores/--threads, not both: %w", errUsage)
			case *topology != "":
				if host, err = readTopology(*topology); err != nil {
					return fmt.Errorf("%w: %w", err, errUsage)
				}
			case *cells != 0 || *cores != 0:
				spec := numa.UniformSpec{Cells: *cells, Cores: *cores, Threads: *threads, MemoryMB: *memory}
				if spec.Dedicated, err = numa.Parse(*dedicated); err != nil {
					return fmt.Errorf("host add: --dedicated: %w: %w", err, errUsage)
				}
				if spec.Shared, err = numa.Parse(*shared); err != nil {
					return fmt.Errorf("host add: --shared: %w: %w", err, errUsage)
				}
				if spec.HugePages, err = parseHugePages(*huge); err != nil {
					return err
				}
				if host, err = numa.Uniform(spec); err != nil {
					return fmt.Errorf("host add: %w: %w", err, errUsage)
				}
			default:
				return fmt.Errorf("host add %s: give --topology FILE or --cells N --cores N: %w", name, errUsage)
			}
			host.Limits = limits
			req.Topology = host
		}
		return withClient(func(a *app, pf *client.Client) error {
			res, err := pf.AddHost(a.ctx, req)
			if err != nil {
				return err
			}
			return printRegistered(stdout, req, res, *asJSON)
		})
	}
	return c
}

// printRegistered says that a host was registered, and with what.
func printRegistered(stdout io.Writer, req client.AddHostRequest, res *api.HostAddResult, asJSON bool) error {
	if asJSON {
		out := map[string]any{"host": res.Host, "generation": res.Generation, "topology": numa.SpecOf(res.Topology)}
		if req.Libvirt != nil {
			out["uri"] = req.Libvirt.URI
		}
		return writeJSON(stdout, out)
	}
	pcpus := 0
	for _, c := range res.Topology.Cells {
		pcpus += c.PCPUs.Len()
	}
	if req.Libvirt != nil {
		fmt.Fprintf(stdout, "libvirt host %s registered from %s: %d cells, %d pinnable CPUs (generation %d)\n",
			res.Host, req.Libvirt.URI, len(res.Topology.Cells), pcpus, res.Generation)
		return nil
	}
	fmt.Fprintf(stdout, "host %s registered: %d cells, %d pinnable CPUs (generation %d)\n", res.Host, len(res.Topology.Cells), pcpus, res.Generation)
	return nil
}

// readTopology reads a host object of the reference case format; usage in
// it (pinned CPUs, memory used) is ignored: the ledger owns usage.
func readTopology(file string) (*numa.Host, error) {
	data, err := readInput(file)
	if err != nil {
		return nil, fmt.Errorf("host add: %w", err)
	}
	var spec numa.HostSpec
	dec := json.NewDecoder(strings.NewReader(string(data)))
	// A misspelt key ("cpu_dedicated_sets", "tag") would leave its
	// setting out and register the host otherwise than meant.
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		if _, field, ok := strings.Cut(err.Error(), "json: unknown field "); ok {
			return nil, fmt.Errorf("host add: --topology %s: unknown key %s; allowed are, in the host object %s, in a cell %s, in a device of pci_devices %s",
				file, field, jsonKeys(numa.HostSpec{}), jsonKeys(numa.CellSpec{}), jsonKeys(numa.PCIDevice{}))
		}
		return nil, fmt.Errorf("host add: --topology %s: not a JSON host object: %v", file, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("host add: --topology %s: more than one JSON value; a topology file holds one host object", file)
	}
	host, err := spec.Host(nil)
	if err != nil {
		return nil, fmt.Errorf("host add: --topology %s: %w", file, err)
	}
	for i := range host.Cells {
		c := &host.Cells[i]
		c.PinnedCPUs, c.MemoryUsedMB, c.CPUUsage = numa.CPUSet{}, 0, 0
		for j := range c.Pages {
			c.Pages[j].Used = 0
		}
	}
	return host, nil
}

// jsonKeys lists the JSON keys of struct v's fields.
func jsonKeys(v any) string {
	t := reflect.TypeOf(v)
	var keys []string
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return strings.Join(keys, ", ")
}

// parseHugePages reads "2M:512,1G:4" into page size (KiB) -> count.
func parseHugePages(s string) (map[int64]int64, error) {
	out := map[int64]int64{}
	if s == "" {
		return out, nil
	}
	units := map[string]int64{"K": 1, "M": 1024, "G": 1024 * 1024}
	for _, part := range strings.Split(s, ",") {
		size, count, ok := strings.Cut(strings.TrimSpace(part), ":")
		n, err := strconv.ParseInt(count, 10, 64)
		if !ok || err != nil || n < 0 || len(size) < 2 {
			return nil, fmt.Errorf("host add: --hugepages %q: expected SIZE:COUNT pairs such as 2M:512,1G:4", s)
		}
		mult, ok := units[strings.ToUpper(size[len(size)-1:])]
		num, err := strconv.ParseInt(size[:len(size)-1], 10, 64)
		if !ok || err != nil || num <= 0 {
			return nil, fmt.Errorf("host add: --hugepages %q: page size %q must be a number with K, M or G, such as 2M", s, size)
		}
		if num > numa.MaxPageSizeKB/mult {
			return nil, fmt.Errorf("host add: --hugepages %q: page size %q: allowed are sizes up to %d KiB", s, size, numa.MaxPageSizeKB)
		}
		out[num*mult] = n
	}
	return out, nil
}

// sortedHosts returns the registered hosts in name order.
func sortedHosts(a *app, led *ledger.Ledger) ([]string, error) {
	hosts, err := led.Hosts(a.ctx)
	if err != nil {
		return nil, err
	}
	sort.Strings(hosts)
	return hosts, nil
}

// hostLimits reads the limit flags of host add: nil when none is given,
// which leaves the host without limits (numa.Host.HostLimits then applies
// the flags' defaults, Nova's initial ratios, to the host as a whole).
func hostLimits(fs *pflag.FlagSet, cpuRatio, ramRatio float64, reservedMB int64) (*numa.Limits, error) {
	if !fs.Changed("cpu-allocation-ratio") && !fs.Changed("ram-allocation-ratio") && !fs.Changed("reserved-host-memory-mb") {
		return nil, nil
	}
	for _, r := range []struct {
		flag string
		v    float64
	}{{"--cpu-allocation-ratio", cpuRatio}, {"--ram-allocation-ratio", ramRatio}} {
		if !(r.v > 0) || math.IsInf(r.v, 0) {
			return nil, fmt.Errorf("host add: %s %v: a ratio is a positive number: %w", r.flag, r.v, errUsage)
		}
	}
	if reservedMB < 0 {
		return nil, fmt.Errorf("host add: --reserved-host-memory-mb %d: reserved memory is 0 or more MiB: %w", reservedMB, errUsage)
	}
	return &numa.Limits{CPUAllocationRatio: cpuRatio, RAMAllocationRatio: ramRatio, ReservedHostMemoryMB: reservedMB}, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// hostView is a host as `host show --json` prints it.
type hostView struct {
	Host       string            `json:"host"`
	Generation int64             `json:"generation"`
	Status     ledger.HostStatus `json:"status"`
	// Usage is what all guests take of the host as a whole, beside the
	// cells: guests without a NUMA topology take nothing else.
	Usage  hostUsage  `json:"host_usage"`
	Cells  []cellView `json:"cells"`
	Claims []claimRow `json:"claims"`
	// Devices are the host's PCI devices in its list's order, each with
	// the claim that holds it, if any.
	Devices []deviceView `json:"devices,omitempty"`
}

// deviceView is one PCI device of a host and its owner.
type deviceView struct {
	numa.PCIDevice
	Owner *owner `json:"owner,omitempty"`
	// VFsInUse marks a free PF some of whose VFs are held: it cannot be
	// given whole until they are free.
	VFsInUse bool `json:"vfs_in_use,omitempty"`
}

// hostUsage is a host's host-level usage and limits (numa.Host.HostLimits).
type hostUsage struct {
	MemoryUsedMB  int64 `json:"memory_used_mb"`
	MemoryLimitMB int64 `json:"memory_limit_mb"`
	VCPUUsage     int   `json:"vcpu_usage"`
	VCPULimit     int64 `json:"vcpu_limit"`
}

type cellView struct {
	ID           int              `json:"id"`
	PCPUs        []int            `json:"pcpus"`
	SharedCPUs   []int            `json:"shared_cpus"`
	PinnedCPUs   []int            `json:"pinned_cpus"`
	Owners       map[string]owner `json:"owners"`
	MemoryMB     int64            `json:"memory_mb"`
	MemoryUsedMB int64            `json:"memory_used_mb"`
	CPUUsage     int              `json:"cpu_usage"`
	Pages        []numa.PagePool  `json:"mempages"`
}

type owner struct {
	Claim    string `json:"claim"`
	Instance string `json:"instance"`
	Name     string `json:"name,omitempty"`
	State    string `json:"state"`
}

type claimRow struct {
	ID       string `json:"id"`
	Instance string `json:"instance"`
	Kind     string `json:"kind"`
	State    string `json:"state"`
	Owner    string `json:"owner_workflow_id"`
	Created  string `json:"created_at"`
	Pins     string `json:"placement"`
}

// view builds the host view from a snapshot, naming instances.
func view(a *app, led *ledger.Ledger, name string) (*hostView, error) {
	snap, err := led.Snapshot(a.ctx, name)
	if err != nil {
		return nil, err
	}
	host := snap.Topology // with usage, read in the same atomic step as the pins
	names := map[string]string{}
	nameOf := func(uuid string) string {
		if n, ok := names[uuid]; ok {
			return n
		}
		if inst, err := led.Instance(a.ctx, uuid); err == nil {
			names[uuid] = inst.Name
		} else {
			names[uuid] = ""
		}
		return names[uuid]
	}
	v := &hostView{Host: name, Generation: snap.Generation, Status: snap.Status}
	memLimit, vcpuLimit := host.HostLimits()
	v.Usage = hostUsage{MemoryUsedMB: host.MemoryUsedMB, MemoryLimitMB: memLimit, VCPUUsage: host.VCPUUsage, VCPULimit: vcpuLimit}
	for _, c := range host.Cells {
		cv := cellView{ID: c.ID, PCPUs: c.PCPUs.List(), SharedCPUs: c.CPUs.List(), PinnedCPUs: c.PinnedCPUs.List(),
			Owners: map[string]owner{}, MemoryMB: c.MemoryMB, MemoryUsedMB: c.MemoryUsedMB, CPUUsage: c.CPUUsage, Pages: c.Pages}
		for _, p := range snap.Pins {
			if p.Cell == c.ID {
				cv.Owners[strconv.Itoa(p.CPU)] = owner{Claim: p.ClaimID, Instance: p.InstanceUUID, Name: nameOf(p.InstanceUUID), State: string(p.State)}
			}
		}
		v.Cells = append(v.Cells, cv)
	}
	devOwners := map[string]owner{}
	busyPF := map[string]bool{} // PFs some of whose VFs are held
	for _, p := range snap.Devices {
		devOwners[p.Address] = owner{Claim: p.ClaimID, Instance: p.InstanceUUID, Name: nameOf(p.InstanceUUID), State: string(p.State)}
		if d := host.PCIDevice(p.Address); d != nil && d.PhysFunction != "" {
			busyPF[d.PhysFunction] = true
		}
	}
	for _, d := range host.PCIDevices {
		dv := deviceView{PCIDevice: d}
		if o, ok := devOwners[d.Address]; ok {
			dv.Owner = &o
		} else {
			dv.VFsInUse = busyPF[d.Address]
		}
		v.Devices = append(v.Devices, dv)
	}
	for _, c := range snap.Claims {
		row := claimRow{ID: c.ID, Instance: c.InstanceUUID, Kind: string(c.Kind), State: string(c.State),
			Owner: c.OwnerWorkflowID, Created: c.CreatedAt.Format("2006-01-02T15:04:05Z07:00")}
		switch {
		case c.Placement != nil:
			row.Pins = c.Placement.String()
		case c.Target != nil:
			row.Pins = "re-pin of " + c.Repins + " to " + c.Target.String()
		}
		v.Claims = append(v.Claims, row)
	}
	return v, nil
}

func hostShowCommand() *cobra.Command {
	c := hostCommandOf("show NAME", "show a host's cells, pins, usage and claims", "")
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, args []string) error { return hostShow(args, asJSON, c.OutOrStdout()) }
	return c
}

func hostShow(pos []string, asJSON *bool, stdout io.Writer) error {
	return withApp(func(a *app) error {
		led, err := a.ledger()
		if err != nil {
			return err
		}
		v, err := view(a, led, pos[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, v)
		}
		renderHost(stdout, v, true)
		return nil
	})
}

func hostListCommand() *cobra.Command {
	c := &cobra.Command{Use: "list", Short: "show every host's pCPUs and which guest owns each", Args: noArgs,
		Long: `Draw every host's pCPU map: a line per NUMA cell, each pCPU with the guest that
owns it ('.' when free); * marks a pending claim of a running operation, ^ a
resize's source hold, ~ the tombstone of an evacuated guest.`}
	asJSON := outputFlags(c.Flags())
	c.RunE = func(c *cobra.Command, _ []string) error { return hostList(asJSON, c.OutOrStdout()) }
	return c
}

func hostList(asJSON *bool, stdout io.Writer) error {
	return withApp(func(a *app) error {
		led, err := a.ledger()
		if err != nil {
			return err
		}
		names, err := sortedHosts(a, led)
		if err != nil {
			return err
		}
		out := jsonArray{w: stdout}
		shown := 0
		err = walkFleet(a.ctx, names, func(_ context.Context, n string) (*hostView, error) {
			v, err := view(a, led, n)
			if errors.Is(err, ledger.ErrUnknownHost) {
				return nil, nil // removed meanwhile
			}
			return v, err
		}, func(_ string, v *hostView) error {
			if v == nil {
				return nil
			}
			shown++
			if *asJSON {
				return out.add(v)
			}
			renderHost(stdout, v, false)
			return nil
		})
		if err != nil {
			return err
		}
		if *asJSON {
			return out.close()
		}
		if shown == 0 {
			fmt.Fprintln(stdout, "no hosts; add one with: pinflow host add NAME --cells 2 --cores 4")
		}
		return nil
	})
}

// renderHost draws a host's pCPU map: one line per cell, each pCPU with
// the name of the guest that owns it, '.' when free.
func renderHost(w io.Writer, v *hostView, claims bool) {
	pcpus, free := 0, 0
	for _, c := range v.Cells {
		pcpus += len(c.PCPUs)
		free += len(c.PCPUs) - len(c.PinnedCPUs)
	}
	state := ""
	if v.Status.State != ledger.HostUp && v.Status.State != "" {
		state = fmt.Sprintf(" [%s: %s]", v.Status.State, v.Status.Reason)
		if v.Status.AutoEvacuate {
			state = fmt.Sprintf(" [%s, evacuated by every audit: %s]", v.Status.State, v.Status.Reason)
		}
	}
	fmt.Fprintf(w, "%s%s: %d cells, %d/%d pCPUs free\n", v.Host, state, len(v.Cells), free, pcpus)
	fmt.Fprintf(w, "  host  mem %d/%d MiB, shared vCPUs %d/%d\n", v.Usage.MemoryUsedMB, v.Usage.MemoryLimitMB, v.Usage.VCPUUsage, v.Usage.VCPULimit)
	for _, c := range v.Cells {
		var sb strings.Builder
		for _, cpu := range c.PCPUs {
			o, ok := c.Owners[strconv.Itoa(cpu)]
			label := "."
			if ok {
				label = o.Name
				if label == "" {
					label = shortID(o.Instance)
				}
				label += stateMark[ledger.ClaimState(o.State)]
			}
			fmt.Fprintf(&sb, " %d:%s", cpu, label)
		}
		fmt.Fprintf(w, "  cell %d  mem %d/%d MiB |%s\n", c.ID, c.MemoryUsedMB, c.MemoryMB, sb.String())
	}
	renderDevices(w, v.Devices, claims)
	if claims && len(v.Claims) > 0 {
		fmt.Fprintln(w, "  claims:")
		for _, c := range v.Claims {
			fmt.Fprintf(w, "    %s  %s %s  instance %s  owner %s  %s\n", c.ID, c.Kind, c.State, c.Instance, c.Owner, c.Pins)
		}
	}
	if claims {
		fmt.Fprintln(w, "  (* pending: claimed by a running operation; ^ source hold of a resize; ~ tombstone of an evacuated guest)")
	}
}

// renderDevices lists a host's PCI devices with their owners: each on its
// own line with its kind and NUMA node when detail is set, all on one line
// otherwise.
func renderDevices(w io.Writer, devs []deviceView, detail bool) {
	if len(devs) == 0 {
		return
	}
	label := func(d deviceView) string {
		switch {
		case d.Owner == nil && d.VFsInUse && detail:
			return "(its VFs are in use)"
		case d.Owner == nil:
			return "."
		}
		l := d.Owner.Name
		if l == "" {
			l = shortID(d.Owner.Instance)
		}
		return l + stateMark[ledger.ClaimState(d.Owner.State)]
	}
	if !detail {
		var sb strings.Builder
		for _, d := range devs {
			fmt.Fprintf(&sb, " %s:%s", d.Address, label(d))
		}
		fmt.Fprintf(w, "  devices |%s\n", sb.String())
		return
	}
	fmt.Fprintln(w, "  devices:")
	for _, d := range devs {
		node := "no NUMA node"
		if d.NUMANode != nil {
			node = fmt.Sprintf("cell %d", *d.NUMANode)
		}
		extra := ""
		if d.PhysFunction != "" {
			extra += " of " + d.PhysFunction
		}
		if n := d.Tags["physical_network"]; n != "" {
			extra += " on " + n
		}
		fmt.Fprintf(w, "    %s  %s:%s %s%s, %s  %s\n", d.Address, d.VendorID, d.ProductID, d.DevType, extra, node, label(d))
	}
}

// stateMark marks the pCPUs of claims that are not resident.
var stateMark = map[ledger.ClaimState]string{ledger.StatePending: "*", ledger.StateHeld: "^", ledger.StateTombstone: "~"}

func shortID(uuid string) string {
	if len(uuid) > 8 {
		return uuid[:8]
	}
	return uuid
}
