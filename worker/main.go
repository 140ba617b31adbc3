// Command pinflow-worker runs pinflow's workflows and activities: it polls
// the Temporal task queue, keeps the ledger in Redis and drives the
// hypervisors. Run one or more on controllers; all configuration comes
// from PINFLOW_* environment variables (see the config package).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/config"
	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/libvirt"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/placement"
	"github.com/pinflow/pinflow/workflows"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pinflow-worker: "+err.Error())
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := config.Load()
	if err != nil {
		return err
	}
	logger := cfg.Logger()
	redis.SetLogger(redisLogs{logger})
	tel, flush, err := startTelemetry(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer flush()
	led, rdb, err := cfg.Redis(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	if err := tel.InstrumentRedis(rdb); err != nil {
		return err
	}
	driver, err := cfg.NewDriver(rdb)
	if err != nil {
		return err
	}
	// Host add and remove make and forget the simulator's machines.
	var simulated activities.SimulatedHosts
	if s, ok := driver.(*sim.Driver); ok {
		simulated = s
	}
	// Any worker registers libvirt hosts, whatever it drives: each read
	// makes a driver of its own.
	libvirtHosts := libvirt.Registrar{New: func() (*libvirt.Driver, error) { return cfg.Libvirt(rdb) }, Registry: cfg.LibvirtRegistry(rdb)}
	policy, err := cfg.Migration.Policy()
	if err != nil {
		return err
	}
	// Every call that changes a domain must come fenced (hypervisor.Guarded).
	driver = hypervisor.Guarded(tel.Driver(driver))
	tc, err := cfg.Dial(ctx, logger, config.WithTelemetry(tel))
	if err != nil {
		return err
	}
	defer tc.Close()
	if err := cfg.BindCluster(ctx, led, tc); err != nil {
		return err
	}
	if err := serveOps(ctx, cfg, tel, rdb, tc, logger); err != nil {
		return err
	}
	if err := api.RegisterSearchAttributes(ctx, tc.OperatorService(), cfg.Namespace); err != nil {
		return err
	}

	w := worker.New(tc, cfg.TaskQueue, workflows.Polling(worker.Options{Interceptors: []interceptor.WorkerInterceptor{activities.Observer()},
		WorkerStopTimeout: cfg.WorkerStopTimeout}))
	for _, wf := range workflows.All() {
		w.RegisterWorkflow(wf)
	}
	// The index lives as long as the worker: a choice fits a few hosts of
	// it, read afresh, instead of every host.
	hosts := placement.NewIndex(led, placement.Options{PollInterval: cfg.Placement.PollInterval,
		SweepInterval: cfg.Placement.SweepInterval, Logger: logger})
	go func() { _ = hosts.Run(ctx) }()
	owners := audit.TemporalOwners{Client: tc, Namespace: cfg.Namespace}
	starter := workflows.AuditStarter{Client: tc, TaskQueue: cfg.TaskQueue}
	auditor := &audit.Auditor{Ledger: led, Driver: driver, Owners: owners, Holders: owners,
		Grace: cfg.Reconcile.Grace, MinGrace: cfg.Reconcile.MinGrace, Settler: starter, Evacuator: starter}
	w.RegisterActivity(&activities.Activities{Ledger: led, Driver: driver, Domain: cfg.DomainOptions, Placement: hosts, Audit: auditor,
		ShutdownTimeout: cfg.ShutdownTimeout, FenceLease: cfg.FenceLease, DrainMaxMoves: cfg.DrainMaxMoves, MigrationPolicy: policy,
		Simulated: simulated, Libvirt: libvirtHosts})
	logger.Info("pinflow worker starting", "temporal", cfg.Address, "namespace", cfg.Namespace,
		"task_queue", cfg.TaskQueue, "redis", cfg.RedisConfig.Endpoint(), "driver", cfg.Driver,
		"traces", cfg.Traces, "metrics", cfg.Metrics, "health", cfg.HealthAddr)
	if err := w.Start(); err != nil {
		return fmt.Errorf("start worker on task queue %s: %w", cfg.TaskQueue, err)
	}
	if err := ensureReconcileSchedule(ctx, tc, cfg.TaskQueue, cfg.Reconcile, logger); err != nil {
		w.Stop()
		return err
	}
	<-ctx.Done()
	logger.Info("pinflow worker stopping: finishing the tasks in hand")
	w.Stop()
	return nil
}
