package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/numa"
)

// AddHost makes host known with the topology topo; its usage (pinned CPUs,
// used memory and pages) is not stored, since the ledger owns usage. Adding
// a host again with the same topology succeeds; with a different one it is
// an error wrapping hypervisor.ErrRejected (remove the host first).
func (d *Driver) AddHost(ctx context.Context, host string, topo *numa.Host) error {
	if !hostNameRE.MatchString(host) {
		return fmt.Errorf("sim: add host %q: a host name is 1-253 letters, digits, '.', '_' or '-', starting with a letter or digit", host)
	}
	if topo == nil {
		return fmt.Errorf("sim: add host %s: topology is nil; a host needs one", host)
	}
	if err := topo.Validate(); err != nil {
		return fmt.Errorf("sim: add host %s: %w", host, err)
	}
	data, err := json.Marshal(topo.WithoutUsage())
	if err != nil {
		return fmt.Errorf("sim: add host %s: %w", host, err)
	}
	code, _, err := d.run(ctx, addHostScript, []string{d.topoKey(host)}, data)
	if err != nil {
		return fmt.Errorf("sim: add host %s: %w", host, err)
	}
	if code == "EXISTS" {
		return fmt.Errorf("sim: add host %s: the host exists with a different topology; remove it first: %w", host, hypervisor.ErrRejected)
	}
	// The set comes second: a crash in between leaves a host that a
	// retried AddHost completes.
	if err := d.rdb.SAdd(ctx, d.hostsKey(), host).Err(); err != nil {
		return fmt.Errorf("sim: add host %s: %w", host, err)
	}
	return nil
}

// RemoveHost forgets host, its latencies and faults and its power
// state (a host added again is on). A host that still holds domains is not
// removed (an error wrapping hypervisor.ErrRejected: undefine them first);
// removing an unknown host succeeds.
func (d *Driver) RemoveHost(ctx context.Context, host string) error {
	keys := []string{d.topoKey(host), d.domainsKey(host), d.latencyKey(host), d.faultsKey(host), d.powerKey(host)}
	code, rest, err := d.run(ctx, removeHostScript, keys)
	if err != nil {
		return fmt.Errorf("sim: remove host %s: %w", host, err)
	}
	if code == "BUSY" {
		return fmt.Errorf("sim: remove host %s: it holds %s domains; undefine them first: %w", host, rest[0], hypervisor.ErrRejected)
	}
	if err := d.rdb.SRem(ctx, d.hostsKey(), host).Err(); err != nil {
		return fmt.Errorf("sim: remove host %s: %w", host, err)
	}
	return nil
}

// Hosts returns the names of the known hosts, sorted.
func (d *Driver) Hosts(ctx context.Context) ([]string, error) {
	names, err := d.rdb.SMembers(ctx, d.hostsKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("sim: hosts: %w", err)
	}
	// A host whose removal was interrupted is still in the set without a
	// topology; it is not a host any more.
	pipe := d.rdb.Pipeline()
	exists := make([]*redis.IntCmd, len(names))
	for i, h := range names {
		exists[i] = pipe.Exists(ctx, d.topoKey(h))
	}
	if len(names) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("sim: hosts: %w", err)
		}
	}
	out := make([]string, 0, len(names))
	for i, h := range names {
		if exists[i].Val() == 1 {
			out = append(out, h)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Capabilities returns the topology host was added with, without usage;
// an error wrapping ErrHostOff while host is powered off.
func (d *Driver) Capabilities(ctx context.Context, host string) (*numa.Host, error) {
	topo, err := d.topology(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("sim: capabilities of %s: %w", host, err)
	}
	return topo, nil
}

// topology reads a host's topology; an unknown host is ErrUnknownHost, a
// powered-off one ErrHostOff.
func (d *Driver) topology(ctx context.Context, host string) (*numa.Host, error) {
	pipe := d.rdb.Pipeline()
	topo := pipe.Get(ctx, d.topoKey(host))
	off := pipe.Exists(ctx, d.powerKey(host))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	data, err := topo.Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, unknownHost(host)
	}
	if err != nil {
		return nil, err
	}
	if off.Val() == 1 {
		return nil, hostOff(host)
	}
	var h numa.Host
	if err := json.Unmarshal(data, &h); err != nil {
		return nil, fmt.Errorf("stored topology of %s: %w", host, err)
	}
	return &h, nil
}

// checkHost returns ErrUnknownHost for a host that was never added, and
// ErrHostOff for one that is powered off.
func (d *Driver) checkHost(ctx context.Context, host string) error {
	pipe := d.rdb.Pipeline()
	known := pipe.Exists(ctx, d.topoKey(host))
	off := pipe.Exists(ctx, d.powerKey(host))
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	return hostStatus(host, known.Val() == 1, off.Val() == 1)
}

// hostStatus is the error of a call addressed to host, given whether the
// host is known and whether it is powered off.
func hostStatus(host string, known, off bool) error {
	switch {
	case !known:
		return unknownHost(host)
	case off:
		return hostOff(host)
	}
	return nil
}

func unknownHost(host string) error {
	return fmt.Errorf("host %q: %w; add it first", host, hypervisor.ErrUnknownHost)
}
