// Command pinflow-worker runs pinflow's workflows and activities: it polls
// the Temporal task queue, keeps the ledger in Redis and drives the
// hypervisors. Run one or more on controllers; all configuration comes
// from PINFLOW_* environment variables (see the config package).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/config"
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
	driver = tel.Driver(driver)
	tc, err := cfg.Dial(ctx, logger, config.WithTelemetry(tel))
	if err != nil {
		return err
	}
	defer tc.Close()
	if err := serveOps(ctx, cfg, tel, rdb, tc, logger); err != nil {
		return err
	}
	if err := registerSearchAttributes(ctx, tc, cfg.Namespace); err != nil {
		return err
	}

	w := worker.New(tc, cfg.TaskQueue, worker.Options{Interceptors: []interceptor.WorkerInterceptor{activities.Observer()}})
	for _, wf := range []any{workflows.Boot, workflows.LiveMigration, workflows.ShelveOffload, workflows.Unshelve, workflows.Delete, workflows.Reconcile} {
		w.RegisterWorkflow(wf)
	}
	w.RegisterActivity(&activities.Activities{Ledger: led, Driver: driver, Domain: cfg.DomainOptions,
		Owners: activities.TemporalOwners{Client: tc}, Grace: cfg.Reconcile.Grace})
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

// registerSearchAttributes adds pinflow's search attributes that the
// namespace lacks; those it has are left as they are.
func registerSearchAttributes(ctx context.Context, tc client.Client, namespace string) error {
	existing, err := tc.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("list search attributes of namespace %s: %w", namespace, err)
	}
	missing := map[string]enumspb.IndexedValueType{}
	for name, typ := range workflows.SearchAttributes() {
		if _, ok := existing.GetCustomAttributes()[name]; !ok {
			missing[name] = typ
		}
	}
	if len(missing) == 0 {
		return nil
	}
	req := &operatorservice.AddSearchAttributesRequest{Namespace: namespace, SearchAttributes: missing}
	if _, err := tc.OperatorService().AddSearchAttributes(ctx, req); err != nil {
		var exists *serviceerror.AlreadyExists
		if !errors.As(err, &exists) {
			return fmt.Errorf("register search attributes in namespace %s: %w", namespace, err)
		}
	}
	return nil
}
