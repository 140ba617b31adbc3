package testenv

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Programs the Redis helpers run; deploy/deps.sh installs them (Debian
// packages redis-server and redis-tools, and valkey-server where
// redis-server predates WAITAOF).
const (
	RedisServerBin = "redis-server"
	RedisCLIBin    = "redis-cli"
	// ValkeyServerBin serves the same protocol and configuration as
	// redis-server 7.2, WAITAOF included (Valkey 7.2 and later).
	ValkeyServerBin = "valkey-server"
)

// startTimeout bounds how long a redis-server may take to answer PING.
const startTimeout = 15 * time.Second

// Redis is one redis-server process serving 127.0.0.1:Port from Dir.
type Redis struct {
	// Addr is "127.0.0.1:<port>".
	Addr string
	Port int
	// Dir is the server's working directory: its config, log, RDB and AOF.
	Dir string

	cfg    redisConfig
	server *server // nil while stopped
	// held has the next start keep the server loading its data
	// (RestartLoadingHeld).
	held bool
}

type redisConfig struct {
	server      string // the program startRedis chose
	waitAOF     bool   // the server must have WAITAOF
	appendOnly  bool
	cluster     bool
	clusterPort int // the cluster bus port, chosen at start
	extra       []string
}

// RedisOption changes how StartRedis configures the server.
type RedisOption func(*redisConfig)

// AppendOnly turns on the append-only file with an fsync per write, so what
// the server acknowledged survives a restart, even one after SIGKILL.
func AppendOnly() RedisOption {
	return func(c *redisConfig) { c.appendOnly = true }
}

// WithWAITAOF starts a server that has WAITAOF (Redis 7.2 and later):
// redis-server when it is recent enough, else valkey-server. Under CI=true
// a missing one fails the test, so the durability that needs WAITAOF is
// always exercised there.
func WithWAITAOF() RedisOption {
	return func(c *redisConfig) { c.waitAOF = true }
}

// RedisConfigLines adds raw redis.conf lines, such as "maxclients 20000".
func RedisConfigLines(lines ...string) RedisOption {
	return func(c *redisConfig) { c.extra = append(c.extra, lines...) }
}

// RequireProgram returns the path of an installed program. When it is
// missing the test is skipped, or fails under CI=true.
func RequireProgram(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("testenv: %s is not installed (run deploy/deps.sh); under CI=true a missing dependency fails the run", name)
	}
	t.Skipf("testenv: %s is not installed (run deploy/deps.sh); skipping", name)
	return ""
}

// StartRedis starts a redis-server on a free loopback port in a new
// temporary directory, waits until it answers PING, and stops it when the
// test ends.
func StartRedis(t testing.TB, opts ...RedisOption) *Redis {
	t.Helper()
	var cfg redisConfig
	for _, o := range opts {
		o(&cfg)
	}
	return startRedis(t, t.TempDir(), cfg)
}

func startRedis(t testing.TB, dir string, cfg redisConfig) *Redis {
	t.Helper()
	cfg.server = RedisServerBin
	if cfg.waitAOF && !hasWAITAOF(t, RedisServerBin) {
		cfg.server = ValkeyServerBin
	}
	RequireProgram(t, cfg.server)
	// A port found free can be taken before the server binds it; try again
	// with another one when the server exits at start.
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		r := &Redis{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, Dir: dir, cfg: cfg}
		if cfg.cluster {
			if r.cfg.clusterPort, err = freePort(); err != nil {
				t.Fatalf("testenv: %v", err)
			}
		}
		err = r.start()
		if err == nil {
			t.Cleanup(func() { r.stop(syscall.SIGTERM) })
			return r
		}
		lastErr = err
		if !errors.Is(err, errExited) {
			break
		}
	}
	t.Fatalf("testenv: %v", lastErr)
	return nil
}

// URL returns the server's redis:// URL.
func (r *Redis) URL() string { return "redis://" + r.Addr + "/0" }

// Restart stops the server cleanly (SIGTERM, which flushes the AOF) and
// starts it again on the same port and directory.
func (r *Redis) Restart(t testing.TB) {
	t.Helper()
	r.stop(syscall.SIGTERM)
	if err := r.start(); err != nil {
		t.Fatalf("testenv: restart: %v", err)
	}
}

// Stop stops the server cleanly (SIGTERM), leaving its port closed until
// Start: an outage of the ledger, as a restart or a failover makes one.
func (r *Redis) Stop(t testing.TB) {
	t.Helper()
	r.stop(syscall.SIGTERM)
}

// Start starts a server Stop stopped, on the same port and directory.
func (r *Redis) Start(t testing.TB) {
	t.Helper()
	if err := r.start(); err != nil {
		t.Fatalf("testenv: start again: %v", err)
	}
}

// KillAndRestart kills the server with SIGKILL, as a crash would, and starts
// it again on the same port and directory.
func (r *Redis) KillAndRestart(t testing.TB) {
	t.Helper()
	r.stop(syscall.SIGKILL)
	if err := r.start(); err != nil {
		t.Fatalf("testenv: restart after kill: %v", err)
	}
}

func (r *Redis) writeConfig() (string, error) {
	lines := []string{
		"bind 127.0.0.1",
		"protected-mode yes",
		"port " + strconv.Itoa(r.Port),
		"dir " + r.Dir,
		"daemonize no",
		"logfile " + filepath.Join(r.Dir, "redis.log"),
		`save ""`,
	}
	if r.cfg.appendOnly {
		lines = append(lines, "appendonly yes", "appendfsync always")
	}
	if r.cfg.cluster {
		lines = append(lines, "cluster-enabled yes", "cluster-port "+strconv.Itoa(r.cfg.clusterPort),
			"cluster-config-file nodes.conf", "cluster-node-timeout 5000")
	}
	lines = append(lines, r.cfg.extra...)
	if r.held {
		// A pause per key loaded, and events processed every KiB read:
		// the server answers (-LOADING) while it loads.
		lines = append(lines, "key-load-delay "+strconv.Itoa(heldKeyDelay), "loading-process-events-interval-bytes 1024")
	}
	path := filepath.Join(r.Dir, "redis.conf")
	return path, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

func (r *Redis) start() error {
	conf, err := r.writeConfig()
	if err != nil {
		return err
	}
	cmd := exec.Command(r.cfg.server, conf)
	cmd.Dir = r.Dir
	ready := func() error { return ping(r.Addr) }
	if r.held {
		ready = func() error { return r.loadingHeld() }
	}
	r.server, err = startServer(cmd, r.cfg.server+" on "+r.Addr, filepath.Join(r.Dir, "redis.log"),
		startTimeout, 20*time.Millisecond, ready)
	return err
}

// Keys RestartLoadingHeld fills db heldDB with, each loaded heldKeyDelay
// microseconds apart: the load takes minutes unless released, longer
// than any wait of a test, and a release takes effect within a tenth of
// a second (the keys of one KiB read).
const (
	heldDB       = "15"
	heldKeys     = 500_000
	heldKeyDelay = 1000
)

// RestartLoadingHeld restarts the server (keeping its data, persisted by
// SHUTDOWN SAVE, or by an AOF rewrite with AppendOnly) and holds it
// loading that data: it accepts connections and answers most commands
// with -LOADING, as a restarted Redis does, until release is called.
// Release lets the load finish, waits until the server answers PING, and
// drops the keys that made the load long (in db 15). A restart with
// Restart, Stop or KillAndRestart after it loads without the hold.
func (r *Redis) RestartLoadingHeld(t testing.TB) (release func()) {
	t.Helper()
	// In scripts short enough not to keep the server busy for clients.
	const chunk = 20_000
	for from := 1; from <= heldKeys; from += chunk {
		script := "redis.call('SELECT', " + heldDB + ") for i = " + strconv.Itoa(from) + ", " + strconv.Itoa(from+chunk-1) +
			" do redis.call('SET', 'testenv:held:' .. i, 'x') end return 1"
		if _, err := r.Do("EVAL", script, "0"); err != nil {
			t.Fatalf("testenv: fill %s for a held load: %v", r.Addr, err)
		}
	}
	if r.cfg.appendOnly {
		// The AOF's base file is an RDB that the delay applies to.
		if _, err := r.Do("BGREWRITEAOF"); err != nil {
			t.Fatalf("testenv: rewrite the AOF of %s: %v", r.Addr, err)
		}
		r.until(t, "the AOF rewrite of "+r.Addr+" to end", func() bool {
			info, err := r.Do("INFO", "persistence")
			return err == nil && strings.Contains(info, "aof_rewrite_in_progress:0") &&
				strings.Contains(info, "aof_rewrite_scheduled:0") && strings.Contains(info, "aof_last_bgrewrite_status:ok")
		})
	}
	// SHUTDOWN SAVE writes the RDB as the server exits: no change slips
	// in between.
	if _, err := r.Do("SHUTDOWN", "SAVE"); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("testenv: SHUTDOWN SAVE on %s: %v", r.Addr, err)
	}
	r.stop(syscall.SIGTERM)
	r.held = true
	err := r.start()
	r.held = false
	if err != nil {
		t.Fatalf("testenv: restart with its load held: %v", err)
	}
	var once sync.Once
	return func() {
		t.Helper()
		once.Do(func() {
			if _, err := r.Do("CONFIG", "SET", "key-load-delay", "0"); err != nil {
				t.Fatalf("testenv: release the load of %s: %v", r.Addr, err)
			}
			r.until(t, r.Addr+" to load its data", func() bool { return ping(r.Addr) == nil })
			if _, err := r.Do("EVAL", "redis.call('SELECT', "+heldDB+") return redis.call('FLUSHDB')", "0"); err != nil {
				t.Fatalf("testenv: drop the keys of the held load on %s: %v", r.Addr, err)
			}
		})
	}
}

// loadingHeld is the readiness of a server started to stay loading: it
// answers -LOADING, and says it is loading.
func (r *Redis) loadingHeld() error {
	if _, err := r.Do("PING"); err == nil {
		return errors.New("the server answers PING: its load was not held")
	} else if !strings.HasPrefix(err.Error(), "LOADING") {
		return err
	}
	info, err := r.Do("INFO", "persistence")
	if err != nil {
		return err
	}
	if !strings.Contains(info, "loading:1") {
		return errors.New("the server is not loading its data")
	}
	return nil
}

// until polls cond for up to startTimeout.
func (r *Redis) until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("testenv: timed out after %s waiting for %s", startTimeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Do sends one command and returns its reply as text: a status, integer
// or bulk string as it is, an array's elements one a line. A Redis error
// reply is returned as an error with Redis' words ("LOADING Redis is
// loading ..."); a closed connection as io.EOF.
func (r *Redis) Do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", r.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	// A fill of the keys of a held load takes seconds on a loaded machine.
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	var req strings.Builder
	req.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		req.WriteString("$" + strconv.Itoa(len(a)) + "\r\n" + a + "\r\n")
	}
	if _, err := c.Write([]byte(req.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

// readReply reads one RESP2 reply.
func readReply(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch body := line[1:]; line[0] {
	case '+', ':':
		return body, nil
	case '-':
		return "", errors.New(body)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return "", err
		}
		var parts []string
		for range n {
			p, err := readReply(br)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", errors.New("unexpected reply " + line)
}

// stop signals the server and waits for it to exit, killing it if a clean
// shutdown takes too long. Stopping a stopped server does nothing.
func (r *Redis) stop(sig syscall.Signal) {
	r.server.stop(sig)
	r.server = nil
}

// hasWAITAOF says whether the installed program is Redis 7.2 or later,
// from its --version line ("Redis server v=7.0.15 ...").
func hasWAITAOF(t testing.TB, bin string) bool {
	t.Helper()
	RequireProgram(t, bin)
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("testenv: %s --version: %v", bin, err)
	}
	return versionAtLeast(string(out), 7, 2)
}

// versionAtLeast reads the "v=MAJOR.MINOR" of a server's --version line.
func versionAtLeast(line string, major, minor int) bool {
	_, v, ok := strings.Cut(line, "v=")
	if !ok {
		return false
	}
	parts := strings.SplitN(strings.Fields(v)[0], ".", 3)
	if len(parts) < 2 {
		return false
	}
	maj, err1 := strconv.Atoi(parts[0])
	mnr, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return maj > major || maj == major && mnr >= minor
}

// freePort returns a loopback TCP port nothing listens on right now, below
// the kernel's ephemeral range, where outgoing connections take no ports.
func freePort() (int, error) { return freePortRange(1) }

// ping sends an inline PING and expects +PONG; it keeps this package free of
// a Redis client.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	// A server with requirepass answers NOAUTH: it is up all the same.
	reply := strings.TrimSpace(line)
	if reply != "+PONG" && !strings.HasPrefix(reply, "-NOAUTH") {
		return errors.New("unexpected reply " + reply)
	}
	return nil
}

// RedisCluster is a Redis Cluster of masters without replicas.
type RedisCluster struct {
	Nodes []*Redis
}

// Addrs returns the nodes' addresses, for a cluster client's seed list.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// StartRedisCluster starts masters cluster-enabled redis-server nodes on
// loopback, joins them with redis-cli --cluster create (no replicas), waits
// until every node reports cluster_state:ok, and stops them when the test
// ends. Redis Cluster needs at least three masters.
func StartRedisCluster(t testing.TB, masters int) *RedisCluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("testenv: redis cluster of %d masters: Redis Cluster needs at least 3", masters)
	}
	cli := RequireProgram(t, RedisCLIBin)
	c := &RedisCluster{}
	for range masters {
		c.Nodes = append(c.Nodes, startRedis(t, t.TempDir(), redisConfig{cluster: true}))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create %s: %v\n%s", strings.Join(c.Addrs(), " "), err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.Nodes {
		for {
			out, err := exec.CommandContext(ctx, cli, "-h", "127.0.0.1", "-p", strconv.Itoa(n.Port), "cluster", "info").Output()
			if err == nil && strings.Contains(string(out), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("testenv: redis cluster node %s not ok after 30s: %v %s", n.Addr, err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return c
}
