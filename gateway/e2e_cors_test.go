package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/infera/infera/internal/browsertest"
)

// A web page in a real browser calls the router from another origin:
// with --cors-allow-origins naming the page's origin, Chromium's preflight
// passes, the page reads the answer, a stream chunk by chunk and the
// X-Request-Id header, and a 401's error body; a page of an origin not
// listed is refused by the browser before anything is sent with its key.
func TestE2EBrowserPageOfAnAllowedOriginCallsTheAPI(t *testing.T) {
	bin := browsertest.FindChromium(t)
	page := func() *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.Write([]byte("<!doctype html><title>app</title><p>app</p>"))
		}))
		t.Cleanup(s.Close)
		return s
	}
	allowed, other := page(), page()
	_, e1 := startEngine(t, "--speedup", "50")
	r := startChild(t, "serve", 0, "--workers", e1, "--api-key", "page-key", "--cors-allow-origins", allowed.URL)
	ctx := newBrowser(t, bin)

	js := func(key, body string) string {
		return `(async () => {
  try {
    const r = await fetch("` + r.url + `/v1/chat/completions", {method: "POST",
      headers: {"Authorization": "Bearer ` + key + `", "Content-Type": "application/json", "x-stainless-lang": "js"},
      body: ` + "`" + body + "`" + `});
    let text = "", chunks = 0;
    const reader = r.body.getReader(), dec = new TextDecoder();
    for (;;) { const {done, value} = await reader.read(); if (done) break; chunks++; text += dec.decode(value); }
    return r.status + "|" + (r.headers.get("x-request-id") || "") + "|" + chunks + "|" + text;
  } catch (e) { return "error|" + e.name; }
})()`
	}
	eval := func(origin *httptest.Server, key, body string) string {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Navigate(origin.URL+"/")); err != nil {
			t.Fatal(err)
		}
		out, err := chromedp.Run(ctx, chromedp.Evaluate[string](js(key, body), chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	got := eval(allowed, "page-key", chatJSON("sim-model", "hi", 2, false))
	parts := strings.SplitN(got, "|", 4)
	if len(parts) != 4 || parts[0] != "200" || len(parts[1]) != 32 || !strings.Contains(parts[3], `"chat.completion"`) {
		t.Fatalf("allowed page, JSON: %q", got)
	}
	got = eval(allowed, "page-key", chatJSON("sim-model", "hi", 6, true))
	if parts = strings.SplitN(got, "|", 4); len(parts) != 4 || parts[0] != "200" || !strings.HasSuffix(parts[3], "data: [DONE]\n\n") {
		t.Fatalf("allowed page, stream: %q", got)
	}
	got = eval(allowed, "wrong-key", chatJSON("sim-model", "hi", 2, false))
	if parts = strings.SplitN(got, "|", 4); len(parts) != 4 || parts[0] != "401" || !strings.Contains(parts[3], "invalid_api_key") {
		t.Fatalf("allowed page, wrong key: %q", got)
	}
	before := strings.Count(r.logText(), "page-key")
	if got = eval(other, "page-key", chatJSON("sim-model", "hi", 2, false)); got != "error|TypeError" {
		t.Fatalf("a page of another origin: %q", got)
	}
	if strings.Count(r.logText(), "page-key") != before {
		t.Fatal("the key shows in the router's log")
	}
}
