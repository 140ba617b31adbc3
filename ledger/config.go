package ledger

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/tlsfile"
)

// Config says how to reach Redis. Its envconfig tags are read under the
// caller's prefix, e.g. PINFLOW_REDIS_URL with envconfig.Process("pinflow",
// &cfg). Set URL for one server or Addrs for a Redis Cluster, not both;
// with neither, the client talks to 127.0.0.1:6379. KeyPrefix, DialTimeout
// and WaitTimeout left zero are DefaultKeyPrefix, DefaultDialTimeout and
// DefaultWaitTimeout.
type Config struct {
	// URL is a redis:// or rediss:// URL of a single server (rediss means
	// TLS). Credentials may be in the URL or in Username and Password.
	URL string `envconfig:"REDIS_URL"`
	// Addrs are host:port seed addresses of a Redis Cluster.
	Addrs []string `envconfig:"REDIS_ADDRS"`
	// Username and Password authenticate (Redis ACL, or requirepass when
	// Username is empty). They override those in URL.
	Username string `envconfig:"REDIS_USERNAME"`
	Password string `envconfig:"REDIS_PASSWORD"`
	// TLS turns on TLS for Addrs, or for a redis:// URL.
	TLS bool `envconfig:"REDIS_TLS"`
	// TLSCA is a PEM file of CAs to trust instead of the system's.
	TLSCA string `envconfig:"REDIS_TLS_CA"`
	// TLSCert and TLSKey are PEM files of a client certificate and its key,
	// for servers that require one.
	TLSCert string `envconfig:"REDIS_TLS_CERT"`
	TLSKey  string `envconfig:"REDIS_TLS_KEY"`
	// KeyPrefix starts every ledger key, so several deployments can share
	// one Redis.
	KeyPrefix string `envconfig:"REDIS_KEY_PREFIX"`
	// DialTimeout bounds connecting, including the first PING.
	DialTimeout time.Duration `envconfig:"REDIS_DIAL_TIMEOUT"`
	// OutageWait, when positive, has every command (and a first PING that
	// finds the server loading its data) wait out a Redis that restarts or
	// fails over, for up to that long,
	// before it fails with an OutageError that says since when: the CLI
	// sets it, so that an operator's command is not failed by a restart.
	// The worker's steps wait in their own way (activities' waitLedger).
	OutageWait time.Duration `ignored:"true"`
	// WaitReplicas is how many replicas must have received each change
	// (claim, release, commit, fence, registration, instance record)
	// before the call that made it succeeds (Redis WAIT); one that is not
	// received in time fails with ledger.ErrNotDurable, and may be
	// retried. A failover to such a replica keeps the change. 0, the
	// default, waits for none: right for one dev server, which has no
	// replica. In production give every master a replica and set 1.
	WaitReplicas int `envconfig:"REDIS_WAIT_REPLICAS" default:"0"`
	// WaitLocal has the master fsync each change to its append-only file
	// before the call that made it succeeds (Redis WAITAOF 1 0), so it
	// survives a crash of the master. It needs Redis 7.2 or later and
	// appendonly yes; the ledger refuses to start otherwise. appendfsync
	// always gives the same guarantee on any version without it, and is
	// what a single server (the dev stack) needs: false is the default.
	WaitLocal bool `envconfig:"REDIS_WAIT_LOCAL" default:"false"`
	// WaitTimeout bounds each wait of WaitReplicas and WaitLocal: a change
	// not acknowledged within it fails its call with ledger.ErrNotDurable.
	// The client's read timeout is raised to fit both waits.
	WaitTimeout time.Duration `envconfig:"REDIS_WAIT_TIMEOUT"`
}

// durability is what the config asks every change to wait for.
func (c Config) durability() Durability {
	return Durability{Replicas: c.WaitReplicas, Local: c.WaitLocal, Timeout: c.WaitTimeout}
}

// DefaultDialTimeout bounds connecting when Config.DialTimeout is 0.
const DefaultDialTimeout = 5 * time.Second

// defaultReadTimeout is go-redis's read timeout, which the config keeps
// unless it waits for durability.
const defaultReadTimeout = 3 * time.Second

// defaultAddr is where a Config with neither URL nor Addrs points.
const defaultAddr = "127.0.0.1:6379"

// Endpoint describes where the config points, without credentials, for
// log lines and errors.
func (c Config) Endpoint() string {
	switch {
	case len(c.Addrs) > 0:
		return "cluster " + strings.Join(c.Addrs, ",")
	case c.URL != "":
		u, err := url.Parse(c.URL)
		if err == nil && u.Scheme == "unix" {
			return "unix://" + u.Path
		}
		if err != nil || u.Host == "" {
			return unparsable
		}
		return u.Scheme + "://" + u.Host + u.EscapedPath()
	}
	return defaultAddr
}

// unparsable is the endpoint of a REDIS_URL that is no URL.
const unparsable = "(unparsable REDIS_URL)"

// NewClient builds a client for the config (a cluster client when Addrs is
// set) and checks it with a PING. Its error is one line naming the
// endpoint and never contains a password.
func (c Config) NewClient(ctx context.Context) (redis.UniversalClient, error) {
	opts, err := c.options()
	if err != nil {
		where := "the ledger's Redis"
		if ep := c.Endpoint(); ep != unparsable {
			where += " at " + ep
		}
		return nil, fmt.Errorf("%s: %s", where, c.redact(err))
	}
	client := redis.NewUniversalClient(opts)
	timeout := c.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hook := outageHook{wait: c.OutageWait, where: c.Endpoint()}
	err = client.Ping(pctx).Err()
	if c.OutageWait > 0 && loading(err) {
		// Up, and loading its data after a restart: worth the wait. A
		// server that refuses the connection may be a wrong address, said
		// at once.
		err = hook.retry(ctx, func() error { return client.Ping(ctx).Err() })
	}
	var outage *OutageError
	if errors.As(err, &outage) {
		// It names the server by its endpoint, which holds no password,
		// and says since when already.
		_ = client.Close()
		return nil, err
	}
	if err != nil {
		_ = client.Close()
		hint := ""
		if opts.TLSConfig == nil && errors.Is(err, io.EOF) {
			// A TLS port closes on a plain client's first command.
			hint = " (if the server only speaks TLS, use a rediss:// URL or REDIS_TLS=true)"
		}
		return nil, fmt.Errorf("the ledger's Redis at %s: cannot connect: %s%s", c.Endpoint(), c.redact(err), hint)
	}
	if c.OutageWait > 0 {
		client.AddHook(hook)
	}
	return client, nil
}

func (c Config) options() (*redis.UniversalOptions, error) {
	if c.URL != "" && len(c.Addrs) > 0 {
		return nil, errors.New("both REDIS_URL and REDIS_ADDRS are set; set REDIS_URL for one server or REDIS_ADDRS for a cluster")
	}
	opts := &redis.UniversalOptions{Addrs: c.Addrs, IsClusterMode: len(c.Addrs) > 0}
	for _, a := range c.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("REDIS_ADDRS entry %q is not host:port", a)
		}
	}
	if c.URL != "" {
		single, err := redis.ParseURL(c.URL)
		if err != nil {
			var uerr *url.Error
			if errors.As(err, &uerr) {
				// url.Error repeats the whole URL, password included.
				err = uerr.Err
			}
			return nil, fmt.Errorf("REDIS_URL is not a redis://, rediss:// or unix:// URL (%v)", err)
		}
		opts.Addrs = []string{single.Addr}
		opts.DB, opts.Username, opts.Password, opts.TLSConfig = single.DB, single.Username, single.Password, single.TLSConfig
		if single.Network == "unix" {
			opts.Dialer = func(ctx context.Context, _, addr string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", addr)
			}
		}
	}
	if len(opts.Addrs) == 0 {
		opts.Addrs = []string{defaultAddr}
	}
	if c.Username != "" {
		opts.Username = c.Username
	}
	if c.Password != "" {
		opts.Password = c.Password
	}
	if c.DialTimeout > 0 {
		opts.DialTimeout = c.DialTimeout
	}
	if d := c.durability(); d.on() {
		// A pipeline's replies are read within one read timeout, and a
		// change waits up to twice the wait timeout (WAITAOF, then WAIT).
		wait := d.Timeout
		if wait <= 0 {
			wait = DefaultWaitTimeout
		}
		opts.ReadTimeout = defaultReadTimeout + 2*wait
	}
	if files := c.tlsFiles(); c.TLS || files.Named() {
		if opts.TLSConfig == nil {
			opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		if err := files.Load(opts.TLSConfig); err != nil {
			return nil, err
		}
	}
	return opts, nil
}

// tlsFiles are the PEM files of the Redis connection.
func (c Config) tlsFiles() tlsfile.Files {
	return tlsfile.Files{Var: "REDIS_TLS", CA: c.TLSCA, Cert: c.TLSCert, Key: c.TLSKey}
}

// redact renders err on one line with every secret the config holds
// blanked out, in case a lower layer echoed one.
func (c Config) redact(err error) string {
	msg := strings.ReplaceAll(err.Error(), "\n", " ")
	secrets := []string{c.Password}
	if u, perr := url.Parse(c.URL); perr == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			secrets = append(secrets, p, url.QueryEscape(p), u.User.String())
		}
	}
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return msg
}
