package discovery

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// TestEtcdTLSAndAuth: the TLS (CA, client cert/key) and auth (user,
// password) options reach a real etcd that requires them.
func TestEtcdTLSAndAuth(t *testing.T) {
	certs := testsrv.GenCerts(t)
	e := testsrv.StartEtcdTLS(t, &certs)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
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
	retryEtcdTimeouts(t, ctx, "add user root", func() error {
		_, err := admin.UserAdd(ctx, "root", "rootpw")
		if errors.Is(err, rpctypes.ErrUserAlreadyExist) {
			return nil // an earlier try that timed out was applied after all
		}
		return err
	})
	retryEtcdTimeouts(t, ctx, "grant root", func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err })
	retryEtcdTimeouts(t, ctx, "enable auth", func() error { _, err := admin.AuthEnable(ctx); return err })

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
	retryEtcdTimeouts(t, ctx, "register", func() error { return reg.Register(ctx, rec("tls1", "http://127.0.0.1:8100")) })
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

// retryEtcdTimeouts runs op again while etcd answers "request timed out"
// (its proposal waited past etcd's request timeout, 7 s, for a disk sync,
// which a CI machine running many test binaries at once can stall: CI
// failed on AuthEnable so) or op's own shorter timeout ran out, as the
// worker's registration loop does. The calls it wraps can be repeated;
// any other error, or ctx ending, fails the test.
func retryEtcdTimeouts(t *testing.T, ctx context.Context, what string, op func() error) {
	t.Helper()
	for {
		err := op()
		if err == nil {
			return
		}
		timedOut := errors.Is(err, rpctypes.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)
		if !timedOut || ctx.Err() != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: %v; trying again", what, err)
	}
}
