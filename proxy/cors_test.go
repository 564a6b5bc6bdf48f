package proxy

import (
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func corsDo(t *testing.T, method, url string, hdr map[string]string, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// --cors-allow-origins: a preflight from an allowed origin gets 204 and the
// CORS headers without credentials (browsers send none); one from another
// origin gets 403 and none; answers to an allowed origin name it, errors
// included; requests without Origin get no CORS header.
func TestCORSAnswersAllowedOriginsOnly(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.APIKey = "sk-cors"
	f.CORSAllowOrigins = []string{"https://app.example.com"}
	r := startRouter(t, f, nil, up.url)
	url := r.url + "/v1/chat/completions"

	pre := corsDo(t, "OPTIONS", url, map[string]string{"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}, "")
	if pre.StatusCode != 204 || pre.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
		pre.Header.Get("Access-Control-Allow-Headers") != "authorization, content-type, x-stainless-os" ||
		!strings.Contains(pre.Header.Get("Access-Control-Allow-Methods"), "POST") || pre.Header.Get("Access-Control-Max-Age") == "" ||
		pre.Header.Get("Vary") != "Origin" || pre.Header.Get("Access-Control-Allow-Credentials") != "" {
		t.Fatalf("preflight: %d %v", pre.StatusCode, pre.Header)
	}
	bad := corsDo(t, "OPTIONS", url, map[string]string{"Origin": "https://evil.example.com", "Access-Control-Request-Method": "POST"}, "")
	if bad.StatusCode != 403 || bad.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("preflight from another origin: %d %v", bad.StatusCode, bad.Header)
	}
	for _, list := range []string{`x"y`, `x a, y`, `x-a;evil=1`, `x-a, y=1`, ` , `, `x(y)`} {
		junk := corsDo(t, "OPTIONS", url, map[string]string{"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
			"Access-Control-Request-Headers": list}, "")
		if junk.StatusCode != 204 || junk.Header.Get("Access-Control-Allow-Headers") != "" {
			t.Fatalf("a request-headers list that is not one (%q) was echoed: %v", list, junk.Header)
		}
	}
	tabs := corsDo(t, "OPTIONS", url, map[string]string{"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "x-a,\tx-b ,x-c"}, "")
	if tabs.Header.Get("Access-Control-Allow-Headers") != "x-a,\tx-b ,x-c" {
		t.Fatalf("a list with spaces and tabs around its commas was not echoed: %v", tabs.Header)
	}

	for key, status := range map[string]int{"sk-cors": 200, "wrong": 401} {
		resp := corsDo(t, "POST", url, map[string]string{"Origin": "https://app.example.com", "Authorization": "Bearer " + key}, chatBody)
		if resp.StatusCode != status || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
			!strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "X-Request-Id") {
			t.Fatalf("key %s: %d %v", key, resp.StatusCode, resp.Header)
		}
	}
	for _, origin := range []string{"", "https://evil.example.com"} {
		resp := corsDo(t, "POST", url, map[string]string{"Origin": origin, "Authorization": "Bearer sk-cors"}, chatBody)
		if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Fatalf("origin %q: %d %v", origin, resp.StatusCode, resp.Header)
		}
	}

	// "*": any origin, named as *.
	f2 := defaultFlags()
	f2.CORSAllowOrigins = []string{"*"}
	r2 := startRouter(t, f2, nil, up.url)
	if resp := corsDo(t, "POST", r2.url+"/v1/chat/completions", map[string]string{"Origin": "https://any.example"}, chatBody); resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("*: %v", resp.Header)
	}
	// Off (the default): a preflight is no request the router knows.
	r3 := startRouter(t, nil, nil, up.url)
	if resp := corsDo(t, "OPTIONS", r3.url+"/v1/chat/completions", map[string]string{"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"}, ""); resp.StatusCode == 204 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("CORS off: %d %v", resp.StatusCode, resp.Header)
	}
}

// The router alone answers CORS: an engine's Access-Control-* headers (vLLM
// and SGLang answer any Origin with Access-Control-Allow-Origin: *) are
// dropped. They were relayed, so with CORS off, or for an origin not
// allowed, any page could read the answers (a text/plain simple request to
// /v1/messages needs no preflight), and Allow-Credentials got through.
func TestTheEnginesCORSHeadersNeverReachTheClient(t *testing.T) {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if o := ctx.Request.Header.Peek("Origin"); len(o) > 0 {
			ctx.Response.Header.Set("Access-Control-Allow-Origin", "*")
			ctx.Response.Header.Set("Access-Control-Allow-Credentials", "true")
		}
		okHandler(ctx)
	})
	// CORS off, an open router (a loopback deployment): a page's simple
	// request (text/plain, no preflight) from any origin.
	r := startRouter(t, nil, nil, up.url)
	resp := corsDo(t, "POST", r.url+"/v1/chat/completions", map[string]string{"Origin": "https://evil.example", "Content-Type": "text/plain"}, chatBody)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if v := resp.Header.Get("Access-Control-Allow-Origin"); v != "" {
		t.Errorf("CORS off: the answer to https://evil.example carries Access-Control-Allow-Origin %q (the engine's, relayed)", v)
	}
	// CORS on for one origin: another origin must get no CORS header, and
	// credentials are never allowed.
	f := defaultFlags()
	f.CORSAllowOrigins = []string{"https://app.example.com"}
	r2 := startRouter(t, f, nil, up.url)
	resp = corsDo(t, "POST", r2.url+"/v1/chat/completions", map[string]string{"Origin": "https://evil.example", "Content-Type": "text/plain"}, chatBody)
	if v := resp.Header.Get("Access-Control-Allow-Origin"); v != "" {
		t.Errorf("origin not allowed: the answer carries Access-Control-Allow-Origin %q", v)
	}
	resp = corsDo(t, "POST", r2.url+"/v1/chat/completions", map[string]string{"Origin": "https://app.example.com", "Content-Type": "text/plain"}, chatBody)
	if v := resp.Header.Get("Access-Control-Allow-Credentials"); v != "" {
		t.Errorf("allowed origin: the answer carries Access-Control-Allow-Credentials %q, which the router never sends", v)
	}
	// vLLM (FastAPI) parses only an application/json body; a page's simple
	// request is text/plain. On /v1/messages the router converts the body
	// and sends it as application/json (appendForwardHeaders, jsonBody),
	// so the page's text/plain request is served, and readable.
	vllm := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Request.Header.ContentType()) != "application/json" {
			ctx.SetStatusCode(422)
			return
		}
		if o := ctx.Request.Header.Peek("Origin"); len(o) > 0 {
			ctx.Response.Header.Set("Access-Control-Allow-Origin", "*")
		}
		okHandler(ctx)
	})
	r3 := startRouter(t, nil, nil, vllm.url)
	resp = corsDo(t, "POST", r3.url+"/v1/messages", map[string]string{"Origin": "https://evil.example", "Content-Type": "text/plain;charset=UTF-8"},
		`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	if v := resp.Header.Get("Access-Control-Allow-Origin"); resp.StatusCode == 200 && v != "" {
		t.Errorf("CORS off, /v1/messages from a page's text/plain simple request: 200 with Access-Control-Allow-Origin %q: the page reads the answer", v)
	}
}

// --cors-allow-origins matches origins as browsers send them (host in lower
// case, no default port): https://App.Example.com and
// https://app.example.com:443 were accepted at start and never matched, so
// every preflight of the page got 403.
func TestCORSOriginsAreMatchedAsBrowsersSendThem(t *testing.T) {
	up := startUpstream(t, okHandler)
	for _, cfgd := range []string{"https://App.Example.com", "https://app.example.com:443"} {
		f := defaultFlags()
		f.CORSAllowOrigins = []string{cfgd}
		f.MaxInflightBodyBytes = 256 << 20
		if err := f.Validate(); err != nil {
			t.Logf("refused at start: %v", err)
			continue // refused at start: fine
		}
		r := startRouter(t, f, nil, up.url)
		pre := corsDo(t, "OPTIONS", r.url+"/v1/chat/completions", map[string]string{"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"}, "")
		if pre.StatusCode != 204 {
			t.Errorf("--cors-allow-origins %s was accepted at start, but the browser's Origin https://app.example.com gets %d", cfgd, pre.StatusCode)
		}
	}
}

// With origins listed, every answer depends on Origin and says Vary:
// Origin, not only those to an allowed origin: a cache could hand the
// allowed page a copy made without the CORS header.
func TestAnswersThatDependOnOriginAlwaysSayVaryOrigin(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.CORSAllowOrigins = []string{"https://app.example.com"}
	r := startRouter(t, f, nil, up.url)
	for _, origin := range []string{"", "https://evil.example"} {
		resp := corsDo(t, "GET", r.url+"/v1/models", map[string]string{"Origin": origin}, "")
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Vary"), "Origin") {
			t.Errorf("GET /v1/models with Origin %q: %d, Vary %q", origin, resp.StatusCode, resp.Header.Values("Vary"))
		}
	}
}

// With origins listed, the answers the router writes before its handler
// runs carry the CORS headers and Vary: Origin as every other answer does
// (docs/security.md): the 400 for a Transfer-Encoding other than chunked,
// the 505 for another HTTP major version, fasthttp's 400 for a head whose
// Host it cannot parse, the 413 before a 100 Continue, and, with only Vary
// (Origin is not read yet), the 503 over --max-conns. They had none.
func TestEveryEarlyAnswerCarriesTheCORSHeaders(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.MaxBodyBytes = 1 << 20
	f.CORSAllowOrigins = []string{"https://app.example.com"}
	r := startRouter(t, f, nil, up.url)
	origin := "Origin: https://app.example.com\r\n"
	for _, tc := range []struct{ name, req, status string }{
		{"transfer-encoding identity", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + origin + "Transfer-Encoding: identity\r\nContent-Length: 2\r\n\r\n{}", "400"},
		{"transfer-encoding identity, other path", "POST /nope HTTP/1.1\r\nHost: x\r\n" + origin + "Transfer-Encoding: identity\r\nContent-Length: 2\r\n\r\n{}", "400"},
		{"HTTP/2.0", "GET /v1/models HTTP/2.0\r\nHost: x\r\n" + origin + "\r\n", "505"},
		{"HTTP/0.9 on an inference path", "POST /v1/messages HTTP/0.9\r\nHost: x\r\n" + origin + "Content-Length: 2\r\n\r\n{}", "505"},
		{"unparsable Host", "POST /v1/chat/completions HTTP/1.1\r\nHost: [::1\r\n" + origin + "Content-Length: 2\r\n\r\n{}", "400"},
		{"413 before 100 Continue", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + origin + "Expect: 100-continue\r\nContent-Length: 99999999\r\n\r\n", "413"},
		{"413 before 100 Continue, other path", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + origin + "Expect: 100-continue\r\nContent-Length: 99999999\r\n\r\n", "413"},
	} {
		got := rawClient(t, r.url, tc.req, 3*time.Second)
		head, _, _ := strings.Cut(got, "\r\n\r\n")
		if !strings.HasPrefix(head, "HTTP/1.1 "+tc.status) || !strings.Contains(head, "\r\nVary: Origin") ||
			!strings.Contains(head, "\r\nAccess-Control-Allow-Origin: https://app.example.com") ||
			!strings.Contains(head, "\r\nAccess-Control-Expose-Headers: X-Request-Id") {
			t.Errorf("%s: want %s with the CORS headers and Vary: Origin, got\n%s", tc.name, tc.status, head)
		}
	}

	f2 := defaultFlags()
	f2.MaxConns = 1
	f2.CORSAllowOrigins = []string{"https://app.example.com"}
	r2 := startRouter(t, f2, nil, up.url)
	hold, err := net.Dial("tcp4", strings.TrimPrefix(r2.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	time.Sleep(100 * time.Millisecond)
	got := rawClient(t, r2.url, "GET /v1/models HTTP/1.1\r\nHost: x\r\n"+origin+"\r\n", 3*time.Second)
	if head, _, _ := strings.Cut(got, "\r\n\r\n"); !strings.HasPrefix(head, "HTTP/1.1 503") || !strings.Contains(head, "\r\nVary: Origin\r\n") {
		t.Errorf("over --max-conns: want 503 with Vary: Origin, got\n%s", head)
	}
}
