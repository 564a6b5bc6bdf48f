package discovery

import (
	"context"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// TestEtcdTLSAndAuth: the TLS (CA, client cert/key) and auth (user,
// password) options reach a real etcd that requires them.
func TestEtcdTLSAndAuth(t *testing.T) {
	certs := testsrv.GenCerts(t)
	e := testsrv.StartEtcdTLS(t, &certs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tlsCfg := EtcdConfig{Endpoints: []string{e.Endpoint}, CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey, RequestTimeout: 2 * time.Second}

	// Without a client certificate etcd refuses us.
	noCert, err := NewEtcdClient(EtcdConfig{Endpoints: []string{e.Endpoint}, CAFile: certs.CA, DialTimeout: time.Second})
	if err == nil {
		cctx, c := context.WithTimeout(ctx, 2*time.Second)
		_, err = noCert.Get(cctx, "x")
		c()
		noCert.Close()
	}
	if err == nil {
		t.Fatal("etcd accepted a client without a certificate")
	}

	admin, err := NewEtcdClient(tlsCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.UserAdd(ctx, "root", "rootpw"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}

	authCfg := tlsCfg
	authCfg.Username, authCfg.Password = "root", "rootpw"
	sink := newMemSink()
	w, err := NewEtcdWatcher(authCfg, nil, sink)
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	defer w.Close()
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	cli, err := NewEtcdClient(authCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	reg := NewEtcdRegistrar(cli, "", 5*time.Second)
	if err := reg.Register(ctx, rec("tls1", "http://127.0.0.1:8100")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "registered over TLS with auth", func() bool { _, ok := sink.get("tls1"); return ok })

	// Wrong password: refused.
	bad := tlsCfg
	bad.Username, bad.Password = "root", "nope"
	if c, err := NewEtcdClient(bad); err == nil {
		cctx, cc := context.WithTimeout(ctx, 2*time.Second)
		_, err = c.Get(cctx, "x")
		cc()
		c.Close()
		if err == nil {
			t.Fatal("etcd accepted a wrong password")
		}
	}
	if err := reg.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "deregistered", func() bool { _, ok := sink.get("tls1"); return !ok })
}
