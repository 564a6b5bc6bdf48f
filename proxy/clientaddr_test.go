package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/logx"
	"github.com/valyala/fasthttp"
)

// chatVia sends a chat request from the loopback source address ip with
// the key, as a proxy at ip forwarding a client whose X-Forwarded-For is
// xff ("" for none).
func chatVia(t *testing.T, ip, url, key, xff string) srcAnswer {
	t.Helper()
	hdr := []string{"Authorization", "Bearer " + key}
	if xff != "" {
		hdr = append(hdr, "X-Forwarded-For", xff)
	}
	return sendFrom(t, ip, url, "POST", "/v1/chat/completions", chatBody, hdr...)
}

// Behind a trusted proxy (--trusted-proxies 127.0.0.1/32), clients that
// differ only in X-Forwarded-For are locked out one by one: one client's
// wrong keys lock it out and no other, and the proxy's own address is
// never locked. Without the flag every client had the proxy's address,
// so one client with a wrong key locked all of them out.
func TestClientsBehindATrustedProxyAreLockedOutOneByOne(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := lockoutFlags(3, time.Minute)
	f.TrustedProxies = []string{"127.0.0.1/32"}
	r := startRouter(t, f, nil, up.url)
	const lb = "127.0.0.1"
	a, b, c := "203.0.113.1", "198.51.100.7, 203.0.113.2", "203.0.113.3" // b came through another proxy first
	for i := 0; i < 3; i++ {
		if got := chatVia(t, lb, r.url, fmt.Sprintf("sk-wrong-a-%d", i), a); got.status != 401 {
			t.Fatalf("client a's wrong key %d: %d %s", i+1, got.status, got.body)
		}
	}
	if got := chatVia(t, lb, r.url, f.APIKey, a); got.status != 429 {
		t.Fatalf("client a after 3 wrong keys, with the right one: %d %s; want 429", got.status, got.body)
	}
	for _, who := range []string{b, c, ""} {
		if got := chatVia(t, lb, r.url, f.APIKey, who); got.status != 200 {
			t.Fatalf("client %q, locked out with client a: %d %s", who, got.status, got.body)
		}
	}
	for i := 0; i < 3; i++ {
		if got := chatVia(t, lb, r.url, fmt.Sprintf("sk-wrong-b-%d", i), b); got.status != 401 {
			t.Fatalf("client b's wrong key %d: %d %s", i+1, got.status, got.body)
		}
	}
	if got := chatVia(t, lb, r.url, f.APIKey, "203.0.113.2"); got.status != 429 {
		t.Fatalf("client b after 3 wrong keys: %d %s; want 429", got.status, got.body)
	}
	if got := chatVia(t, lb, r.url, f.APIKey, c); got.status != 200 {
		t.Fatalf("client c after a and b were locked out: %d %s", got.status, got.body)
	}
	if got := chatVia(t, lb, r.url, f.APIKey, ""); got.status != 200 {
		t.Fatalf("the proxy's own requests after a and b were locked out: %d %s", got.status, got.body)
	}
}

// A client that is not a trusted proxy (127.0.0.2, the router trusting
// 127.0.0.1 only) is its own address whatever X-Forwarded-For it sends:
// a new one with every guess neither spreads its wrong keys nor lifts its
// lockout.
func TestAnUntrustedPeerCannotEscapeItsLockoutWithXForwardedFor(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := lockoutFlags(3, time.Minute)
	f.TrustedProxies = []string{"127.0.0.1/32"}
	r := startRouter(t, f, nil, up.url)
	const guesser = "127.0.0.2"
	for i := 0; i < 3; i++ {
		if got := chatVia(t, guesser, r.url, fmt.Sprintf("sk-wrong-%d", i), fmt.Sprintf("203.0.113.%d", 10+i)); got.status != 401 {
			t.Fatalf("wrong key %d: %d %s", i+1, got.status, got.body)
		}
	}
	for i, xff := range []string{"", "203.0.113.99", "127.0.0.1", "203.0.113.99, 127.0.0.1"} {
		if got := chatVia(t, guesser, r.url, f.APIKey, xff); got.status != 429 {
			t.Fatalf("%d: the right key from %s with X-Forwarded-For %q: %d %s; want 429", i, guesser, xff, got.status, got.body)
		}
	}
	// The trusted proxy, forwarding a client that claims the guesser's
	// address, is that client: locked out too.
	if got := chatVia(t, "127.0.0.1", r.url, f.APIKey, guesser); got.status != 429 {
		t.Fatalf("a client the proxy names %s: %d %s; want 429", guesser, got.status, got.body)
	}
	if got := chatVia(t, "127.0.0.1", r.url, f.APIKey, "203.0.113.10"); got.status != 200 {
		t.Fatalf("a client the proxy names 203.0.113.10 (an address the guesser claimed): %d %s", got.status, got.body)
	}
}

// The lockout's log line names the client X-Forwarded-For gave and the
// proxy it came through.
func TestALockoutBehindATrustedProxyLogsTheClientAndTheProxy(t *testing.T) {
	logs := captureLogs(t)
	old := lockoutLog
	lockoutLog = &logx.Throttle{} // no line of an earlier test's lockout in the way
	t.Cleanup(func() { lockoutLog = old })
	up := startUpstream(t, okHandler)
	f := lockoutFlags(1, time.Minute)
	f.TrustedProxies = []string{"127.0.0.1"}
	r := startRouter(t, f, nil, up.url)
	chatVia(t, "127.0.0.1", r.url, "sk-wrong", "203.0.113.77")
	waitUntil(t, "the lockout's log line", func() bool { return strings.Contains(logs.String(), "locked out") })
	l := logs.String()
	if !strings.Contains(l, "203.0.113.77") || !strings.Contains(l, "127.0.0.1:") {
		t.Fatalf("the log line names not the client and the proxy:\n%s", l)
	}
}

// The access log's client is the one X-Forwarded-For names when the
// request came through a trusted proxy, and the TCP peer otherwise
// (an untrusted peer's X-Forwarded-For is not believed).
func TestTheAccessLogNamesTheClientBehindATrustedProxy(t *testing.T) {
	up := startUpstream(t, okHandler)
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := OpenAccessLog(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	f := defaultFlags()
	f.APIKey = "sk-right-0123456789"
	f.TrustedProxies = []string{"127.0.0.1"}
	r := startRouterWith(t, f, nil, func(o *Options) { o.AccessLog = l }, up.url)
	for _, c := range []struct{ peer, xff string }{
		{"127.0.0.1", "198.51.100.1, 203.0.113.5"},
		{"127.0.0.2", "203.0.113.6"},
		{"127.0.0.1", ""},
		{"127.0.0.1", "2001:db8::5, 127.0.0.1"},
	} {
		if a := chatVia(t, c.peer, r.url, f.APIKey, c.xff); a.status != 200 {
			t.Fatalf("%v: %d %s", c, a.status, a.body)
		}
	}
	r.srv.Shutdown()
	l.Close()
	var got []string
	for _, line := range readAccessLog(t, path) {
		got = append(got, fmt.Sprint(line["client"]))
	}
	if want := "203.0.113.5 127.0.0.2 127.0.0.1 2001:db8::5"; strings.Join(got, " ") != want {
		t.Fatalf("access log clients %v, want %s", got, want)
	}
}

// TestThePeerTextIsFormattedOncePerConnectionAsPeerIP: an accepted
// connection keeps its peer's address as the text peerIP formats (each of
// its requests forwards it in X-Forwarded-For), and a request on another
// kind of connection gets the same text formatted on the spot.
func TestThePeerTextIsFormattedOncePerConnectionAsPeerIP(t *testing.T) {
	for _, a := range []string{"127.0.0.1", "::1"} {
		ln, err := net.Listen("tcp", net.JoinHostPort(a, "0"))
		if err != nil {
			t.Skipf("no %s: %v", a, err)
		}
		l := &listener{Listener: ln}
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		nc, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		cc := nc.(*clientConn)
		var ctx fasthttp.RequestCtx
		ctx.Init2(cc, nil, false)
		if got, want := string(peerText(nil, &ctx)), appendPeerText(nil, peerIP(&ctx)); got != string(want) || got != a {
			t.Fatalf("%s: the connection's peer text %q, peerIP's %q", a, got, want)
		}
		nc.Close()
		c.Close()
		ln.Close()
	}
	var req fasthttp.Request
	for _, a := range []string{"192.0.2.7", "::ffff:192.0.2.8", "2001:db8::1"} {
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, &net.TCPAddr{IP: net.ParseIP(a), Port: 9}, nil)
		want := netip.MustParseAddr(a).Unmap().String()
		if got := string(peerText(nil, &ctx)); got != want {
			t.Fatalf("%s: %q, want %q", a, got, want)
		}
	}
}
