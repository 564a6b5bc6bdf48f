package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// The engine gets the client's X-Forwarded-For with the address the
// router received the request from appended, as one field line (RFC 9110
// section 5.3 lets lines be joined with commas): what nginx's
// $proxy_add_x_forwarded_for, Envoy and Go's httputil.ReverseProxy send.
// A client without the header gets one naming its address. The router
// passed the client's lines through unchanged, so an engine (uvicorn with
// --forwarded-allow-ips, another router with --trusted-proxies) that
// trusts the router took the address the client wrote last as the client.
func TestTheEngineGetsXForwardedForWithTheClientsAddressAppended(t *testing.T) {
	var mu sync.Mutex
	var got []string
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		var lines []string
		for _, v := range ctx.Request.Header.PeekAll("X-Forwarded-For") {
			lines = append(lines, string(v))
		}
		mu.Lock()
		got = lines
		mu.Unlock()
		okHandler(ctx)
	})
	r := startRouter(t, nil, nil, up.url)
	send := func(from string, xff ...string) []string {
		t.Helper()
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, n, a string) (net.Conn, error) { return d.DialContext(ctx, n, a) }}}
		req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(chatBody))
		req.Header.Set("Content-Type", "application/json")
		if len(xff) > 0 {
			req.Header["X-Forwarded-For"] = xff // one line each
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("status %d", res.StatusCode)
		}
		mu.Lock()
		defer mu.Unlock()
		return got
	}
	f := func(want string, from string, xff ...string) {
		t.Helper()
		if g := send(from, xff...); strings.Join(g, "|") != want {
			t.Fatalf("from %s with X-Forwarded-For %q the engine got %q, want one line %q", from, xff, g, want)
		}
	}
	f("127.0.0.2", "127.0.0.2")
	f("198.51.100.1, 127.0.0.2", "127.0.0.2", "198.51.100.1")
	f("198.51.100.1, 203.0.113.9, 127.0.0.2", "127.0.0.2", "198.51.100.1", "203.0.113.9")
	f("198.51.100.1,  203.0.113.9, 127.0.0.3", "127.0.0.3", "198.51.100.1,  203.0.113.9")
	f("127.0.0.2", "127.0.0.2", "") // an empty line adds nothing
}

// A router behind another (the front router is B's worker-facing proxy,
// and B trusts it with --trusted-proxies) finds the front router's
// client, never the address that client wrote into X-Forwarded-For: the
// front router passed the client's header through unchanged, so B's
// access log and lockout took the client's own claim (198.51.100.66) as
// its address.
func TestARouterBehindARouterSeesTheClientNotWhatTheClientWrote(t *testing.T) {
	up := startUpstream(t, okHandler)
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := OpenAccessLog(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	fb := defaultFlags()
	fb.TrustedProxies = []string{"127.0.0.1"} // the front router dials from 127.0.0.1
	b := startRouterWith(t, fb, nil, func(o *Options) { o.AccessLog = l }, up.url)
	front := startRouter(t, nil, nil, b.url)
	if a := sendFrom(t, "127.0.0.5", front.url, "POST", "/v1/chat/completions", chatBody, "X-Forwarded-For", "198.51.100.66"); a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	b.srv.Shutdown()
	l.Close()
	lines := readAccessLog(t, path)
	if len(lines) != 1 || lines[0]["client"] != "127.0.0.5" {
		t.Fatalf("the second router's access log: %v; want client 127.0.0.5", lines)
	}
}
