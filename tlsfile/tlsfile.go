// Package tlsfile loads the PEM files a TLS client is configured with, so
// that the Temporal and the Redis connections check them the same way.
package tlsfile

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Files are the PEM files of one connection. Var is the stem of the
// variables that name them, for errors: "REDIS_TLS" stands for
// REDIS_TLS_CA, REDIS_TLS_CERT and REDIS_TLS_KEY.
type Files struct {
	Var           string
	CA, Cert, Key string
}

// Named reports whether any file is named, which turns TLS on.
func (f Files) Named() bool {
	return f.CA != "" || f.Cert != "" || f.Key != ""
}

// Load adds the CA pool and the client certificate f names to t. A CA
// file must hold a PEM certificate, and a certificate comes with its key.
// Its error is one line naming the variable, its value and what is
// allowed.
func (f Files) Load(t *tls.Config) error {
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return fmt.Errorf("%s_CA %s: %w; want a PEM file of CA certificates", f.Var, f.CA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("%s_CA %s: no PEM certificate in it; want a PEM file of CA certificates", f.Var, f.CA)
		}
		t.RootCAs = pool
	}
	if (f.Cert == "") != (f.Key == "") {
		return fmt.Errorf("%s_CERT %q and %s_KEY %q: a client certificate and its key must be set together", f.Var, f.Cert, f.Var, f.Key)
	}
	if f.Cert != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return fmt.Errorf("%s_CERT %s and %s_KEY %s: %w; want a PEM certificate and its PEM private key", f.Var, f.Cert, f.Var, f.Key, err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return nil
}
