package upstream

import (
	"net"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

// An external upstream gets the body, its own key, and none of the
// client's credentials or addresses, over a real (in-memory) connection.
func TestPrepareRequestSendsOnlyAllowedHeadersAndTheUpstreamKey(t *testing.T) {
	ln := fasthttputil.NewInmemoryListener()
	defer ln.Close()
	type got struct {
		uri, host, body string
		headers         map[string]string
	}
	gotc := make(chan got, 1)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
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
	hc := NewHostClient(&ep, ClientOptions{Dial: func(string) (net.Conn, error) { return ln.Dial() }})
	hc.IsTLS = false // the in-memory server speaks plain HTTP

	var in fasthttp.RequestHeader
	in.SetMethod("POST")
	in.SetRequestURI("/v1/chat/completions?key=q-SECRET")
	for k, v := range map[string]string{
		"Authorization": "Bearer client-SECRET", "Cookie": "s=c-SECRET", "X-Api-Key": "k-SECRET",
		"X-Forwarded-For": "10.0.0.1", "Proxy-Authorization": "Basic p-SECRET", "Connection": "keep-alive",
		"Content-Type": "application/json", "Accept": "text/event-stream", "User-Agent": "sdk/1.0",
		"X-Request-Id": "req-1", "X-Session-Id": "sess-1", "OpenAI-Organization": "org-SECRET",
	} {
		in.Set(k, v)
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	body := []byte(`{"model":"gpt-4o","stream":true}`)
	PrepareRequest(req, &in, &ep, []byte("/v1/chat/completions"), body, config.NewSecret("sk-upstream"), true,
		"X-Session-Id", "Authorization", "cookie")
	if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
		t.Fatalf("do: %v %d", err, resp.StatusCode())
	}
	g := <-gotc
	if g.uri != "/compatible/v1/chat/completions" || g.host != "api.example.com:8443" || g.body != string(body) {
		t.Fatalf("upstream got %s host %s body %s", g.uri, g.host, g.body)
	}
	want := map[string]string{
		"Authorization": "Bearer sk-upstream", "Content-Type": "application/json", "Accept": "text/event-stream",
		"User-Agent": "sdk/1.0", "X-Request-Id": "req-1", "X-Session-Id": "sess-1", HopHeader: "1",
		"Content-Length": "32", "Host": "api.example.com:8443",
	}
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
	// Without a key and without hop: no Authorization at all.
	req.Reset()
	PrepareRequest(req, &in, &ep, []byte("/v1/completions"), body, config.Secret{}, false)
	if len(req.Header.Peek("Authorization")) != 0 || len(req.Header.Peek(HopHeader)) != 0 {
		t.Fatalf("unexpected headers: %s", req.Header.String())
	}
}
