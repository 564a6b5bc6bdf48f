// Package certs serves a TLS certificate and key from files, reloaded on
// demand (SIGHUP) without a restart: a renewed certificate (certbot,
// cert-manager) is picked up by new connections while open ones go on.
package certs

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Reloader holds the current certificate.
type Reloader struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

// Load reads the certificate chain and key (PEM) from their files.
func Load(certFile, keyFile string) (*Reloader, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("TLS needs both a certificate and a key file")
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload reads the files again. On failure the certificate in use stays.
// A certificate that expired already is refused (a renewal hook that
// copied the old file must not replace a good one), and one not valid yet.
func (r *Reloader) Reload() error {
	c, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		// The error names the files and the PEM problem, never key bytes.
		return fmt.Errorf("TLS certificate %s / key %s: %w", r.certFile, r.keyFile, err)
	}
	if c.Leaf != nil && time.Now().After(c.Leaf.NotAfter) {
		return fmt.Errorf("TLS certificate %s expired on %s", r.certFile, c.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	// Nor one no client accepts yet (a clock skew of a few minutes with
	// the issuer is allowed).
	if c.Leaf != nil && time.Now().Add(notBeforeSkew).Before(c.Leaf.NotBefore) {
		return fmt.Errorf("TLS certificate %s is not valid before %s", r.certFile, c.Leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	r.cur.Store(&c)
	return nil
}

// notBeforeSkew is how far ahead of the clock a certificate's NotBefore
// may be (an issuer's clock a little ahead).
const notBeforeSkew = 5 * time.Minute

// NotAfter is the current certificate's expiry.
func (r *Reloader) NotAfter() time.Time {
	if c := r.cur.Load(); c != nil && c.Leaf != nil {
		return c.Leaf.NotAfter
	}
	return time.Time{}
}

// Config returns a server configuration that serves the current
// certificate: TLS 1.2 or later, HTTP/1.1 by ALPN.
func (r *Reloader) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return r.cur.Load(), nil
		},
	}
}
