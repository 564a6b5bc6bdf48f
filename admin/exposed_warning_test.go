package admin

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

// An admin listener beyond loopback without TLS says so at start, naming
// the address: the admin key and every setting cross the network in clear.
// A loopback one, or one with TLS, does not. (Every listener here is bound
// on loopback: listen stands in for the address the router would bind.)
func TestAnAdminListenerBeyondLoopbackWithoutTLSWarnsAtStart(t *testing.T) {
	old := listen
	listen = func(network, _ string) (net.Listener, error) { return net.Listen(network, "127.0.0.1:0") }
	t.Cleanup(func() { listen = old })
	logs := captureLogs(t)
	start := func(addr string, tlsOn bool) string {
		t.Helper()
		o := Options{Store: config.NewStore("", nil), Key: testKey, Addr: addr}
		if tlsOn {
			o.TLS = &tls.Config{}
		}
		a, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		before := len(logs.String())
		if err := a.Start(); err != nil {
			t.Fatal(err)
		}
		a.Close()
		var warned []string
		for _, l := range strings.Split(logs.String()[before:], "\n") {
			if strings.Contains(l, "level=WARN") && strings.Contains(l, "without TLS") {
				warned = append(warned, l)
			}
		}
		return strings.Join(warned, "\n")
	}
	for _, addr := range []string{"0.0.0.0:8081", "[::]:8081", ":8081", "192.0.2.10:8081", "[2001:db8::1]:8081"} {
		w := start(addr, false)
		if w == "" || !strings.Contains(w, "admin_addr="+addr) {
			t.Errorf("%s without TLS: warning %q, want one naming the address", addr, w)
		}
		if w := start(addr, true); w != "" {
			t.Errorf("%s with TLS: warned %q", addr, w)
		}
	}
	for _, addr := range []string{"127.0.0.1:8081", "127.0.0.2:8081", "[::1]:8081", "[::ffff:127.0.0.1]:8081", "localhost:8081"} {
		if w := start(addr, false); w != "" {
			t.Errorf("%s: warned %q", addr, w)
		}
	}
}
