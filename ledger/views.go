package ledger

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/numa"
)

// readChunk bounds the commands of one pipeline of a many-host read: the
// server answers a chunk while the client reads the previous one's reply.
const readChunk = 1000

// HostVersion identifies one state of a host's ledger: two reads of a
// host with the same version saw the same topology and usage.
type HostVersion struct {
	// Gen is the topology generation; 0 when the host is not registered.
	Gen int64
	// Rev grows with every claim and release.
	Rev int64
	// Digest names the topology.
	Digest string
}

// HostView is one host's topology and usage as one atomic read saw them.
type HostView struct {
	Name    string
	Version HostVersion
	// Topology is the host without usage; Host is it with the usage.
	// Both are nil when the host is not registered. Views of hosts of one
	// topology share its sibling groups, cpusets and limits: read them,
	// never change them.
	Topology *numa.Host
	Host     *numa.Host
}

// HostVersions returns the versions of many hosts, read in pipelines: a
// few round trips for thousands of hosts. A host that is not registered
// has the zero version.
func (l *Ledger) HostVersions(ctx context.Context, names []string) ([]HostVersion, error) {
	if err := checkHostNames("host versions", names); err != nil {
		return nil, err
	}
	out := make([]HostVersion, len(names))
	for lo := 0; lo < len(names); lo += readChunk {
		chunk := names[lo:min(lo+readChunk, len(names))]
		cmds := make([]*redis.SliceCmd, len(chunk))
		if _, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, h := range chunk {
				cmds[i] = p.HMGet(ctx, l.hostKeys(h).topo, "gen", "rev", "digest")
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("ledger: host versions: %w", err)
		}
		for i, c := range cmds {
			v := c.Val()
			gen, _ := v[0].(string)
			rev, _ := v[1].(string)
			digest, _ := v[2].(string)
			if gen == "" {
				continue
			}
			hv := HostVersion{Digest: digest}
			var err error
			if hv.Gen, err = strconv.ParseInt(gen, 10, 64); err != nil {
				return nil, fmt.Errorf("ledger: version of host %s: stored generation %q is not a number", chunk[i], gen)
			}
			if rev != "" {
				if hv.Rev, err = strconv.ParseInt(rev, 10, 64); err != nil {
					return nil, fmt.Errorf("ledger: version of host %s: stored revision %q is not a number", chunk[i], rev)
				}
			}
			out[lo+i] = hv
		}
	}
	return out, nil
}

// ReadHosts reads many hosts' topologies and usage, each host in one
// atomic step as Host does, all in pipelines. known says which topology
// the caller holds for a host, and its digest ("" and nil for none): a
// host that still has it comes without its topology, and its view shares
// the caller's. A topology read comes once per digest and call. Unlike
// Host, ReadHosts leaves this ledger's caches alone: a reader of every
// host would otherwise keep a cache of each.
func (l *Ledger) ReadHosts(ctx context.Context, names []string, known func(host string) (digest string, topo *numa.Host)) ([]HostView, error) {
	if err := checkHostNames("read hosts", names); err != nil {
		return nil, err
	}
	out := make([]HostView, len(names))
	held := make([]*numa.Host, len(names))
	decoded := map[string]*numa.Host{}
	for lo := 0; lo < len(names); lo += readChunk {
		chunk := names[lo:min(lo+readChunk, len(names))]
		digests := make([]string, len(chunk))
		for i, h := range chunk {
			if known != nil {
				if d, t := known(h); t != nil {
					digests[i], held[lo+i] = d, t
				}
			}
		}
		cmds := make([]*redis.Cmd, len(chunk))
		run := func(p redis.Pipeliner, i int, eval bool) {
			keys := l.hostKeys(chunk[i]).all()
			if eval {
				cmds[i] = readScript.Eval(ctx, p, keys, digests[i], "")
			} else {
				cmds[i] = readScript.EvalSha(ctx, p, keys, digests[i], "")
			}
		}
		if _, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range chunk {
				run(p, i, false)
			}
			return nil
		}); err != nil && !redis.HasErrorPrefix(err, "NOSCRIPT") {
			return nil, fmt.Errorf("ledger: read hosts: %w", err)
		}
		var again []int
		for i, c := range cmds {
			if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				again = append(again, i)
			}
		}
		if len(again) > 0 {
			// A server that has not seen the script yet: EVAL loads it.
			if _, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, i := range again {
					run(p, i, true)
				}
				return nil
			}); err != nil {
				return nil, fmt.Errorf("ledger: read hosts: %w", err)
			}
		}
		for i, c := range cmds {
			res, err := c.Slice()
			if err != nil {
				return nil, fmt.Errorf("ledger: read host %s: %w", chunk[i], err)
			}
			v, err := viewOf(chunk[i], res, digests[i], held[lo+i], decoded)
			if err != nil {
				return nil, fmt.Errorf("ledger: read host %s: %w", chunk[i], err)
			}
			out[lo+i] = v
		}
	}
	return out, nil
}

// viewOf makes a view of the read script's reply (see readState); held is
// the caller's topology of digest asked, decoded the topologies this call
// decoded.
func viewOf(name string, res []any, asked string, held *numa.Host, decoded map[string]*numa.Host) (HostView, error) {
	v := HostView{Name: name}
	if len(res) == 0 {
		return v, nil
	}
	if len(res) != 7 {
		return v, fmt.Errorf("read script returned %d values, want 7", len(res))
	}
	genStr, _ := res[0].(string)
	revStr, _ := res[3].(string)
	v.Version.Digest, _ = res[1].(string)
	var err error
	if v.Version.Gen, err = strconv.ParseInt(genStr, 10, 64); err != nil {
		return v, fmt.Errorf("stored generation %q is not a number", genStr)
	}
	if v.Version.Rev, err = strconv.ParseInt(revStr, 10, 64); err != nil {
		return v, fmt.Errorf("stored revision %q is not a number", revStr)
	}
	switch data, sent := res[2].(string); {
	case sent && decoded[v.Version.Digest] != nil:
		v.Topology = decoded[v.Version.Digest]
	case sent:
		topo, err := decodeTopology(data)
		if err != nil {
			return v, err
		}
		decoded[v.Version.Digest] = topo
		v.Topology = topo
	case held != nil && asked == v.Version.Digest:
		v.Topology = held
	default:
		return v, fmt.Errorf("read script sent no topology for a changed digest")
	}
	pins, _ := res[4].(string)
	usage, _ := res[5].(string)
	v.Host = composeView(v.Topology, parsePins(pins), parseCounters(usage))
	return v, nil
}

// composeView is compose for a view: the host shares what usage leaves
// alone (sibling groups, cpusets, limits) with topo instead of copying it.
func composeView(topo *numa.Host, pins pinSet, usage map[string]int64) *numa.Host {
	h := *topo
	h.Devices = pins.freeDevices(topo)
	h.Cells = make([]numa.Cell, len(topo.Cells))
	n := 0
	for _, c := range topo.Cells {
		n += len(c.Pages)
	}
	pools := make([]numa.PagePool, 0, n)
	pinned := numa.NewCPUSet(pins.cpus...)
	h.MemoryUsedMB, h.VCPUUsage = usage[hostMemField], int(usage[hostVCPUsField])
	for i, c := range topo.Cells {
		at := len(pools)
		pools = append(pools, c.Pages...)
		c.Pages = pools[at:len(pools):len(pools)]
		c.PinnedCPUs = pinned.Intersection(c.PCPUs)
		c.MemoryUsedMB = usage[usageField(c.ID, "mem")]
		c.CPUUsage = int(usage[usageField(c.ID, "shared")])
		for j := range c.Pages {
			c.Pages[j].Used = usage[pagesField(c.ID, c.Pages[j].SizeKB)]
		}
		h.Cells[i] = c
	}
	return &h
}

func checkHostNames(op string, names []string) error {
	for _, h := range names {
		if err := checkHostName(h); err != nil {
			return fmt.Errorf("ledger: %s: %w", op, err)
		}
	}
	return nil
}
