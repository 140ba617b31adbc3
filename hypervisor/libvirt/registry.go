package libvirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
	"github.com/pinflow/pinflow/numa"
)

// Registry keeps each host's libvirthost.Config in Redis, so a host registered once
// (`pinflow host add NAME --libvirt URI`) is known to every worker; its
// Resolve method is a Config.Resolve.
type Registry struct {
	rdb redis.UniversalClient
	key string
}

// NewRegistry returns the registry stored under prefix (e.g. "pinflow").
func NewRegistry(rdb redis.UniversalClient, prefix string) *Registry {
	return &Registry{rdb: rdb, key: prefix + ":libvirt:hosts"}
}

// Put records how to reach the host.
func (r *Registry) Put(ctx context.Context, name string, hc libvirthost.Config) error {
	if err := checkHostName(name); err != nil {
		return err
	}
	if err := hc.Validate(); err != nil {
		return fmt.Errorf("libvirt: host %s: %w", name, err)
	}
	data, err := json.Marshal(hc)
	if err != nil {
		return err
	}
	if err := r.rdb.HSet(ctx, r.key, name, data).Err(); err != nil {
		return fmt.Errorf("libvirt: record host %s: %w", name, err)
	}
	return nil
}

// Resolve returns how to reach the host, or an error wrapping
// hypervisor.ErrUnknownHost.
func (r *Registry) Resolve(ctx context.Context, name string) (libvirthost.Config, error) {
	data, err := r.rdb.HGet(ctx, r.key, name).Bytes()
	if errors.Is(err, redis.Nil) {
		return libvirthost.Config{}, fmt.Errorf("libvirt: host %s is not registered: %w", name, hypervisor.ErrUnknownHost)
	}
	if err != nil {
		return libvirthost.Config{}, fmt.Errorf("libvirt: look up host %s: %w", name, err)
	}
	var hc libvirthost.Config
	if err := json.Unmarshal(data, &hc); err != nil {
		return libvirthost.Config{}, fmt.Errorf("libvirt: host %s: stored configuration is not valid JSON: %w", name, err)
	}
	return hc, nil
}

// Registrar registers libvirt hosts for every worker: it reads a host's
// topology through a driver of its own and records how to reach the host
// in the registry.
type Registrar struct {
	// New makes the driver each read uses; the read closes it.
	New      func() (*Driver, error)
	Registry *Registry
}

// Capabilities reads the NUMA topology of the host hc reaches. The host is
// registered with a driver made for this read alone, so a host that
// cannot be reached leaves no URI in any driver the workers use.
func (r Registrar) Capabilities(ctx context.Context, name string, hc libvirthost.Config) (*numa.Host, error) {
	d, err := r.New()
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if err := d.RegisterHost(name, hc); err != nil {
		return nil, err
	}
	return d.Capabilities(ctx, name)
}

// Record records how to reach the host, for every worker.
func (r Registrar) Record(ctx context.Context, name string, hc libvirthost.Config) error {
	return r.Registry.Put(ctx, name, hc)
}
