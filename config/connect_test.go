package config

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pinflow/pinflow/internal/testenv"
)

// secret is a credential the tests pass; no error may contain it.
const secret = "pf-s3cret-9d1e"

// checkConnectError fails unless err is one line that names endpoint,
// says why (contains every one of why) and holds no secret.
func checkConnectError(t *testing.T, what string, err error, endpoint string, why ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: connected, want an error", what)
	}
	msg := err.Error()
	t.Logf("%s: %s", what, msg)
	if strings.Contains(msg, "\n") {
		t.Errorf("%s: error spans lines: %q", what, msg)
	}
	if !strings.Contains(msg, endpoint) {
		t.Errorf("%s: error %q does not name the endpoint %s", what, msg, endpoint)
	}
	for _, w := range why {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: error %q does not say %q", what, msg, w)
		}
	}
	if strings.Contains(msg, secret) {
		t.Errorf("%s: error %q contains the secret", what, msg)
	}
}

// TestRedisCredentials: a wrong password or ACL user fails the connect
// with one line naming the server; the right one connects.
func TestRedisCredentials(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t, testenv.RedisConfigLines(
		"requirepass "+secret+"-right",
		"user pinflow on >"+secret+"-acl ~pinflow:* &* +@all",
	))
	endpoint := "redis://" + srv.Addr + "/0"
	tests := []struct {
		name     string
		cfg      RedisConfig
		ok       bool
		wantWhat string
	}{
		{"no password", RedisConfig{URL: srv.URL()}, false, "NOAUTH"},
		{"wrong password", RedisConfig{URL: srv.URL(), Password: secret}, false, "WRONGPASS"},
		{"wrong password in the URL", RedisConfig{URL: "redis://:" + secret + "@" + srv.Addr + "/0"}, false, "WRONGPASS"},
		{"wrong ACL user", RedisConfig{URL: srv.URL(), Username: "nobody", Password: secret}, false, "WRONGPASS"},
		{"right password", RedisConfig{URL: srv.URL(), Password: secret + "-right"}, true, ""},
		{"right ACL user", RedisConfig{URL: srv.URL(), Username: "pinflow", Password: secret + "-acl"}, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{RedisConfig: tt.cfg, Temporal: Temporal{Namespace: "default"}}
			c.RedisConfig.DialTimeout = 3 * time.Second
			_, rdb, err := c.Redis(ctx)
			if tt.ok {
				if err != nil {
					t.Fatalf("Redis(%s): %v", c.RedisConfig.Endpoint(), err)
				}
				_ = rdb.Close()
				return
			}
			checkConnectError(t, "Redis", err, endpoint, tt.wantWhat)
		})
	}
}

// TestRedisTLS: a server whose certificate the configured CA did not sign,
// or a plain client on a TLS port, fails with one line naming the server;
// the right CA connects.
func TestRedisTLS(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	serverCA := writeCA(t, dir, "server-ca")
	otherCA := writeCA(t, dir, "other-ca")
	cert, key := serverCA.issue(t, dir, "redis")
	tlsPort := freeLoopbackPort(t)
	testenv.StartRedis(t, testenv.RedisConfigLines(
		fmt.Sprintf("tls-port %d", tlsPort),
		"tls-cert-file "+cert, "tls-key-file "+key, "tls-ca-cert-file "+serverCA.certFile,
		"tls-auth-clients no",
	))
	tlsAddr := fmt.Sprintf("127.0.0.1:%d", tlsPort)
	tests := []struct {
		name string
		cfg  RedisConfig
		ok   bool
		why  []string
	}{
		{"wrong CA", RedisConfig{URL: "rediss://" + tlsAddr + "/0", TLSCA: otherCA.certFile}, false, []string{"rediss://" + tlsAddr, "certificate"}},
		{"missing CA file", RedisConfig{URL: "rediss://" + tlsAddr + "/0", TLSCA: key + ".missing"}, false, []string{"rediss://" + tlsAddr, "REDIS_TLS_CA"}},
		{"plain client on the TLS port", RedisConfig{URL: "redis://" + tlsAddr + "/0"}, false, []string{"redis://" + tlsAddr, "TLS"}},
		{"right CA", RedisConfig{URL: "rediss://" + tlsAddr + "/0", TLSCA: serverCA.certFile}, true, nil},
		{"redis:// URL with REDIS_TLS", RedisConfig{URL: "redis://" + tlsAddr + "/0", TLS: true, TLSCA: serverCA.certFile}, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{RedisConfig: tt.cfg, Temporal: Temporal{Namespace: "default"}}
			c.RedisConfig.DialTimeout = 3 * time.Second
			_, rdb, err := c.Redis(ctx)
			if tt.ok {
				if err != nil {
					t.Fatalf("Redis(%s): %v", c.RedisConfig.Endpoint(), err)
				}
				_ = rdb.Close()
				return
			}
			checkConnectError(t, "Redis", err, tt.why[0], tt.why[1:]...)
		})
	}
}

// TestTemporalTLS: TLS, an API key (which implies TLS) or a bad CA file
// against a plain dev server fail with one line naming the frontend.
func TestTemporalTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Temporal dev server; skipped with -short")
	}
	ctx := context.Background()
	ts := testenv.StartTemporal(t)
	dir := t.TempDir()
	ca := writeCA(t, dir, "ca")
	notPEM := filepath.Join(dir, "not-pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		tmp  Temporal
		why  []string
	}{
		{"TLS against a plain server", Temporal{TLS: true, TLSCA: ca.certFile}, []string{"cannot connect"}},
		{"API key against a plain server", Temporal{APIKey: secret}, []string{"cannot connect"}},
		{"CA file without PEM", Temporal{TLS: true, TLSCA: notPEM}, []string{"PINFLOW_TEMPORAL_TLS_CA", "no PEM certificate"}},
		{"missing client certificate", Temporal{TLSCert: filepath.Join(dir, "missing.pem"), TLSKey: filepath.Join(dir, "missing.key")}, []string{"PINFLOW_TEMPORAL_TLS_CERT " + filepath.Join(dir, "missing.pem"), "want a PEM certificate"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Temporal: tt.tmp}
			c.Address, c.Namespace = ts.Address, ts.Namespace
			tc, err := c.Dial(ctx, nil)
			if err == nil {
				tc.Close()
			}
			checkConnectError(t, "Dial", err, ts.Address, tt.why...)
		})
	}
}

// TestTemporalTLSFiles: the Temporal TLS files get the checks the Redis
// ones get. A client certificate without its key, or a key without its
// certificate, is refused before any connection is tried, even without
// PINFLOW_TEMPORAL_TLS; a pair and a CA file load.
func TestTemporalTLSFiles(t *testing.T) {
	dir := t.TempDir()
	ca := writeCA(t, dir, "ca")
	cert, key := ca.issue(t, dir, "client")
	const addr = "127.0.0.1:1" // nothing is dialled
	together := []string{"PINFLOW_TEMPORAL_TLS_CERT", "PINFLOW_TEMPORAL_TLS_KEY", "must be set together"}
	tests := []struct {
		name string
		tmp  Temporal
		why  []string // empty: the files load
	}{
		{"certificate without key", Temporal{TLS: true, TLSCert: cert}, together},
		{"key without certificate", Temporal{TLSKey: key}, together},
		{"CA file without PEM", Temporal{TLSCA: key}, []string{"PINFLOW_TEMPORAL_TLS_CA " + key, "no PEM certificate"}},
		{"pair and CA", Temporal{TLSCA: ca.certFile, TLSCert: cert, TLSKey: key}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Temporal: tt.tmp}
			c.Address = addr
			tc, err := c.tlsConfig()
			if len(tt.why) == 0 {
				if err != nil || len(tc.Certificates) != 1 || tc.RootCAs == nil {
					t.Fatalf("tlsConfig(%+v) = %+v, %v; want a client certificate and a CA pool", tt.tmp, tc, err)
				}
				return
			}
			_, err = c.Dial(context.Background(), nil)
			checkConnectError(t, "Dial", err, addr, tt.why...)
		})
	}
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// testCA is a certificate authority made for one test.
type testCA struct {
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	certFile string
}

func writeCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pinflow test " + name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, name+".pem")
	writePEM(t, file, "CERTIFICATE", der)
	return &testCA{cert: cert, key: key, certFile: file}
}

// issue makes a server certificate for 127.0.0.1 and localhost and
// returns its certificate and key files.
func (ca *testCA) issue(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	return certFile, keyFile
}

func writePEM(t *testing.T, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
