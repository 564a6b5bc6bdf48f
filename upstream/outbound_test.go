package upstream

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/valyala/fasthttp"
)

// An external upstream gets the body, its own key, and none of the
// client's credentials or addresses: the header block is sent over a real
// loopback connection and parsed by a real HTTP server.
func TestAppendHeadersSendsOnlyAllowedHeadersAndTheUpstreamKey(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		uri, host, body string
		headers         map[string]string
	}
	gotc := make(chan got, 1)
	srv := &fasthttp.Server{DisableHeaderNamesNormalizing: true, Handler: func(ctx *fasthttp.RequestCtx) {
		g := got{uri: string(ctx.RequestURI()), host: string(ctx.Host()), body: string(ctx.PostBody()), headers: map[string]string{}}
		for k, v := range ctx.Request.Header.All() {
			g.headers[string(k)] = string(v)
		}
		gotc <- g
		ctx.SetBodyString(`{"ok":true}`)
	}}
	go srv.Serve(ln)
	defer srv.Shutdown()

	ep, err := ParseEndpoint("https://api.example.com:8443/compatible/v1")
	if err != nil {
		t.Fatal(err)
	}
	var in fasthttp.RequestHeader
	in.SetMethod("POST")
	in.SetRequestURI("/v1/chat/completions?key=q-SECRET")
	for k, v := range map[string]string{
		"Authorization": "Bearer client-SECRET", "Cookie": "s=c-SECRET", "X-Api-Key": "k-SECRET",
		"X-Forwarded-For": "10.0.0.1", "Proxy-Authorization": "Basic p-SECRET", "Connection": "keep-alive",
		"Content-Type": "application/json", "Accept": "text/event-stream", "User-Agent": "sdk/1.0",
		"X-Request-Id": "client-id", "X-Session-Id": "sess-1", "OpenAI-Organization": "org-SECRET",
	} {
		in.Set(k, v)
	}
	body := `{"model":"gpt-4o","stream":true}`
	send := func(hdr []byte, path string) got {
		t.Helper()
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		req := "POST " + string(ep.AppendPath(nil, []byte(path))) + " HTTP/1.1\r\nHost: " + ep.Host + "\r\n" + string(hdr) +
			"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.Contains(line, " 200 ") {
			t.Fatalf("answer %q %v", line, err)
		}
		return <-gotc
	}
	g := send(AppendHeaders(nil, &in, config.NewSecret("sk-upstream"), true, false, "X-Session-Id", []byte("req-1")), "/v1/chat/completions")
	if g.uri != "/compatible/v1/chat/completions" || g.host != "api.example.com:8443" || g.body != body {
		t.Fatalf("upstream got %s host %s body %s", g.uri, g.host, g.body)
	}
	want := map[string]string{
		"Authorization": "Bearer sk-upstream", "Content-Type": "application/json", "Accept": "text/event-stream",
		"User-Agent": "sdk/1.0", "X-Request-Id": "req-1", "X-Session-Id": "sess-1", HopHeader: "1",
		ForwardsHeader: "1", "Content-Length": "32", "Host": "api.example.com:8443",
	}
	check := func(g got, want map[string]string) {
		t.Helper()
		for k, v := range want {
			if g.headers[k] != v {
				t.Fatalf("upstream header %s = %q, want %q (all: %v)", k, g.headers[k], v, g.headers)
			}
		}
		for k, v := range g.headers {
			if _, ok := want[k]; !ok {
				t.Fatalf("upstream got unexpected header %s: %s", k, v)
			}
			if strings.Contains(v, "SECRET") {
				t.Fatalf("client credential reached the upstream in %s", k)
			}
		}
	}
	check(g, want)

	// extra may not name a credential; without a key and without hop: no
	// Authorization and no hop header; a missing Content-Type is JSON.
	// A request that arrived forwarded counts one more.
	in.Set(ForwardsHeader, "2")
	for _, extra := range []string{"Authorization", "cookie", "x-api-key", "Host", "X-Infera-Hop", "X-Infera-Forwards", "Content-Length", "bad name"} {
		in.Del("Content-Type")
		g = send(AppendHeaders(nil, &in, config.Secret{}, false, false, extra, []byte("req-1")), "/v1/completions")
		if g.uri != "/compatible/v1/completions" {
			t.Fatalf("uri %s", g.uri)
		}
		check(g, map[string]string{"Content-Type": "application/json", "Accept": "text/event-stream",
			"User-Agent": "sdk/1.0", "X-Request-Id": "req-1", ForwardsHeader: "3", "Content-Length": "32", "Host": "api.example.com:8443"})
	}
}

// A client header value with a control character is left out rather than
// forwarded (fasthttp refuses CR and LF; NUL and friends are ours to stop).
func TestAppendHeadersDropsControlCharacters(t *testing.T) {
	var in fasthttp.RequestHeader
	in.DisableNormalizing()
	in.Set("User-Agent", "a\x00b")
	in.Set("Accept", "ok")
	got := string(AppendHeaders(nil, &in, config.Secret{}, false, false, "", nil))
	if strings.Contains(got, "User-Agent") || !strings.Contains(got, "Accept: ok\r\n") || strings.Contains(got, "X-Request-Id") {
		t.Fatalf("block %q", got)
	}
}

// A body the gateway wrote (jsonBody) goes as application/json in place of
// the client's type; otherwise the client's type goes, and JSON when it
// sent none.
func TestAppendHeadersTypesAWrittenBodyAsJSON(t *testing.T) {
	f := func(ct string, jsonBody bool, want string) {
		t.Helper()
		var in fasthttp.RequestHeader
		if ct != "" {
			in.Set("Content-Type", ct)
		}
		got := string(AppendHeaders(nil, &in, config.Secret{}, false, jsonBody, "", nil))
		if strings.Count(got, "Content-Type: ") != 1 || !strings.Contains(got, "Content-Type: "+want+"\r\n") {
			t.Fatalf("type %q, jsonBody %v: block %q, want Content-Type %q", ct, jsonBody, got, want)
		}
	}
	f("text/plain", true, "application/json")
	f("application/x-www-form-urlencoded", true, "application/json")
	f("", true, "application/json")
	f("text/plain", false, "text/plain")
	f("application/json; charset=utf-8", false, "application/json; charset=utf-8")
	f("", false, "application/json")
}

// Forwards reads the count a request arrived with, bounded by MaxForwards;
// a value that is not a count stops forwarding.
func TestForwardsReadsTheArrivedCount(t *testing.T) {
	f := func(v string, want int) {
		t.Helper()
		var in fasthttp.RequestHeader
		if v != "" {
			in.Set(ForwardsHeader, v)
		}
		if got := Forwards(&in); got != want {
			t.Fatalf("Forwards(%q) = %d, want %d", v, got, want)
		}
	}
	f("", 0)
	f("0", 0)
	f("3", 3)
	f("4", MaxForwards)
	f("99999999999999999999999", MaxForwards)
	f("-1", MaxForwards)
	f("x", MaxForwards)
}
