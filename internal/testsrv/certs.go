package testsrv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certs are PEM files of a throwaway CA, a server certificate for
// 127.0.0.1/localhost and a client certificate, all signed by the CA.
type Certs struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string

	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

// GenCerts writes a fresh CA, server and client certificate into a temp dir.
func GenCerts(t testing.TB) Certs {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "infera-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	c := Certs{CA: filepath.Join(dir, "ca.pem"), dir: dir, caCert: caCert, caKey: caKey}
	writePEM(t, c.CA, "CERTIFICATE", caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		return c.leaf(t, name, serial, usage, now.Add(-time.Hour), now.Add(24*time.Hour))
	}
	c.ServerCert, c.ServerKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	c.ClientCert, c.ClientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return c
}

// ServerLeaf writes another server certificate for 127.0.0.1/localhost,
// signed by the CA, with the given serial number and validity end (one in
// the past makes an expired certificate).
func (c Certs) ServerLeaf(t testing.TB, name string, serial int64, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	notBefore := time.Now().Add(-time.Hour)
	if !notAfter.After(notBefore) {
		notBefore = notAfter.Add(-48 * time.Hour)
	}
	return c.leaf(t, name, serial, x509.ExtKeyUsageServerAuth, notBefore, notAfter)
}

// ServerLeafBetween is ServerLeaf valid from notBefore.
func (c Certs) ServerLeafBetween(t testing.TB, name string, serial int64, notBefore, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	return c.leaf(t, name, serial, x509.ExtKeyUsageServerAuth, notBefore, notAfter)
}

func (c Certs) leaf(t testing.TB, name string, serial int64, usage x509.ExtKeyUsage, notBefore, notAfter time.Time) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.caCert, &key.PublicKey, c.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cf, kf := filepath.Join(c.dir, name+".pem"), filepath.Join(c.dir, name+"-key.pem")
	writePEM(t, cf, "CERTIFICATE", der)
	writePEM(t, kf, "EC PRIVATE KEY", kder)
	return cf, kf
}

// Pool is a certificate pool holding the CA, for clients.
func (c Certs) Pool(t testing.TB) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(c.CA)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(b)
	return p
}

// Install copies a certificate and key file to certDst and keyDst (a
// renewal put in place).
func Install(t testing.TB, cert, key, certDst, keyDst string) {
	t.Helper()
	for src, dst := range map[string]string{cert: certDst, key: keyDst} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
