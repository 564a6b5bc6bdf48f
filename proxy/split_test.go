package proxy

import (
	"bufio"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/sched"
	upstreams "github.com/infera/infera/upstream"
	"github.com/valyala/fasthttp"
)

// startRouterWith is startRouter with Options adjusted by opt (a mirror, a
// poller, ...) and workers serving model "m" at urls.
func startRouterWith(t testing.TB, f *config.Serve, cfg *config.Config, opt func(*Options), urls ...string) *testRouter {
	t.Helper()
	if f == nil {
		f = defaultFlags()
	}
	if cfg == nil {
		cfg = config.Default()
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("test config: %v", err)
	}
	fl := fleet.NewFleet(fleet.BreakerConfig{Threshold: f.BreakerFailureThreshold, Cooldown: f.BreakerCooldown(), MaxCooldown: f.BreakerMaxCooldown()})
	t.Cleanup(fl.Close)
	fl.AddHook(HTTPHook(f))
	var rs []fleet.Record
	for i, u := range urls {
		rs = append(rs, fleet.Record{ID: fmt.Sprintf("w%d", i), URL: u, Models: []string{"m"}})
	}
	if errs := fl.Sync(rs); len(errs) > 0 {
		t.Fatal(errs)
	}
	store := config.NewStore("", cfg)
	sc := sched.NewScheduler(fl, mustPolicy(f.RouterPolicy))
	opts := Options{Flags: f, Store: store, Sched: sc, BlockSize: 16}
	if opt != nil {
		opt(&opts)
	}
	srv := New(opts)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	return &testRouter{url: "http://" + ln.Addr().String(), srv: srv, fl: fl, store: store, flags: f}
}

// recorder is an external upstream that records what it received.
type recorder struct {
	mu   sync.Mutex
	reqs []recorded
}

type recorded struct {
	uri, host, body string
	header          http.Header
}

func (rc *recorder) record(ctx *fasthttp.RequestCtx) {
	r := recorded{uri: string(ctx.RequestURI()), host: string(ctx.Host()), body: string(ctx.PostBody()), header: http.Header{}}
	for k, v := range ctx.Request.Header.All() {
		r.header.Add(string(k), string(v))
	}
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, r)
	rc.mu.Unlock()
}

func (rc *recorder) all() []recorded {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]recorded(nil), rc.reqs...)
}

func splitConfig(strategy config.SplitStrategy, proxies ...config.Proxy) *config.Config {
	cfg := config.Default()
	cfg.Debug.DecisionHeader = true
	cfg.SplitProxy.Enabled, cfg.SplitProxy.Strategy, cfg.SplitProxy.Proxies = true, strategy, proxies
	return cfg
}

func postWith(t *testing.T, url, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

const gptBody = `{"model":"gpt-4o","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`

// Prefix rules pick the proxy; a failing primary fails over to the
// failover-flagged entries in list order; the external upstream gets its
// own key and base path, never the client's credentials.
func TestSplitPrefixFailsOverInListOrderWithTheUpstreamKey(t *testing.T) {
	local := startUpstream(t, okHandler)
	var rec1, rec2 recorder
	fail1 := false
	var mu sync.Mutex
	ext1 := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		rec1.record(ctx)
		mu.Lock()
		f := fail1
		mu.Unlock()
		if f {
			ctx.SetStatusCode(503)
			ctx.SetBodyString(`{"error":{"message":"ext1 down"}}`)
			return
		}
		okHandler(ctx)
	})
	ext2 := startUpstream(t, func(ctx *fasthttp.RequestCtx) { rec2.record(ctx); okHandler(ctx) })
	f := defaultFlags()
	f.APIKey = "client-key"
	cfg := splitConfig(config.SplitPrefix,
		config.Proxy{Name: "bad", Address: deadURL(t), ModelRules: []string{"gpt-*"}},
		config.Proxy{Local: true, ModelRules: []string{"m"}},
		config.Proxy{Name: "ext1", Address: ext1.url + "/compat/v1", APIKey: config.NewSecret("sk-ext1"), Failover: true},
		config.Proxy{Name: "ext2", Address: ext2.url, APIKey: config.NewSecret("sk-ext2"), Failover: true},
	)
	r := startRouterWith(t, f, cfg, nil, local.url)
	client := map[string]string{"Authorization": "Bearer client-key", "Cookie": "session=c-secret",
		"X-Forwarded-For": "10.1.2.3", "OpenAI-Organization": "org-secret", "X-Request-Id": "req-7"}

	resp, b := postWith(t, r.url+"/v1/chat/completions?debug=1", gptBody, client)
	if resp.StatusCode != 200 || b != okJSON || resp.Header.Get("X-Infera-Upstream") != "split:ext1" {
		t.Fatalf("gpt via bad->ext1: %d %q upstream %q", resp.StatusCode, b, resp.Header.Get("X-Infera-Upstream"))
	}
	got := rec1.all()
	if len(got) != 1 || len(rec2.all()) != 0 || local.hits.Load() != 0 {
		t.Fatalf("ext1 %d ext2 %d local %d", len(got), len(rec2.all()), local.hits.Load())
	}
	g := got[0]
	if g.uri != "/compat/v1/chat/completions" || g.body != gptBody || g.host != strings.TrimPrefix(ext1.url, "http://") {
		t.Fatalf("ext1 got uri %q host %q body %q", g.uri, g.host, g.body)
	}
	if g.header.Get("Authorization") != "Bearer sk-ext1" || g.header.Get("X-Request-Id") != "req-7" {
		t.Fatalf("ext1 headers %v", g.header)
	}
	for k, vs := range g.header {
		for _, v := range vs {
			if strings.Contains(v, "secret") || strings.Contains(v, "client-key") || strings.Contains(v, "10.1.2.3") {
				t.Fatalf("client credential reached the external upstream: %s: %s", k, v)
			}
		}
	}

	// ext1 answers 503: the next failover entry in list order takes it.
	mu.Lock()
	fail1 = true
	mu.Unlock()
	resp, b = postWith(t, r.url+"/v1/chat/completions", gptBody, client)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "split:ext2" || len(rec2.all()) != 1 {
		t.Fatalf("gpt via bad->ext1(503)->ext2: %d %q upstream %q ext2 %d", resp.StatusCode, b, resp.Header.Get("X-Infera-Upstream"), len(rec2.all()))
	}
	if rec2.all()[0].header.Get("Authorization") != "Bearer sk-ext2" {
		t.Fatalf("ext2 key: %v", rec2.all()[0].header)
	}

	// A model the local rules match stays local; the local entry is never a
	// failover target.
	resp, b = postWith(t, r.url+"/v1/chat/completions", chatBody, client)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "" || resp.Header.Get("X-Infera-Worker") != "w0" {
		t.Fatalf("local: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	if local.hits.Load() != 1 {
		t.Fatalf("local hits %d", local.hits.Load())
	}

	// Every entry fails: the last upstream answer is relayed.
	ext2.srv.Shutdown()
	resp, b = postWith(t, r.url+"/v1/chat/completions", gptBody, client)
	if resp.StatusCode != 502 && resp.StatusCode != 503 {
		t.Fatalf("all failed: %d %s", resp.StatusCode, b)
	}
	checkOpenAIError(t, b)
}

// The local fleet failing before the first byte fails over to an external
// upstream; a local scheduler refusal (unknown model) does too.
func TestSplitLocalFailureFailsOverToExternal(t *testing.T) {
	var rec recorder
	ext := startUpstream(t, func(ctx *fasthttp.RequestCtx) { rec.record(ctx); okHandler(ctx) })
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "ext", Address: ext.url, Failover: true},
	)
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	resp, b := postWith(t, r.url+"/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "split:ext" {
		t.Fatalf("dead local -> ext: %d %s %v", resp.StatusCode, b, resp.Header)
	}
	resp, b = postWith(t, r.url+"/v1/chat/completions", gptBody, nil)
	if resp.StatusCode != 200 || len(rec.all()) != 2 {
		t.Fatalf("unknown model locally -> ext: %d %s (ext saw %d)", resp.StatusCode, b, len(rec.all()))
	}
	// A client error is answered, never failed over.
	resp, b = postWith(t, r.url+"/v1/chat/completions", `{"model":"m","messages":[]}`, nil)
	if resp.StatusCode != 400 || len(rec.all()) != 2 {
		t.Fatalf("bad request: %d %s", resp.StatusCode, b)
	}
}

// A canary rule splits "m" 2:1 between service "stable" (one worker,
// answering 500) and service "canary" (one healthy worker); the router may
// retry once. Every request's retry must reach the healthy canary worker.
// The retry used to re-run the rule's sequence (stable, canary, stable,
// ...): the second request's retry got "stable" again, whose only worker
// it had tried, Pick answered ErrExhausted, and the client got the broken
// worker's 500 with a retry left and a healthy service.
func TestACanaryFailoverReachesTheHealthyService(t *testing.T) {
	bad := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(500)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"boom","type":"server_error"}}`)
	})
	good := startUpstream(t, okHandler)
	cfg := config.Default()
	cfg.Canary.Enabled = true
	cfg.Canary.Rules = []config.CanaryRule{{Model: "m", Targets: []config.CanaryTarget{{Service: "stable", Weight: 2}, {Service: "canary", Weight: 1}}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := startRouter(t, nil, cfg, bad.url, good.url)
	if errs := r.fl.Sync([]fleet.Record{
		{ID: "w0", URL: bad.url, Service: "stable", Models: []string{"m"}},
		{ID: "w1", URL: good.url, Service: "canary", Models: []string{"m"}},
	}); len(errs) > 0 {
		t.Fatal(errs)
	}
	for i := 0; i < 6; i++ {
		resp := postPath(t, r.url, "/v1/chat/completions", "", chatBody)
		if resp.status != 200 {
			t.Fatalf("request %d: %d %s (bad worker hits %d, good worker hits %d)", i, resp.status, resp.body, bad.hits.Load(), good.hits.Load())
		}
	}
}

// Under the weight strategy any window of requests is split by the weights.
func TestSplitWeightSharesTraffic(t *testing.T) {
	local := startUpstream(t, okHandler)
	a := startUpstream(t, okHandler)
	b := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "a", Address: a.url, Weight: 3},
		config.Proxy{Name: "b", Address: b.url, Weight: 6, Status: config.ProxyEnabled},
		config.Proxy{Name: "off", Address: deadURL(t), Weight: 50, Status: config.ProxyDisabled},
	)
	r := startRouterWith(t, nil, cfg, nil, local.url)
	for i := 0; i < 100; i++ {
		if code, body := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	near := func(got int64, want int64) bool { return got >= want-3 && got <= want+3 }
	if !near(local.hits.Load(), 10) || !near(a.hits.Load(), 30) || !near(b.hits.Load(), 60) {
		t.Fatalf("split 1:3:6 over 100: local %d a %d b %d", local.hits.Load(), a.hits.Load(), b.hits.Load())
	}
}

// An external upstream has its own breaker: after --breaker-failure-threshold
// failures it receives nothing until its cooldown passes, and the request
// goes straight to the failover entry.
func TestSplitExternalBreakerSkipsAFailingUpstream(t *testing.T) {
	bad := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(500) })
	good := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitPrefix,
		config.Proxy{Local: true},
		config.Proxy{Name: "bad", Address: bad.url, ModelRules: []string{"gpt"}},
		config.Proxy{Name: "good", Address: good.url, Failover: true},
	)
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	for i := 0; i < 6; i++ {
		if code, b := post(t, r.url+"/v1/chat/completions", gptBody); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, b)
		}
	}
	if bad.hits.Load() != 3 || good.hits.Load() != 6 {
		t.Fatalf("bad saw %d (want the threshold, 3), good %d", bad.hits.Load(), good.hits.Load())
	}
	u := r.srv.ext.splitTable(&r.store.Load().SplitProxy).ups[1]
	if u.w.Breaker.State() != fleet.BreakerOpen || u.w.Load.Requests.Load() != 0 {
		t.Fatalf("bad breaker %d, in flight %d", u.w.Breaker.State(), u.w.Load.Requests.Load())
	}
}

// Streams from an external upstream are relayed as from a local engine:
// the first event before the upstream finishes, the end intact.
func TestSplitStreamsThroughExternal(t *testing.T) {
	su := &sseUpstream{n: 3, gate: make(chan struct{})}
	ext := startUpstream(t, su.handler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 0},
		config.Proxy{Name: "ext", Address: ext.url + "/v1", Weight: 1},
	)
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Infera-Upstream") != "split:ext" {
		t.Fatalf("headers %v", resp.Header)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: {\"i\":0}\n" || su.finished.Load() != 0 {
		t.Fatalf("first line %q %v finished=%d", line, err, su.finished.Load())
	}
	close(su.gate)
	rest, _ := io.ReadAll(br)
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || !strings.Contains(string(rest), `{"i":2}`) {
		t.Fatalf("rest %q", rest)
	}
	u := r.srv.ext.splitTable(&r.store.Load().SplitProxy).ups[1]
	waitFor(t, func() bool { return u.w.Load.Requests.Load() == 0 }, "external lease ended")
}

// An https upstream is reached over TLS (certificate verified against the
// upstream's host, Host the upstream's).
func TestSplitExternalOverTLS(t *testing.T) {
	var host string
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host = r.Host
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, okJSON)
	}))
	defer ts.Close()
	pool := x509.NewCertPool()
	pool.AddCert(ts.Certificate())
	extRootCAs = pool
	defer func() { extRootCAs = nil }()
	addr := ts.URL // the test certificate names 127.0.0.1
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true},
		config.Proxy{Name: "tls", Address: addr, Weight: 1},
	)
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	for i := 0; i < 3; i++ {
		resp, b := postWith(t, r.url+"/v1/chat/completions", chatBody, nil)
		if resp.StatusCode != 200 || b != okJSON {
			t.Fatalf("tls: %d %s", resp.StatusCode, b)
		}
	}
	if host != strings.TrimPrefix(addr, "https://") {
		t.Fatalf("Host %q", host)
	}
}

// A reload that changes an entry's address starts a new upstream (and
// breaker); an unchanged entry keeps its connections and breaker.
func TestSplitReloadKeepsUnchangedUpstreams(t *testing.T) {
	a := startUpstream(t, okHandler)
	b := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true},
		config.Proxy{Name: "a", Address: a.url, Weight: 1},
		config.Proxy{Name: "b", Address: b.url, Failover: true},
	)
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	post(t, r.url+"/v1/chat/completions", chatBody)
	t1 := r.srv.ext.splitTable(&r.store.Load().SplitProxy)
	c := *cfg
	c.SplitProxy.Proxies = append([]config.Proxy(nil), cfg.SplitProxy.Proxies...)
	c.SplitProxy.Proxies[2].Address = a.url + "/v1"
	r.store.Set(&c)
	post(t, r.url+"/v1/chat/completions", chatBody)
	t2 := r.srv.ext.splitTable(&r.store.Load().SplitProxy)
	if t1 == t2 || t1.ups[1] != t2.ups[1] || t1.ups[2] == t2.ups[2] || t2.ups[0] != nil {
		t.Fatalf("reload: a kept %v, b replaced %v", t1.ups[1] == t2.ups[1], t1.ups[2] != t2.ups[2])
	}
	if a.hits.Load() != 2 {
		t.Fatalf("a hits %d", a.hits.Load())
	}
}

// The timeouts section applies to external upstreams as to engines: a
// stream whose first packet does not come within stream_first_packet_s
// fails over to the next entry; the hung upstream's breaker counts it.
func TestSplitExternalFirstPacketTimeoutFailsOver(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	slow := startUpstream(t, func(ctx *fasthttp.RequestCtx) { <-hang })
	su := &sseUpstream{n: 2}
	good := startUpstream(t, su.handler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true},
		config.Proxy{Name: "slow", Address: slow.url, Weight: 1},
		config.Proxy{Name: "good", Address: good.url, Failover: true},
	)
	cfg.Timeouts.StreamFirstPacketSeconds = 0.2
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	t0 := time.Now()
	resp, b := postWith(t, r.url+"/v1/chat/completions", streamBody, nil)
	if el := time.Since(t0); resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "split:good" ||
		!strings.HasSuffix(b, "data: [DONE]\n\n") || el > 2*time.Second {
		t.Fatalf("%d after %v: %q %v", resp.StatusCode, el, b, resp.Header)
	}
	u := r.srv.ext.splitTable(&r.store.Load().SplitProxy).ups[1]
	if slow.hits.Load() != 1 || u.w.Load.Requests.Load() != 0 {
		t.Fatalf("slow hits %d, in flight %d", slow.hits.Load(), u.w.Load.Requests.Load())
	}
}

// A request that loaded its config snapshot before a reload and reaches the
// split proxy after requests of the new snapshot (here: held by the
// classifier) does not undo the reload: the new snapshot's upstreams keep
// their breakers and connections. It used to rebuild the table for its old
// snapshot, retiring the new upstreams; the next request of the new
// snapshot then rebuilt them afresh, with closed breakers, so an external
// upstream whose breaker had opened was sent requests again.
func TestSplitLateRequestOfAReplacedSnapshotKeepsTheNewUpstreams(t *testing.T) {
	hold := make(chan struct{})
	cls := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if strings.Contains(string(ctx.PostBody()), "hold me") {
			<-hold
		}
		ctx.SetBodyString(`{"tier":"L3"}`)
	})
	bad := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(500) })
	good := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitPrefix,
		config.Proxy{Local: true},
		config.Proxy{Name: "a", Address: bad.url, APIKey: config.NewSecret("sk-old"), ModelRules: []string{"t3"}},
		config.Proxy{Name: "good", Address: good.url, Failover: true},
	)
	cfg.SmartModelSelection = config.SmartModelSelection{Enabled: true, ClassifierURL: cls.url + "/v1/classify",
		TimeoutMS: 10000, FallbackTier: "L3", MatchModels: []string{"auto"},
		Tiers: config.TierModels{L1: "t3", L2: "t3", L3: "t3"}, MaxTextBytes: 8192}
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	late := make(chan int, 1)
	go func() {
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"auto","messages":[{"role":"user","content":"hold me"}],"max_tokens":4}`))
		if err != nil {
			late <- -1
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		late <- resp.StatusCode
	}()
	waitFor(t, func() bool { return cls.hits.Load() == 1 }, "the late request reached the classifier")

	// The reload rotates a's key; a fails under the new snapshot until its
	// breaker opens (threshold 3).
	c := *cfg
	c.SplitProxy.Proxies = append([]config.Proxy(nil), cfg.SplitProxy.Proxies...)
	c.SplitProxy.Proxies[1].APIKey = config.NewSecret("sk-new")
	r.store.Set(&c)
	t3 := `{"model":"t3","messages":[{"role":"user","content":"x"}],"max_tokens":4}`
	for i := 0; i < 5; i++ {
		if code, b := post(t, r.url+"/v1/chat/completions", t3); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, b)
		}
	}
	tbl := r.srv.ext.splitTable(&r.store.Load().SplitProxy)
	if bad.hits.Load() != 3 || tbl.ups[1].w.Breaker.State() != fleet.BreakerOpen {
		t.Fatalf("a saw %d requests, breaker %d", bad.hits.Load(), tbl.ups[1].w.Breaker.State())
	}

	close(hold)
	if code := <-late; code != 200 {
		t.Fatalf("late request: %d", code)
	}
	for i := 0; i < 5; i++ {
		if code, b := post(t, r.url+"/v1/chat/completions", t3); code != 200 {
			t.Fatalf("request %d after the late one: %d %s", i, code, b)
		}
	}
	if got := r.srv.ext.splitTable(&r.store.Load().SplitProxy); got != tbl || bad.hits.Load() != 3 {
		t.Fatalf("after the late request: table replaced %v, a saw %d requests (its breaker was open)", got != tbl, bad.hits.Load())
	}
	if v := metricValue(t, r.url, `infera_split_proxy_failures_total{proxy="a"}`); v != "3" {
		t.Fatalf("a's failures counter %s, want 3", v)
	}
}

// With session affinity on, a split-proxy entry (another gateway, say)
// gets the client's session header, so it keeps the session on one engine
// too; without it, it does not.
func TestSplitExternalGetsTheSessionHeader(t *testing.T) {
	var rec recorder
	ext := startUpstream(t, func(ctx *fasthttp.RequestCtx) { rec.record(ctx); okHandler(ctx) })
	for _, on := range []bool{true, false} {
		cfg := splitConfig(config.SplitWeight,
			config.Proxy{Local: true, Weight: 0},
			config.Proxy{Name: "ext", Address: ext.url + "/v1", Weight: 1},
		)
		cfg.SessionAffinity.Enabled = on
		r := startRouterWith(t, nil, cfg, nil, deadURL(t))
		resp, body := postWith(t, r.url+"/v1/chat/completions", chatBody, map[string]string{"X-Session-Id": "sess-42"})
		if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "split:ext" {
			t.Fatalf("%d %s %v", resp.StatusCode, body, resp.Header)
		}
		all := rec.all()
		got := all[len(all)-1].header.Get("X-Session-Id")
		if want := map[bool]string{true: "sess-42", false: ""}[on]; got != want {
			t.Fatalf("session affinity %v: the external upstream got X-Session-Id %q, want %q", on, got, want)
		}
	}
}

// Disabling the split proxy (or global scheduling) retires its external
// upstreams at the reload: their series leave /metrics (a breaker_state
// of 2 kept an alert firing) and their idle connections close. They used
// to stay until the section's next request, which a disabled section
// never gets.
func TestDisablingTheSplitProxyRetiresItsUpstreamsAtTheReload(t *testing.T) {
	bad := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(500) })
	good := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true},
		config.Proxy{Name: "a", Address: bad.url, Weight: 1},
		config.Proxy{Name: "good", Address: good.url, Failover: true},
	)
	cfg.GlobalScheduling = globalConfig(config.Member{Name: "m1", URL: good.url}).GlobalScheduling
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	for i := 0; i < 3; i++ { // a's breaker opens (threshold 3)
		if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, b)
		}
	}
	const state = `infera_split_proxy_breaker_state{proxy="a"}`
	if v := metricValue(t, r.url, state); v != "2" {
		t.Fatalf("a's breaker state %q, want 2", v)
	}
	c := *cfg
	c.GlobalScheduling.Enabled = false
	r.store.Set(&c) // a member table is built for this snapshot
	if v := metricValue(t, r.url, `infera_global_member_breaker_state{member="m1"}`); v != "" {
		t.Fatalf("a disabled member's series is listed: %q", v)
	}
	c2 := c
	c2.GlobalScheduling.Enabled = true
	r.store.Set(&c2)
	if v := metricValue(t, r.url, `infera_global_member_breaker_state{member="m1"}`); v != "0" {
		t.Fatalf("the enabled member's breaker state %q, want 0", v)
	}
	up := r.srv.ext.split.Load().ups[2]
	if idleConns(up.pool) == 0 {
		t.Fatal("good has no idle connection to close")
	}
	c3 := c2
	c3.SplitProxy.Enabled = false
	c3.GlobalScheduling.Enabled = false
	r.store.Set(&c3)
	for _, s := range []string{state, `infera_split_proxy_requests_total{proxy="good"}`, `infera_global_member_breaker_state{member="m1"}`} {
		if v := metricValue(t, r.url, s); v != "" {
			t.Fatalf("after disabling, %s is still %s", s, v)
		}
	}
	if n := idleConns(up.pool); n != 0 {
		t.Fatalf("a retired upstream keeps %d idle connections", n)
	}
}

func idleConns(p *httpPool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// The split proxy's list holds at least one local entry, as the spec says,
// not exactly one: under prefix, local rules can sit before and after an
// external entry (local m, external gpt-*, local for the rest). A second
// local entry was refused.
func TestASplitProxyListMayHoldSeveralLocalEntries(t *testing.T) {
	local := startUpstream(t, okHandler)
	ext := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitPrefix,
		config.Proxy{Name: "m-local", Local: true, ModelRules: []string{"m"}},
		config.Proxy{Name: "ext", Address: ext.url, APIKey: config.NewSecret("sk-ext"), ModelRules: []string{"gpt-*"}},
		config.Proxy{Name: "rest", Local: true},
	)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := startRouterWith(t, nil, cfg, nil, local.url)
	for model, want := range map[string]string{"gpt-4o": "split:ext", "m": ""} {
		resp, b := postWith(t, r.url+"/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`, nil)
		if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != want {
			t.Fatalf("%s: %d upstream %q, want %q: %s", model, resp.StatusCode, resp.Header.Get("X-Infera-Upstream"), want, b)
		}
	}
	if local.hits.Load() != 1 || ext.hits.Load() != 1 {
		t.Fatalf("local %d ext %d, want 1 and 1", local.hits.Load(), ext.hits.Load())
	}
	two := splitConfig(config.SplitPrefix, config.Proxy{Name: "a", Local: true}, config.Proxy{Name: "a", Local: true})
	if err := two.Validate(); err == nil || !strings.Contains(err.Error(), "duplicate name") {
		t.Fatalf("two local entries of one name: %v", err)
	}
}

// A split proxy entry that leads back to the gateway (its own address here;
// two gateways listing each other alike) is followed at most
// upstreams.MaxForwards times: the request then goes to the local entries
// only. Each forward used to be split again, so one client request became
// thousands, until the connection limit answered 503.
func TestASplitProxyEntryLeadingBackToTheGatewayDoesNotLoop(t *testing.T) {
	r := startRouterWith(t, nil, nil, nil, startUpstream(t, okHandler).url)
	cfg := splitConfig(config.SplitPrefix,
		config.Proxy{Local: true, ModelRules: []string{"m"}},
		config.Proxy{Name: "self", Address: r.url + "/v1", ModelRules: []string{"*"}})
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r.store.Set(cfg)
	resp, b := postWith(t, r.url+"/v1/chat/completions", gptBody, nil)
	sent := r.srv.ext.set.GetOrCreateCounter(`infera_split_proxy_requests_total{proxy="self"}`).Get()
	if sent != upstreams.MaxForwards || resp.StatusCode != 503 {
		t.Fatalf("one request was forwarded to the gateway itself %d times (want %d), answer %d %s", sent, upstreams.MaxForwards, resp.StatusCode, b)
	}
	// A model of the local entry is served, whatever the count.
	resp, b = postWith(t, r.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{upstreams.ForwardsHeader: "99"})
	if resp.StatusCode != 200 {
		t.Fatalf("local model after %s 99: %d %s", upstreams.ForwardsHeader, resp.StatusCode, b)
	}
}

// A request the local fleet failed (a dead worker) and a failover entry
// answered says so in the access log: retries counts the attempt that
// followed the failed one, as it does for a retry across workers. It was
// absent, and the line read as if the external upstream had been the only
// try. A request the local fleet had no worker for (no attempt failed)
// has none.
func TestTheAccessLogCountsASplitFailoverAsARetry(t *testing.T) {
	ext := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "ext", Address: ext.url, Failover: true},
	)
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := OpenAccessLog(path)
	if err != nil {
		t.Fatal(err)
	}
	r := startRouterWith(t, nil, cfg, func(o *Options) { o.AccessLog = l }, deadURL(t))
	for _, id := range []string{"dead-local", "unknown-model"} {
		body := chatBody
		if id == "unknown-model" {
			body = gptBody
		}
		if resp, b := postWith(t, r.url+"/v1/chat/completions", body, map[string]string{"X-Request-Id": id}); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", id, resp.StatusCode, b)
		}
	}
	r.srv.Shutdown()
	l.Close()
	got := map[string]any{}
	for _, line := range readAccessLog(t, path) {
		if line["upstream"] != "split:ext" {
			t.Errorf("line not from the failover entry: %v", line)
		}
		got[line["request_id"].(string)] = line["retries"]
	}
	if got["dead-local"] != 1.0 || got["unknown-model"] != nil {
		t.Fatalf("retries: dead local worker %v (want 1), unknown model %v (want none)", got["dead-local"], got["unknown-model"])
	}
}

// With debug.decision_header, an error answer relayed after the walk (the
// last one kept while the next entry was tried) names who answered it, as
// every other relayed answer does: an external entry's carried no
// X-Infera-Upstream, a local worker's 5xx no X-Infera-Worker.
func TestARelayedErrorAnswerNamesWhoAnsweredIt(t *testing.T) {
	busy := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(429)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"slow down","type":"rate_limit_error"}}`)
	})
	cfg := splitConfig(config.SplitPrefix,
		config.Proxy{Local: true},
		config.Proxy{Name: "ext", Address: busy.url, ModelRules: []string{"gpt"}},
	)
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	resp, b := postWith(t, r.url+"/v1/chat/completions", gptBody, nil)
	if resp.StatusCode != 429 || !strings.Contains(b, "slow down") {
		t.Fatalf("got %d %s, want the upstream's 429", resp.StatusCode, b)
	}
	if got := resp.Header.Get("X-Infera-Upstream"); got != "split:ext" {
		t.Errorf("X-Infera-Upstream %q, want split:ext", got)
	}

	local := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(503)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"engine overloaded","type":"server_error"}}`)
	})
	lc := config.Default()
	lc.Debug.DecisionHeader = true
	r2 := startRouterWith(t, nil, lc, nil, local.url)
	resp, b = postWith(t, r2.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != 503 || !strings.Contains(b, "engine overloaded") {
		t.Fatalf("got %d %s, want the worker's 503", resp.StatusCode, b)
	}
	if got := resp.Header.Get("X-Infera-Worker"); got != "w0" {
		t.Errorf("X-Infera-Worker %q, want w0", got)
	}
}

// Under the weight strategy with session affinity on, a session stays on
// the entry its first request went to (the local service or an external
// upstream): the weights split sessions, not turns, as a canary rule
// does; requests without a session still take turns. A reload that sets
// an entry's weight to 0 moves its sessions to the others, where they stay.
// Before, every turn drew again: 20 sessions of 5 turns on 1:1:2 weights
// each went to 2 or 3 entries, the external ones included, losing the
// engines' prompt cache on every switch.
func TestASplitSessionStaysOnTheEntryItStartedOn(t *testing.T) {
	local := startUpstream(t, okHandler)
	a := startUpstream(t, okHandler)
	b := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "a", Address: a.url, Weight: 1},
		config.Proxy{Name: "b", Address: b.url, Weight: 2},
	)
	cfg.SessionAffinity.Enabled = true
	r := startRouterWith(t, nil, cfg, nil, local.url)
	where := func(sess string) string {
		t.Helper()
		hdr := map[string]string{}
		if sess != "" {
			hdr["X-Session-Id"] = sess
		}
		resp, body := postWith(t, r.url+"/v1/chat/completions", chatBody, hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("session %q: %d %s", sess, resp.StatusCode, body)
		}
		if u := resp.Header.Get("X-Infera-Upstream"); u != "" {
			return u
		}
		return "local"
	}
	const sessions = 20
	first := map[string]string{}
	for turn := range 5 {
		for i := range sessions {
			sess := fmt.Sprintf("sess-%d", i)
			got := where(sess)
			if turn == 0 {
				first[sess] = got
			} else if got != first[sess] {
				t.Fatalf("turn %d of %s went to %s, its first to %s", turn, sess, got, first[sess])
			}
			where("") // a request without a session takes a turn between
		}
	}
	count := map[string]int{}
	for _, u := range first {
		count[u]++
	}
	if count["local"] < 3 || count["split:a"] < 3 || count["split:b"] < 7 {
		t.Fatalf("sessions split 1:1:2 as %v", count)
	}

	c := *cfg
	c.SplitProxy.Proxies = append([]config.Proxy(nil), cfg.SplitProxy.Proxies...)
	c.SplitProxy.Proxies[1].Weight = 0
	r.store.Set(&c)
	for turn := range 3 {
		for i := range sessions {
			sess := fmt.Sprintf("sess-%d", i)
			got := where(sess)
			switch {
			case got == "split:a":
				t.Fatalf("%s went to a, weighing 0", sess)
			case first[sess] != "split:a" && got != first[sess]:
				t.Fatalf("%s moved from %s to %s at a reload that left its entry alone", sess, first[sess], got)
			case turn == 0:
				first[sess] = got
			case got != first[sess]:
				t.Fatalf("turn %d of %s after the reload went to %s, its first to %s", turn, sess, got, first[sess])
			}
		}
	}
}

// A session bound to a local worker that left the fleet (removed, or
// draining) is not held on the local entry: the weights decide again, as
// for a disabled or weightless entry. Before, splitBound returned the
// local entry for any fleet worker the table still named (and refreshed
// the binding), so with the only local worker gone every turn of such a
// session went to the local service and got 503, turn after turn, while a
// new session was split onto the external upstream.
func TestASplitSessionBoundToAWorkerThatLeftIsSplitAgain(t *testing.T) {
	local := startUpstream(t, okHandler)
	a := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "a", Address: a.url, Weight: 1},
	)
	cfg.SessionAffinity.Enabled = true
	r := startRouterWith(t, nil, cfg, nil, local.url)
	var bound []string
	for i := 0; i < 20 && len(bound) < 4; i++ {
		sess := fmt.Sprintf("sess-%d", i)
		resp, body := postWith(t, r.url+"/v1/chat/completions", chatBody, map[string]string{"X-Session-Id": sess})
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", sess, resp.StatusCode, body)
		}
		if resp.Header.Get("X-Infera-Upstream") == "" {
			bound = append(bound, sess)
		}
	}
	if len(bound) == 0 {
		t.Fatal("no session went to the local entry")
	}
	if errs := r.fl.Sync(nil); len(errs) > 0 { // the local worker leaves
		t.Fatal(errs)
	}
	for _, sess := range bound {
		served := false
		for turn := 0; turn < 8 && !served; turn++ {
			resp, _ := postWith(t, r.url+"/v1/chat/completions", chatBody, map[string]string{"X-Session-Id": sess})
			served = resp.StatusCode == 200 && resp.Header.Get("X-Infera-Upstream") == "split:a"
		}
		if !served {
			t.Fatalf("%s, bound to the worker that left, never went to the external entry in 8 turns", sess)
		}
	}
}

// A session bound to an external entry that starts refusing it (429,
// which never opens the entry's breaker, or 5xx below the breaker's
// threshold) is split again after the refusal, and served where the
// weights send it then; while the entry works, its sessions stay on it.
// Before, splitBound kept the session on the entry: every turn of it was
// answered 429 while the local worker was idle.
func TestASplitSessionWhoseEntryRefusesItIsSplitAgain(t *testing.T) {
	local := startUpstream(t, okHandler)
	var refuse atomic.Int32
	a := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if st := refuse.Load(); st != 0 {
			ctx.SetStatusCode(int(st))
			ctx.SetBodyString(`{"error":{"message":"slow down","type":"rate_limit"}}`)
			return
		}
		okHandler(ctx)
	})
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "a", Address: a.url, Weight: 1},
	)
	cfg.SessionAffinity.Enabled = true
	r := startRouterWith(t, nil, cfg, nil, local.url)
	turn := func(sess string) (int, string) {
		resp, _ := postWith(t, r.url+"/v1/chat/completions", chatBody, map[string]string{"X-Session-Id": sess})
		return resp.StatusCode, resp.Header.Get("X-Infera-Upstream")
	}
	var onA []string
	for i := 0; i < 20 && len(onA) < 4; i++ {
		sess := fmt.Sprintf("sess-%d", i)
		if code, up := turn(sess); code == 200 && up == "split:a" {
			onA = append(onA, sess)
		}
	}
	if len(onA) == 0 {
		t.Fatal("no session went to the external entry")
	}
	for _, sess := range onA { // bound while the entry works
		if code, up := turn(sess); code != 200 || up != "split:a" {
			t.Fatalf("%s left the working entry: %d %q", sess, code, up)
		}
	}
	for _, status := range []int32{429, 503} {
		refuse.Store(status)
		for _, sess := range onA {
			served := false
			for n := 0; n < 8 && !served; n++ {
				code, up := turn(sess)
				served = code == 200 && up == ""
			}
			if !served {
				t.Fatalf("%s, bound to an entry answering %d, never reached the local worker in 8 turns", sess, status)
			}
			// Served locally, it stays there.
			if code, up := turn(sess); code != 200 || up != "" {
				t.Fatalf("%s left the local entry it was split to: %d %q", sess, code, up)
			}
		}
		refuse.Store(0)
		// Sessions the weights send to the entry again get bound there.
		onA = onA[:0]
		for i := 100 * int(status); i < 100*int(status)+20 && len(onA) < 4; i++ {
			sess := fmt.Sprintf("sess-%d", i)
			if code, up := turn(sess); code == 200 && up == "split:a" {
				onA = append(onA, sess)
			}
		}
	}
}

// The same for a session bound to the local entry: when every local worker
// tried refuses it (429 opens no breaker), its next request is split
// again. Before, the session stayed bound to the local worker and got its
// 429 on every turn while the external entry was free (seen with the
// binary: 5 sessions out of 10, 5 turns out of 5).
func TestASplitSessionWhoseLocalWorkersRefuseItIsSplitAgain(t *testing.T) {
	var refuse atomic.Bool
	local := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if refuse.Load() {
			ctx.SetStatusCode(429)
			ctx.SetBodyString(`{"error":{"message":"busy","type":"rate_limit"}}`)
			return
		}
		okHandler(ctx)
	})
	a := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "a", Address: a.url, Weight: 1},
	)
	cfg.SessionAffinity.Enabled = true
	r := startRouterWith(t, nil, cfg, nil, local.url)
	turn := func(sess string) (int, string) {
		resp, _ := postWith(t, r.url+"/v1/chat/completions", chatBody, map[string]string{"X-Session-Id": sess})
		return resp.StatusCode, resp.Header.Get("X-Infera-Upstream")
	}
	var onLocal []string
	for i := 0; i < 20 && len(onLocal) < 4; i++ {
		sess := fmt.Sprintf("sess-%d", i)
		if code, up := turn(sess); code == 200 && up == "" {
			onLocal = append(onLocal, sess)
		}
	}
	if len(onLocal) == 0 {
		t.Fatal("no session went to the local entry")
	}
	refuse.Store(true)
	for _, sess := range onLocal {
		served := false
		for n := 0; n < 8 && !served; n++ {
			code, up := turn(sess)
			served = code == 200 && up == "split:a"
		}
		if !served {
			t.Fatalf("%s, bound to a local worker answering 429, never reached the external entry in 8 turns", sess)
		}
		if code, up := turn(sess); code != 200 || up != "split:a" {
			t.Fatalf("%s left the entry it was split to: %d %q", sess, code, up)
		}
	}
}

// A session's binding is dropped only when the worker it is bound to
// refuses it. In soft mode a turn of a session whose worker is overloaded
// goes to another worker without moving the binding; when that other
// worker refuses the turn (429), the session keeps its worker (and its KV
// cache) for its next turn. Before, the local entry dropped whatever
// binding the session had after any local refusal, so the turn refused by
// the other worker also cost the session the worker that held its cache.
func TestASplitSessionKeepsItsWorkerWhenAnotherWorkerRefusesATurn(t *testing.T) {
	hold := make(chan struct{})
	a := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if strings.Contains(string(ctx.PostBody()), "hold") {
			<-hold
		}
		okHandler(ctx)
	})
	b := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(429)
		ctx.SetBodyString(`{"error":{"message":"busy","type":"rate_limit"}}`)
	})
	// A failover entry that refuses too: the request is answered with a
	// failure, and no entry binds the session.
	ext := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(503)
		ctx.SetBodyString(`{"error":{"message":"down","type":"server_error"}}`)
	})
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "x", Address: ext.url, Weight: 0, Failover: true},
	)
	cfg.SessionAffinity.Enabled = true
	cfg.SessionAffinity.Mode = "soft"
	cfg.PrefixCache.Enabled = false
	f := defaultFlags()
	f.RequestMaxRetries = 0 // the turn refused by b is not retried on a
	r := startRouterWith(t, f, cfg, nil, a.url, b.url)
	var held sync.WaitGroup
	t.Cleanup(func() { close(hold); held.Wait() })

	turn := func(sess string) int {
		resp, _ := postWith(t, r.url+"/v1/chat/completions", chatBody, map[string]string{"X-Session-Id": sess})
		return resp.StatusCode
	}
	bound := func(sess string) string {
		w := r.srv.sched.BoundWorker(r.store.Load(), &sched.Request{Model: []byte("m"), SessionID: []byte(sess)})
		if w == nil {
			return ""
		}
		return w.ID
	}
	sess := ""
	for i := 0; i < 10 && sess == ""; i++ {
		s := fmt.Sprintf("sess-%d", i)
		if turn(s) == 200 && bound(s) == "w0" {
			sess = s
		}
	}
	if sess == "" {
		t.Fatal("no session was bound to worker a")
	}
	// Two requests held on a (b refuses the ones it gets) overload it:
	// load 2 against an average of 1, above soft_max_load_ratio 1.5.
	var wa *fleet.Worker
	for _, w := range r.fl.View().ByIdx {
		if w != nil && w.ID == "w0" {
			wa = w
		}
	}
	holdBody := `{"model":"m","messages":[{"role":"user","content":"hold"}],"max_tokens":4}`
	for i := 0; i < 20 && wa.Load.Requests.Load() < 2; i++ {
		onA, onB := wa.Load.Requests.Load(), b.hits.Load()
		held.Add(1)
		go func() {
			defer held.Done()
			req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(holdBody))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		deadline := time.Now().Add(2 * time.Second)
		for wa.Load.Requests.Load() == onA && b.hits.Load() == onB && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if n := wa.Load.Requests.Load(); n < 2 {
		t.Fatalf("%d requests held on a, want 2", n)
	}
	refused := false
	for n := 0; n < 8 && !refused; n++ {
		code := turn(sess)
		refused = code != 200
		if !refused && bound(sess) != "w0" {
			t.Fatalf("a turn served while a was overloaded moved %s to %q", sess, bound(sess))
		}
	}
	if !refused {
		t.Fatal("no turn of the session went to b in 8 turns")
	}
	if got := bound(sess); got != "w0" {
		t.Fatalf("after b refused a turn, %s is bound to %q, want w0 (a, which never refused it)", sess, got)
	}
}

// A session bound to a local worker stays on the local entry whatever the
// worker's id: an external entry's worker is told from a fleet worker by
// its index, not by its id alone. Before, a fleet worker whose id was an
// external entry's worker id ("split:<name>") matched that entry, listed
// before the local one, and every later turn of its sessions went to the
// external upstream.
func TestASplitSessionOnALocalWorkerNamedLikeAnEntryStaysLocal(t *testing.T) {
	local := startUpstream(t, okHandler)
	a := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Name: "a", Address: a.url, Weight: 1},
		config.Proxy{Local: true, Weight: 1},
	)
	cfg.SessionAffinity.Enabled = true
	r := startRouterWith(t, nil, cfg, nil)
	if errs := r.fl.Sync([]fleet.Record{{ID: "split:a", URL: local.url, Models: []string{"m"}}}); len(errs) > 0 {
		t.Fatal(errs)
	}
	turn := func(sess string) string {
		resp, body := postWith(t, r.url+"/v1/chat/completions", chatBody, map[string]string{"X-Session-Id": sess})
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", sess, resp.StatusCode, body)
		}
		if u := resp.Header.Get("X-Infera-Upstream"); u != "" {
			return u
		}
		return "local"
	}
	var onLocal []string
	for i := 0; i < 20 && len(onLocal) < 4; i++ {
		if sess := fmt.Sprintf("sess-%d", i); turn(sess) == "local" {
			onLocal = append(onLocal, sess)
		}
	}
	if len(onLocal) == 0 {
		t.Fatal("no session went to the local entry")
	}
	for _, sess := range onLocal {
		for n := range 3 {
			if got := turn(sess); got != "local" {
				t.Fatalf("turn %d of %s, bound to local worker split:a, went to %s", n+1, sess, got)
			}
		}
	}
}

// With --request-max-retries 0 the local worker's 429 is the client's
// answer at once (no other attempt may replace it): the session bound to
// that worker is split again on its next request all the same. Before,
// only a refusal kept aside (another attempt might follow) unbound it; a
// relayed one left the session on the refusing worker, 429 on every turn
// while the external entry was free.
func TestASplitSessionWhoseLocalWorkerAnswers429WithoutRetriesIsSplitAgain(t *testing.T) {
	var refuse atomic.Bool
	local := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if refuse.Load() {
			ctx.SetStatusCode(429)
			ctx.SetBodyString(`{"error":{"message":"busy","type":"rate_limit"}}`)
			return
		}
		okHandler(ctx)
	})
	a := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "a", Address: a.url, Weight: 1},
	)
	cfg.SessionAffinity.Enabled = true
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouterWith(t, f, cfg, nil, local.url)
	turn := func(sess string) (int, string) {
		resp, _ := postWith(t, r.url+"/v1/chat/completions", chatBody, map[string]string{"X-Session-Id": sess})
		return resp.StatusCode, resp.Header.Get("X-Infera-Upstream")
	}
	var onLocal []string
	for i := 0; i < 20 && len(onLocal) < 4; i++ {
		sess := fmt.Sprintf("sess-%d", i)
		if code, up := turn(sess); code == 200 && up == "" {
			onLocal = append(onLocal, sess)
		}
	}
	if len(onLocal) == 0 {
		t.Fatal("no session went to the local entry")
	}
	refuse.Store(true)
	for _, sess := range onLocal {
		served := false
		for n := 0; n < 8 && !served; n++ {
			code, up := turn(sess)
			served = code == 200 && up == "split:a"
		}
		if !served {
			t.Fatalf("%s, bound to a local worker answering 429, never reached the external entry in 8 turns", sess)
		}
		if code, up := turn(sess); code != 200 || up != "split:a" {
			t.Fatalf("%s left the entry it was split to: %d %q", sess, code, up)
		}
	}
}

// unavailableCount returns infera_split_proxy_unavailable_total for
// reason (0 when the series does not exist).
func unavailableCount(t *testing.T, reason string) int {
	t.Helper()
	var sb strings.Builder
	metrics.WritePrometheus(&sb, false)
	series := `infera_split_proxy_unavailable_total{reason="` + reason + `"} `
	for _, line := range strings.Split(sb.String(), "\n") {
		if v, ok := strings.CutPrefix(line, series); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%s%s", series, v)
			}
			return n
		}
	}
	return 0
}

// An external entry skipped because its breaker is open (within its
// cooldown) and one skipped because its breaker is half-open with the
// single probe already in flight are counted apart:
// infera_split_proxy_unavailable_total{reason="breaker_open"} and
// {reason="probe_in_flight"}.
func TestSplitUnavailableEntriesAreCountedByReason(t *testing.T) {
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	var n atomic.Int64
	bad := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if n.Add(1) > 1 {
			<-gate // the probe: held until the second request was skipped
		}
		ctx.SetStatusCode(500)
	})
	good := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitPrefix,
		config.Proxy{Local: true},
		config.Proxy{Name: "bad", Address: bad.url, ModelRules: []string{"gpt"}},
		config.Proxy{Name: "good", Address: good.url, Failover: true},
	)
	f := defaultFlags()
	f.BreakerFailureThreshold, f.BreakerCooldownS = 1, 0.3
	r := startRouterWith(t, f, cfg, nil, deadURL(t))
	open0, probe0 := unavailableCount(t, "breaker_open"), unavailableCount(t, "probe_in_flight")
	for i := 0; i < 2; i++ { // the first opens bad's breaker, the second finds it open
		if code, b := post(t, r.url+"/v1/chat/completions", gptBody); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, b)
		}
	}
	if bad.hits.Load() != 1 {
		t.Fatalf("bad saw %d requests, want 1 (its breaker open after it)", bad.hits.Load())
	}
	if got := unavailableCount(t, "breaker_open") - open0; got != 1 {
		t.Fatalf("breaker_open counted %d, want 1", got)
	}
	time.Sleep(400 * time.Millisecond) // the cooldown passes: the next request is the probe
	probeDone := make(chan int, 1)
	go func() {
		code, _ := post(t, r.url+"/v1/chat/completions", gptBody)
		probeDone <- code
	}()
	deadline := time.Now().Add(5 * time.Second)
	for bad.hits.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the probe did not reach bad")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if code, b := post(t, r.url+"/v1/chat/completions", gptBody); code != 200 {
		t.Fatalf("request behind the probe: %d %s", code, b)
	}
	open()
	if code := <-probeDone; code != 200 {
		t.Fatalf("the probe's request (failed over to good): %d", code)
	}
	if bad.hits.Load() != 2 {
		t.Fatalf("bad saw %d requests, want 2 (the probe's only)", bad.hits.Load())
	}
	if got := unavailableCount(t, "probe_in_flight") - probe0; got != 1 {
		t.Fatalf("probe_in_flight counted %d, want 1", got)
	}
	if got := unavailableCount(t, "breaker_open") - open0; got != 1 {
		t.Fatalf("breaker_open counted %d after the probe, want still 1", got)
	}
}

// A request the router converted (Anthropic Messages, OpenAI Responses)
// reaches an external entry as the JSON the router wrote, so as
// application/json whatever type the client's body was sent as, as it
// reaches a local engine (TestAConvertedRequestReachesTheEngineAsJSON).
// The external path forwarded the client's Content-Type: curl's form type
// or text/plain went with a chat completions body, which an
// OpenAI-compatible server that reads a body by its type need not take as JSON. A request
// the router did not convert keeps the client's type.
func TestAConvertedRequestReachesAnExternalUpstreamAsJSON(t *testing.T) {
	e := &chatEngine{}
	ext := startChatEngine(t, e)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 0},
		config.Proxy{Name: "ext", Address: ext.url + "/v1", Weight: 1},
	)
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	for _, ct := range []string{"application/x-www-form-urlencoded", "text/plain", ""} {
		for _, c := range []struct{ path, body string }{
			{"/v1/messages", anthropicBody},
			{"/v1/responses", `{"model":"m","input":"hello","max_output_tokens":16}`},
		} {
			resp, b := postH(t, r.url+c.path, c.body, map[string]string{"Content-Type": ct})
			if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "split:ext" {
				t.Fatalf("%s %q: %d %v %s", c.path, ct, resp.StatusCode, resp.Header, b)
			}
			got := e.last(t)
			if got.path != "/v1/chat/completions" {
				t.Fatalf("%s: the upstream got %s", c.path, got.path)
			}
			if v := got.hdr.Values("Content-Type"); len(v) != 1 || v[0] != "application/json" {
				t.Fatalf("%s, client type %q: the upstream got Content-Type %q", c.path, ct, v)
			}
		}
	}
	resp, b := postH(t, r.url+"/v1/chat/completions", gptBody, map[string]string{"Content-Type": "application/json; charset=utf-8"})
	if resp.StatusCode != 200 {
		t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
	if v := e.last(t).hdr.Values("Content-Type"); len(v) != 1 || v[0] != "application/json; charset=utf-8" {
		t.Fatalf("an unconverted request: the upstream got Content-Type %q", v)
	}
}

// A Responses follow-up (passthrough) whose previous response a local
// engine holds goes to that engine whatever the split proxy's weights or
// rules say, and fails over to no external entry: an external upstream
// cannot know the id and answers 404, as global scheduling never forwards
// such a request (TestAFollowUpPinnedToALocalEngineIsNotForwardedToAnotherRegion).
// The weights took it like any request: with local 1 and external 1,
// every other follow-up reached the external entry and got its 404.
func TestASplitResponsesFollowUpGoesToTheLocalEngineHoldingItsResponse(t *testing.T) {
	local := storingResponsesEngine(t, "l")
	ext := storingResponsesEngine(t, "x")
	proxies := []config.Proxy{
		{Local: true, Weight: 1, ModelRules: []string{"local-only"}},
		{Name: "x", Address: ext.url, Weight: 1, ModelRules: []string{"m"}, Failover: true},
	}
	for _, strategy := range []config.SplitStrategy{config.SplitWeight, config.SplitPrefix} {
		t.Run(string(strategy), func(t *testing.T) {
			// The response is made under the weight strategy (every other
			// request is local), then the strategy tested is applied: under
			// prefix, model "m" is the external entry's.
			weight := splitConfig(config.SplitWeight, proxies...)
			weight.Protocol.ResponsesPassthrough = true
			r := startRouterWith(t, nil, weight, nil, local.url)
			post := func(body string) (*http.Response, string) {
				t.Helper()
				return postWith(t, r.url+"/v1/responses", body, nil)
			}
			id := ""
			for i := 0; i < 4 && id == ""; i++ {
				resp, b := post(`{"model":"m","input":"hello"}`)
				var v struct{ ID string }
				json.Unmarshal([]byte(b), &v)
				if resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, b)
				}
				if strings.HasPrefix(v.ID, "resp_l_") {
					id = v.ID
				}
			}
			if id == "" {
				t.Fatal("no response from the local engine")
			}
			cfg := splitConfig(strategy, proxies...)
			cfg.Protocol.ResponsesPassthrough = true
			r.store.Set(cfg)
			extHits := ext.hits.Load()
			for i := 0; i < 6; i++ {
				resp, b := post(`{"model":"m","input":"more","previous_response_id":"` + id + `"}`)
				if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "" || !strings.Contains(b, `"id":"resp_l_`) {
					t.Fatalf("follow-up %d: %d upstream %q %s", i, resp.StatusCode, resp.Header.Get("X-Infera-Upstream"), b)
				}
			}
			if n := ext.hits.Load() - extHits; n != 0 {
				t.Fatalf("the external entry got %d follow-ups", n)
			}
			// A request naming no previous response is split as before.
			seen := false
			for i := 0; i < 4 && !seen; i++ {
				resp, _ := post(`{"model":"m","input":"hello"}`)
				seen = resp.Header.Get("X-Infera-Upstream") == "split:x"
			}
			if !seen {
				t.Fatal("no request reached the external entry")
			}
		})
	}
}

// A Responses follow-up (passthrough) of a response an external entry
// made goes back to that entry, whatever the weights or rules say, and
// fails over to no other entry: only that upstream knows the id. The
// gateway learned the ids of local answers alone, so the weights split
// such follow-ups, and every other one reached the local engine and got
// its 404.
func TestASplitResponsesFollowUpGoesToTheExternalEntryThatMadeItsResponse(t *testing.T) {
	local := storingResponsesEngine(t, "l")
	ext := storingResponsesEngine(t, "x")
	proxies := []config.Proxy{
		{Local: true, Weight: 1, ModelRules: []string{"m"}},
		{Name: "x", Address: ext.url, Weight: 1, ModelRules: []string{"external-only"}},
	}
	for _, strategy := range []config.SplitStrategy{config.SplitWeight, config.SplitPrefix} {
		t.Run(string(strategy), func(t *testing.T) {
			// The response is made under the weight strategy (every other
			// request is the external entry's), then the strategy tested
			// is applied: under prefix, model "m" is the local entry's.
			weight := splitConfig(config.SplitWeight, proxies...)
			weight.Protocol.ResponsesPassthrough = true
			r := startRouterWith(t, nil, weight, nil, local.url)
			post := func(body string) (*http.Response, string) {
				t.Helper()
				return postWith(t, r.url+"/v1/responses", body, nil)
			}
			id := ""
			for i := 0; i < 4 && id == ""; i++ {
				resp, b := post(`{"model":"m","input":"hello"}`)
				var v struct{ ID string }
				json.Unmarshal([]byte(b), &v)
				if resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, b)
				}
				if strings.HasPrefix(v.ID, "resp_x_") {
					id = v.ID
				}
			}
			if id == "" {
				t.Fatal("no response from the external entry")
			}
			cfg := splitConfig(strategy, proxies...)
			cfg.Protocol.ResponsesPassthrough = true
			r.store.Set(cfg)
			localHits := local.hits.Load()
			for i := 0; i < 6; i++ {
				resp, b := post(`{"model":"m","input":"more","previous_response_id":"` + id + `"}`)
				if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "split:x" || !strings.Contains(b, `"id":"resp_x_`) {
					t.Fatalf("follow-up %d: %d upstream %q %s", i, resp.StatusCode, resp.Header.Get("X-Infera-Upstream"), b)
				}
			}
			if n := local.hits.Load() - localHits; n != 0 {
				t.Fatalf("the local engine got %d follow-ups", n)
			}
			// Once the entry is gone, a follow-up is routed as any request
			// (the engine that gets it says the response is unknown).
			gone := splitConfig(strategy, proxies[0])
			gone.Protocol.ResponsesPassthrough = true
			r.store.Set(gone)
			if resp, b := post(`{"model":"m","input":"more","previous_response_id":"` + id + `"}`); resp.StatusCode != 404 || local.hits.Load() == localHits {
				t.Fatalf("follow-up after the entry left: %d %s", resp.StatusCode, b)
			}
		})
	}
}

// Under the weight strategy an external entry whose breaker is open is
// left out of the draw while another weighted entry can take the request:
// its share goes to the others by their weights, as a load balancer skips
// a server it marked down, until its cooldown lets a request probe it. The
// draw picked it anyway, and with no failover entry (the local entry
// cannot be one) its share, half of every request here, was answered 503
// no_upstreams while the local fleet was idle.
func TestAnOpenExternalEntryIsLeftOutOfTheWeightedDraw(t *testing.T) {
	local := startUpstream(t, okHandler)
	bad := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(500) })
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "bad", Address: bad.url, Weight: 1},
	)
	r := startRouterWith(t, nil, cfg, nil, local.url)
	u := r.srv.ext.splitTable(&r.store.Load().SplitProxy).ups[1]
	for i := 0; i < 12 && u.w.Breaker.State() != fleet.BreakerOpen; i++ {
		post(t, r.url+"/v1/chat/completions", chatBody)
	}
	if u.w.Breaker.State() != fleet.BreakerOpen || bad.hits.Load() != 3 {
		t.Fatalf("bad breaker %d after %d requests", u.w.Breaker.State(), bad.hits.Load())
	}
	served := local.hits.Load()
	for i := 0; i < 10; i++ {
		if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
			t.Fatalf("request %d with the entry open: %d %s", i, code, b)
		}
	}
	if n := local.hits.Load() - served; n != 10 || bad.hits.Load() != 3 {
		t.Fatalf("local served %d of 10, bad got %d requests in all", n, bad.hits.Load())
	}
}
