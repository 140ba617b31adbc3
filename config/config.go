// Package config is pinflow's configuration, read from the environment
// under the PINFLOW_ prefix, and the connections it describes: Temporal,
// Redis (the ledger) and the hypervisor driver. The worker and the CLI
// share it, so both reach the same stack with the same variables.
package config

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/redis/go-redis/v9"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"

	"github.com/pinflow/pinflow/guestxml"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/libvirt"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/tlsfile"
)

// Prefix starts every environment variable pinflow reads.
const Prefix = "PINFLOW"

// Embedded configurations keep their own variable names (PINFLOW_REDIS_URL,
// PINFLOW_SIM_LATENCY, ...); the aliases give the embedded fields distinct
// names.
type (
	// RedisConfig is how to reach Redis.
	RedisConfig = ledger.Config
	// SimConfig configures the simulated hypervisor.
	SimConfig = sim.Config
	// DomainOptions say what kind of guest a boot defines.
	DomainOptions = guestxml.Options
	// LibvirtConfig configures the libvirt driver.
	LibvirtConfig = libvirt.Config
)

// Config is all of pinflow's configuration.
type Config struct {
	Temporal
	RedisConfig
	SimConfig
	LibvirtConfig
	DomainOptions
	// Driver is the hypervisor driver: sim or libvirt.
	Driver string `envconfig:"DRIVER"`
	Reconcile
	Placement
	Steps
	Migration
	Operations
	Devices
}

// The values of Config.Driver; DriverSim is its default.
const (
	DriverSim     = "sim"
	DriverLibvirt = "libvirt"
)

// errDriver is the error for a Config.Driver that names no driver.
func errDriver(driver string) error {
	return fmt.Errorf("config: %s_DRIVER %q: allowed are %s or %s", Prefix, driver, DriverSim, DriverLibvirt)
}

// Steps configures how the workflows' hypervisor steps behave.
type Steps struct {
	// ShutdownTimeout is how long a shelve-offload waits for the guest to
	// power itself off before it destroys it.
	ShutdownTimeout time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"60s"`
	// FenceLease is how long a hypervisor step that passed its fence may
	// take to act (define, start, stop or undefine a guest, switch a
	// migration over); neither the audit nor another operation takes the
	// claim meanwhile.
	FenceLease time.Duration `envconfig:"FENCE_LEASE"`
	// WorkerStopTimeout is how long a stopping worker lets running
	// activities finish; a live migration is handed to the next attempt
	// instead of being aborted.
	WorkerStopTimeout time.Duration `envconfig:"WORKER_STOP_TIMEOUT" default:"30s"`
	// DrainMaxMoves bounds the moves every drain together runs at once in
	// the whole cloud (KubeVirt's default is 5 migrations per cluster);
	// give every worker the same value.
	DrainMaxMoves int `envconfig:"DRAIN_MAX_MOVES"`
}

// Temporal is how to reach the Temporal frontend.
type Temporal struct {
	// Address is the Temporal frontend's host:port, or the frontends of
	// one cluster, comma-separated: calls then spread over those that
	// answer, so losing one does not stop the worker or the CLI.
	Address string `envconfig:"TEMPORAL_ADDRESS" default:"127.0.0.1:7233"`
	// Namespace is the Temporal namespace pinflow's workflows run in. The
	// first worker or CLI to use a ledger binds it to its namespace, and
	// one of any other namespace is refused there: only this namespace
	// sees the workflows the ledger's claims name.
	Namespace string `envconfig:"TEMPORAL_NAMESPACE" default:"default"`
	// TaskQueue is the task queue workers poll and the CLI starts on.
	TaskQueue string `envconfig:"TEMPORAL_TASK_QUEUE" default:"pinflow"`
	// APIKey authenticates to Temporal Cloud or a server that takes keys;
	// it implies TLS.
	APIKey string `envconfig:"TEMPORAL_API_KEY"`
	// TLS turns on TLS; TLSCA, TLSCert and TLSKey are PEM files (a client
	// certificate makes it mTLS), TLSServerName overrides the name checked.
	TLS           bool   `envconfig:"TEMPORAL_TLS"`
	TLSCA         string `envconfig:"TEMPORAL_TLS_CA"`
	TLSCert       string `envconfig:"TEMPORAL_TLS_CERT"`
	TLSKey        string `envconfig:"TEMPORAL_TLS_KEY"`
	TLSServerName string `envconfig:"TEMPORAL_TLS_SERVER_NAME"`
}

// Reconcile configures the periodic ledger audit.
type Reconcile struct {
	// Interval between audits run by the schedule; 0 turns the schedule off.
	Interval time.Duration `envconfig:"RECONCILE_INTERVAL" default:"1m"`
	// Grace is how old a claim must be before the audit judges it.
	Grace time.Duration `envconfig:"RECONCILE_GRACE" default:"2m"`
	// Concurrency bounds how many hosts are audited at once.
	Concurrency int `envconfig:"RECONCILE_CONCURRENCY"`
	// MinGrace is the least time an owner must have been closed before
	// the audit frees its claim, whatever grace an audit asks for: the
	// owner's last activity attempts may still be writing.
	MinGrace time.Duration `envconfig:"RECONCILE_MIN_GRACE" default:"10s"`
}

// Placement configures the worker's index of hosts' free capacity, which
// ChooseHost fits a few candidates from instead of every host.
type Placement struct {
	// PollInterval is how often the index reads the hosts that changed
	// since its last look, named in the ledger's change hints.
	PollInterval time.Duration `envconfig:"PLACEMENT_POLL_INTERVAL"`
	// SweepInterval is how often the index reads every host's version and
	// the hosts it holds stale: a change whose hint a crash lost is seen
	// within it.
	SweepInterval time.Duration `envconfig:"PLACEMENT_SWEEP_INTERVAL"`
}

// Load reads the configuration from the environment.
func Load() (*Config, error) {
	c := defaults()
	if err := envconfig.Process(Prefix, &c); err != nil {
		return nil, envError(err)
	}
	if c.Driver != DriverSim && c.Driver != DriverLibvirt {
		return nil, errDriver(c.Driver)
	}
	if c.ShutdownTimeout < 0 || c.FenceLease <= 0 || c.WorkerStopTimeout < 0 || c.MinGrace < 0 {
		return nil, fmt.Errorf("config: %s_SHUTDOWN_TIMEOUT %s, %s_FENCE_LEASE %s, %s_WORKER_STOP_TIMEOUT %s, %s_RECONCILE_MIN_GRACE %s: the lease must be positive, the others 0 or more",
			Prefix, c.ShutdownTimeout, Prefix, c.FenceLease, Prefix, c.WorkerStopTimeout, Prefix, c.MinGrace)
	}
	if c.DrainMaxMoves < 1 {
		return nil, fmt.Errorf("config: %s_DRAIN_MAX_MOVES %d: it must be at least 1", Prefix, c.DrainMaxMoves)
	}
	if _, err := c.Migration.Policy(); err != nil {
		return nil, err
	}
	if c.Placement.PollInterval <= 0 || c.Placement.SweepInterval <= 0 {
		return nil, fmt.Errorf("config: %s_PLACEMENT_POLL_INTERVAL %s and %s_PLACEMENT_SWEEP_INTERVAL %s: both must be positive",
			Prefix, c.Placement.PollInterval, Prefix, c.Placement.SweepInterval)
	}
	if err := c.Operations.check(); err != nil {
		return nil, err
	}
	if _, err := c.PCIAliases(); err != nil {
		return nil, err
	}
	if _, err := c.Temporal.frontends(); err != nil {
		return nil, err
	}
	return &c, nil
}

// envError says which variable has a value of the wrong kind, and what
// it takes, in the words of the variable and not of the Go field.
func envError(err error) error {
	var pe *envconfig.ParseError
	if !errors.As(err, &pe) {
		return fmt.Errorf("config: %w", err)
	}
	allowed := map[string]string{
		"time.Duration": "a duration such as 0, 90s, 2m or 1h30m",
		"bool":          "true or false",
		"int":           "a whole number", "int64": "a whole number", "uint": "a whole number",
		"float64": "a number",
	}
	what, ok := allowed[pe.TypeName]
	if !ok {
		what = "a " + pe.TypeName
	}
	return fmt.Errorf("config: %s %q: allowed is %s", pe.KeyName, pe.Value, what)
}

// Logger is the structured logger pinflow's programs log with.
func Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// Dial connects to Temporal; extra options (WithTelemetry) adjust the
// client. Its error is one line naming the address.
func (c *Config) Dial(ctx context.Context, logger *slog.Logger, extra ...func(*client.Options)) (client.Client, error) {
	hostPort, dialOpts, err := c.Temporal.dialTarget()
	if err != nil {
		return nil, err
	}
	opts := client.Options{HostPort: hostPort, Namespace: c.Namespace}
	opts.ConnectionOptions.DialOptions = dialOpts
	for _, f := range extra {
		f(&opts)
	}
	if logger != nil {
		opts.Logger = tlog.NewStructuredLogger(logger)
	}
	if c.Temporal.TLS || c.APIKey != "" || c.temporalTLSFiles().Named() {
		t, err := c.tlsConfig()
		if err != nil {
			return nil, fmt.Errorf("temporal %s: %w", c.Address, err)
		}
		opts.ConnectionOptions.TLS = t
	}
	if c.APIKey != "" {
		opts.Credentials = client.NewAPIKeyStaticCredentials(c.APIKey)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cl, err := client.DialContext(dctx, opts)
	if err != nil {
		return nil, fmt.Errorf("temporal %s (namespace %s): cannot connect: %v", c.Address, c.Namespace, err)
	}
	return cl, nil
}

// tlsConfig is the TLS configuration of the Temporal connection, its
// files checked as the Redis connection's are.
func (c *Config) tlsConfig() (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.Temporal.serverName()}
	if err := c.temporalTLSFiles().Load(t); err != nil {
		return nil, err
	}
	return t, nil
}

// temporalTLSFiles are the PEM files of the Temporal connection.
func (c *Config) temporalTLSFiles() tlsfile.Files {
	return tlsfile.Files{Var: Prefix + "_TEMPORAL_TLS", CA: c.Temporal.TLSCA, Cert: c.Temporal.TLSCert, Key: c.Temporal.TLSKey}
}

// Redis connects to Redis and opens the ledger on it, bound to the
// Temporal namespace (ledger.Bind): a ledger that serves another
// namespace is refused, before anything acts on it, since its claims
// name workflows this namespace cannot see.
func (c *Config) Redis(ctx context.Context) (*ledger.Ledger, redis.UniversalClient, error) {
	led, rdb, err := ledger.Open(ctx, c.RedisConfig)
	if err != nil {
		return nil, nil, err
	}
	if err := c.bind(ctx, led, ledger.Deployment{Namespace: c.Namespace}); err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return led, rdb, nil
}

// BindCluster binds led, opened by Redis, to the namespace's id on the
// Temporal cluster tc serves: a ledger that serves a namespace of the
// same name on another cluster is refused. Every process that starts
// workflows or audits binds so, once it is connected to Temporal.
func (c *Config) BindCluster(ctx context.Context, led *ledger.Ledger, tc client.Client) error {
	desc, err := tc.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: c.Namespace})
	if err != nil {
		return fmt.Errorf("temporal %s: describe namespace %s: %v", c.Address, c.Namespace, err)
	}
	return c.bind(ctx, led, ledger.Deployment{Namespace: c.Namespace, NamespaceID: desc.GetNamespaceInfo().GetId()})
}

// bind binds led to want, and says how to fix a refusal.
func (c *Config) bind(ctx context.Context, led *ledger.Ledger, want ledger.Deployment) error {
	err := led.Bind(ctx, want)
	var other *ledger.OtherDeploymentError
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &other):
		return fmt.Errorf("redis %s: %w", c.RedisConfig.Endpoint(), err)
	case other.Bound.Namespace == want.Namespace:
		return fmt.Errorf("the ledger at %s (key prefix %s) serves Temporal namespace %q of another cluster (namespace id %s, this cluster's is %s); connect to that cluster, or give this deployment its own %s_REDIS_KEY_PREFIX",
			c.RedisConfig.Endpoint(), c.RedisConfig.KeyPrefix, other.Bound.Namespace, other.Bound.NamespaceID, want.NamespaceID, Prefix)
	}
	return fmt.Errorf("the ledger at %s (key prefix %s) serves Temporal namespace %q, not %q; set %s_TEMPORAL_NAMESPACE=%s, or give this deployment its own %s_REDIS_KEY_PREFIX",
		c.RedisConfig.Endpoint(), c.RedisConfig.KeyPrefix, other.Bound.Namespace, want.Namespace, Prefix, other.Bound.Namespace, Prefix)
}

// NewDriver returns the configured hypervisor driver; the simulator keeps
// its state in rdb.
func (c *Config) NewDriver(rdb redis.UniversalClient) (hypervisor.Driver, error) {
	switch c.Driver {
	case DriverSim:
		return c.Simulator(rdb)
	case DriverLibvirt:
		return c.Libvirt(rdb)
	}
	return nil, errDriver(c.Driver)
}

// Libvirt returns the libvirt driver; hosts not named in
// PINFLOW_LIBVIRT_HOSTS are looked up in the registry in rdb, where
// `pinflow host add NAME --libvirt URI` records them.
func (c *Config) Libvirt(rdb redis.UniversalClient) (*libvirt.Driver, error) {
	lc := c.LibvirtConfig
	lc.Resolve = c.LibvirtRegistry(rdb).Resolve
	return libvirt.New(lc)
}

// LibvirtRegistry returns the registry of libvirt hosts in rdb.
func (c *Config) LibvirtRegistry(rdb redis.UniversalClient) *libvirt.Registry {
	return libvirt.NewRegistry(rdb, c.RedisConfig.KeyPrefix)
}

// Simulator returns the simulated hypervisor on rdb, or on the server
// PINFLOW_SIM_REDIS_URL names.
func (c *Config) Simulator(rdb redis.UniversalClient) (*sim.Driver, error) {
	opts, err := c.SimConfig.Options()
	if err != nil {
		return nil, err
	}
	if c.SimConfig.RedisURL != "" {
		own, err := ledger.Config{URL: c.SimConfig.RedisURL}.NewClient(context.Background())
		if err != nil {
			return nil, fmt.Errorf("config: %s_SIM_REDIS_URL: %w", Prefix, err)
		}
		rdb = own
	}
	return sim.New(rdb, opts), nil
}
