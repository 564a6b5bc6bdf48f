package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/testsrv"
	"github.com/infera/infera/kv"
	"github.com/infera/infera/kvroute"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
	"github.com/infera/infera/tokenizer"
	"github.com/valyala/fasthttp"
)

// govConfig parses a config document the way the router does.
func govConfig(t testing.TB, js string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(js))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, js)
	}
	return c
}

// newGovernor returns an in-process governor serving cfg.
func newGovernor(t testing.TB, cfg *config.Config) *govern.Governor {
	return newGovernorAt(t, "", cfg)
}

// newGovernorAt returns a governor serving cfg with its counters at state
// ("" for in-process, or a redis:// URL).
func newGovernorAt(t testing.TB, state string, cfg *config.Config) *govern.Governor {
	t.Helper()
	g, err := govern.New(govern.Options{State: state})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	return g
}

func mintKey(t testing.TB) (key, hash string) {
	t.Helper()
	k, h, err := govern.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return k, h
}

// govRouter starts a router with a governor over cfg in front of urls.
func govRouter(t testing.TB, f *config.Serve, js string, urls ...string) (*testRouter, *govern.Governor) {
	t.Helper()
	cfg := govConfig(t, js)
	g := newGovernor(t, cfg)
	return startRouterGov(t, f, cfg, g, urls...), g
}

// apiResp is one answer: status, Retry-After and the OpenAI error code.
type apiResp struct {
	status int
	retry  string
	code   string
	body   string
}

// apiCall posts a chat body with Authorization: Bearer key (none when key
// is "").
func apiCall(t testing.TB, url, key, body string) apiResp {
	t.Helper()
	return postPath(t, url, "/v1/chat/completions", key, body)
}

// postPath posts body to url+path, as apiCall does.
func postPath(t testing.TB, url, path, key, body string) apiResp {
	t.Helper()
	req, _ := http.NewRequest("POST", url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	return do(t, req)
}

func do(t testing.TB, req *http.Request) apiResp {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	r := apiResp{status: resp.StatusCode, retry: resp.Header.Get("Retry-After"), body: b.String()}
	if resp.StatusCode >= 400 {
		var e struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    string  `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(r.body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Fatalf("status %d: not an OpenAI error: %s", resp.StatusCode, r.body)
		}
		r.code = e.Error.Code
	}
	return r
}

func want(t testing.TB, r apiResp, status int, code string) {
	t.Helper()
	if r.status != status || r.code != code {
		t.Fatalf("got %d %q, want %d %q: %s", r.status, r.code, status, code, r.body)
	}
}

func TestUserKeysIdentifyUsersAndTheGlobalKeyIsNotLimited(t *testing.T) {
	up := startUpstream(t, okHandler)
	ka, ha := mintKey(t)
	kb, hb := mintKey(t)
	kx, _ := mintKey(t)
	f := defaultFlags()
	f.APIKey = "global-secret"
	r, _ := govRouter(t, f, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "one-a-minute", "default": true, "rate": {"enabled": true, "rpm": 1}}]},
		"users": [{"name": "alice", "keys": [%q]}, {"name": "bob", "keys": [%q], "enabled": false}]}`, ha, hb), up.url)

	want(t, apiCall(t, r.url, ka, chatBody), 200, "")
	rej := apiCall(t, r.url, ka, chatBody)
	want(t, rej, 429, "rate_limit_rpm")
	if n, err := strconv.Atoi(rej.retry); err != nil || n < 1 || n > 60 {
		t.Fatalf("Retry-After %q, want the seconds until the bucket holds one request", rej.retry)
	}
	// x-api-key identifies the same user (Anthropic clients send it).
	req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("x-api-key", ka)
	want(t, do(t, req), 429, "rate_limit_rpm")
	// The global key: no user limits.
	for i := 0; i < 3; i++ {
		want(t, apiCall(t, r.url, "global-secret", chatBody), 200, "")
	}
	want(t, apiCall(t, r.url, kb, chatBody), 403, "user_disabled")
	want(t, apiCall(t, r.url, kx, chatBody), 401, "invalid_api_key")                 // well-formed, unknown
	want(t, apiCall(t, r.url, ka[:len(ka)-1]+"x", chatBody), 401, "invalid_api_key") // known id, wrong secret
	want(t, apiCall(t, r.url, "not-a-key", chatBody), 401, "invalid_api_key")        // malformed
	want(t, apiCall(t, r.url, "", chatBody), 401, "invalid_api_key")                 // none
	if got := apiCall(t, r.url, kx, chatBody); strings.Contains(got.body, kx) || strings.Contains(got.body, kx[4:20]) {
		t.Fatalf("the key is echoed: %s", got.body)
	}
	// A user key opens the rest of the API too.
	req, _ = http.NewRequest("GET", r.url+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+ka)
	if got := do(t, req); got.status != 200 {
		t.Fatalf("/v1/models with a user key: %d %s", got.status, got.body)
	}
	if up.hits.Load() != 4 {
		t.Fatalf("the engine saw %d requests, want the 4 admitted", up.hits.Load())
	}
}

func TestRouterWithoutKeyOrUsersStaysOpen(t *testing.T) {
	up := startUpstream(t, okHandler)
	r, _ := govRouter(t, nil, `{}`, up.url)
	want(t, apiCall(t, r.url, "", chatBody), 200, "")
	want(t, apiCall(t, r.url, "anything", chatBody), 200, "")
}

// holdUpstream answers once released; it counts requests in flight.
type holdUpstream struct {
	*upstream
	inflight atomic.Int64
	release  chan struct{}
}

func startHold(t testing.TB) *holdUpstream {
	h := &holdUpstream{release: make(chan struct{}, 1000)}
	h.upstream = startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		h.inflight.Add(1)
		defer h.inflight.Add(-1)
		select {
		case <-h.release:
		case <-time.After(10 * time.Second):
		}
		okHandler(ctx)
	})
	return h
}

// waitUntil polls cond for up to 10 s.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// async posts in the background; the answer arrives on the channel.
func async(t testing.TB, url, key, body string) chan apiResp {
	ch := make(chan apiResp, 1)
	go func() { ch <- apiCall(t, url, key, body) }()
	return ch
}

func TestSeatsPassOverWorkersAtTheirLimit(t *testing.T) {
	a, b := startHold(t), startHold(t)
	for _, policy := range []string{"round-robin", "least-requests"} {
		t.Run(policy, func(t *testing.T) {
			f := defaultFlags()
			f.RouterPolicy = policy
			r, _ := govRouter(t, f, `{"rate_limit": {"scope": "instance", "overall_concurrency": 1}}`, a.url, b.url)
			// Hold a request on one worker; every following request goes to
			// the other one while it is held, whatever the policy prefers.
			first := async(t, r.url, "", chatBody)
			waitUntil(t, "a held request", func() bool { return a.inflight.Load()+b.inflight.Load() == 1 })
			held, free := a, b
			if b.inflight.Load() == 1 {
				held, free = b, a
			}
			before := held.hits.Load()
			for i := 0; i < 4; i++ {
				free.release <- struct{}{}
				want(t, apiCall(t, r.url, "", chatBody), 200, "")
			}
			if held.hits.Load() != before {
				t.Fatal("a request went to the worker at its limit")
			}
			// Both at their limit: refused at once, in OpenAI's shape.
			second := async(t, r.url, "", chatBody)
			waitUntil(t, "both workers busy", func() bool { return a.inflight.Load() == 1 && b.inflight.Load() == 1 })
			rej := apiCall(t, r.url, "", chatBody)
			want(t, rej, 429, "concurrency_overall")
			if rej.retry != "" {
				t.Fatalf("Retry-After %q on a concurrency refusal (no time is known)", rej.retry)
			}
			a.release <- struct{}{}
			b.release <- struct{}{}
			want(t, <-first, 200, "")
			want(t, <-second, 200, "")
		})
	}
}

func TestSeatQueueServesTheFirstCandidateThatFrees(t *testing.T) {
	a, b := startHold(t), startHold(t)
	r, g := govRouter(t, nil, `{"rate_limit": {"scope": "instance", "prefill_concurrency": 1,
		"overlimit": "queue", "queue_size": 10, "queue_timeout_ms": 5000}}`, a.url, b.url)
	ra := async(t, r.url, "", chatBody)
	rb := async(t, r.url, "", chatBody)
	waitUntil(t, "both workers busy", func() bool { return a.inflight.Load() == 1 && b.inflight.Load() == 1 })
	queued := async(t, r.url, "", chatBody)
	waitUntil(t, "a queued request", func() bool { return g.QueueLength() == 1 })
	hitsA, hitsB := a.hits.Load(), b.hits.Load()
	b.release <- struct{}{} // b frees its seat: the queued request goes there
	waitUntil(t, "the queued request on b", func() bool { return b.hits.Load() == hitsB+1 && b.inflight.Load() == 1 })
	b.release <- struct{}{}
	want(t, <-queued, 200, "")
	a.release <- struct{}{}
	want(t, <-ra, 200, "")
	want(t, <-rb, 200, "")
	if a.hits.Load() != hitsA || g.QueueLength() != 0 {
		t.Fatalf("a got %d more requests; queue %d", a.hits.Load()-hitsA, g.QueueLength())
	}
	// Each worker counts the requests it was sent
	// (infera_router_worker_requests_total), not the leases the queued
	// request took and handed back while it waited.
	for i, up := range []*holdUpstream{a, b} {
		if sent, _ := r.fl.Get(fmt.Sprintf("w%d", i)).Counts(); sent != uint64(up.hits.Load()) {
			t.Fatalf("w%d counts %d requests sent, it got %d", i, sent, up.hits.Load())
		}
	}
	// A full queue refuses at once.
	r2, g2 := govRouter(t, nil, `{"rate_limit": {"scope": "gateway", "prefill_concurrency": 1,
		"overlimit": "queue", "queue_size": 1, "queue_timeout_ms": 5000}}`, a.url)
	held := async(t, r2.url, "", chatBody)
	waitUntil(t, "a held request", func() bool { return a.inflight.Load() == 1 })
	waiting := async(t, r2.url, "", chatBody)
	waitUntil(t, "a queued request", func() bool { return g2.QueueLength() == 1 })
	want(t, apiCall(t, r2.url, "", chatBody), 429, "concurrency_prefill")
	a.release <- struct{}{}
	a.release <- struct{}{}
	want(t, <-held, 200, "")
	want(t, <-waiting, 200, "")
}

// rawRequest sends a chat request over a raw connection and returns it
// (the caller closes it: the client leaves).
func rawRequest(t testing.TB, url, key, body string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp4", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	auth := ""
	if key != "" {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", auth, len(body), body)
	return c
}

func TestQueuedRequestWhoseClientLeavesIsRemovedAtOnce(t *testing.T) {
	t.Run("seat queue", func(t *testing.T) {
		up := startHold(t)
		r, g := govRouter(t, nil, `{"rate_limit": {"prefill_concurrency": 1, "overlimit": "queue",
			"queue_size": 10, "queue_timeout_ms": 30000}}`, up.url)
		held := async(t, r.url, "", chatBody)
		waitUntil(t, "a held request", func() bool { return up.inflight.Load() == 1 })
		c := rawRequest(t, r.url, "", chatBody)
		waitUntil(t, "a queued request", func() bool { return g.QueueLength() == 1 })
		t0 := time.Now()
		c.Close()
		waitUntil(t, "the seat queue emptied", func() bool { return g.QueueLength() == 0 })
		if el := time.Since(t0); el > 5*time.Second { // the queue timeout is 30 s
			t.Fatalf("the abandoned request left the queue after %v", el)
		}
		up.release <- struct{}{}
		want(t, <-held, 200, "")
		if up.hits.Load() != 1 {
			t.Fatalf("the engine saw %d requests, want 1 (the abandoned one is never dispatched)", up.hits.Load())
		}
	})
	t.Run("user queue", func(t *testing.T) {
		up := startHold(t)
		key, hash := mintKey(t)
		r, _ := govRouter(t, nil, fmt.Sprintf(`{
			"user_limit": {"templates": [{"name": "t", "default": true,
				"concurrency": {"enabled": true, "limit": 1, "overlimit": "queue", "queue_size": 10, "queue_timeout_ms": 30000}}]},
			"users": [{"name": "alice", "keys": [%q]}]}`, hash), up.url)
		held := async(t, r.url, key, chatBody)
		waitUntil(t, "a held request", func() bool { return up.inflight.Load() == 1 })
		c := rawRequest(t, r.url, key, chatBody)
		waitUntil(t, "alice's second request queued", func() bool { return userQueueLen(t, r.url) == 1 })
		t0 := time.Now()
		c.Close()
		waitUntil(t, "the user queue emptied", func() bool { return userQueueLen(t, r.url) == 0 })
		if el := time.Since(t0); el > 5*time.Second { // the queue timeout is 30 s
			t.Fatalf("the abandoned request left the queue after %v", el)
		}
		up.release <- struct{}{}
		want(t, <-held, 200, "")
		// Alice's slot is free again: the abandoned request holds nothing.
		up.release <- struct{}{}
		want(t, apiCall(t, r.url, key, chatBody), 200, "")
		if up.hits.Load() != 2 {
			t.Fatalf("the engine saw %d requests, want 2 (the abandoned one is never dispatched)", up.hits.Load())
		}
	})
}

// userQueueLen reads infera_user_limit_queue_length from the router.
func userQueueLen(t *testing.T, url string) int {
	return int(metricFloat(t, url, "infera_user_limit_queue_length"))
}

// metricFloat reads one series from the router's /metrics (0 when absent).
func metricFloat(t *testing.T, url, series string) float64 {
	t.Helper()
	f, _ := strconv.ParseFloat(metricValue(t, url, series), 64)
	return f
}

// usageUpstream answers with the usage it is told (none when prompt < 0),
// or with status when it is not 200.
type usageUpstream struct {
	*upstream
	mu                         sync.Mutex
	status                     int
	prompt, cached, completion int
}

func startUsage(t testing.TB) *usageUpstream {
	u := &usageUpstream{status: 200}
	u.upstream = startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		u.mu.Lock()
		st, p, c, o := u.status, u.prompt, u.cached, u.completion
		u.mu.Unlock()
		ctx.SetContentType("application/json")
		if st != 200 {
			ctx.SetStatusCode(st)
			ctx.SetBodyString(`{"error":{"message":"engine says no","type":"server_error","param":null,"code":null}}`)
			return
		}
		if p < 0 {
			ctx.SetBodyString(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
			return
		}
		fmt.Fprintf(ctx, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, p, o, p+o, c)
	})
	return u
}

func (u *usageUpstream) set(status, prompt, cached, completion int) {
	u.mu.Lock()
	u.status, u.prompt, u.cached, u.completion = status, prompt, cached, completion
	u.mu.Unlock()
}

// The TPM bucket is pre-deducted with the estimate (prompt estimate + the
// default output estimate) and reconciled with the usage the engine
// reports: a refund lets the next request in, a charge beyond the estimate
// keeps it out; no reported usage keeps the estimate; an engine failure
// refunds everything.
func TestTPMReconciledWithTheEngineReportedUsage(t *testing.T) {
	up := startUsage(t)
	key, hash := mintKey(t)
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r, _ := govRouter(t, f, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true,
			"rate": {"enabled": true, "tpm": 1000, "default_output_tokens": 900}}]},
		"users": [{"name": "alice", "keys": [%q]}]}`, hash), up.url)
	noMax := `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`
	// Each request reserves ~905 of 1000 tokens; the engine reports 10:
	// without reconciliation the second request would be refused.
	up.set(200, 7, 0, 3)
	for i := 0; i < 5; i++ {
		want(t, apiCall(t, r.url, key, noMax), 200, "")
	}
	// An engine failure, or an engine too busy to serve it (429), refunds
	// the reservation.
	up.set(500, 0, 0, 0)
	for i := 0; i < 3; i++ {
		want(t, apiCall(t, r.url, key, noMax), 500, "")
	}
	up.set(429, 0, 0, 0)
	for i := 0; i < 3; i++ {
		want(t, apiCall(t, r.url, key, noMax), 429, "")
	}
	// No usage reported: the request keeps its estimate, so the next one
	// does not fit.
	up.set(200, -1, 0, 0)
	want(t, apiCall(t, r.url, key, noMax), 200, "")
	rej := apiCall(t, r.url, key, noMax)
	want(t, rej, 429, "rate_limit_tpm")
	if n, _ := strconv.Atoi(rej.retry); n < 40 || n > 60 {
		t.Fatalf("Retry-After %q: the bucket lacks ~810 of 1000 tokens a minute, want ~49 s", rej.retry)
	}

	// Charging beyond the estimate: a request with max_tokens 10 reports
	// 3000 tokens, which takes the bucket below zero.
	key2, hash2 := mintKey(t)
	r2, _ := govRouter(t, f, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true,
			"rate": {"enabled": true, "tpm": 1000}}]},
		"users": [{"name": "bob", "keys": [%q]}]}`, hash2), up.url)
	up.set(200, 1000, 0, 2000)
	want(t, apiCall(t, r2.url, key2, chatBody), 200, "")
	rej = apiCall(t, r2.url, key2, chatBody)
	want(t, rej, 429, "rate_limit_tpm")
	if n, _ := strconv.Atoi(rej.retry); n < 120 {
		t.Fatalf("Retry-After %q: the bucket is ~2000 tokens below zero at 1000/min, want over 2 minutes", rej.retry)
	}
}

// A served request is counted in its user's quota with the engine's
// reported usage, weighted (input that missed the cache, output, cached
// input), as infera_user_quota_tokens_total shows.
func TestQuotaChargedWithWeightedReportedUsage(t *testing.T) {
	up := startUsage(t)
	key, hash := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "weights": {"input": 2, "output": 3, "cached": 0.5},
				"windows": [{"period": "day", "max_tokens": 100000}]}}]},
		"users": [{"name": "quota-carol", "keys": [%q]}]}`, hash), up.url)
	series := `infera_user_quota_tokens_total{user="quota-carol"}`
	up.set(200, 100, 40, 10) // (100-40)*2 + 40*0.5 + 10*3 = 170
	want(t, apiCall(t, r.url, key, chatBody), 200, "")
	if v := metricFloat(t, r.url, series); v != 170 {
		t.Fatalf("charged %v weighted tokens, want 170", v)
	}
	up.set(404, 0, 0, 0) // an engine's 4xx answer: the request counts, no tokens
	want(t, apiCall(t, r.url, key, chatBody), 404, "")
	if v := metricFloat(t, r.url, series); v != 170 {
		t.Fatalf("charged %v weighted tokens after a 4xx answer, want 170", v)
	}
}

// startRouterGov is startRouter with a governor (users, limits); under
// kv-aware the prompts are rendered, tokenized and hashed as in
// startRouter.
func startRouterGov(t testing.TB, f *config.Serve, cfg *config.Config, gov *govern.Governor, urls ...string) *testRouter {
	t.Helper()
	return startRouterWith(t, f, cfg, func(o *Options) {
		o.Governor = gov
		if o.Flags.RouterPolicy == "kv-aware" {
			o.Sched.KV = kvroute.NewKVAware(kvroute.KVAwareConfig{Index: radix.New(), OverlapWeight: 1, BlockSize: 16})
			o.Tokenizer, o.HashBlocks = tokenizer.Simple{}, kv.HashBlocks
		}
	}, urls...)
}

// Saturated (global scheduling's question) is true when no candidate has a
// free seat, whether or not the request could wait in the queue (a member
// with room takes it now); never in dry run.
func TestSaturatedWhenNoCandidateHasASeat(t *testing.T) {
	a, b := startHold(t), startHold(t)
	for _, tc := range []struct {
		rl   string
		want bool
	}{
		{`{"overall_concurrency": 1}`, true},
		{`{"overall_concurrency": 1, "overlimit": "queue", "queue_size": 5}`, true},
		{`{"overall_concurrency": 1, "dry_run": true}`, false},
		{`{"overall_concurrency": 2}`, false},
	} {
		r, _ := govRouter(t, nil, `{"rate_limit": `+tc.rl+`}`, a.url, b.url)
		req := &sched.Request{Model: []byte("m")}
		cfg := r.store.Load()
		if r.srv.Saturated(cfg, req) {
			t.Fatalf("%s: saturated while idle", tc.rl)
		}
		h1, h2 := async(t, r.url, "", chatBody), async(t, r.url, "", chatBody)
		waitUntil(t, "both workers busy", func() bool { return a.inflight.Load() == 1 && b.inflight.Load() == 1 })
		if got := r.srv.Saturated(cfg, req); got != tc.want {
			t.Fatalf("%s: saturated %v with both workers holding one request, want %v", tc.rl, got, tc.want)
		}
		if r.srv.Saturated(cfg, &sched.Request{Model: []byte("other")}) {
			t.Fatalf("%s: saturated for a model nobody serves", tc.rl)
		}
		a.release <- struct{}{}
		b.release <- struct{}{}
		want(t, <-h1, 200, "")
		want(t, <-h2, 200, "")
	}
}

// With the seats in Redis, another router's requests fill them: this
// router's own load says nothing, the seat acquisition finds out, and
// global scheduling forwards the refused request to another region.
func TestSeatRefusedInRedisForwardsToAnotherRegion(t *testing.T) {
	rd := testsrv.StartRedis(t)
	hold := startHold(t)
	engB := startUpstream(t, okHandler)
	cfgRL := govConfig(t, `{"rate_limit": {"overall_concurrency": 1}}`)
	redisGov := func() *govern.Governor { return newGovernorAt(t, rd.URL, cfgRL) }
	// Router A0 and router A share the engine (worker w0) and its seat.
	a0 := startRouterGov(t, nil, cfgRL, redisGov(), hold.url)
	fb := defaultFlags()
	fb.APIKey = "key-b"
	b := startRouterWith(t, fb, config.Default(), nil, engB.url)
	cfgA := globalConfig(config.Member{Name: "b", URL: b.url, APIKey: config.NewSecret("key-b")})
	cfgA.GlobalScheduling.MinFree = 0
	cfgA.RateLimit = cfgRL.RateLimit
	pa := startPoller(t, &cfgA.GlobalScheduling)
	ga := redisGov()
	if err := ga.Apply(cfgA); err != nil {
		t.Fatal(err)
	}
	a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller, o.Governor = pa, ga }, hold.url)
	waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "A's report of B")

	held := async(t, a0.url, "", chatBody)
	waitUntil(t, "a0's request on the engine", func() bool { return hold.inflight.Load() == 1 })
	resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "global:b" || engB.hits.Load() != 1 {
		t.Fatalf("A with its seat taken by A0: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	if hold.hits.Load() != 1 {
		t.Fatalf("the engine at its limit got %d requests", hold.hits.Load())
	}
	hold.release <- struct{}{}
	want(t, <-held, 200, "")
}

// PD legs take seats of their phase: a decode worker at its decode limit
// is passed over while another decode worker has a seat; with every decode
// seat taken the request is refused with concurrency_decode, before its
// prefill is sent; the prefill seat is back at the prefill leg's first
// token.
func TestPDLegsTakeSeatsOfTheirPhase(t *testing.T) {
	var pl, dl legLog
	var ok atomic.Int32
	p := startUpstream(t, vllmPrefill(&pl, "engine-p", &ok))
	hold := make(chan struct{}, 10)
	var inflight atomic.Int64
	dh := decodeEngine(&dl, `"remote_engine_id":"engine-p"`, &ok)
	decode := func(ctx *fasthttp.RequestCtx) {
		inflight.Add(1)
		defer inflight.Add(-1)
		<-hold
		dh(ctx)
	}
	d1, d2 := startUpstream(t, decode), startUpstream(t, decode)
	cfg := pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "vllm"
		c.RateLimit.PrefillConcurrency, c.RateLimit.DecodeConcurrency = 1, 1
	})
	g := newGovernor(t, cfg)
	f := defaultFlags()
	r := startPDRouterGov(t, f, cfg, g, pdWorker("p", p.url, "prefill", ""), pdWorker("d1", d1.url, "decode", ""), pdWorker("d2", d2.url, "decode", ""))
	url, fl := r.url, r.fl
	body := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`

	a := async(t, url, "", body)
	waitUntil(t, "one decode leg held", func() bool { return inflight.Load() == 1 })
	b := async(t, url, "", body) // the prefill seat is free again; the other decode worker
	waitUntil(t, "two decode legs held", func() bool { return inflight.Load() == 2 })
	if d1.hits.Load() != 1 || d2.hits.Load() != 1 {
		t.Fatalf("decode legs on d1 %d, d2 %d: want one each", d1.hits.Load(), d2.hits.Load())
	}
	want(t, apiCall(t, url, "", body), 429, "concurrency_decode")
	hold <- struct{}{}
	hold <- struct{}{}
	want(t, <-a, 200, "")
	want(t, <-b, 200, "")
	hold <- struct{}{}
	want(t, apiCall(t, url, "", body), 200, "")
	noLoadLeft(t, fl)
	if pl.n() != 3 {
		t.Fatalf("prefill legs %d, want 3 (the decode seat is taken before the prefill is sent: the refused request sent none)", pl.n())
	}
}

// With the counters in Redis and seats limited, a user's admission is
// deferred to the first seat acquisition and runs in its script. A request
// the user's concurrency limit queues gives its lease back and waits in
// the user's queue without holding a worker's load; a refusal of the
// deferred admission answers in OpenAI's shape, and the engine never sees
// the refused request.
func TestDeferredAdmissionInRedisQueuesWithoutTheLeaseAndRefusesInShape(t *testing.T) {
	rd := testsrv.StartRedis(t)
	up := startHold(t)
	key, hash := mintKey(t)
	cfg := govConfig(t, fmt.Sprintf(`{
		"rate_limit": {"overall_concurrency": 100},
		"user_limit": {"templates": [{"name": "t", "default": true,
			"concurrency": {"enabled": true, "limit": 1, "overlimit": "queue", "queue_size": 10, "queue_timeout_ms": 30000},
			"quota": {"enabled": true, "windows": [{"period": "day", "max_requests": 2}]}}]},
		"users": [{"name": "alice", "keys": [%q]}]}`, hash))
	r := startRouterGov(t, nil, cfg, newGovernorAt(t, rd.URL, cfg), up.url)
	w := r.fl.View().All[0]
	held := async(t, r.url, key, chatBody)
	waitUntil(t, "a held request", func() bool { return up.inflight.Load() == 1 })
	queued := async(t, r.url, key, chatBody)
	waitUntil(t, "alice's second request queued", func() bool { return userQueueLen(t, r.url) == 1 })
	if n := w.Load.Requests.Load(); n != 1 {
		t.Fatalf("the worker counts %d requests while one is queued for alice's slot, want 1", n)
	}
	up.release <- struct{}{}
	want(t, <-held, 200, "")
	waitUntil(t, "the queued request on the engine", func() bool { return up.inflight.Load() == 1 })
	up.release <- struct{}{}
	want(t, <-queued, 200, "")
	want(t, apiCall(t, r.url, key, chatBody), 429, "quota_requests_day") // 2 a day
	if up.hits.Load() != 2 {
		t.Fatalf("the engine saw %d requests, want 2", up.hits.Load())
	}
}

// One batched /v1/completions request (16 prompts, n 65536, max_tokens
// 2^31: the most the parser accepts) under an output weight of 5 is
// refused by a 1000-token quota. Its estimate overflowed and wrapped
// negative: it was admitted, and with Redis the month's count became a
// float no later request could add to, voiding the quota.
func TestAnEstimatePastAnyLimitIsRefusedNotWrapped(t *testing.T) {
	for _, backend := range []string{"local", "redis"} {
		t.Run(backend, func(t *testing.T) {
			up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
				if strings.Contains(string(ctx.PostBody()), `"n":65536`) {
					// vLLM refuses max_tokens beyond the context.
					ctx.SetStatusCode(400)
					ctx.SetBodyString(`{"error":{"message":"max_tokens is too large","type":"BadRequestError","param":null,"code":"bad_request"}}`)
					return
				}
				ctx.SetContentType("application/json")
				ctx.SetBodyString(`{"id":"x","object":"text_completion","model":"m","choices":[{"index":0,"text":"hi","finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":16,"total_tokens":36}}`)
			})
			key, hash := mintKey(t)
			cfg := govConfig(t, fmt.Sprintf(`{
				"user_limit": {"templates": [{"name": "t", "default": true,
					"quota": {"enabled": true, "weights": {"input": 1, "output": 5, "cached": 1},
						"windows": [{"period": "month", "max_tokens": 1000}]}}]},
				"users": [{"name": "huge-dan", "keys": [%q]}]}`, hash))
			state := ""
			if backend == "redis" {
				state = testsrv.StartRedis(t).URL
			}
			r := startRouterGov(t, nil, cfg, newGovernorAt(t, state, cfg), up.url)
			prompts := strings.TrimSuffix(strings.Repeat(`"a",`, 16), ",")
			huge := `{"model":"m","prompt":[` + prompts + `],"n":65536,"max_tokens":2147483648}`
			res := postPath(t, r.url, "/v1/completions", key, huge)
			if res.status == 429 {
				t.Logf("huge request refused: %s", res.body)
			} else {
				t.Errorf("a request estimated at ~1.1e16 weighted tokens was not refused by a 1000-token quota: %d %s", res.status, res.body)
			}
			// 36 reported tokens, weighted 20 + 16x5 = 100 each: 10 fit.
			ok := 0
			for range 30 {
				if res := postPath(t, r.url, "/v1/completions", key, `{"model":"m","prompt":"hello","max_tokens":16}`); res.status == 200 {
					ok++
				}
			}
			if ok > 10 {
				t.Errorf("%d requests of 100 weighted tokens served under a 1000-token monthly quota", ok)
			}
		})
	}
}

// A /v1/messages/count_tokens request passed through to the engine
// (protocol.anthropic_passthrough) runs no model and costs no tokens. Its
// admission pre-deducted default_output_tokens (1024), and the engine's
// answer ({"input_tokens": n}) carries no usage to settle it: each count
// cost ~1024 tokens of TPM and quota, and Claude Code counts tokens often.
func TestCountingTokensPassedThroughCostsNoTokens(t *testing.T) {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		if strings.HasSuffix(string(ctx.Path()), "/count_tokens") {
			ctx.SetBodyString(`{"input_tokens":12}`)
			return
		}
		ctx.SetBodyString(`{"id":"m1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":12,"output_tokens":2}}`)
	})
	key, hash := mintKey(t)
	cfg := govConfig(t, fmt.Sprintf(`{
		"protocol": {"anthropic_passthrough": true},
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 100000}]},
			"rate": {"enabled": true, "tpm": 3000}}]},
		"users": [{"name": "count-erin", "keys": [%q]}]}`, hash))
	r := startRouterGov(t, nil, cfg, newGovernor(t, cfg), up.url)
	body := `{"model":"m","messages":[{"role":"user","content":"how many tokens is this?"}]}`
	for i := range 3 {
		req, _ := http.NewRequest("POST", r.url+"/v1/messages/count_tokens", strings.NewReader(body))
		req.Header.Set("x-api-key", key)
		req.Header.Set("anthropic-version", "2023-06-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("count_tokens #%d: %d %s", i+1, resp.StatusCode, b)
		}
	}
	charged := metricFloat(t, r.url, `infera_user_quota_tokens_total{user="count-erin"}`)
	if charged != 0 {
		t.Errorf("3 token counts (prompts of ~12 tokens, nothing generated) charged %v tokens to the user's quota", charged)
	}
	// A real request now: refused by TPM, which the token counts spent.
	res := postPath(t, r.url, "/v1/chat/completions", key, `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)
	if res.status != 200 {
		t.Errorf("a 16-token request after 3 token counts, under a TPM of 3000: %d %s", res.status, res.body)
	}
}

// rate.default_output_tokens applies only when rate limiting is on, as the
// spec says ("Applies only when rate limiting is enabled"): a value kept
// while it is off changes nothing. It was the quota's output estimate
// anyway, and a request without max_tokens got 429 quota_tokens_day with
// nothing used.
func TestTheDefaultOutputEstimateAppliesOnlyWhenRateLimitingIsOn(t *testing.T) {
	up := startUpstream(t, okHandler) // usage 7 prompt + 1 completion
	key, hash := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 50000}]},
			"rate": {"enabled": false, "tpm": 1000000, "default_output_tokens": 100000}}]},
		"users": [{"name": "dave", "keys": [%q]}]}`, hash), up.url)
	noMax := `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`
	want(t, apiCall(t, r.url, key, noMax), 200, "")
}

// A request's key is checked again when a reload came while its body was
// arriving (authentication runs before the body is read): a user disabled,
// removed, or given another model list meanwhile is answered as a new
// request would be. Such a request was admitted and served as the user
// stood when its headers came.
func TestAReloadWhileTheBodyArrivesAppliesToTheRequest(t *testing.T) {
	up := startUpstream(t, okHandler)
	key, hash := mintKey(t)
	users := func(extra string) *config.Config {
		return govConfig(t, fmt.Sprintf(`{"user_limit": {"templates": [{"name": "t", "default": true, "rate": {"enabled": true, "rpm": 1000}}]},
			"users": [{"name": "alice", "keys": [%q]%s}, {"name": "bob"}]}`, hash, extra))
	}
	cfg := users("")
	g := newGovernor(t, cfg)
	r := startRouterGov(t, nil, cfg, g, up.url)
	body := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + strings.Repeat("x ", 100_000) + `"}]}`
	for _, tc := range []struct {
		name   string
		reload *config.Config
		status int
		code   string
	}{
		{"disabled", users(`, "enabled": false`), 403, "user_disabled"},
		{"removed", govConfig(t, `{"users": [{"name": "bob"}]}`), 401, "invalid_api_key"},
		{"models", users(`, "models": ["other"]`), 403, "model_not_allowed"},
		{"unchanged", users(""), 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := g.Apply(cfg); err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body[:70_000])
			waitUntil(t, "the request is being read", func() bool { return r.srv.states.n.Load() == 1 })
			time.Sleep(50 * time.Millisecond) // authenticated, reading the body
			if err := g.Apply(tc.reload); err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(c, body[70_000:]); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(string(b), `"code":"`+tc.code+`"`) && tc.code != "" {
				t.Fatalf("got %d %s, want %d %s", resp.StatusCode, b, tc.status, tc.code)
			}
		})
	}
}

// /tokenize and /debug/route authenticate before their body arrives, as
// inference does: a reload during the upload that narrows the user's model
// list (or removes the user) applies to them too. Their model check used
// the user as it stood at authentication.
func TestAReloadWhileADebugBodyArrivesAppliesToIt(t *testing.T) {
	up := startUpstream(t, okHandler)
	key, hash := mintKey(t)
	users := func(extra string) *config.Config {
		return govConfig(t, fmt.Sprintf(`{"users": [{"name": "alice", "keys": [%q]%s}, {"name": "bob"}]}`, hash, extra))
	}
	cfg := users("")
	g := newGovernor(t, cfg)
	f := defaultFlags()
	f.RouterPolicy = "kv-aware"
	r := startRouterGov(t, f, cfg, g, up.url)
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x ", 60_000) + `"}]}`
	for _, path := range []string{"/tokenize", "/debug/route"} {
		for _, tc := range []struct {
			name   string
			reload *config.Config
			status int
		}{
			{"models", users(`, "models": ["other"]`), 404},
			{"removed", govConfig(t, `{"users": [{"name": "bob"}]}`), 401},
			{"unchanged", users(""), 200},
		} {
			t.Run(path+" "+tc.name, func(t *testing.T) {
				if err := g.Apply(cfg); err != nil {
					t.Fatal(err)
				}
				c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", path, key, len(body), body[:50_000])
				waitUntil(t, "the request is being read", func() bool { return r.srv.states.n.Load() == 1 })
				time.Sleep(50 * time.Millisecond) // authenticated, reading the body
				if err := g.Apply(tc.reload); err != nil {
					t.Fatal(err)
				}
				if _, err := io.WriteString(c, body[50_000:]); err != nil {
					t.Fatal(err)
				}
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.status {
					t.Fatalf("got %d %.200s, want %d", resp.StatusCode, b, tc.status)
				}
			})
		}
	}
}

// An n the engine reads as an integer though it is written otherwise
// (3.0, "3", 3e0: pydantic's lax int, as vLLM's request models read it)
// makes as many completions as "n":3, and the router must charge them:
// it read them as 1 and admitted, under a 1000-token daily quota, a
// request the engine answers with 3 x 400 tokens.
func TestAnNWrittenAsAFloatOrAStringIsChargedAsItsCompletions(t *testing.T) {
	up := startUpstream(t, okHandler)
	key, hash := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 1000}]}}]},
		"users": [{"name": "lax-nina", "keys": [%q]}]}`, hash), up.url)
	for _, n := range []string{`3`, `3.0`, `3e0`, `30e-1`, `"3"`, `" 3 "`, `"+3"`, `"\u0033"`, `"3.00"`, `"3_0"`} {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":400,"n":` + n + `}`
		if res := apiCall(t, r.url, key, body); res.status != 429 {
			t.Errorf("n %s with max_tokens 400 under a 1000-token quota: %d %s, want 429", n, res.status, res.body)
		}
	}
	if h := up.hits.Load(); h != 0 {
		t.Errorf("the engine got %d requests the quota should have refused", h)
	}
	// What the engine refuses (or reads as 1) is still charged as one.
	for _, n := range []string{`0`, `3.5`, `"x"`, `"3x"`, `null`, `true`, `[3]`} {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":400,"n":` + n + `}`
		if res := apiCall(t, r.url, key, body); res.status == 429 {
			t.Errorf("n %s refused by the quota as more than one completion: %s", n, res.body)
		}
	}
}

// A passthrough body the converter refuses is routed on a minimal view
// (routingView) that kept its output limit only when written as a plain
// integer: "max_tokens":"100000" (which the engine's lax int reads as
// 100000) was estimated at default_output_tokens, and a 5000-token quota
// let through a request for 100,000.
func TestAPassthroughOutputLimitWrittenAsAStringIsCharged(t *testing.T) {
	up := startUpstream(t, okHandler)
	key, hash := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{
		"protocol": {"anthropic_passthrough": true, "responses_passthrough": true},
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 5000}]}}]},
		"users": [{"name": "pass-olga", "keys": [%q]}]}`, hash), up.url)
	for _, tc := range []struct{ path, body string }{
		{"/v1/messages", `{"model":"m","max_tokens":"100000","messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/messages", `{"model":"m","max_tokens":" +100000 ","messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/responses", `{"model":"m","max_output_tokens":"100000","input":"hi"}`},
		{"/v1/responses", `{"model":"m","max_output_tokens":"100000.0","input":"hi"}`},
	} {
		res := postPath(t, r.url, tc.path, key, tc.body)
		if res.status != 429 {
			t.Errorf("%s %s under a 5000-token quota: %d %s, want 429", tc.path, tc.body, res.status, res.body)
		}
	}
	if h := up.hits.Load(); h != 0 {
		t.Errorf("the engine got %d requests the quota should have refused", h)
	}
}

// vLLM takes max_completion_tokens unless it is falsy ("max_completion_tokens
// or max_tokens"): a max_completion_tokens of 0 leaves max_tokens in force.
// The router took the 0 (no output limit: an estimate of the prompt alone)
// and admitted, under a 5000-token quota, a request the engine lets
// generate 100,000 tokens.
func TestAZeroMaxCompletionTokensLeavesMaxTokensCharged(t *testing.T) {
	up := startUpstream(t, okHandler)
	key, hash := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 5000}]}}]},
		"users": [{"name": "zero-pia", "keys": [%q]}]}`, hash), up.url)
	for _, limits := range []string{`"max_completion_tokens":0,"max_tokens":100000`, `"max_tokens":100000,"max_completion_tokens":0`} {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}],` + limits + `}`
		if res := apiCall(t, r.url, key, body); res.status != 429 {
			t.Errorf("%s under a 5000-token quota: %d %s, want 429", limits, res.status, res.body)
		}
	}
	if h := up.hits.Load(); h != 0 {
		t.Errorf("the engine got %d requests the quota should have refused", h)
	}
	// A max_completion_tokens above 0 still wins.
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":10,"max_tokens":100000}`
	want(t, apiCall(t, r.url, key, body), 200, "")
}

// An output limit written otherwise than as a plain integer (100.0, 1e2,
// "100": vLLM's lax int reads each as 100) is served and charged as that
// integer; the router refused it with 400 "max_tokens must be a
// non-negative integer", a request the engine serves.
func TestAnOutputLimitWrittenAsAFloatOrAStringIsServedAndCharged(t *testing.T) {
	up := startUpstream(t, okHandler)
	key, hash := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 5000}]}}]},
		"users": [{"name": "lax-rui", "keys": [%q]}]}`, hash), up.url)
	for _, v := range []string{`100.0`, `1e2`, `"100"`, `" +100 "`} {
		for _, field := range []string{"max_tokens", "max_completion_tokens"} {
			body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"` + field + `":` + v + `}`
			if res := apiCall(t, r.url, key, body); res.status != 200 {
				t.Errorf("%s %s: %d %s, want 200", field, v, res.status, res.body)
			}
		}
	}
	for _, v := range []string{`100000.0`, `1e5`, `"100000"`} {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":` + v + `}`
		if res := apiCall(t, r.url, key, body); res.status != 429 {
			t.Errorf("max_tokens %s under a 5000-token quota: %d %s, want 429", v, res.status, res.body)
		}
	}
	if h := up.hits.Load(); h != 8 {
		t.Errorf("the engine got %d requests, want the 8 within the quota", h)
	}
}
