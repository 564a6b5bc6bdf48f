package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// The router reaches a broker that demands an NKey and a client
// certificate of its own CA (--nats-nkey-seed-file, --nats-tls-*), and
// reaches it again after the broker restarts. It could not: the router's
// only NATS credentials were the URL's token or user:password.
func TestTheRouterReachesABrokerThatDemandsAnNKeyAndAClientCertificate(t *testing.T) {
	nkeyConf, seed := testsrv.NATSNkeyConf(t)
	tlsConf, certs := testsrv.NATSTLSConf(t)
	conf := filepath.Join(t.TempDir(), "nats.conf")
	var b []byte
	for _, p := range []string{nkeyConf, tlsConf} {
		c, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, c...)
	}
	if err := os.WriteFile(conf, b, 0o600); err != nil {
		t.Fatal(err)
	}
	ns := testsrv.StartNATSArgs(t, "-c", conf)
	f := parseServe(t, "--workers", "a=http://127.0.0.1:1", "--worker-model", "m",
		"--request-transport", "nats", "--kv-event-transport", "nats", "--nats-url", ns.URL,
		"--nats-nkey-seed-file", seed, "--nats-tls-ca-file", certs.CA,
		"--nats-tls-cert-file", certs.ClientCert, "--nats-tls-key-file", certs.ClientKey)
	g, err := New(f)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	connected := func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !g.nc.IsConnected() {
			if time.Now().After(deadline) {
				t.Fatalf("not connected to the broker: %v, last error %v", g.nc.Status(), g.nc.LastError())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	connected()
	ns.Restart()
	connected()
}

// A seed file that is not a seed refuses the router's start, naming the
// flag and not the file's content.
func TestABadNATSSeedFileRefusesTheRouterStart(t *testing.T) {
	seed := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seed, []byte("hunter2-not-a-seed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := parseServe(t, "--workers", "a=http://127.0.0.1:1", "--worker-model", "m",
		"--request-transport", "nats", "--kv-event-transport", "nats", "--nats-url", "nats://127.0.0.1:1",
		"--nats-nkey-seed-file", seed)
	g, err := New(f)
	if err == nil {
		g.Close()
		t.Fatal("the router started with a seed file that holds no seed")
	}
	if !strings.Contains(err.Error(), "--nats-nkey-seed-file") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %q: want the flag named, never the content", err)
	}
}

// The broker's credential and TLS flags on a router that uses no broker
// (HTTP requests, ZMQ KV events) refuse the start, as --workers with
// another discovery does: they were accepted without a word, their files
// not even read, by a router an operator believed authenticated.
func TestNATSSecurityFlagsWithoutABrokerRefuseTheRouterStart(t *testing.T) {
	for _, flag := range []string{"--nats-creds-file", "--nats-nkey-seed-file", "--nats-tls-ca-file", "--nats-tls-cert-file", "--nats-tls-key-file"} {
		f := parseServe(t, "--workers", "a=http://127.0.0.1:1", "--worker-model", "m",
			"--request-transport", "http", "--kv-event-transport", "zmq", flag, "/nonexistent/file")
		g, err := New(f)
		if err == nil {
			g.Close()
			t.Fatalf("%s: the router started without using NATS", flag)
		}
		if !strings.Contains(err.Error(), flag) || !strings.Contains(err.Error(), "does not use") {
			t.Fatalf("%s: error %q does not name the flag and why", flag, err)
		}
	}
}
