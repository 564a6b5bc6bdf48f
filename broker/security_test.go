package broker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// roundTrip checks a connection carries a request to a responder on
// another connection with the same options.
func roundTrip(t *testing.T, nc, responder *nats.Conn) {
	t.Helper()
	subj := nats.NewInbox()
	sub, err := responder.Subscribe(subj, func(m *nats.Msg) { m.Respond(append([]byte("re:"), m.Data...)) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := responder.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := nc.Request(subj, []byte("x"), 2*time.Second)
	if err != nil {
		t.Fatalf("request over the authenticated connection: %v", err)
	}
	if string(m.Data) != "re:x" {
		t.Fatalf("answer %q", m.Data)
	}
}

func waitConnected(t *testing.T, nc *nats.Conn, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !nc.IsConnected() {
		if nc.IsClosed() || time.Now().After(deadline) {
			t.Fatalf("not (re)connected: status %v, last error %v", nc.Status(), nc.LastError())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEachNATSAuthMethodConnectsAndReconnectsAfterABrokerRestart: an NKey
// seed file, a .creds file (operator mode) and mutual TLS with a custom CA
// each connect to a nats-server that demands them, carry a request, and
// reconnect after the broker restarts (the files are read again then).
func TestEachNATSAuthMethodConnectsAndReconnectsAfterABrokerRestart(t *testing.T) {
	type setup struct {
		conf   string
		sec    Security
		scheme string
	}
	cases := map[string]func(t *testing.T) setup{
		"nkey": func(t *testing.T) setup {
			conf, seed := testsrv.NATSNkeyConf(t)
			return setup{conf: conf, sec: Security{NkeySeedFile: seed}}
		},
		"creds": func(t *testing.T) setup {
			conf, creds := testsrv.NATSOperatorConf(t)
			return setup{conf: conf, sec: Security{CredsFile: creds}}
		},
		"mtls": func(t *testing.T) setup {
			conf, certs := testsrv.NATSTLSConf(t)
			return setup{conf: conf, sec: Security{CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}}
		},
		"mtls-url": func(t *testing.T) setup {
			conf, certs := testsrv.NATSTLSConf(t)
			return setup{conf: conf, sec: Security{CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}, scheme: "tls://"}
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			s := mk(t)
			ns := testsrv.StartNATSArgs(t, "-c", s.conf)
			url := ns.URL
			if s.scheme != "" {
				url = strings.Replace(url, "nats://", s.scheme, 1)
			}
			// Without the options the broker refuses the connection.
			if nc, err := nats.Connect(url, nats.NoReconnect()); err == nil {
				nc.Close()
				t.Fatal("the broker took a connection without credentials: the setup is wrong")
			}
			opts, err := s.sec.Options(url)
			if err != nil {
				t.Fatal(err)
			}
			quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
			conn := func() *nats.Conn {
				nc, err := nats.Connect(url, append(append(Reconnect(), opts...), quiet)...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nc.Close)
				return nc
			}
			a, b := conn(), conn()
			roundTrip(t, a, b)
			ns.Restart()
			waitConnected(t, a, 5*time.Second)
			waitConnected(t, b, 5*time.Second)
			roundTrip(t, a, b)
		})
	}
}

func writeFile(t testing.TB, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestABadNATSSecurityFileIsAStartErrorThatNeverShowsItsContent: a
// missing, unreadable or malformed seed, .creds, CA or certificate file,
// or flags that cannot go together, are refused by Options, naming the
// flag, never showing a file's content.
func TestABadNATSSecurityFileIsAStartErrorThatNeverShowsItsContent(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		writeFile(t, p, content)
		return p
	}
	user, _ := nkeys.CreateUser()
	seed, _ := user.Seed()
	acc, _ := nkeys.CreateAccount()
	accSeed, _ := acc.Seed()
	other, _ := nkeys.CreateUser()
	otherPub, _ := other.PublicKey()
	_, goodCreds := testsrv.NATSOperatorConf(t)
	certs := testsrv.GenCerts(t)
	expiredCert, expiredKey := certs.ServerLeaf(t, "expired", 9, time.Now().Add(-time.Hour))
	unreadable := file("unreadable.nk", string(seed))
	if err := os.Chmod(unreadable, 0); err != nil {
		t.Fatal(err)
	}
	credsFor := func(sub string) string {
		jwt := testsrv.SignJWT(t, acc, sub, "u", map[string]any{"type": "user", "version": 2})
		return "-----BEGIN NATS USER JWT-----\n" + jwt + "\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n" + string(seed) + "\n------END USER NKEY SEED------\n"
	}
	f := func(name string, s Security, url, want string) {
		t.Helper()
		opts, err := s.Options(url)
		if err == nil {
			t.Errorf("%s: no error (%d options)", name, len(opts))
			return
		}
		msg := err.Error()
		t.Logf("%s: %s", name, msg)
		if !strings.Contains(msg, want) {
			t.Errorf("%s: error %q does not say %q", name, msg, want)
		}
		for _, secret := range []string{string(seed), string(accSeed), "hunter2", string(seed[:12])} {
			if strings.Contains(msg, secret) {
				t.Errorf("%s: the error shows a secret: %q", name, msg)
			}
		}
	}
	u := "nats://127.0.0.1:4222"
	f("missing seed", Security{NkeySeedFile: filepath.Join(dir, "none.nk")}, u, "--nats-nkey-seed-file")
	if os.Getuid() != 0 {
		f("unreadable seed", Security{NkeySeedFile: unreadable}, u, "permission denied")
	}
	f("garbage seed", Security{NkeySeedFile: file("garbage.nk", "hunter2 is not a seed\n")}, u, "--nats-nkey-seed-file")
	f("corrupt seed", Security{NkeySeedFile: file("corrupt.nk", string(seed[:len(seed)-3])+"AAA\n")}, u, "--nats-nkey-seed-file")
	f("account seed", Security{NkeySeedFile: file("acc.nk", string(accSeed)+"\n")}, u, "--nats-nkey-seed-file")
	f("missing creds", Security{CredsFile: filepath.Join(dir, "none.creds")}, u, "--nats-creds-file")
	f("seed as creds", Security{CredsFile: file("seed.creds", string(seed)+"\n")}, u, "not a .creds file")
	f("creds of another key", Security{CredsFile: file("other.creds", credsFor(otherPub))}, u, "do not go together")
	f("creds and nkey", Security{CredsFile: goodCreds, NkeySeedFile: file("ok.nk", string(seed))}, u, "exclude each other")
	f("nkey and a url token", Security{NkeySeedFile: file("ok2.nk", string(seed))}, "nats://hunter2@127.0.0.1:4222", "carries credentials")
	f("creds and a url password", Security{CredsFile: goodCreds}, "nats://127.0.0.1:1, nats://u:hunter2@127.0.0.1:4222", "carries credentials")
	f("missing ca", Security{CAFile: filepath.Join(dir, "none.pem")}, u, "--nats-tls-ca-file")
	f("garbage ca", Security{CAFile: file("ca.pem", "hunter2\n")}, u, "--nats-tls-ca-file")
	f("cert without key", Security{CertFile: certs.ClientCert}, u, "go together")
	f("key without cert", Security{KeyFile: certs.ClientKey}, u, "go together")
	f("cert with another key", Security{CertFile: certs.ClientCert, KeyFile: certs.ServerKey}, u, "--nats-tls-cert-file")
	f("garbage key", Security{CertFile: certs.ClientCert, KeyFile: file("key.pem", "-----BEGIN EC PRIVATE KEY-----\nhunter2\n-----END EC PRIVATE KEY-----\n")}, u, "--nats-tls-cert-file")
	f("expired cert", Security{CertFile: expiredCert, KeyFile: expiredKey}, u, "valid from")

	if opts, err := (Security{}).Options(u); err != nil || len(opts) != 0 {
		t.Fatalf("no files: %d options, %v", len(opts), err)
	}
}
