package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"github.com/valyala/fasthttp"
)

// jsonOrSSE answers a streaming request with two events and [DONE], any
// other with okJSON.
func jsonOrSSE(ctx *fasthttp.RequestCtx) {
	if !bytes.Contains(ctx.PostBody(), []byte(`"stream":true`)) {
		okHandler(ctx)
		return
	}
	ctx.SetContentType("text/event-stream")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		w.WriteString("data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n")
	})
}

// limited sends body to url+path as the holder of key and returns the
// answer's status and headers (its body read whole).
func limited(t *testing.T, url, path, key, body string) (int, http.Header) {
	t.Helper()
	resp, _ := send(t, "POST", url+path, key, "", body)
	return resp.StatusCode, resp.Header
}

// wantReset checks an OpenAI reset header: a Go duration in (lo, hi].
func wantReset(t *testing.T, h http.Header, name string, lo, hi time.Duration) {
	t.Helper()
	d, err := time.ParseDuration(h.Get(name))
	if err != nil || d <= lo || d > hi {
		t.Fatalf("%s %q, want a duration in (%v, %v]", name, h.Get(name), lo, hi)
	}
}

func wantHeader(t *testing.T, h http.Header, name, v string) {
	t.Helper()
	if got := h.Get(name); got != v {
		t.Fatalf("%s %q, want %q", name, got, v)
	}
}

// A user whose template has RPM and TPM learns its buckets from every
// answer: OpenAI's x-ratelimit-* on the OpenAI endpoints (JSON and
// streamed), Anthropic's anthropic-ratelimit-* on /v1/messages, and the
// refusal says none is left and when the bucket is full again. The global
// key's answers carry none.
func TestAnswersTellTheUsersRateLimitsInTheClientsShape(t *testing.T) {
	up := startUpstream(t, jsonOrSSE)
	key, hash := mintKey(t)
	f := defaultFlags()
	f.APIKey = "global-secret"
	r, _ := govRouter(t, f, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true, "rate": {"enabled": true, "rpm": 4, "tpm": 6000}}]},
		"users": [{"name": "alice", "keys": [%q]}]}`, hash), up.url)

	code, h := limited(t, r.url, "/v1/chat/completions", key, chatBody)
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	wantHeader(t, h, "X-Ratelimit-Limit-Requests", "4")
	wantHeader(t, h, "X-Ratelimit-Remaining-Requests", "3")
	// One request of 4 a minute comes back in 15 s.
	wantReset(t, h, "X-Ratelimit-Reset-Requests", 14*time.Second, 15*time.Second)
	wantHeader(t, h, "X-Ratelimit-Limit-Tokens", "6000")
	// The request's estimate (its prompt and max_tokens 4) is taken.
	if n, err := strconv.Atoi(h.Get("X-Ratelimit-Remaining-Tokens")); err != nil || n >= 6000 || n < 5900 {
		t.Fatalf("X-Ratelimit-Remaining-Tokens %q, want the estimate taken from 6000", h.Get("X-Ratelimit-Remaining-Tokens"))
	}
	wantReset(t, h, "X-Ratelimit-Reset-Tokens", 0, time.Second)
	if h.Get("Anthropic-Ratelimit-Requests-Limit") != "" {
		t.Fatal("Anthropic's headers on an OpenAI endpoint")
	}

	code, h = limited(t, r.url, "/v1/chat/completions", key, streamBody)
	if code != 200 || h.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %q", code, h.Get("Content-Type"))
	}
	wantHeader(t, h, "X-Ratelimit-Remaining-Requests", "2")

	before := time.Now()
	code, h = limited(t, r.url, "/v1/messages", key, anthropicBody)
	if code != 200 {
		t.Fatalf("/v1/messages: %d", code)
	}
	wantHeader(t, h, "Anthropic-Ratelimit-Requests-Limit", "4")
	wantHeader(t, h, "Anthropic-Ratelimit-Requests-Remaining", "1")
	wantHeader(t, h, "Anthropic-Ratelimit-Tokens-Limit", "6000")
	// Three requests of 4 a minute are back in 45 s: an RFC 3339 time.
	at, err := time.Parse(time.RFC3339, h.Get("Anthropic-Ratelimit-Requests-Reset"))
	if err != nil || at.Before(before.Add(43*time.Second)) || at.After(time.Now().Add(47*time.Second)) {
		t.Fatalf("Anthropic-Ratelimit-Requests-Reset %q, want about 45 s from now", h.Get("Anthropic-Ratelimit-Requests-Reset"))
	}
	if _, err := time.Parse(time.RFC3339, h.Get("Anthropic-Ratelimit-Tokens-Reset")); err != nil {
		t.Fatalf("Anthropic-Ratelimit-Tokens-Reset %q", h.Get("Anthropic-Ratelimit-Tokens-Reset"))
	}
	if h.Get("X-Ratelimit-Limit-Requests") != "" {
		t.Fatal("OpenAI's headers on /v1/messages")
	}

	_, h = limited(t, r.url, "/v1/chat/completions", key, chatBody)
	wantHeader(t, h, "X-Ratelimit-Remaining-Requests", "0")
	rej := apiCall(t, r.url, key, chatBody)
	want(t, rej, 429, "rate_limit_rpm")
	code, h = limited(t, r.url, "/v1/chat/completions", key, chatBody)
	if code != 429 || h.Get("Retry-After") == "" {
		t.Fatalf("refusal: %d, Retry-After %q", code, h.Get("Retry-After"))
	}
	wantHeader(t, h, "X-Ratelimit-Limit-Requests", "4")
	wantHeader(t, h, "X-Ratelimit-Remaining-Requests", "0")
	wantReset(t, h, "X-Ratelimit-Reset-Requests", 45*time.Second, time.Minute)
	code, h = limited(t, r.url, "/v1/messages", key, anthropicBody)
	if code != 429 {
		t.Fatalf("/v1/messages refusal: %d", code)
	}
	wantHeader(t, h, "Anthropic-Ratelimit-Requests-Remaining", "0")

	code, h = limited(t, r.url, "/v1/chat/completions", "global-secret", chatBody)
	if code != 200 || h.Get("X-Ratelimit-Limit-Requests") != "" || h.Get("X-Ratelimit-Limit-Tokens") != "" {
		t.Fatalf("the global key: %d, limit %q", code, h.Get("X-Ratelimit-Limit-Requests"))
	}
}

// No header promises a rate the router does not enforce: not in dry run
// (over the limit the request passes), not for a template whose only rule
// is concurrency.
func TestNoRateLimitHeadersInDryRunOrWithoutARate(t *testing.T) {
	up := startUpstream(t, okHandler)
	kd, hd := mintKey(t)
	kc, hc := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{
		"user_limit": {"templates": [
			{"name": "dry", "dry_run": true, "rate": {"enabled": true, "rpm": 1}},
			{"name": "conc", "concurrency": {"enabled": true, "limit": 5}}]},
		"users": [{"name": "d", "keys": [%q], "template": "dry"}, {"name": "c", "keys": [%q], "template": "conc"}]}`, hd, hc), up.url)
	for i := 0; i < 3; i++ {
		for _, k := range []string{kd, kc} {
			code, h := limited(t, r.url, "/v1/chat/completions", k, chatBody)
			if code != 200 {
				t.Fatalf("status %d", code)
			}
			for name := range h {
				if strings.HasPrefix(strings.ToLower(name), "x-ratelimit") {
					t.Fatalf("%s: %q", name, h.Get(name))
				}
			}
		}
	}
}

// With the counters in Redis the headers tell the shared buckets: two
// routers' answers count down one user's requests together, through the
// admission that also takes a concurrency seat in the same script.
func TestRateLimitHeadersTellTheBucketsSharedInRedis(t *testing.T) {
	rd := testsrv.StartRedis(t)
	up := startUpstream(t, okHandler)
	key, hash := mintKey(t)
	cfg := govConfig(t, fmt.Sprintf(`{
		"rate_limit": {"overall_concurrency": 100},
		"user_limit": {"templates": [{"name": "t", "default": true, "rate": {"enabled": true, "rpm": 3, "tpm": 100000}}]},
		"users": [{"name": "alice", "keys": [%q]}]}`, hash))
	a := startRouterGov(t, nil, cfg, newGovernorAt(t, rd.URL, cfg), up.url)
	b := startRouterGov(t, nil, cfg, newGovernorAt(t, rd.URL, cfg), up.url)
	for i, url := range []string{a.url, b.url, a.url} {
		code, h := limited(t, url, "/v1/chat/completions", key, chatBody)
		if code != 200 {
			t.Fatalf("request %d: %d", i, code)
		}
		wantHeader(t, h, "X-Ratelimit-Limit-Requests", "3")
		wantHeader(t, h, "X-Ratelimit-Remaining-Requests", strconv.Itoa(2-i))
		wantReset(t, h, "X-Ratelimit-Reset-Requests", time.Duration(i+1)*19*time.Second, time.Duration(i+1)*20*time.Second)
		wantHeader(t, h, "X-Ratelimit-Limit-Tokens", "100000")
	}
	code, h := limited(t, b.url, "/v1/chat/completions", key, chatBody)
	if code != 429 {
		t.Fatalf("fourth request: %d", code)
	}
	wantHeader(t, h, "X-Ratelimit-Remaining-Requests", "0")
	wantReset(t, h, "X-Ratelimit-Reset-Requests", 55*time.Second, time.Minute)
}

func TestResetDurationsAreWrittenLikeOpenAIs(t *testing.T) {
	for _, c := range []struct {
		ns   int64
		want string
	}{
		{0, "0s"}, {-5, "0s"}, {1, "1ms"}, {20e6, "20ms"}, {999e6, "999ms"}, {999_000_001, "1s"},
		{1e9, "1s"}, {1.5e9, "1.5s"}, {1_020e6, "1.02s"}, {59_999e6, "59.999s"},
		{60e9, "1m0s"}, {6 * 60e9, "6m0s"}, {3723e9, "1h2m3s"}, {3600e9, "1h0m0s"},
	} {
		got := string(appendResetDuration(nil, c.ns))
		if got != c.want {
			t.Errorf("%d ns: %q, want %q", c.ns, got, c.want)
		}
		if d, err := time.ParseDuration(got); err != nil || (c.ns > 0 && (d.Nanoseconds() < c.ns || d.Nanoseconds()-c.ns >= 1e6)) {
			t.Errorf("%d ns: %q parses to %v, %v", c.ns, got, d, err)
		}
	}
}

// A refusal that clears within a minute says when to the millisecond
// (Retry-After-Ms, read first by the OpenAI and Anthropic SDKs); a longer
// one (a monthly quota) says X-Should-Retry: false, so those SDKs give up
// instead of sleeping until the window ends.
func TestRefusalsTellTheSDKsWhetherAndWhenToRetry(t *testing.T) {
	up := startUpstream(t, okHandler)
	kr, hr := mintKey(t)
	kq, hq := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{
		"user_limit": {"templates": [
			{"name": "rpm", "rate": {"enabled": true, "rpm": 4}},
			{"name": "day", "quota": {"enabled": true, "windows": [{"period": "month", "max_requests": 1}]}}]},
		"users": [{"name": "r", "keys": [%q], "template": "rpm"}, {"name": "q", "keys": [%q], "template": "day"}]}`, hr, hq), up.url)
	for range 4 {
		limited(t, r.url, "/v1/chat/completions", kr, chatBody)
	}
	code, h := limited(t, r.url, "/v1/chat/completions", kr, chatBody)
	ms, err := strconv.Atoi(h.Get("Retry-After-Ms"))
	if code != 429 || err != nil || ms < 14000 || ms > 15000 || h.Get("Retry-After") != "15" || h.Get("X-Should-Retry") != "" {
		t.Fatalf("RPM refusal: %d, Retry-After %q, Retry-After-Ms %q, X-Should-Retry %q", code, h.Get("Retry-After"), h.Get("Retry-After-Ms"), h.Get("X-Should-Retry"))
	}
	limited(t, r.url, "/v1/chat/completions", kq, chatBody)
	code, h = limited(t, r.url, "/v1/chat/completions", kq, chatBody)
	if s, _ := strconv.Atoi(h.Get("Retry-After")); code != 429 || s <= 60 || h.Get("X-Should-Retry") != "false" || h.Get("Retry-After-Ms") != "" {
		t.Fatalf("monthly quota refusal: %d, Retry-After %q, Retry-After-Ms %q, X-Should-Retry %q", code, h.Get("Retry-After"), h.Get("Retry-After-Ms"), h.Get("X-Should-Retry"))
	}
}
