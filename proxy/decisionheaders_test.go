package proxy

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/valyala/fasthttp"
)

// An upstream that is itself a gateway (a member region, a split-proxy
// entry) answers with its own decision headers, naming its internal
// workers. They never reach the client: without debug.decision_header the
// client sees none, with it only this router's. The engine's own headers
// pass.
func TestAnUpstreamGatewaysDecisionHeadersNeverReachTheClient(t *testing.T) {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		h := &ctx.Response.Header
		h.Set("X-Infera-Worker", "http://10.0.0.7:8000")
		h.Set("X-Infera-Route", "layer=inner")
		h.Set("X-Infera-Prefill-Worker", "p-internal")
		h.Set("X-Infera-Prefill-Route", "layer=kv")
		h.Set("X-Infera-Upstream", "global:inner")
		h.Set("x-infera-tier", "L3")
		h.Set("X-Infera-Engine-Id", "engine-7")
		okHandler(ctx)
	})
	for _, on := range []bool{false, true} {
		cfg := config.Default()
		cfg.Debug.DecisionHeader = on
		r := startRouter(t, nil, cfg, up.url)
		resp, body := postWith(t, r.url+"/v1/chat/completions", chatBody, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		for _, k := range []string{"X-Infera-Prefill-Worker", "X-Infera-Prefill-Route", "X-Infera-Upstream", "X-Infera-Tier"} {
			if v := resp.Header.Values(k); len(v) > 0 {
				t.Errorf("decision header %v: the upstream's %s reached the client: %q", on, k, v)
			}
		}
		if v := resp.Header.Values("X-Infera-Route"); len(v) != map[bool]int{false: 0, true: 1}[on] || (on && v[0] == "layer=inner") {
			t.Errorf("decision header %v: X-Infera-Route %q, want only this router's", on, v)
		}
		want := []string(nil)
		if on {
			want = []string{"w0"}
		}
		if got := resp.Header.Values("X-Infera-Worker"); len(got) != len(want) || (len(want) > 0 && got[0] != want[0]) {
			t.Errorf("decision header %v: X-Infera-Worker %q, want %q", on, got, want)
		}
		if got := resp.Header.Get("X-Infera-Engine-Id"); got != "engine-7" {
			t.Errorf("the engine's own header: %q", got)
		}
	}
}

// With the decision header on, every answer to a request smart model
// selection classified says its tier, an error answer too (the tier's
// model not served here): only answers relayed from a worker said it.
func TestAClassifiedRequestsErrorAnswerCarriesItsTier(t *testing.T) {
	cls := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"tier":"L3"}`) })
	up := startUpstream(t, okHandler)
	for _, on := range []bool{false, true} {
		cfg := config.Default()
		cfg.Debug.DecisionHeader = on
		cfg.SmartModelSelection = config.SmartModelSelection{Enabled: true, ClassifierURL: cls.url + "/v1/classify",
			TimeoutMS: 10000, FallbackTier: "L1", MatchModels: []string{"auto"},
			Tiers: config.TierModels{L1: "m", L2: "m", L3: "not-served"}, MaxTextBytes: 8192}
		r := startRouter(t, nil, cfg, up.url)
		resp, body := postWith(t, r.url+"/v1/chat/completions", `{"model":"auto","messages":[{"role":"user","content":"hi"}]}`, nil)
		want := map[bool]string{false: "", true: "L3"}[on]
		if resp.StatusCode != 404 || resp.Header.Get("X-Infera-Tier") != want {
			t.Fatalf("decision header %v: %d X-Infera-Tier %q, want 404 and %q: %s", on, resp.StatusCode, resp.Header.Get("X-Infera-Tier"), want, body)
		}
	}
}

// A client that leaves while the classifier is being asked is not sent to
// an engine: it was, and the engine's request was cancelled only once the
// liveness watchdog noticed (review 173: five clients that gave up after
// 0.5 s on a 2 s classifier each reached the engine at 2 s).
func TestAClientGoneWhileClassifiedIsNotSentToAnEngine(t *testing.T) {
	release := make(chan struct{})
	cls := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		<-release
		ctx.SetBodyString(`{"tier":"L1"}`)
	})
	up := startUpstream(t, okHandler)
	cfg := config.Default()
	cfg.SmartModelSelection = config.SmartModelSelection{Enabled: true, ClassifierURL: cls.url + "/v1/classify",
		TimeoutMS: 10000, FallbackTier: "L1", MatchModels: []string{"auto"},
		Tiers: config.TierModels{L1: "m", L2: "m", L3: "m"}, MaxTextBytes: 8192}
	r := startRouter(t, nil, cfg, up.url)
	c, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"auto","messages":[{"role":"user","content":"hi"}]}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	time.Sleep(200 * time.Millisecond) // the router is waiting for the classifier
	c.Close()
	time.Sleep(100 * time.Millisecond)
	close(release)
	time.Sleep(300 * time.Millisecond)
	if n := up.hits.Load(); n != 0 {
		t.Fatalf("the engine got %d requests of a client that had left", n)
	}
	// A client that stays is served.
	if resp, b := postWith(t, r.url+"/v1/chat/completions", body, nil); resp.StatusCode != 200 || up.hits.Load() != 1 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}
