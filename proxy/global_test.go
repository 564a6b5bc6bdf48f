package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	upstreams "github.com/infera/infera/upstream"
	"github.com/valyala/fasthttp"
)

func globalConfig(members ...config.Member) *config.Config {
	cfg := config.Default()
	cfg.Debug.DecisionHeader = true
	cfg.GlobalScheduling = config.GlobalScheduling{Enabled: true, Members: members,
		PollIntervalMS: 20, PollTimeoutMS: 500, StaleAfterMS: 2000, MinFree: 1}
	return cfg
}

func startPoller(t *testing.T, g *config.GlobalScheduling) *upstreams.Poller {
	t.Helper()
	p := upstreams.NewPoller()
	t.Cleanup(p.Close)
	if err := p.Update(g); err != nil {
		t.Fatal(err)
	}
	return p
}

func metricValue(t *testing.T, url, series string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, series+" ") {
			return strings.TrimPrefix(line, series+" ")
		}
	}
	return ""
}

// A gateway with no routable worker for the model forwards the request to
// the member reporting free capacity for it, with the member's key and the
// hop header; the member, seeing the hop header, never forwards it back.
func TestGlobalForwardsWhenNoLocalWorkerAndNeverLoops(t *testing.T) {
	var gotAuth, gotHop string
	engB := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		gotAuth = string(ctx.Request.Header.Peek("Authorization"))
		gotHop = string(ctx.Request.Header.Peek(upstreams.HopHeader))
		okHandler(ctx)
	})
	// B serves "m"; A serves nothing. Each lists the other.
	fb := defaultFlags()
	fb.APIKey = "key-b"
	pb := upstreams.NewPoller() // B's members are set once A exists
	t.Cleanup(pb.Close)
	b := startRouterWith(t, fb, config.Default(), func(o *Options) { o.Poller = pb }, engB.url)
	fa := defaultFlags()
	fa.APIKey = "key-a"
	cfgA := globalConfig(config.Member{Name: "b", URL: b.url, APIKey: config.NewSecret("key-b")})
	pa := startPoller(t, &cfgA.GlobalScheduling)
	a := startRouterWith(t, fa, cfgA, func(o *Options) { o.Poller = pa }, deadURL(t))
	// A serves only "a-only", B only "m".
	engA := startUpstream(t, okHandler)
	a.fl.Remove("w0")
	if err := a.fl.Upsert(fleet.Record{ID: "wa", URL: engA.url, Models: []string{"a-only"}}); err != nil {
		t.Fatal(err)
	}
	// B lists A back (its poller sees A's report: no models).
	cfgB2 := globalConfig(config.Member{Name: "a", URL: a.url, APIKey: config.NewSecret("key-a")})
	if err := pb.Update(&cfgB2.GlobalScheduling); err != nil {
		t.Fatal(err)
	}
	b.store.Set(cfgB2)
	waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "A's report of B")
	waitFor(t, func() bool { _, _, ok := pb.Members()[0].Report(); return ok }, "B's report of A")

	resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer key-a"})
	if resp.StatusCode != 200 || body != okJSON || resp.Header.Get("X-Infera-Upstream") != "global:b" {
		t.Fatalf("forward: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	if engB.hits.Load() != 1 || gotHop != "1" || gotAuth != "" {
		t.Fatalf("B's engine: hits %d, hop %q, auth %q", engB.hits.Load(), gotHop, gotAuth)
	}
	if v := metricValue(t, a.url, `infera_global_forwarded_total{member="b"}`); v != "1" {
		t.Fatalf("A forwarded %q", v)
	}
	// A request carrying the hop header (whatever its value) is not
	// forwarded again: B has no worker for "a-only" and answers 404 itself
	// instead of sending it to A, which reports serving it.
	aOnly := strings.Replace(chatBody, `"m"`, `"a-only"`, 1)
	resp, body = postWith(t, b.url+"/v1/chat/completions", aOnly,
		map[string]string{"Authorization": "Bearer key-b", upstreams.HopHeader: "0"})
	if resp.StatusCode != 404 || engA.hits.Load() != 0 {
		t.Fatalf("hop request: %d %s (A's engine %d)", resp.StatusCode, body, engA.hits.Load())
	}
	if v := metricValue(t, b.url, `infera_global_forwarded_total{member="a"}`); v != "0" {
		t.Fatalf("B forwarded %q", v)
	}
	// Without the hop header B forwards it to A.
	resp, body = postWith(t, b.url+"/v1/chat/completions", aOnly, map[string]string{"Authorization": "Bearer key-b"})
	if resp.StatusCode != 200 || engA.hits.Load() != 1 || resp.Header.Get("X-Infera-Upstream") != "global:a" {
		t.Fatalf("B to A: %d %s (A's engine %d)", resp.StatusCode, body, engA.hits.Load())
	}
	// No member serves the model: answered as without global scheduling.
	resp, body = postWith(t, a.url+"/v1/chat/completions", strings.Replace(chatBody, `"m"`, `"x"`, 1), map[string]string{"Authorization": "Bearer key-a"})
	if resp.StatusCode != 404 {
		t.Fatalf("unserved model: %d %s", resp.StatusCode, body)
	}
	checkOpenAIError(t, body)
}

// When every local candidate is at its concurrency limit the request goes
// to the member with the most free capacity.
func TestGlobalForwardsWhenSaturatedToTheMostFreeMember(t *testing.T) {
	su := &sseUpstream{n: 2, gate: make(chan struct{})}
	engA := startUpstream(t, su.handler)
	eng1, eng2 := startUpstream(t, okHandler), startUpstream(t, okHandler)
	limit := func(cfg *config.Config, n int) *config.Config {
		cfg.RateLimit.OverallConcurrency = n
		return cfg
	}
	m1 := startRouterWith(t, nil, limit(config.Default(), 2), nil, eng1.url)
	m2 := startRouterWith(t, nil, limit(config.Default(), 5), nil, eng2.url)
	cfgA := limit(globalConfig(config.Member{Name: "m1", URL: m1.url}, config.Member{Name: "m2", URL: m2.url}), 1)
	pa := startPoller(t, &cfgA.GlobalScheduling)
	a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa }, engA.url)
	waitFor(t, func() bool {
		_, _, ok1 := pa.Members()[0].Report()
		_, _, ok2 := pa.Members()[1].Report()
		return ok1 && ok2
	}, "member reports")
	// Occupy A's only seat with a stream held open.
	held, err := http.Post(a.url+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Body.Close()
	resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "global:m2" || eng2.hits.Load() != 1 || eng1.hits.Load() != 0 {
		t.Fatalf("saturated: %d %s %v (m1 %d, m2 %d)", resp.StatusCode, body, resp.Header, eng1.hits.Load(), eng2.hits.Load())
	}
	close(su.gate)
	io.ReadAll(held.Body)
	waitFor(t, func() bool { return a.fl.View().All[0].Load.Requests.Load() == 0 }, "A's seat free")
	resp, _ = postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Worker") != "w0" {
		t.Fatalf("not saturated any more: %d %v", resp.StatusCode, resp.Header)
	}
}

// The capacity endpoint: authenticated like inference, free capacity per
// rate limiting scope, served models and routing aliases.
func TestCapacityEndpoint(t *testing.T) {
	f := defaultFlags()
	f.APIKey = "k"
	cfg := config.Default()
	cfg.RateLimit.OverallConcurrency = 4
	cfg.ModelRouting.Enabled = true
	cfg.ModelRouting.DefaultModel = "m"
	cfg.ModelRouting.Mappings = []config.ModelMapping{{Pattern: "gpt-4*", Services: []string{"m"}}}
	up := startUpstream(t, okHandler)
	r := startRouterWith(t, f, cfg, nil, up.url, up.url)
	get := func(key string) (int, upstreams.Capacity) {
		req, _ := http.NewRequest("GET", r.url+upstreams.CapacityPath, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return resp.StatusCode, upstreams.Capacity{}
		}
		c, err := upstreams.ParseCapacity(b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		return 200, c
	}
	if code, _ := get(""); code != 401 {
		t.Fatalf("no key: %d", code)
	}
	if code, _ := get("wrong"); code != 401 {
		t.Fatalf("wrong key: %d", code)
	}
	w := r.fl.View().All[0]
	w.Acquire(0, 0, 0)
	defer w.Release(0, 0, 0, true)
	code, c := get("k")
	if code != 200 || c.Free != 7 || c.Inflight != 1 || c.Workers != 2 {
		t.Fatalf("capacity %d %+v", code, c)
	}
	want := map[string]int{"m": 7, "gpt-4*": 7, "*": 7}
	if len(c.Models) != len(want) {
		t.Fatalf("models %+v", c.Models)
	}
	for _, m := range c.Models {
		if want[m.Name] != m.Free {
			t.Fatalf("models %+v", c.Models)
		}
	}
	b, _ := json.Marshal(c)
	if !strings.Contains(string(b), `"queued":0`) {
		t.Fatalf("%s", b)
	}
}

func TestFreeOfByScope(t *testing.T) {
	fl := fleet.NewFleet(fleet.BreakerConfig{Threshold: 1})
	defer fl.Close()
	fl.Sync([]fleet.Record{
		{ID: "a1", URL: "http://127.0.0.1:1", Models: []string{"m"}, Service: "a"},
		{ID: "a2", URL: "http://127.0.0.1:2", Models: []string{"m"}, Service: "a"},
		{ID: "b1", URL: "http://127.0.0.1:3", Models: []string{"m"}, Service: "b"},
		{ID: "d1", URL: "http://127.0.0.1:4", Models: []string{"m"}, Service: "b", Role: "decode"},
	})
	v := fl.View()
	busy := func(id string, n int) {
		w := fl.Get(id)
		for i := 0; i < n; i++ {
			w.Acquire(0, 0, 0)
		}
	}
	busy("a1", 3) // 3 in flight, all before their first token
	busy("b1", 1)
	busy("d1", 9)
	f := func(rl config.RateLimit, want int) {
		t.Helper()
		if got := freeOf(&rl, v, v.Routable, 0); got != want {
			t.Fatalf("%+v: free %d, want %d", rl, got, want)
		}
	}
	f(config.RateLimit{Scope: config.ScopeInstance, OverallConcurrency: 2}, 0+2+1)
	f(config.RateLimit{Scope: config.ScopeService, OverallConcurrency: 5}, (5-3)+(5-1))
	f(config.RateLimit{Scope: config.ScopeGateway, OverallConcurrency: 10}, 10-4)
	f(config.RateLimit{Scope: config.ScopeInstance, PrefillConcurrency: 4}, 1+4+3)
	f(config.RateLimit{Scope: config.ScopeInstance}, 3*UnlimitedWorkerSlots-4)
	fl.Get("a1").FirstToken(0) // one of a1's requests is decoding now
	f(config.RateLimit{Scope: config.ScopeInstance, PrefillConcurrency: 4}, 2+4+3)
	fl.Get("b1").Fault(1, false) // threshold 1: b1's breaker opens
	f(config.RateLimit{Scope: config.ScopeInstance, OverallConcurrency: 4}, 1+4)
}

// With overlimit "queue", a request that finds every local seat taken is
// forwarded to a member with room at once; it does not wait in the local
// queue (up to queue_timeout_ms, 30 s here) while another region is idle.
func TestGlobalForwardsAQueueableRequestInsteadOfQueueing(t *testing.T) {
	su := &sseUpstream{n: 2, gate: make(chan struct{})}
	defer close(su.gate) // before the routers' shutdown (a cleanup) waits for the held stream
	engA := startUpstream(t, su.handler)
	engM := startUpstream(t, okHandler)
	m := startRouterWith(t, nil, nil, nil, engM.url)
	cfgA := globalConfig(config.Member{Name: "m", URL: m.url})
	cfgA.RateLimit.Scope, cfgA.RateLimit.Overlimit = "gateway", "queue"
	cfgA.RateLimit.OverallConcurrency, cfgA.RateLimit.QueueSize, cfgA.RateLimit.QueueTimeoutMS = 1, 10, 30000
	g := newGovernor(t, cfgA)
	pa := startPoller(t, &cfgA.GlobalScheduling)
	a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa; o.Governor = g }, engA.url)
	waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "the member's report")
	held, err := http.Post(a.url+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Body.Close()
	start := time.Now()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Post(a.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatalf("no answer after %v: it waits in the local queue", time.Since(start))
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "global:m" || engM.hits.Load() != 1 {
		t.Fatalf("%d %s %v (member's engine %d) after %v", resp.StatusCode, body, resp.Header, engM.hits.Load(), time.Since(start))
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("forwarded after %v: it waited in the local queue first", d)
	}
}

// A default model is advertised as "*" with the workers model routing
// serves it by, whatever names it: the served model in another notation, an
// abbreviation (fuzzy match) or an alias (a model mapping). Only a default
// model that was a served model's exact name or a service was advertised:
// a member whose default model is, say, "mistral" for mistral-7b answered
// any name itself but reported none, so no region forwarded it one.
func TestTheCapacityReportAdvertisesADefaultModelAsRoutingServesIt(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouterWith(t, nil, nil, nil, up.url, up.url)
	for _, dm := range []string{"m", "M", "alias", "m-*"} {
		cfg := config.Default()
		cfg.ModelRouting.Enabled = true
		cfg.ModelRouting.DefaultModel = dm
		cfg.ModelRouting.Mappings = []config.ModelMapping{{Pattern: "alias", Services: []string{"m"}}}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		r.store.Set(cfg)
		resp, err := http.Get(r.url + upstreams.CapacityPath)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		c, err := upstreams.ParseCapacity(b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		free := -1
		for _, m := range c.Models {
			if m.Name == "*" {
				free = m.Free
			}
		}
		want := 2 * UnlimitedWorkerSlots
		if dm == "m-*" {
			want = -1 // no served model matches it: nothing serves unmatched names
		}
		if free != want {
			t.Fatalf("default model %q: \"*\" free %d, want %d (%s)", dm, free, want, b)
		}
	}
}

// A canary rule's model written with surrounding spaces matches the name
// without them (the rule's pattern is trimmed), and that name is the one
// GET /v1/models and the capacity report advertise. They listed " alias ",
// spaces included: a client asking for the listed name got 404, with
// " alias " as the close name to try, and no region forwarded "alias".
func TestACanaryNameWithSurroundingSpacesIsListedAsItMatches(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouterWith(t, nil, nil, nil, up.url)
	cfg := config.Default()
	cfg.Canary.Enabled = true
	cfg.Canary.Rules = []config.CanaryRule{{Model: " alias ", Targets: []config.CanaryTarget{{Service: "m", Weight: 1}}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r.store.Set(cfg)
	for _, path := range []string{"/v1/models", upstreams.CapacityPath} {
		resp, err := http.Get(r.url + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `"alias"`) || strings.Contains(string(b), `" alias "`) {
			t.Fatalf("%s lists %s, want \"alias\"", path, b)
		}
	}
	if resp, body := postWith(t, r.url+"/v1/chat/completions", `{"model":"alias","messages":[{"role":"user","content":"hi"}]}`, nil); resp.StatusCode != 200 {
		t.Fatalf("alias: %d %s", resp.StatusCode, body)
	}
}

// A model whose every local worker has its breaker open (its engines are
// down) is forwarded to a member that serves it, with or without a
// concurrency limit: the capacity report already counts those workers for
// nothing, but the request was dispatched to a dead engine and answered
// 503 while the member had room.
func TestGlobalForwardsWhenEveryLocalWorkerForTheModelHasItsBreakerOpen(t *testing.T) {
	engB := startUpstream(t, okHandler)
	fb := defaultFlags()
	fb.APIKey = "key-b"
	b := startRouterWith(t, fb, config.Default(), nil, engB.url)
	for _, limited := range []bool{false, true} {
		cfgA := globalConfig(config.Member{Name: "b", URL: b.url, APIKey: config.NewSecret("key-b")})
		if limited { // request rate limiting's seats answer Saturated
			cfgA.RateLimit.OverallConcurrency = 4
		}
		pa := startPoller(t, &cfgA.GlobalScheduling)
		g := newGovernor(t, cfgA)
		a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller, o.Governor = pa, g }, deadURL(t))
		waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "A's report of B")
		w := a.fl.View().ByModel["m"][0]
		now := time.Now().UnixNano()
		for i := 0; i < a.flags.BreakerFailureThreshold; i++ {
			w.Breaker.Failure(now, false)
		}
		if w.Breaker.Available(time.Now().UnixNano()) {
			t.Fatal("breaker did not open")
		}
		resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
		if resp.StatusCode != 200 || body != okJSON || resp.Header.Get("X-Infera-Upstream") != "global:b" {
			t.Fatalf("rate limit %v: %d %s %v", limited, resp.StatusCode, body, resp.Header)
		}
	}
}

// A member whose breaker is open is not forwarded to: nothing is sent, so
// neither infera_global_forwarded_total nor forward_failed_total counts it
// (both counted every request that picked it: 10 "forwarded" requests the
// member never received), and a request no other member takes counts in
// no_member_total.
func TestAMemberWhoseBreakerIsOpenCountsNoForward(t *testing.T) {
	engB := startUpstream(t, okHandler)
	fb := defaultFlags()
	fb.APIKey = "key-b"
	b := startRouterWith(t, fb, config.Default(), nil, engB.url)
	cfgA := globalConfig(config.Member{Name: "brk", URL: b.url, APIKey: config.NewSecret("key-b")})
	pa := startPoller(t, &cfgA.GlobalScheduling)
	a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa }, deadURL(t))
	a.fl.Remove("w0") // A serves nothing: every request for "m" wants a member
	waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "A's report of B")
	u := a.srv.ext.memberTable(&cfgA.GlobalScheduling).member("brk")
	now := time.Now().UnixNano()
	for i := 0; i < a.flags.BreakerFailureThreshold; i++ {
		u.w.Breaker.Failure(now, false)
	}
	failed0, none0 := mGlobalFailed.Get(), mGlobalNoMember.Get()
	for i := 0; i < 3; i++ {
		waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "A's report of B")
		resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
		if resp.StatusCode == 200 {
			t.Fatalf("answered through a member whose breaker is open: %s", body)
		}
	}
	if n := engB.hits.Load(); n != 0 {
		t.Fatalf("B's engine got %d requests", n)
	}
	if v := metricValue(t, a.url, `infera_global_forwarded_total{member="brk"}`); v != "0" {
		t.Fatalf("infera_global_forwarded_total = %s, want 0", v)
	}
	if d := mGlobalFailed.Get() - failed0; d != 0 {
		t.Fatalf("infera_global_forward_failed_total counted %d", d)
	}
	if d := mGlobalNoMember.Get() - none0; d != 3 {
		t.Fatalf("infera_global_no_member_total counted %d of 3 requests no member could take", d)
	}
}

// A request whose local attempts all fail before the first byte (the
// engine refuses connections, or answers 503) is forwarded to a member
// that serves the model, as docs/upstreams.md says ("every candidate was
// already tried"): the local failure was answered 503 until the worker's
// breaker opened. With no member to take it, the local engine's own
// answer is still what the client gets.
func TestGlobalTakesARequestEveryLocalWorkerFailed(t *testing.T) {
	engB := startUpstream(t, okHandler)
	fb := defaultFlags()
	fb.APIKey = "key-b"
	b := startRouterWith(t, fb, config.Default(), nil, engB.url)
	busy := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(503)
		ctx.Response.Header.Set("Retry-After", "7")
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"engine busy","type":"server_error"}}`)
	})
	for _, local := range []string{deadURL(t), busy.url} {
		cfgA := globalConfig(config.Member{Name: "b", URL: b.url, APIKey: config.NewSecret("key-b")})
		pa := startPoller(t, &cfgA.GlobalScheduling)
		a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa }, local)
		waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "A's report of B")
		resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
		if resp.StatusCode != 200 || body != okJSON || resp.Header.Get("X-Infera-Upstream") != "global:b" {
			t.Fatalf("local %s: %d %s %v", local, resp.StatusCode, body, resp.Header)
		}
		if w := a.fl.View().ByModel["m"][0]; !w.Breaker.Available(time.Now().UnixNano()) {
			t.Fatalf("local %s: one failure opened the breaker: the test no longer checks a closed one", local)
		}
		noLoadLeft(t, a.fl)
	}
	// No member: the local engine's 503 and its Retry-After are relayed.
	cfgA := globalConfig(config.Member{Name: "b", URL: b.url, APIKey: config.NewSecret("key-b")})
	pa := startPoller(t, &cfgA.GlobalScheduling)
	a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa }, busy.url)
	resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, map[string]string{upstreams.HopHeader: "1"})
	if resp.StatusCode != 503 || !strings.Contains(body, "engine busy") || resp.Header.Get("Retry-After") != "7" {
		t.Fatalf("a request no member may take: %d %s %v", resp.StatusCode, body, resp.Header)
	}
}

// A model no local worker serves whose members (serving it) have no room
// now is busy, not unknown: 503 global_capacity_exhausted with a
// Retry-After, where it was 404 model_not_found (a burst of 40 requests
// for a model served in one other region with 2 free got 38 404s).
func TestAModelServedOnlyByFullMembersIsBusyNotUnknown(t *testing.T) {
	engB := startUpstream(t, okHandler)
	fb := defaultFlags()
	fb.APIKey = "key-b"
	b := startRouterWith(t, fb, config.Default(), nil, engB.url)
	cfgA := globalConfig(config.Member{Name: "b", URL: b.url, APIKey: config.NewSecret("key-b")})
	cfgA.GlobalScheduling.MinFree = 1 << 20 // no report ever has that much room
	pa := startPoller(t, &cfgA.GlobalScheduling)
	a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa }, deadURL(t))
	engA := startUpstream(t, okHandler)
	a.fl.Remove("w0")
	if err := a.fl.Upsert(fleet.Record{ID: "wa", URL: engA.url, Models: []string{"a-only"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "A's report of B")
	resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != 503 || !strings.Contains(body, "global_capacity_exhausted") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a model only full members serve: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	checkOpenAIError(t, body)
	// A model nobody serves is still unknown.
	resp, body = postWith(t, a.url+"/v1/chat/completions", strings.Replace(chatBody, `"m"`, `"x"`, 1), nil)
	if resp.StatusCode != 404 {
		t.Fatalf("unserved model: %d %s", resp.StatusCode, body)
	}
	if engB.hits.Load() != 0 {
		t.Fatalf("B's engine got %d requests", engB.hits.Load())
	}
}

// infera_global_saturated_total counts requests, one per request that
// found the local fleet saturated: a request that no member could take and
// that request rate limiting then refused its seat counted twice (once
// before the scheduler, once at the refusal), a forwarded one once.
func TestASaturatedRequestCountsOnceInTheSaturatedMetric(t *testing.T) {
	su := &sseUpstream{n: 2, gate: make(chan struct{})}
	defer close(su.gate) // before the routers' shutdown (a cleanup) waits for the held stream
	engA := startUpstream(t, su.handler)
	engM := startUpstream(t, okHandler)
	m := startRouterWith(t, nil, nil, nil, engM.url)
	cfgA := globalConfig(config.Member{Name: "m", URL: m.url})
	cfgA.RateLimit.OverallConcurrency = 1
	g := newGovernor(t, cfgA)
	pa := startPoller(t, &cfgA.GlobalScheduling)
	a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa; o.Governor = g }, engA.url)
	waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "the member's report")
	held, err := http.Post(a.url+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Body.Close()
	waitFor(t, func() bool { return a.fl.View().All[0].Load.Requests.Load() == 1 }, "A's seat taken")

	// Forwarded: one count.
	before := mGlobalSaturated.Get()
	resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "global:m" {
		t.Fatalf("forwarded: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	if d := mGlobalSaturated.Get() - before; d != 1 {
		t.Fatalf("a forwarded request counted %d times as saturated", d)
	}

	// No member qualifies: the seat is refused (429), still one count.
	g2 := cfgA.GlobalScheduling
	g2.MinFree = 1 << 20 // no report ever has that much room
	if err := pa.Update(&g2); err != nil {
		t.Fatal(err)
	}
	before = mGlobalSaturated.Get()
	resp, body = postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != 429 {
		t.Fatalf("no member with room: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	if d := mGlobalSaturated.Get() - before; d != 1 {
		t.Fatalf("a request refused its seat after no member qualified counted %d times as saturated", d)
	}
}

// getCapacity fetches a router's capacity report (no key).
func getCapacity(t *testing.T, url string) upstreams.Capacity {
	t.Helper()
	resp, err := http.Get(url + upstreams.CapacityPath)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	c, err := upstreams.ParseCapacity(b)
	if err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return c
}

// The names smart model selection takes (match_models, as GET /v1/models
// lists "auto") are in the capacity report, with the least room among
// the tiers' models served here: the tier is known only once the
// classifier answered. They were missing, so a region without smart model
// selection answered 404 to a client asking for "auto" that a member
// region with it would have served. A tier served neither here nor by the
// split proxy leaves them out: a request forwarded here and classified
// into it could go nowhere.
func TestTheCapacityReportAdvertisesTheNamesSmartSelectionTakes(t *testing.T) {
	cls := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"tier":"L2"}`) })
	var gotModel atomic.Value
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		var b struct{ Model string }
		json.Unmarshal(ctx.PostBody(), &b)
		gotModel.Store(b.Model)
		okHandler(ctx)
	})
	smart := func(match ...string) *config.Config {
		cfg := config.Default()
		cfg.Debug.DecisionHeader = true
		cfg.RateLimit.OverallConcurrency = 3
		cfg.SmartModelSelection = config.SmartModelSelection{Enabled: true, ClassifierURL: cls.url + "/v1/classify",
			TimeoutMS: 10000, FallbackTier: "L1", MatchModels: match,
			Tiers: config.TierModels{L1: "small", L2: "mid", L3: "mid"}, MaxTextBytes: 8192}
		return cfg
	}
	a := startRouterWith(t, nil, smart("auto", "smart-*"), nil, up.url)
	a.fl.Remove("w0")
	for i, m := range []string{"small", "mid", "mid"} {
		if err := a.fl.Upsert(fleet.Record{ID: fmt.Sprintf("a%d", i), URL: up.url, Models: []string{m}}); err != nil {
			t.Fatal(err)
		}
	}
	free := func(c upstreams.Capacity) map[string]int {
		out := map[string]int{}
		for _, m := range c.Models {
			out[m.Name] = m.Free
		}
		return out
	}
	want := map[string]int{"small": 3, "mid": 6, "auto": 3, "smart-*": 3}
	if got := free(getCapacity(t, a.url)); !maps.Equal(got, want) {
		t.Fatalf("capacity models %v, want %v", got, want)
	}
	// Every name is classified: any name is taken.
	a.store.Set(smart())
	want = map[string]int{"small": 3, "mid": 6, "*": 3}
	if got := free(getCapacity(t, a.url)); !maps.Equal(got, want) {
		t.Fatalf("empty match_models: capacity models %v, want %v", got, want)
	}
	// A tier's model is served neither here nor by the split proxy:
	// nothing is advertised.
	cfg := smart("auto")
	cfg.SmartModelSelection.Tiers.L3 = "elsewhere"
	a.store.Set(cfg)
	want = map[string]int{"small": 3, "mid": 6}
	if got := free(getCapacity(t, a.url)); !maps.Equal(got, want) {
		t.Fatalf("a tier served nowhere: capacity models %v, want %v", got, want)
	}
	// The split proxy sends it to an external upstream: the local tiers'
	// room is advertised.
	cfg = smart("auto")
	cfg.SmartModelSelection.Tiers.L3 = "elsewhere"
	cfg.SplitProxy = config.SplitProxy{Enabled: true, Strategy: config.SplitPrefix, Proxies: []config.Proxy{
		{Local: true, ModelRules: []string{"small", "mid"}},
		{Name: "ext", Address: up.url, ModelRules: []string{"elsewhere"}},
	}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a.store.Set(cfg)
	want = map[string]int{"small": 3, "mid": 6, "auto": 3}
	if got := free(getCapacity(t, a.url)); !maps.Equal(got, want) {
		t.Fatalf("a tier served by the split proxy: capacity models %v, want %v", got, want)
	}
	a.store.Set(smart("auto"))

	// A region without smart model selection forwards "auto" to A, which
	// classifies it and serves the tier's model.
	cfgB := globalConfig(config.Member{Name: "a", URL: a.url})
	pb := startPoller(t, &cfgB.GlobalScheduling)
	b := startRouterWith(t, nil, cfgB, func(o *Options) { o.Poller = pb }, up.url)
	waitFor(t, func() bool {
		c, _, ok := pb.Members()[0].Report()
		return ok && c.FreeFor([]byte("auto")) > 0
	}, "B's report of A listing auto")
	resp, body := postWith(t, b.url+"/v1/chat/completions", `{"model":"auto","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "global:a" || gotModel.Load() != "mid" {
		t.Fatalf("auto asked of B: %d %s %v (the engine got model %v)", resp.StatusCode, body, resp.Header, gotModel.Load())
	}
}

// A model only a member region serves is not unknown because that member
// failed a forward a moment ago: until its next report it takes no
// forward, and a request for the model is answered 503 (busy, retry), not
// 404 model_not_found, which SDKs do not retry. The failed forward
// dropped the member's report, so every request until the next poll (a
// second by default) was told the model does not exist.
func TestAModelServedOnlyByAMemberThatJustFailedIsBusyNotUnknown(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	engB := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if fail.Load() {
			ctx.SetStatusCode(503)
			ctx.SetBodyString(`{"error":{"message":"engine restarting","type":"server_error"}}`)
			return
		}
		okHandler(ctx)
	})
	b := startRouterWith(t, nil, config.Default(), nil, engB.url)
	cfgA := globalConfig(config.Member{Name: "b", URL: b.url})
	cfgA.GlobalScheduling.PollIntervalMS, cfgA.GlobalScheduling.StaleAfterMS = 60000, 120000 // one poll in this test
	pa := startPoller(t, &cfgA.GlobalScheduling)
	a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa }, deadURL(t))
	engA := startUpstream(t, okHandler)
	a.fl.Remove("w0")
	if err := a.fl.Upsert(fleet.Record{ID: "wa", URL: engA.url, Models: []string{"a-only"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "A's report of B")
	resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != 503 || resp.Header.Get("X-Infera-Upstream") != "global:b" {
		t.Fatalf("B's engine failing: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	fail.Store(false)
	resp, body = postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != 503 || !strings.Contains(body, "global_capacity_exhausted") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("the model's only member failed a moment ago: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	checkOpenAIError(t, body)
	// A model nobody serves is still unknown.
	resp, body = postWith(t, a.url+"/v1/chat/completions", strings.Replace(chatBody, `"m"`, `"x"`, 1), nil)
	if resp.StatusCode != 404 {
		t.Fatalf("unserved model: %d %s", resp.StatusCode, body)
	}
	if n := engB.hits.Load(); n != 1 {
		t.Fatalf("B's engine got %d requests, want the one that failed", n)
	}
}

// A model only a member region serves is busy, not unknown, while that
// region is briefly down (a restart): its last report, until it is
// stale_after_ms old, still says which models it serves, though it is
// chosen for none. A failed poll dropped the whole report, and every
// request for the model got 404 model_not_found, which SDKs do not retry,
// from the first failed poll on. Once the report is stale the model is
// unknown again.
func TestAModelServedOnlyByAMemberBrieflyDownIsBusyNotUnknown(t *testing.T) {
	engB := startUpstream(t, okHandler)
	b := startRouterWith(t, nil, config.Default(), nil, engB.url)
	cfgA := globalConfig(config.Member{Name: "b", URL: b.url})
	cfgA.GlobalScheduling.PollIntervalMS, cfgA.GlobalScheduling.StaleAfterMS = 20, 1500
	pa := startPoller(t, &cfgA.GlobalScheduling)
	a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa }, deadURL(t))
	engA := startUpstream(t, okHandler)
	a.fl.Remove("w0")
	if err := a.fl.Upsert(fleet.Record{ID: "wa", URL: engA.url, Models: []string{"a-only"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "A's report of B")
	if resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, nil); resp.StatusCode != 200 {
		t.Fatalf("B up: %d %s", resp.StatusCode, body)
	}
	b.srv.Shutdown()
	down := time.Now()
	failed := metricValue(t, a.url, `infera_global_capacity_polls_total{member="b",result="error"}`)
	waitFor(t, func() bool {
		return metricValue(t, a.url, `infera_global_capacity_polls_total{member="b",result="error"}`) != failed
	}, "a failed poll of B")
	resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
	if time.Since(down) < 1200*time.Millisecond && (resp.StatusCode != 503 || !strings.Contains(body, "global_capacity_exhausted") || resp.Header.Get("Retry-After") == "") {
		t.Fatalf("B down for %v: %d %s %v", time.Since(down), resp.StatusCode, body, resp.Header)
	}
	time.Sleep(time.Until(down.Add(1700 * time.Millisecond)))
	if resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, nil); resp.StatusCode != 404 {
		t.Fatalf("B's last report stale: %d %s", resp.StatusCode, body)
	}
}
