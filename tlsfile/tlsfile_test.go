package tlsfile

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writePair writes a self-signed certificate and its key into dir.
func writePair(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	write(t, cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	write(t, key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
	return cert, key
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	cert, key := writePair(t, dir)
	notPEM := filepath.Join(dir, "not-pem")
	write(t, notPEM, []byte("not a certificate"))
	missing := filepath.Join(dir, "missing.pem")
	tests := []struct {
		name  string
		files Files
		want  string // in the error; empty: the files load
	}{
		{"nothing", Files{}, ""},
		{"CA and pair", Files{CA: cert, Cert: cert, Key: key}, ""},
		{"missing CA", Files{CA: missing}, "X_TLS_CA " + missing + ": no such file or directory; want a PEM file of CA certificates"},
		{"CA without PEM", Files{CA: notPEM}, "X_TLS_CA " + notPEM + ": no PEM certificate in it"},
		{"certificate without key", Files{Cert: cert}, `X_TLS_CERT "` + cert + `" and X_TLS_KEY "": a client certificate and its key must be set together`},
		{"key without certificate", Files{Key: key}, `X_TLS_CERT "" and X_TLS_KEY "` + key + `"`},
		{"key that is no key", Files{Cert: cert, Key: notPEM}, "X_TLS_CERT " + cert + " and X_TLS_KEY " + notPEM + ": "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.files.Var = "X_TLS"
			var tc tls.Config
			err := tt.files.Load(&tc)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Load(%+v) = %v, want nil", tt.files, err)
				}
				if (tc.RootCAs != nil) != (tt.files.CA != "") || len(tc.Certificates) != map[bool]int{false: 0, true: 1}[tt.files.Cert != ""] {
					t.Errorf("Load(%+v) set RootCAs %v and %d certificates, want those the files name", tt.files, tc.RootCAs != nil, len(tc.Certificates))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Load(%+v) = %v, want one line with %q", tt.files, err, tt.want)
			}
		})
	}
}
