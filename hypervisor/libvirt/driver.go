// Package libvirt is pinflow's hypervisor.Driver for real hosts: it speaks
// libvirt's RPC protocol to each host's libvirtd (pure Go, through
// github.com/digitalocean/go-libvirt), reads host NUMA topology from the
// capabilities XML, manages persistent domains by UUID and live-migrates
// them peer to peer with a rewritten destination XML.
//
// Host names map to libvirt URIs through, in this order, hosts registered
// at run time (Register), the static Config.Hosts, and Config.Resolve. One
// connection per host is kept and dialled again after it fails.
//
// # Fencing a migration
//
// Migrate calls MigrateRequest.Fence, when set, right before it asks the
// source libvirtd to start the migration (DomainMigratePerform3Params), and
// then at every poll of the job's progress, every Config.ProgressInterval,
// until that call returns or the migration switches to post-copy. A fence
// that fails before the start means no migration was started. A fence that
// fails at a poll makes Migrate abort the job exactly as a cancelled ctx
// does (DomainAbortJob until the call returns): the guest keeps running on
// the source, the destination keeps nothing, and the error wraps
// hypervisor.ErrFenced and the fence's error. A switch to post-copy
// (DomainMigrateStartPostCopy) is a point of no return that Migrate
// chooses itself, so the fence is called right before it; a fence that
// refuses it aborts the job instead.
//
// That is all the fence guarantees. libvirt has no hook right before its
// own switchover, so a fence failure can only abort a job that is still
// copying memory. A fence that would fail only after the last poll (up to
// one ProgressInterval before the switchover), or whose abort reaches
// libvirt once the switchover has begun, does not stop the migration: it
// completes, and Migrate returns nil with the guest on the destination.
// Covering that window is the job of the caller's lease on the claim the
// fence checks. Nor does a retried Migrate fence a migration that an
// earlier call left running and that it waits for instead of starting its
// own.
//
// # Migration policy
//
// MigrateRequest.Policy becomes libvirt's flags and parameters at the
// start: VIR_MIGRATE_AUTO_CONVERGE and VIR_MIGRATE_POSTCOPY when allowed,
// the bandwidth cap as the bandwidth (and, with post-copy, the
// bandwidth.postcopy) parameter, and the downtime limit through
// DomainMigrateSetMaxDowntime on the source just before it, 300ms (QEMU's
// default) when the policy sets none, since the limit stays on the guest
// after a migration that failed. The timeouts are Migrate's own, checked
// at each poll against the job's data remaining (the progress timeout
// tracks its lowest figure, which a migration that does not converge stops
// lowering) and the time since the start. One that fires aborts the job
// as a cancel does, or switches it to post-copy when the policy says so;
// a switch that fails, or that the fence refuses, aborts it instead. A
// retried Migrate that finds an earlier call's migration still running
// takes it over: it fences, times and aborts it as its own, the timeouts
// counted from the retry, and knows when it has switched to post-copy.
//
// A migration that fails after its switch to post-copy (the connection
// between the hosts broke) leaves the guest paused on both hosts, its
// memory split between them. Migrate resumes it (VIR_MIGRATE_POSTCOPY_RESUME)
// instead of resuming the source, a few times and then with an error
// wrapping hypervisor.ErrPostCopyFailed; called again it resumes again.
// A post-copy migration or resume that sends no data for
// Config.PostCopyStallTimeout is paused (VIR_DOMAIN_ABORT_JOB_POSTCOPY)
// and resumed the same way: past the switch nothing else bounds it.
// Rollback refuses such a migration with the same error.
package libvirt

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
)

// Driver is a hypervisor.Driver for hosts running libvirtd. It is safe for
// concurrent use.
type Driver struct {
	cfg Config

	mu         sync.Mutex
	registered map[string]libvirthost.Config
	conns      map[string]*pooled
}

var _ hypervisor.Driver = (*Driver)(nil)

// pooled is the connection slot of one host. Its one-token channel is the
// lock that serialises dialling, so a caller can stop waiting when its
// context ends.
type pooled struct {
	lock chan struct{}
	uri  string
	l    *golibvirt.Libvirt
}

// conn is a live connection to one host, as a method call sees it.
type conn struct {
	host string
	hc   libvirthost.Config
	l    *golibvirt.Libvirt
	d    *Driver
}

// New returns a driver for the hosts in cfg. It checks the configuration
// but does not connect; connections are made on first use.
func New(cfg Config) (*Driver, error) {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = DefaultProgressInterval
	}
	if cfg.AbortTimeout <= 0 {
		cfg.AbortTimeout = DefaultAbortTimeout
	}
	if cfg.PostCopyStallTimeout <= 0 {
		cfg.PostCopyStallTimeout = DefaultPostCopyStall
	}
	names := map[string]bool{}
	for _, m := range []HostMap{cfg.Hosts, cfg.MigrateURIs, cfg.CPUDedicatedSets, cfg.CPUSharedSets} {
		for name := range m {
			names[name] = true
		}
	}
	for _, name := range sortedKeys(names) {
		if err := checkHostName(name); err != nil {
			return nil, err
		}
		// Hosts registered later may use the per-host options, so only
		// the options are checked for hosts without a static URI.
		hc := cfg.withDefaults(name, libvirthost.Config{URI: cfg.Hosts[name]})
		if hc.URI == "" {
			hc.URI = "qemu:///system"
		}
		if err := hc.Validate(); err != nil {
			return nil, fmt.Errorf("libvirt: host %s: %w", name, err)
		}
	}
	return &Driver{cfg: cfg, registered: map[string]libvirthost.Config{}, conns: map[string]*pooled{}}, nil
}

// withDefaults fills the fields hc leaves empty from the per-host maps.
func (cfg *Config) withDefaults(name string, hc libvirthost.Config) libvirthost.Config {
	if hc.MigrateURI == "" {
		hc.MigrateURI = cfg.MigrateURIs[name]
	}
	if hc.CPUDedicatedSet == "" {
		hc.CPUDedicatedSet = cfg.CPUDedicatedSets[name]
	}
	if hc.CPUSharedSet == "" {
		hc.CPUSharedSet = cfg.CPUSharedSets[name]
	}
	return hc
}

// Register adds a host reached at uri, or changes the URI of a registered
// one; it takes precedence over Config.Hosts. The per-host options of the
// Config still apply to it.
func (d *Driver) Register(name, uri string) error {
	return d.RegisterHost(name, libvirthost.Config{URI: uri})
}

// RegisterHost adds or replaces a host with its full configuration. Empty
// fields other than URI fall back to the per-host options of the Config.
func (d *Driver) RegisterHost(name string, hc libvirthost.Config) error {
	if err := checkHostName(name); err != nil {
		return err
	}
	if err := hc.Validate(); err != nil {
		return fmt.Errorf("libvirt: register host %s: %w", name, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.registered[name] = hc
	return nil
}

// Unregister forgets a host added with Register and closes its
// connection. Hosts from Config.Hosts or Resolve stay reachable.
func (d *Driver) Unregister(name string) {
	d.mu.Lock()
	delete(d.registered, name)
	p := d.conns[name]
	delete(d.conns, name)
	d.mu.Unlock()
	if p != nil {
		p.lock <- struct{}{}
		if p.l != nil {
			go p.l.Disconnect()
		}
		p.l = nil
		<-p.lock
	}
}

// Hosts returns the names of the registered and statically configured
// hosts, sorted; hosts only Config.Resolve knows are not listed.
func (d *Driver) Hosts() []string {
	names := map[string]bool{}
	for n := range d.cfg.Hosts {
		names[n] = true
	}
	d.mu.Lock()
	for n := range d.registered {
		names[n] = true
	}
	d.mu.Unlock()
	return sortedKeys(names)
}

// HostConfig returns how the driver reaches host, or an error wrapping
// hypervisor.ErrUnknownHost.
func (d *Driver) HostConfig(ctx context.Context, host string) (libvirthost.Config, error) {
	d.mu.Lock()
	hc, ok := d.registered[host]
	d.mu.Unlock()
	if !ok {
		if uri, found := d.cfg.Hosts[host]; found {
			hc, ok = libvirthost.Config{URI: uri}, true
		}
	}
	if !ok && d.cfg.Resolve != nil {
		var err error
		if hc, err = d.cfg.Resolve(ctx, host); err != nil {
			return libvirthost.Config{}, fmt.Errorf("libvirt: host %s: resolving its URI: %w", host, err)
		}
		ok = true
	}
	if !ok {
		return libvirthost.Config{}, fmt.Errorf("libvirt: host %q is not configured; register it or list it in PINFLOW_LIBVIRT_HOSTS: %w", host, hypervisor.ErrUnknownHost)
	}
	hc = d.cfg.withDefaults(host, hc)
	if err := hc.Validate(); err != nil {
		return libvirthost.Config{}, fmt.Errorf("libvirt: host %s: %w", host, err)
	}
	return hc, nil
}

// Close disconnects from every host. The driver dials again if it is used
// afterwards.
func (d *Driver) Close() error {
	d.mu.Lock()
	pools := d.conns
	d.conns = map[string]*pooled{}
	d.mu.Unlock()
	var errs []error
	for _, name := range sortedKeys(pools) {
		p := pools[name]
		p.lock <- struct{}{}
		if p.l != nil {
			if err := p.l.Disconnect(); err != nil {
				errs = append(errs, fmt.Errorf("libvirt: host %s (%s): disconnect: %w", name, redactURI(p.uri), err))
			}
			p.l = nil
		}
		<-p.lock
	}
	return errors.Join(errs...)
}

// connect returns the host's pooled connection, dialling when there is
// none, it broke, or the host's URI changed.
func (d *Driver) connect(ctx context.Context, host string) (*conn, error) {
	hc, err := d.HostConfig(ctx, host)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	p := d.conns[host]
	if p == nil {
		p = &pooled{lock: make(chan struct{}, 1)}
		d.conns[host] = p
	}
	d.mu.Unlock()

	select {
	case p.lock <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("libvirt: host %s (%s): waiting to connect: %w", host, redactURI(hc.URI), ctx.Err())
	}
	defer func() { <-p.lock }()
	if p.l != nil && p.uri == hc.URI && p.l.IsConnected() {
		return &conn{host: host, hc: hc, l: p.l, d: d}, nil
	}
	if p.l != nil {
		// A broken or outdated connection; closing it may block on a dead
		// peer, which must not hold up this call.
		go p.l.Disconnect()
		p.l = nil
	}
	l, err := d.dial(ctx, hc.URI)
	if err != nil {
		return nil, fmt.Errorf("libvirt: host %s (%s): connect: %w", host, redactURI(hc.URI), err)
	}
	p.l, p.uri = l, hc.URI
	return &conn{host: host, hc: hc, l: l, d: d}, nil
}

// dial connects to a libvirtd, giving up at the dial timeout or when ctx
// ends; a connection that completes after that is closed.
func (d *Driver) dial(ctx context.Context, uri string) (*golibvirt.Libvirt, error) {
	u, err := libvirthost.ParseURI(uri)
	if err != nil {
		return nil, err
	}
	type result struct {
		l   *golibvirt.Libvirt
		err error
	}
	ch := make(chan result, 1)
	go func() {
		l, err := golibvirt.ConnectToURI(u)
		ch <- result{l, err}
	}()
	timer := time.NewTimer(d.cfg.DialTimeout)
	defer timer.Stop()
	abandon := func() {
		go func() {
			if r := <-ch; r.l != nil {
				r.l.Disconnect()
			}
		}()
	}
	select {
	case r := <-ch:
		return r.l, r.err
	case <-ctx.Done():
		abandon()
		return nil, ctx.Err()
	case <-timer.C:
		abandon()
		return nil, fmt.Errorf("no answer within %v", d.cfg.DialTimeout)
	}
}

// drop forgets c's connection after a transport failure, so the next call
// dials again.
func (c *conn) drop() {
	c.d.mu.Lock()
	p := c.d.conns[c.host]
	c.d.mu.Unlock()
	if p == nil {
		return
	}
	p.lock <- struct{}{}
	if p.l == c.l {
		go p.l.Disconnect()
		p.l = nil
	}
	<-p.lock
}

// call runs one libvirt RPC and returns early when ctx ends; the RPC then
// finishes in the background, since the protocol cannot cancel it.
func call[T any](ctx context.Context, c *conn, f func(l *golibvirt.Libvirt) (T, error)) (T, error) {
	var zero T
	if err := hypervisor.Expired(ctx); err != nil {
		return zero, err
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f(c.l)
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil && !isLibvirtError(r.err) {
			// Not an answer from libvirtd: the transport failed.
			c.drop()
		}
		return r.v, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// do is call for RPCs without a result.
func do(ctx context.Context, c *conn, f func(l *golibvirt.Libvirt) error) error {
	_, err := call(ctx, c, func(l *golibvirt.Libvirt) (struct{}, error) { return struct{}{}, f(l) })
	return err
}

// isLibvirtError reports whether err is an error libvirtd answered with.
func isLibvirtError(err error) bool {
	var le golibvirt.Error
	return errors.As(err, &le)
}

// libvirtCode returns the libvirt error number of err, or -1.
func libvirtCode(err error) golibvirt.ErrorNumber {
	var le golibvirt.Error
	if errors.As(err, &le) {
		return golibvirt.ErrorNumber(le.Code)
	}
	return -1
}

// where names the host and URI in errors.
func (c *conn) where() string {
	return fmt.Sprintf("host %s (%s)", c.host, redactURI(c.hc.URI))
}

// errorf wraps err, a failed call on c's host, into one line that says
// what was done where, adding hypervisor.ErrNotFound or ErrRejected when
// libvirt's answer means one of them.
func (c *conn) errorf(err error, format string, args ...any) error {
	return c.wrap(classify(err), err, format, args...)
}

// wrap is errorf with the driver error chosen by the caller (nil: none).
func (c *conn) wrap(sentinel, err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	if sentinel != nil {
		return fmt.Errorf("libvirt: %s on %s: %w: %w", what, c.where(), sentinel, oneLine{err})
	}
	return fmt.Errorf("libvirt: %s on %s: %w", what, c.where(), oneLine{err})
}

// classify maps a libvirt answer to the driver error it means, or nil.
func classify(err error) error {
	switch libvirtCode(err) {
	case golibvirt.ErrNoDomain:
		return hypervisor.ErrNotFound
	case golibvirt.ErrXMLError, golibvirt.ErrXMLDetail, golibvirt.ErrXMLInvalidSchema,
		golibvirt.ErrConfigUnsupported, golibvirt.ErrInvalidArg, golibvirt.ErrNoSupport,
		golibvirt.ErrArgumentUnsupported, golibvirt.ErrOperationUnsupported,
		golibvirt.ErrCPUIncompatible, golibvirt.ErrMigrateUnsafe:
		return hypervisor.ErrRejected
	}
	return nil
}

// classifyDefinition is classify for calls that only check and store a
// definition, such as DomainDefineXML: libvirt reports many refusals of a
// domain XML as internal or operation-failed errors, so every answer
// except a transient or state-related one is a refusal.
func classifyDefinition(err error) error {
	if s := classify(err); s != nil || !isLibvirtError(err) {
		return s
	}
	switch libvirtCode(err) {
	case golibvirt.ErrNoMemory, golibvirt.ErrNoConnect, golibvirt.ErrInvalidConn, golibvirt.ErrRPC,
		golibvirt.ErrOperationTimeout, golibvirt.ErrResourceBusy, golibvirt.ErrAgentUnresponsive,
		golibvirt.ErrSystemError, golibvirt.ErrOperationAborted, golibvirt.ErrOperationInvalid,
		golibvirt.ErrOperationDenied, golibvirt.ErrAccessDenied, golibvirt.ErrAuthFailed,
		golibvirt.ErrAuthCancelled, golibvirt.ErrAuthUnavailable, golibvirt.ErrInvalidDomain,
		golibvirt.ErrOpenFailed, golibvirt.ErrReadFailed, golibvirt.ErrWriteFailed:
		return nil
	}
	return hypervisor.ErrRejected
}

// oneLine keeps an error but prints it on one line; libvirt messages can
// span several.
type oneLine struct{ err error }

func (e oneLine) Error() string {
	return strings.Join(strings.Fields(e.err.Error()), " ")
}

func (e oneLine) Unwrap() error { return e.err }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
