package testenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Cluster is the distributed deployment deploy/cluster.sh runs on one
// machine: PostgreSQL, two Temporal server nodes, a Redis Cluster of three
// masters with a replica each, and no pinflow worker (tests start their
// own). Env holds what the script wrote to cluster.env.
type Cluster struct {
	Dir    string
	Env    map[string]string
	script string
	base   int
}

// clusterPorts is how many ports above its base the script may use.
const clusterPorts = 128

// clusterSlots bounds the clusters a test binary runs at once: each is
// a PostgreSQL, two Temporal nodes and seven Redis servers, and tests that
// run in parallel wait here for a slot rather than share the machine with
// more of them.
var clusterSlots = make(chan struct{}, 2)

// StartCluster runs deploy/cluster.sh up in a new directory on free
// loopback ports and brings it down, state and all, when the test ends.
// Under CI=true a missing program fails the test, else it skips. It waits
// while two other clusters of this test binary run.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	clusterSlots <- struct{}{}
	// Registered first, so it runs after the cleanup that brings the
	// cluster down.
	t.Cleanup(func() { <-clusterSlots })
	root := ModuleRoot(t)
	for _, p := range []string{"temporal-server", "temporal-sql-tool"} {
		if _, err := os.Stat(filepath.Join(root, "bin", p)); err != nil {
			RequireProgram(t, p)
		}
	}
	RequireProgram(t, "redis-server")
	RequireProgram(t, RedisCLIBin)
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		RequireProgram(t, "initdb")
	}
	dir, err := os.MkdirTemp("", "pinflow-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	// PostgreSQL runs as its own user, which must enter the directory.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	base, release, err := reserveClusterPorts(clusterPorts)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	// Registered before the cleanup that brings the cluster down, so it
	// runs after it.
	t.Cleanup(release)
	c := &Cluster{Dir: dir, script: filepath.Join(root, "deploy", "cluster.sh"), base: base}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cluster status:\n%s", c.status())
		}
		if out, err := c.run("down", "--purge"); err != nil {
			t.Logf("testenv: cluster down: %v\n%s", err, out)
		}
	})
	start := time.Now()
	if out, err := c.run("up"); err != nil {
		t.Fatalf("testenv: deploy/cluster.sh up: %v\n%s\nnode 1:\n%s\nnode 2:\n%s", err, out,
			c.Log("temporal-1/server.log", 15), c.Log("temporal-2/server.log", 15))
	}
	if c.Env, err = readEnvFile(filepath.Join(dir, "cluster.env")); err != nil {
		t.Fatal(err)
	}
	t.Logf("testenv: cluster up in %s (Temporal %s, Redis %s)", time.Since(start).Round(100*time.Millisecond),
		c.Env["PINFLOW_TEMPORAL_ADDRESS"], c.Env["PINFLOW_CLUSTER_REDIS_PORTS"])
	return c
}

// Frontends are the Temporal frontends' host:port addresses.
func (c *Cluster) Frontends() []string {
	return strings.Split(c.Env["PINFLOW_TEMPORAL_ADDRESS"], ",")
}

// RedisAddrs are the addresses of every Redis node, masters and replicas.
func (c *Cluster) RedisAddrs() []string {
	return strings.Split(c.Env["PINFLOW_REDIS_ADDRS"], ",")
}

// Do runs one of the script's process verbs (kill, stop, start) on one
// process: "temporal" N, "redis" PORT or "worker" N. It may be called
// from any goroutine.
func (c *Cluster) Do(verb, kind, which string) error {
	if out, err := c.run(verb, kind, which); err != nil {
		return fmt.Errorf("testenv: deploy/cluster.sh %s %s %s: %v\n%s", verb, kind, which, err, out)
	}
	return nil
}

// Log returns the last lines of one process's log under the state
// directory, e.g. "temporal-1/server.log".
func (c *Cluster) Log(name string, lines int) string {
	b, err := os.ReadFile(filepath.Join(c.Dir, name))
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

func (c *Cluster) status() string {
	out, _ := c.run("status")
	return string(out)
}

func (c *Cluster) run(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.script, args...)
	cmd.Env = append(os.Environ(), "PINFLOW_CLUSTER_DIR="+c.Dir,
		fmt.Sprintf("PINFLOW_CLUSTER_BASE_PORT=%d", c.base), "PINFLOW_CLUSTER_WORKERS=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// readEnvFile reads KEY=VALUE lines, skipping blanks and comments.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok {
			return nil, fmt.Errorf("testenv: %s: line %q is not KEY=VALUE", path, line)
		}
		env[k] = v
	}
	return env, sc.Err()
}

// Every port stays below the kernel's ephemeral range (32768), which
// Temporal's membership table needs too (it stores ports as smallint).
// Clusters take theirs from a region of their own, where the tests'
// single-port servers do not pick: a node a test kills must find its
// ports free when the test starts it again, however many tests run beside
// it.
// The Temporal dev server also binds its --port + 1000 (HTTP), which
// stays below the clusters' region too.
const (
	singlePortsFrom  = 20000
	singlePortsTo    = 27000
	clusterPortsFrom = 28000
	portsTo          = 32768
)

// reservedClusterPorts are the base ports of this test binary's running
// clusters, whose ranges no other cluster may take, even while one of
// their nodes is down.
var reservedClusterPorts = struct {
	sync.Mutex
	bases map[int]bool
}{bases: map[int]bool{}}

// reserveClusterPorts finds n ports in a row in the clusters' region that
// accept a listener now and overlap no running cluster's, and reserves
// them until release.
func reserveClusterPorts(n int) (base int, release func(), err error) {
	r := &reservedClusterPorts
	r.Lock()
	defer r.Unlock()
	for range 50 {
		base := clusterPortsFrom + rand.IntN(portsTo-clusterPortsFrom-n)
		taken := false
		for b := range r.bases {
			taken = taken || base < b+n && b < base+n
		}
		if taken || !listenable(base, n) {
			continue
		}
		r.bases[base] = true
		return base, func() {
			r.Lock()
			defer r.Unlock()
			delete(r.bases, base)
		}, nil
	}
	return 0, nil, fmt.Errorf("find %d free loopback ports in a row from %d: none in 50 tries", n, clusterPortsFrom)
}

// listenable says whether ports base to base+n-1 all accept a listener.
func listenable(base, n int) bool {
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// freePortRange finds a base port in the single-port servers' region
// whose next n ports all accept a listener now.
func freePortRange(n int) (int, error) {
	for range 50 {
		base := singlePortsFrom + rand.IntN(singlePortsTo-singlePortsFrom-n)
		if listenable(base, n) {
			return base, nil
		}
	}
	return 0, fmt.Errorf("find %d free loopback ports in a row from %d to %d: none in 50 tries", n, singlePortsFrom, singlePortsTo)
}
