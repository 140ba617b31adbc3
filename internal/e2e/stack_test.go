package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/pinflow/pinflow/api"
	"github.com/pinflow/pinflow/config"
	"github.com/pinflow/pinflow/hypervisor/sim"
	"github.com/pinflow/pinflow/internal/testenv"
	"github.com/pinflow/pinflow/ledger"
)

// build is one build of the pinflow CLI and the worker.
type build struct {
	once sync.Once
	dir  string
	err  error
}

// builds are the test binary's builds: with the race detector for the
// tests, without it for the benchmarks, which time the binaries.
var builds = map[bool]*build{true: {}, false: {}}

// binaries builds the pinflow CLI and the worker once per test binary,
// with the race detector unless t is a benchmark.
func binaries(t testing.TB) (cli, worker string) {
	t.Helper()
	_, bench := t.(*testing.B)
	race := !bench
	bl := builds[race]
	bl.once.Do(func() {
		bl.dir, bl.err = os.MkdirTemp("", "pinflow-e2e-bin")
		if bl.err != nil {
			return
		}
		root := testenv.ModuleRoot(t)
		for out, pkg := range map[string]string{"pinflow": "./starter", "pinflow-worker": "./worker"} {
			args := []string{"build", "-o", filepath.Join(bl.dir, out), pkg}
			if race {
				args = append(args[:1], append([]string{"-race"}, args[1:]...)...)
			}
			cmd := exec.Command("go", args...)
			cmd.Dir = root
			if b, err := cmd.CombinedOutput(); err != nil {
				bl.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
				return
			}
		}
	})
	if bl.err != nil {
		t.Fatal(bl.err)
	}
	return filepath.Join(bl.dir, "pinflow"), filepath.Join(bl.dir, "pinflow-worker")
}

// stack is a real Redis, a real Temporal and pinflow workers with the
// simulated hypervisor, driven through the pinflow CLI: a dev server and
// one redis-server, or, under PINFLOW_E2E_TARGET=cluster, the cluster
// deploy/cluster.sh runs (two Temporal nodes on PostgreSQL, a Redis
// Cluster of three masters with a replica each) and three workers.
type stack struct {
	t           testing.TB
	cli         string
	worker      string
	env         []string
	tc          client.Client
	redisConfig ledger.Config
	simRedisURL string            // the simulated hypervisors' own Redis; empty keeps them in redisConfig's
	sim         *sim.Driver       // made by simulator()
	temporal    *testenv.Temporal // nil on a cluster
	redis       *testenv.Redis    // nil on a cluster
	cluster     *testenv.Cluster  // nil on the dev server
	workers     []*exec.Cmd
	logs        []*bytes.Buffer
}

// onCluster says whether the suite runs against the cluster rather than
// the dev server.
func onCluster() bool { return os.Getenv("PINFLOW_E2E_TARGET") == "cluster" }

// newStack starts the stack; env adds or overrides worker and CLI
// variables (PINFLOW_DRIVER=libvirt, ...).
func newStack(t testing.TB, env ...string) *stack {
	t.Helper()
	return newStackWith(t, nil, env...)
}

// newStackWith is newStack with options for its Redis server, which only
// the dev server's stack has.
func newStackWith(t testing.TB, redisOpts []testenv.RedisOption, env ...string) *stack {
	t.Helper()
	if onCluster() {
		if len(redisOpts) > 0 {
			t.Fatalf("%s needs a Redis server of its own; it does not run under PINFLOW_E2E_TARGET=cluster", t.Name())
		}
		return newClusterStack(t, env...)
	}
	s := newBareStack(t)
	s.redis = testenv.StartRedis(t, redisOpts...)
	s.temporal = testenv.StartTemporal(t)
	s.tc = s.temporal.Client
	s.redisConfig = ledger.Config{URL: s.redis.URL()}
	s.env = append(s.env,
		"PINFLOW_REDIS_URL="+s.redis.URL(),
		"PINFLOW_TEMPORAL_ADDRESS="+s.temporal.Address,
		"PINFLOW_TEMPORAL_NAMESPACE="+s.temporal.Namespace,
	)
	s.env = append(s.env, env...)
	s.stopWorkersAtEnd()
	s.startWorker()
	s.waitSearchAttributes()
	return s
}

// waitSearchAttributes waits until the worker registered pinflow's search
// attributes with the dev server (the cluster's script registers them
// itself): every command that starts a workflow, a host's registration
// among them, sets them and is refused without them.
func (s *stack) waitSearchAttributes() {
	s.t.Helper()
	s.eventually("the worker to register the search attributes", 2*time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := s.tc.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: s.temporal.Namespace})
		if err != nil {
			return false
		}
		for name := range api.SearchAttributes() {
			if _, ok := resp.GetCustomAttributes()[name]; !ok {
				return false
			}
		}
		return true
	})
}

// newClusterStack starts the cluster and three workers on it; every
// worker and CLI call gets both Temporal frontends and the Redis Cluster.
func newClusterStack(t testing.TB, env ...string) *stack {
	t.Helper()
	s := newBareStack(t)
	s.cluster = testenv.StartCluster(t)
	// The hypervisors are not the ledger: the simulated ones keep their
	// state in a Redis of their own, which a failover of the ledger's
	// cannot lose.
	for _, k := range []string{"PINFLOW_TEMPORAL_ADDRESS", "PINFLOW_TEMPORAL_NAMESPACE", "PINFLOW_REDIS_ADDRS", "PINFLOW_REDIS_WAIT_REPLICAS", "PINFLOW_SIM_REDIS_URL"} {
		s.env = append(s.env, k+"="+s.cluster.Env[k])
	}
	s.env = append(s.env, env...)
	s.redisConfig = clusterLedger(s.cluster)
	s.simRedisURL = s.cluster.Env["PINFLOW_SIM_REDIS_URL"]
	s.tc = dialCluster(t, s.cluster)
	s.stopWorkersAtEnd()
	for range 3 {
		s.startWorker()
	}
	return s
}

// clusterLedger is how the cluster's workers reach the ledger: every
// change waits for a replica.
func clusterLedger(cl *testenv.Cluster) ledger.Config {
	return ledger.Config{Addrs: cl.RedisAddrs(), WaitReplicas: 1}
}

// dialCluster is a client of both of the cluster's frontends, closed when
// the test ends.
func dialCluster(t testing.TB, cl *testenv.Cluster) client.Client {
	t.Helper()
	var cfg config.Config
	cfg.Address, cfg.Namespace = cl.Env["PINFLOW_TEMPORAL_ADDRESS"], cl.Env["PINFLOW_TEMPORAL_NAMESPACE"]
	// Warnings only: the SDK's own default logs every activity it runs.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tc, err := cfg.Dial(context.Background(), logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tc.Close)
	return tc
}

// newBareStack is a stack with its binaries and common settings, before
// its Redis and Temporal are started; it stops its workers at the end.
func newBareStack(t testing.TB) *stack {
	t.Helper()
	if testing.Short() {
		t.Skip("the end-to-end tests start Redis, Temporal and workers; skipped with -short")
	}
	cli, worker := binaries(t)
	s := &stack{t: t, cli: cli, worker: worker}
	s.env = append(os.Environ(),
		"PINFLOW_TEMPORAL_TASK_QUEUE=e2e-"+strings.ReplaceAll(t.Name(), "/", "-"),
		"PINFLOW_DRIVER=sim",
		// Short enough for tests to wait out, long enough to matter.
		"PINFLOW_RECONCILE_MIN_GRACE="+minGrace.String(),
		"PINFLOW_FENCE_LEASE=10s",
		"PINFLOW_SHUTDOWN_TIMEOUT=2s",
		// A scheduled audit at a minute boundary would race the audits
		// a test runs and asserts on; TestScheduledAudit turns it on.
		"PINFLOW_RECONCILE_INTERVAL=0",
	)
	return s
}

// minGrace is the audit's minimum grace in the tests' workers: a claim
// whose owner closed less than this ago is kept.
const minGrace = 2 * time.Second

// pastMinGrace waits until every workflow that has closed closed at least
// the minimum grace ago: an audit then judges every claim they left. Open
// workflows (a resize waiting for its decision) keep their claims anyway.
// A run the visibility store still lists as running is asked directly, in
// case it closed a moment ago.
func (s *stack) pastMinGrace() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var last time.Time
	var next []byte
	for {
		page, err := s.tc.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{NextPageToken: next})
		if err != nil {
			s.t.Fatalf("list the workflows: %v", err)
		}
		for _, e := range page.Executions {
			closed := e.GetCloseTime()
			if e.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
				d, err := s.tc.DescribeWorkflow(ctx, e.GetExecution().GetWorkflowId(), e.GetExecution().GetRunId())
				if err != nil {
					s.t.Fatalf("describe workflow %s: %v", e.GetExecution().GetWorkflowId(), err)
				}
				closed = d.RawResponse.GetWorkflowExecutionInfo().GetCloseTime()
			}
			if closed != nil && closed.AsTime().After(last) {
				last = closed.AsTime()
			}
		}
		if next = page.NextPageToken; len(next) == 0 {
			break
		}
	}
	time.Sleep(time.Until(last.Add(minGrace + 100*time.Millisecond)))
}

// envOf is the value the stack's workers and CLI get for variable name:
// the last one set wins, as in a process's environment.
func (s *stack) envOf(name string) string {
	v := ""
	for _, kv := range s.env {
		if val, ok := strings.CutPrefix(kv, name+"="); ok {
			v = val
		}
	}
	return v
}

// stopWorkersAtEnd stops the workers when the test ends, before the Redis
// and Temporal started before this call stop.
func (s *stack) stopWorkersAtEnd() {
	s.t.Cleanup(func() {
		for _, w := range s.workers {
			if w.ProcessState == nil {
				w.Process.Signal(syscall.SIGTERM)
				w.Wait()
			}
		}
		if s.t.Failed() {
			for i, l := range s.logs {
				s.t.Logf("worker %d log:\n%s", i, l.String())
			}
		}
	})
}

// simulator is the simulated hypervisors the stack's workers drive, made
// on first use.
func (s *stack) simulator() *sim.Driver {
	s.t.Helper()
	if s.sim != nil {
		return s.sim
	}
	if s.simRedisURL == "" {
		s.sim = sim.New(s.redisClient(), sim.Options{})
		return s.sim
	}
	rdb, err := ledger.Config{URL: s.simRedisURL}.NewClient(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = rdb.Close() })
	s.sim = sim.New(rdb, sim.Options{})
	return s.sim
}

// redisClient is a client of the stack's Redis, closed when the test
// ends.
func (s *stack) redisClient() redis.UniversalClient {
	s.t.Helper()
	rdb, err := s.redisConfig.NewClient(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func (s *stack) startWorker() {
	s.t.Helper()
	cmd := exec.Command(s.worker)
	cmd.Env = s.env
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start worker: %v", err)
	}
	s.workers = append(s.workers, cmd)
	s.logs = append(s.logs, &log)
}

// killWorker kills the newest worker with SIGKILL, as a crash would.
func (s *stack) killWorker() {
	s.t.Helper()
	w := s.workers[len(s.workers)-1]
	if err := w.Process.Kill(); err != nil {
		s.t.Fatal(err)
	}
	w.Wait()
}

// killWorkers kills every running worker with SIGKILL: on the cluster
// three workers run, and the one running a given step is any of them.
func (s *stack) killWorkers() {
	s.t.Helper()
	for _, w := range s.workers {
		if w.ProcessState == nil {
			if err := w.Process.Kill(); err != nil {
				s.t.Fatal(err)
			}
			w.Wait()
		}
	}
}

// run runs the CLI and returns its stdout, stderr and exit code.
func (s *stack) run(args ...string) (string, string, int) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.cli, args...)
	cmd.Env = s.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		exit, ok := err.(*exec.ExitError)
		if !ok {
			s.t.Fatalf("pinflow %s: %v", strings.Join(args, " "), err)
		}
		code = exit.ExitCode()
	}
	return stdout.String(), stderr.String(), code
}

// background is a CLI command running while the test goes on; its output
// can be read before it ends.
type background struct {
	args           []string
	cmd            *exec.Cmd
	stdout, stderr lockedBuffer
	done           chan struct{}
	code           int
	err            error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// start starts the CLI in the background (bounded like run); wait collects it.
func (s *stack) start(args ...string) *background {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	cmd := exec.CommandContext(ctx, s.cli, args...)
	cmd.Env = s.env
	bg := &background{args: args, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &bg.stdout, &bg.stderr
	if err := cmd.Start(); err != nil {
		cancel()
		s.t.Fatalf("pinflow %s: %v", strings.Join(args, " "), err)
	}
	go func() {
		defer close(bg.done)
		defer cancel()
		bg.err = cmd.Wait()
		if exit, ok := bg.err.(*exec.ExitError); ok {
			bg.code, bg.err = exit.ExitCode(), nil
		}
	}()
	s.t.Cleanup(func() { cancel(); <-bg.done })
	return bg
}

// wait waits for the command to end and returns what run would.
func (b *background) wait(t *testing.T) (string, string, int) {
	t.Helper()
	<-b.done
	if b.err != nil {
		t.Fatalf("pinflow %s: %v", strings.Join(b.args, " "), b.err)
	}
	return b.stdout.String(), b.stderr.String(), b.code
}

// ok runs the CLI and fails the test unless it exits 0.
func (s *stack) ok(args ...string) string {
	s.t.Helper()
	out, errOut, code := s.run(args...)
	if code != 0 {
		s.t.Fatalf("pinflow %s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// refused runs the CLI, expects a non-zero exit with one line on stderr
// containing want, and returns that line.
func (s *stack) refused(want string, args ...string) string {
	s.t.Helper()
	out, errOut, code := s.run(args...)
	// With --wait, progress lines come first; the error is the last line.
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	line := lines[len(lines)-1]
	if code == 0 {
		s.t.Fatalf("pinflow %s succeeded (%s), want it refused with %q", strings.Join(args, " "), out, want)
	}
	if !strings.HasPrefix(line, "pinflow: ") || !strings.Contains(line, want) {
		s.t.Errorf("pinflow %s: stderr %q, want one line containing %q", strings.Join(args, " "), line, want)
	}
	return line
}

func (s *stack) jsonOf(v any, args ...string) {
	s.t.Helper()
	out := s.ok(append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		s.t.Fatalf("pinflow %s --json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// shownGuest is `pinflow show --json`.
type shownGuest struct {
	UUID      string  `json:"uuid"`
	Name      string  `json:"name"`
	Host      *string `json:"host"`
	VMState   string  `json:"vm_state"`
	TaskState *string `json:"task_state"`
	Placement *struct {
		Cells []struct {
			HostCell   int            `json:"host_cell"`
			CPUPinning map[string]int `json:"cpu_pinning"`
		} `json:"cells"`
	} `json:"placement"`
}

func (g shownGuest) pcpus() string {
	if g.Placement == nil {
		return ""
	}
	var ids []int
	for _, c := range g.Placement.Cells {
		for _, p := range c.CPUPinning {
			ids = append(ids, p)
		}
	}
	return cpuList(ids)
}

func (s *stack) guest(uuid string) shownGuest {
	s.t.Helper()
	var g shownGuest
	s.jsonOf(&g, "show", uuid)
	return g
}

// hostView is `pinflow host show --json`.
type hostView struct {
	Host  string `json:"host"`
	Cells []struct {
		ID         int   `json:"id"`
		PinnedCPUs []int `json:"pinned_cpus"`
		Owners     map[string]struct {
			Claim    string `json:"claim"`
			Instance string `json:"instance"`
			State    string `json:"state"`
		} `json:"owners"`
	} `json:"cells"`
	Claims []struct {
		ID       string `json:"id"`
		Instance string `json:"instance"`
		Kind     string `json:"kind"`
		State    string `json:"state"`
	} `json:"claims"`
}

func (s *stack) host(name string) hostView {
	s.t.Helper()
	var h hostView
	s.jsonOf(&h, "host", "show", name)
	return h
}

// pinned returns the host's pinned pCPUs as a cpuset list.
func (s *stack) pinned(name string) string {
	s.t.Helper()
	var ids []int
	for _, c := range s.host(name).Cells {
		ids = append(ids, c.PinnedCPUs...)
	}
	return cpuList(ids)
}

func cpuList(ids []int) string {
	seen := map[int]bool{}
	for _, id := range ids {
		seen[id] = true
	}
	var parts []string
	for id := 0; id <= 8191 && len(seen) > 0; id++ {
		if !seen[id] {
			continue
		}
		end := id
		for seen[end+1] {
			end++
		}
		for i := id; i <= end; i++ {
			delete(seen, i)
		}
		if end > id {
			parts = append(parts, fmt.Sprintf("%d-%d", id, end))
		} else {
			parts = append(parts, fmt.Sprint(id))
		}
		id = end
	}
	return strings.Join(parts, ",")
}

// boot boots a pinned guest and returns its uuid.
func (s *stack) boot(name, host string, vcpus int) string {
	s.t.Helper()
	var res struct {
		UUID string `json:"uuid"`
		Host string `json:"host"`
	}
	args := []string{"boot", "--name", name, "--vcpus", fmt.Sprint(vcpus), "--memory-mb", "1024", "--spec", "hw:cpu_policy=dedicated", "--wait"}
	if host != "" {
		args = append(args, "--host", host)
	}
	s.jsonOf(&res, args...)
	if res.UUID == "" {
		s.t.Fatalf("boot %s: no uuid in the result", name)
	}
	return res.UUID
}

// eventually polls cond until it holds or the timeout passes.
func (s *stack) eventually(what string, timeout time.Duration, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// heldLong sets a stack's simulator to take a migration that makes no
// progress for dead only after an hour instead of 10 s, for tests that
// hold a migration at a gate while they act: on a loaded machine their
// steps may outlast the default, and a read of the guest would roll the
// held migration back. Tests that kill the worker keep the default, so
// that the migration it drove dies.
const heldLong = "PINFLOW_SIM_STALE_MIGRATION=1h"

// queryStatus reads the status of the workflow id into st; false while it
// cannot be asked (not started yet, or closed).
func (s *stack) queryStatus(id string, st *api.Status) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := s.tc.QueryWorkflow(ctx, id, "", api.StatusQuery)
	return err == nil && v.Get(st) == nil
}
