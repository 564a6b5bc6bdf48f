package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/sched"
	"github.com/valyala/fasthttp"
)

// sendChunkedWithTrailer sends a chat request over a raw connection: the
// head lines head, body as one chunk, then the trailer section trailer
// ("Name: value\r\n" lines). It returns the answer's status.
func sendChunkedWithTrailer(t *testing.T, url, head, body, trailer string) int {
	t.Helper()
	c, err := net.Dial("tcp4", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s"+
		"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n%s\r\n", head, len(body), body, trailer)
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// After dropTrailers no trailer field reads as a header, through Peek or
// PeekAll, and the head's own values of the same names stay.
func TestDropTrailersKeepsTheHeadAndForgetsTheTrailer(t *testing.T) {
	var req fasthttp.Request
	raw := "POST / HTTP/1.1\r\nHost: x\r\nTrailer: X-Session-Id\r\nX-Session-Id: head\r\nUser-Agent: ua-head\r\n" +
		"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n" +
		"X-Session-Id: trailer\r\nx-worker-instance-id: w1\r\nUser-Agent: ua-trailer\r\nAnthropic-Beta: b1\r\nanthropic-beta: b2\r\n\r\n"
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatal(err)
	}
	h := &req.Header
	if got := string(h.Peek(hdrWorkerID)); got != "w1" {
		t.Fatalf("the test's premise: fasthttp's Peek gives the trailer's %s, got %q", hdrWorkerID, got)
	}
	dropTrailers(h)
	f := func(name string, want ...string) {
		t.Helper()
		var got []string
		for _, v := range h.PeekAll(name) {
			got = append(got, string(v))
		}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("%s: PeekAll gave %q, want %q", name, got, want)
		}
		if p, w := string(h.Peek(name)), append(want, "")[0]; p != w {
			t.Fatalf("%s: Peek gave %q, want %q", name, p, w)
		}
	}
	f("X-Session-Id", "head")
	f(hdrWorkerID)
	f("User-Agent", "ua-head")
	f("Anthropic-Beta")
	if b := h.TrailerHeader(); string(b) != "\r\n" {
		t.Fatalf("trailer section left: %q", b)
	}
	if string(h.Host()) != "x" || string(req.Body()) != "{}" {
		t.Fatalf("host %q body %q", h.Host(), req.Body())
	}
}

// In direct mode, x-worker-instance-id in a trailer does not pin the
// worker: the request is routed as one without it (round-robin here).
// fasthttp's Peek falls back to the trailer section for a name the head
// lacks, and the router read the header after the body: every request
// went to the worker the trailer named.
func TestATrailerWorkerIDDoesNotPinTheWorker(t *testing.T) {
	a := startUpstream(t, okHandler)
	b := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterMode = "direct"
	r := startRouterWith(t, f, nil, func(o *Options) { o.Sched.Mode = sched.ModeDirect }, a.url, b.url)
	for range 4 {
		if st := sendChunkedWithTrailer(t, r.url, "", chatBody, hdrWorkerID+": w1\r\n"); st != 200 {
			t.Fatalf("status %d", st)
		}
	}
	if a.hits.Load() != 2 || b.hits.Load() != 2 {
		t.Fatalf("w0 got %d, w1 %d; want 2 each (round-robin, the trailer ignored)", a.hits.Load(), b.hits.Load())
	}
}

// A session affinity header in a trailer binds no session: the requests
// are load balanced as ones without it, where they all went to the worker
// the trailer's session was bound to.
func TestATrailerSessionHeaderBindsNoSession(t *testing.T) {
	a := startUpstream(t, okHandler)
	b := startUpstream(t, okHandler)
	cfg := config.Default()
	cfg.SessionAffinity.Enabled, cfg.SessionAffinity.Mode, cfg.SessionAffinity.Header = true, "strong", "X-Session-Id"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := startRouter(t, nil, cfg, a.url, b.url)
	for range 4 {
		if st := sendChunkedWithTrailer(t, r.url, "", chatBody, "X-Session-Id: s-trailer\r\n"); st != 200 {
			t.Fatalf("status %d", st)
		}
	}
	if a.hits.Load() != 2 || b.hits.Load() != 2 {
		t.Fatalf("w0 got %d, w1 %d; want 2 each (round-robin, the trailer ignored)", a.hits.Load(), b.hits.Load())
	}
}

// An external upstream gets the listed client headers (Anthropic-Beta,
// OpenAI-Beta, ...) from the head only: one in a trailer reached it
// (upstream.AppendHeaders peeks them after the body was read).
func TestATrailerHeaderDoesNotReachAnExternalUpstream(t *testing.T) {
	var rec recorder
	ext := startUpstream(t, func(ctx *fasthttp.RequestCtx) { rec.record(ctx); okHandler(ctx) })
	local := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitPrefix,
		config.Proxy{Local: true, ModelRules: []string{"m"}},
		config.Proxy{Name: "ext", Address: ext.url, ModelRules: []string{"gpt-*"}},
	)
	r := startRouterWith(t, nil, cfg, nil, local.url)
	if st := sendChunkedWithTrailer(t, r.url, "OpenAI-Beta: head-beta\r\n", gptBody, "Anthropic-Beta: trailer-beta\r\nOpenAI-Beta: trailer-beta\r\n"); st != 200 {
		t.Fatalf("status %d", st)
	}
	got := rec.all()
	if len(got) != 1 {
		t.Fatalf("the external upstream got %d requests", len(got))
	}
	if h := got[0].header; h.Get("Anthropic-Beta") != "" || strings.Join(h.Values("Openai-Beta"), "|") != "head-beta" {
		t.Fatalf("the external upstream got Anthropic-Beta %q OpenAI-Beta %q; want none and head-beta", h.Values("Anthropic-Beta"), h.Values("Openai-Beta"))
	}
}

// Behind a trusted proxy, an X-Forwarded-For in a trailer never names the
// client (fasthttp refuses the field in a trailer section; PeekAll would
// append it to the head's lines, the rightmost address).
func TestATrailerXForwardedForDoesNotNameTheClient(t *testing.T) {
	up := startUpstream(t, okHandler)
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := OpenAccessLog(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	f := defaultFlags()
	f.TrustedProxies = []string{"127.0.0.1"} // the test dials from 127.0.0.1: the trusted proxy
	r := startRouterWith(t, f, nil, func(o *Options) { o.AccessLog = l }, up.url)
	sendChunkedWithTrailer(t, r.url, "X-Forwarded-For: 198.51.100.7\r\n", chatBody, "X-Session-Id: s\r\nX-Forwarded-For: 203.0.113.9\r\n")
	r.srv.Shutdown()
	l.Close()
	lines := readAccessLog(t, path)
	if len(lines) != 1 || lines[0]["client"] != "198.51.100.7" {
		t.Fatalf("access log %v; want client 198.51.100.7 (the proxy's word, not the trailer's)", lines)
	}
}
