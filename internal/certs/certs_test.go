package certs

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

func serial(t *testing.T, r *Reloader) int64 {
	t.Helper()
	c, err := r.Config().GetCertificate(&tls.ClientHelloInfo{})
	if err != nil || c == nil || c.Leaf == nil {
		t.Fatalf("no certificate: %v", err)
	}
	return c.Leaf.SerialNumber.Int64()
}

// Reload serves the files' new certificate; a reload that fails (a broken
// file, an expired certificate, one not valid yet) keeps the one in use.
func TestReloadServesTheNewCertificateAndKeepsTheOldOneOnFailure(t *testing.T) {
	c := testsrv.GenCerts(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	install := func(cf, kf string) { t.Helper(); testsrv.Install(t, cf, kf, cert, key) }
	install(c.ServerCert, c.ServerKey)
	r, err := Load(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	if serial(t, r) != 2 {
		t.Fatal("not the server certificate")
	}
	renewed, renewedKey := c.ServerLeaf(t, "renewed", 10, time.Now().Add(90*24*time.Hour))
	install(renewed, renewedKey)
	if err := r.Reload(); err != nil || serial(t, r) != 10 {
		t.Fatalf("renewed: %v, serial %d", err, serial(t, r))
	}
	if got := r.NotAfter(); time.Until(got) < 89*24*time.Hour {
		t.Fatalf("NotAfter %v", got)
	}

	expired, expiredKey := c.ServerLeaf(t, "expired", 11, time.Now().Add(-time.Hour))
	install(expired, expiredKey)
	if err := r.Reload(); err == nil || !strings.Contains(err.Error(), "expired") || serial(t, r) != 10 {
		t.Fatalf("expired: %v, serial %d", err, serial(t, r))
	}
	// Not valid yet: no client would accept it (a few minutes ahead is an
	// issuer's clock, accepted).
	future, futureKey := c.ServerLeafBetween(t, "future", 12, time.Now().Add(365*24*time.Hour), time.Now().Add(400*24*time.Hour))
	install(future, futureKey)
	if err := r.Reload(); err == nil || !strings.Contains(err.Error(), "not valid before") || serial(t, r) != 10 {
		t.Fatalf("not yet valid: %v, serial %d", err, serial(t, r))
	}
	skewed, skewedKey := c.ServerLeafBetween(t, "skewed", 13, time.Now().Add(time.Minute), time.Now().Add(90*24*time.Hour))
	install(skewed, skewedKey)
	if err := r.Reload(); err != nil || serial(t, r) != 13 {
		t.Fatalf("a minute ahead: %v, serial %d", err, serial(t, r))
	}
	install(renewed, renewedKey)
	if err := r.Reload(); err != nil || serial(t, r) != 10 {
		t.Fatalf("back to renewed: %v, serial %d", err, serial(t, r))
	}
	keyPEM, _ := os.ReadFile(renewedKey)
	install(renewed, c.ServerKey) // a key that is not the certificate's
	if err := r.Reload(); err == nil || serial(t, r) != 10 {
		t.Fatalf("mismatched key: %v, serial %d", err, serial(t, r))
	}
	os.WriteFile(key, []byte("not a key"), 0o600)
	err = r.Reload()
	if err == nil || serial(t, r) != 10 {
		t.Fatalf("broken key: %v", err)
	}
	if strings.Contains(err.Error(), string(keyPEM[30:60])) {
		t.Fatal("the error shows key bytes")
	}
}

func TestLoadRefusesMissingOrHalfConfiguredFiles(t *testing.T) {
	c := testsrv.GenCerts(t)
	for _, tc := range [][2]string{{"", c.ServerKey}, {c.ServerCert, ""}, {c.ServerCert, "/nonexistent/key.pem"}} {
		if _, err := Load(tc[0], tc[1]); err == nil {
			t.Fatalf("%q %q loaded", tc[0], tc[1])
		}
	}
}
