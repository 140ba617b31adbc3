package testenv

import (
	"bufio"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// do sends one inline command and returns the first reply line.
func do(t *testing.T, addr, cmd string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		t.Fatalf("%s on %s: %v", cmd, addr, err)
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("%s on %s: %v", cmd, addr, err)
	}
	line = strings.TrimSpace(line)
	if strings.HasPrefix(line, "$") && line != "$-1" {
		if line, err = r.ReadString('\n'); err != nil {
			t.Fatalf("%s on %s: %v", cmd, addr, err)
		}
		line = strings.TrimSpace(line)
	}
	return line
}

func TestStartRedisRestartKeepsAppendOnlyData(t *testing.T) {
	r := StartRedis(t, AppendOnly())
	if got := do(t, r.Addr, "SET k v"); got != "+OK" {
		t.Fatalf("SET k v = %q, want +OK", got)
	}
	port := r.Port
	r.Restart(t)
	if r.Port != port {
		t.Errorf("Restart: port %d, want the same %d", r.Port, port)
	}
	if got := do(t, r.Addr, "GET k"); got != "v" {
		t.Errorf("GET k after Restart = %q, want v", got)
	}
	if got := do(t, r.Addr, "SET k2 v2"); got != "+OK" {
		t.Fatalf("SET k2 v2 = %q, want +OK", got)
	}
	r.KillAndRestart(t)
	if got := do(t, r.Addr, "GET k2"); got != "v2" {
		t.Errorf("GET k2 after KillAndRestart = %q, want v2", got)
	}
}

func TestStartRedisWithoutAppendOnlyForgets(t *testing.T) {
	r := StartRedis(t)
	do(t, r.Addr, "SET k v")
	r.Restart(t)
	if got := do(t, r.Addr, "GET k"); got != "$-1" {
		t.Errorf("GET k after Restart without appendonly = %q, want $-1 (nil)", got)
	}
}

func TestStartRedisCluster(t *testing.T) {
	c := StartRedisCluster(t, 3)
	if len(c.Addrs()) != 3 {
		t.Fatalf("StartRedisCluster(3): %d nodes, want 3", len(c.Addrs()))
	}
	for _, n := range c.Nodes {
		if got := do(t, n.Addr, "CLUSTER INFO"); !strings.HasPrefix(got, "cluster_state:ok") {
			t.Errorf("CLUSTER INFO on %s = %q, want cluster_state:ok", n.Addr, got)
		}
	}
}

// fakeTB records how RequireProgram ends a test; like testing.T it stops
// the calling goroutine on Fatalf and Skipf.
type fakeTB struct {
	testing.TB
	fatal, skip string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestRequireProgramMissing(t *testing.T) {
	for _, tc := range []struct {
		ci        string
		wantFatal bool
	}{
		{ci: "true", wantFatal: true},
		{ci: "", wantFatal: false},
		{ci: "false", wantFatal: false},
	} {
		t.Setenv("CI", tc.ci)
		f := &fakeTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			RequireProgram(f, "pinflow-no-such-program")
		}()
		<-done
		if gotFatal := f.fatal != ""; gotFatal != tc.wantFatal || (f.fatal == "" && f.skip == "") {
			t.Errorf("RequireProgram(missing) with CI=%q: fatal %q, skip %q; want fatal=%v", tc.ci, f.fatal, f.skip, tc.wantFatal)
		}
	}
}

func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		line string
		want bool
	}{
		{"Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=1", false},
		{"Redis server v=7.2.0 sha=00000000:0", true},
		{"Redis server v=8.0.1 sha=00000000:0", true},
		{"Valkey server v=8.0.1 sha=00000000:0 malloc=jemalloc-5.3.0", true},
		{"Redis server v=6.9.99", false},
		{"no version here", false},
		{"v=x.y", false},
	} {
		if got := versionAtLeast(tc.line, 7, 2); got != tc.want {
			t.Errorf("versionAtLeast(%q, 7, 2) = %v, want %v", tc.line, got, tc.want)
		}
	}
}

// TestWithWAITAOFAnswersWAITAOF: the server WithWAITAOF starts knows the
// command, whatever redis-server is installed.
func TestWithWAITAOFAnswersWAITAOF(t *testing.T) {
	srv := StartRedis(t, WithWAITAOF(), AppendOnly())
	if got := do(t, srv.Addr, "WAITAOF 1 0 1000"); !strings.HasPrefix(got, "*2") {
		t.Errorf("WAITAOF 1 0 1000 on %s = %q, want a two-element array", srv.Addr, got)
	}
}

// TestRestartLoadingHeld: a server restarted with its load held answers
// -LOADING, and says it is loading, until released; then it has its data
// and none of the keys that held the load.
func TestRestartLoadingHeld(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []RedisOption
	}{
		{"rdb", nil},
		{"aof", []RedisOption{AppendOnly()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := StartRedis(t, tt.opts...)
			if _, err := r.Do("SET", "k", "v"); err != nil {
				t.Fatal(err)
			}
			release := r.RestartLoadingHeld(t)
			if _, err := r.Do("GET", "k"); err == nil || !strings.HasPrefix(err.Error(), "LOADING") {
				t.Errorf("GET k while the load is held = %v, want a LOADING error", err)
			}
			if info, err := r.Do("INFO", "persistence"); err != nil || !strings.Contains(info, "loading:1") {
				t.Errorf("INFO persistence while the load is held = %v, %q; want loading:1", err, info)
			}
			release()
			if got, err := r.Do("GET", "k"); err != nil || got != "v" {
				t.Errorf("GET k after the release = %q, %v; want v", got, err)
			}
			if got, err := r.Do("EVAL", "redis.call('SELECT', 15) return redis.call('DBSIZE')", "0"); err != nil || got != "0" {
				t.Errorf("keys left in db 15 after the release = %q, %v; want 0", got, err)
			}
		})
	}
}
