package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/pinflow/pinflow/activities"
	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/config"
	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/telemetry"
	"github.com/pinflow/pinflow/workflows"
)

// TestMigrationTrace runs a live migration on a real Temporal dev server,
// Redis and the simulated hypervisor, with a worker and a starter wired
// the way pinflow-worker and the pinflow CLI wire theirs, and checks that
// the migration is one trace: the starter's span, the workflow, each
// activity, the Redis scripts each ledger activity runs and the driver
// calls, every span's parent in the same trace.
func TestMigrationTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis and a Temporal dev server; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs := testenv.StartRedis(t)
	ts := testenv.StartTemporal(t)

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tel, err := telemetry.New(tp, nil)
	if err != nil {
		t.Fatal(err)
	}

	cfg := config.Config{Temporal: config.Temporal{Address: ts.Address, Namespace: ts.Namespace, TaskQueue: "trace-test"}, Driver: config.DriverSim}
	cfg.RedisConfig = config.RedisConfig{URL: rs.URL(), KeyPrefix: "pinflow", DialTimeout: 5 * time.Second}
	led, rdb, err := cfg.Redis(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	sim, err := cfg.Simulator(rdb)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"a", "b"} {
		topo, err := numa.Uniform(numa.UniformSpec{Cells: 1, Cores: 4, Threads: 1, MemoryMB: 8192})
		if err != nil {
			t.Fatal(err)
		}
		if err := sim.AddHost(ctx, h, topo); err != nil {
			t.Fatal(err)
		}
		if _, err := led.RegisterHost(ctx, h, topo); err != nil {
			t.Fatal(err)
		}
	}
	// Instrumented after setup, so that only the operations' commands are
	// traced.
	if err := tel.InstrumentRedis(rdb); err != nil {
		t.Fatal(err)
	}

	tc, err := cfg.Dial(ctx, nil, config.WithTelemetry(tel))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tc.Close)
	registerSearchAttributes(ctx, t, tc, ts.Namespace)
	w := worker.New(tc, cfg.TaskQueue, worker.Options{Interceptors: []interceptor.WorkerInterceptor{activities.Observer()}})
	for _, wf := range []any{workflows.Boot, workflows.LiveMigration} {
		w.RegisterWorkflow(wf)
	}
	w.RegisterActivity(&activities.Activities{Ledger: led, Driver: tel.Driver(sim), ProgressEvery: 100 * time.Millisecond})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)

	uuid := "6f1c2a4e-3b5d-4c7e-8f90-a1b2c3d4e5f6"
	flavor := guest.Flavor{VCPUs: 2, MemoryMB: 1024, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
	start(ctx, t, tc, uuid, workflows.Boot, api.BootInput{UUID: uuid, Name: "traced", Flavor: flavor, Host: "a"})
	exp.Reset()

	// The starter's own span, as the CLI opens one per command.
	sctx, root := tel.Start(ctx, "pinflow migrate")
	start(sctx, t, tc, uuid, workflows.LiveMigration, api.LiveMigrationInput{UUID: uuid, Dest: "b"})
	root.End()

	spans := exp.GetSpans()
	tree := traceOf(spans, root.SpanContext().TraceID())
	if len(tree.byID) == 0 {
		t.Fatalf("no span in the migration's trace %s among %d spans:\n%s", root.SpanContext().TraceID(), len(spans), names(spans))
	}
	// Every span's parent is in the trace, up to the starter's span.
	for _, s := range tree.byID {
		if s.SpanContext.SpanID() == root.SpanContext().SpanID() {
			continue
		}
		if _, ok := tree.byID[s.Parent.SpanID()]; !ok {
			t.Errorf("span %q has parent %s, which is not in the trace", s.Name, s.Parent.SpanID())
		}
	}

	tests := []struct {
		span, parent string
	}{
		{"StartWorkflow:LiveMigration", "pinflow migrate"},
		{"RunWorkflow:LiveMigration", "StartWorkflow:LiveMigration"},
		{"StartActivity:LoadInstance", "RunWorkflow:LiveMigration"},
		{"RunActivity:LoadInstance", "StartActivity:LoadInstance"},
		{"RunActivity:SetTaskState", "StartActivity:SetTaskState"},
		{"RunActivity:Claim", "StartActivity:Claim"},
		{"RunActivity:PrepareMigration", "StartActivity:PrepareMigration"},
		{"RunActivity:Migrate", "StartActivity:Migrate"},
		{"RunActivity:CommitMigration", "StartActivity:CommitMigration"},
		{"hypervisor.Lookup", "RunActivity:PrepareMigration"},
		{"hypervisor.PrepareMigration", "RunActivity:PrepareMigration"},
		{"hypervisor.Migrate", "RunActivity:Migrate"},
	}
	for _, tt := range tests {
		if !tree.hasChildOf(tt.span, tt.parent) {
			t.Errorf("trace has no span %q under %q; spans:\n%s", tt.span, tt.parent, tree.dump())
		}
	}
	// The ledger's Redis scripts run under the activities that call them.
	for _, act := range []string{"RunActivity:LoadInstance", "RunActivity:Claim", "RunActivity:CommitMigration"} {
		if !tree.hasRedisUnder(act) {
			t.Errorf("trace has no Redis command under %q; spans:\n%s", act, tree.dump())
		}
	}
	if t.Failed() {
		return
	}
	t.Logf("migration trace: %d spans\n%s", len(tree.byID), tree.dump())
}

func start(ctx context.Context, t *testing.T, tc client.Client, uuid string, wf, in any) {
	t.Helper()
	run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: guest.InstanceWorkflowID(uuid), TaskQueue: "trace-test",
		WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		TypedSearchAttributes:                    temporal.NewSearchAttributes(api.AttrInstance.ValueSet(uuid)),
	}, wf, in)
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Get(ctx, nil); err != nil {
		t.Fatalf("workflow %s: %v", run.GetID(), err)
	}
}

func registerSearchAttributes(ctx context.Context, t *testing.T, tc client.Client, ns string) {
	t.Helper()
	_, err := tc.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace: ns, SearchAttributes: api.SearchAttributes()})
	var exists *serviceerror.AlreadyExists
	if err != nil && !errors.As(err, &exists) {
		t.Fatal(err)
	}
}

// spanTree is one trace's spans by id.
type spanTree struct {
	byID map[trace.SpanID]tracetest.SpanStub
}

func traceOf(spans tracetest.SpanStubs, id trace.TraceID) spanTree {
	tr := spanTree{byID: map[trace.SpanID]tracetest.SpanStub{}}
	for _, s := range spans {
		if s.SpanContext.TraceID() == id {
			tr.byID[s.SpanContext.SpanID()] = s
		}
	}
	return tr
}

func (tr spanTree) hasChildOf(name, parent string) bool {
	for _, s := range tr.byID {
		if s.Name == name {
			if p, ok := tr.byID[s.Parent.SpanID()]; ok && p.Name == parent {
				return true
			}
		}
	}
	return false
}

// hasRedisUnder says whether a Redis command span descends from a span
// named name.
func (tr spanTree) hasRedisUnder(name string) bool {
	for _, s := range tr.byID {
		if !isRedis(s) {
			continue
		}
		for p, ok := tr.byID[s.Parent.SpanID()]; ok; p, ok = tr.byID[p.Parent.SpanID()] {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

func isRedis(s tracetest.SpanStub) bool {
	for _, a := range s.Attributes {
		if a.Key == "db.system" || a.Key == "db.system.name" {
			return a.Value.AsString() == "redis"
		}
	}
	return false
}

// dump renders the tree indented by depth, children in start order.
func (tr spanTree) dump() string {
	children := map[trace.SpanID][]tracetest.SpanStub{}
	var roots []tracetest.SpanStub
	for _, s := range tr.byID {
		if _, ok := tr.byID[s.Parent.SpanID()]; ok {
			children[s.Parent.SpanID()] = append(children[s.Parent.SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) }
	var b strings.Builder
	var walk func(s tracetest.SpanStub, depth int)
	walk = func(s tracetest.SpanStub, depth int) {
		fmt.Fprintf(&b, "%s%s\n", strings.Repeat("  ", depth), s.Name)
		kids := children[s.SpanContext.SpanID()]
		slices.SortFunc(kids, byStart)
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	slices.SortFunc(roots, byStart)
	for _, r := range roots {
		walk(r, 0)
	}
	return b.String()
}

func names(spans tracetest.SpanStubs) string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return strings.Join(out, "\n")
}
