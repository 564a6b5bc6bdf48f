package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testsrv"
	"github.com/valyala/fasthttp"
)

// With users configured and no --api-key, a user's API key (Authorization
// or x-api-key) is the router's: it never reaches an engine.
func TestAUsersKeyIsNeverForwardedToEngines(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		seen = append(seen, string(ctx.Request.Header.Peek("Authorization"))+"|"+string(ctx.Request.Header.Peek("x-api-key")))
		mu.Unlock()
		okHandler(ctx)
	})
	key, hash := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{"users": [{"name": "alice", "keys": [%q]}]}`, hash), up.url)
	want(t, apiCall(t, r.url, key, chatBody), 200, "")
	req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("x-api-key", key)
	want(t, do(t, req), 200, "")
	mu.Lock()
	defer mu.Unlock()
	for _, s := range seen {
		if strings.Contains(s, key) {
			t.Errorf("the engine received the user's API key: %q", s)
		}
	}
}

// The token reservation counts every choice: with "n" the engine generates
// up to n x max_tokens, so concurrent requests that each carry max_tokens
// must not overshoot a token quota (docs/governance.md, "No overshoot").
func TestTheTokenReservationCountsEveryChoice(t *testing.T) {
	release := make(chan struct{})
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		<-release
		ctx.SetContentType("application/json")
		// n=10, max_tokens=4: the engine generates 40 tokens.
		ctx.SetBodyString(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":40,"total_tokens":45}}`)
	})
	key, hash := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 60}]}}]},
		"users": [{"name": "nuser", "keys": [%q]}]}`, hash), up.url)
	body := `{"model":"m","n":10,"messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	var res []chan apiResp
	for range 4 {
		res = append(res, async(t, r.url, key, body))
	}
	time.Sleep(300 * time.Millisecond)
	close(release)
	ok := 0
	for _, c := range res {
		if (<-c).status == 200 {
			ok++
		}
	}
	charged := metricFloat(t, r.url, `infera_user_quota_tokens_total{user="nuser"}`)
	t.Logf("%d of 4 requests served, %v weighted tokens charged against a daily quota of 60", ok, charged)
	if charged > 60 {
		t.Errorf("quota overshoot with every request carrying max_tokens: %v > 60", charged)
	}
}

// In PD mode a 4xx answer of the prefill engine, relayed to the client,
// counts like a mixed worker's (docs: "The engine answered 4xx (other than
// 429): the request counts (requests, RPM), no tokens").
func TestAPrefillEngines4xxCountsAgainstTheUser(t *testing.T) {
	var pl, dl legLog
	var pst, dst atomic.Int32
	pst.Store(400)
	p := startUpstream(t, vllmPrefill(&pl, "engine-p", &pst))
	d := startUpstream(t, decodeEngine(&dl, `"remote_engine_id":"engine-p"`, &dst))
	key, hash := mintKey(t)
	cfg := pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "vllm"
		c2 := govConfig(t, fmt.Sprintf(`{"user_limit": {"templates": [{"name": "t", "default": true, "rate": {"enabled": true, "rpm": 1}}]},
			"users": [{"name": "pduser", "keys": [%q]}]}`, hash))
		c.UserLimit, c.Users = c2.UserLimit, c2.Users
	})
	g := newGovernor(t, cfg)
	f := defaultFlags()
	f.RequestMaxRetries = 0
	url := startPDRouterGov(t, f, cfg, g, pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", "")).url
	body := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	r1 := apiCall(t, url, key, body)
	r2 := apiCall(t, url, key, body)
	r3 := apiCall(t, url, key, body)
	t.Logf("with rpm 1 and the prefill engine answering 400: %d, %d, %d (engine saw %d prefill legs)", r1.status, r2.status, r3.status, pl.n())
	if r2.status != 429 {
		t.Errorf("second request in the minute: %d %q, want 429 rate_limit_rpm (the first, answered 400 by the engine, counts)", r2.status, r2.code)
	}
}

// Control for TestAPrefillEngines4xxCountsAgainstTheUser: a mixed worker's 400 counts.
func TestAMixedWorkers4xxCountsAgainstTheUser(t *testing.T) {
	up := startUsage(t)
	up.set(400, 0, 0, 0)
	key, hash := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{"user_limit": {"templates": [{"name": "t", "default": true, "rate": {"enabled": true, "rpm": 1}}]},
		"users": [{"name": "mixuser", "keys": [%q]}]}`, hash), up.url)
	want(t, apiCall(t, r.url, key, chatBody), 400, "")
	want(t, apiCall(t, r.url, key, chatBody), 429, "rate_limit_rpm")
}

// With the counters in Redis and request rate limiting on (the user's
// admission deferred to the first seat), a request the user's quota refuses
// still costs no classifier call (docs: admission happens "before anything
// is spent on the request: no classifier call").
func TestARequestTheUsersQuotaRefusesCostsNoClassifierCall(t *testing.T) {
	rd := testsrv.StartRedis(t)
	var calls atomic.Int32
	cls := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		calls.Add(1)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"tier":"L1"}`)
	})
	up := startUpstream(t, okHandler)
	key, hash := mintKey(t)
	cfg := govConfig(t, fmt.Sprintf(`{
		"rate_limit": {"overall_concurrency": 100},
		"smart_model_selection": {"enabled": true, "classifier_url": %q, "tiers": {"L1": "m", "L2": "m", "L3": "m"}},
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_requests": 1}]}}]},
		"users": [{"name": "alice", "keys": [%q]}]}`, cls.url+"/classify", hash))
	r := startRouterGov(t, nil, cfg, newGovernorAt(t, rd.URL, cfg), up.url)
	want(t, apiCall(t, r.url, key, chatBody), 200, "")
	before := calls.Load()
	for range 3 {
		want(t, apiCall(t, r.url, key, chatBody), 429, "quota_requests_day")
	}
	if n := calls.Load() - before; n != 0 {
		t.Errorf("3 requests refused by the user's quota cost %d classifier calls", n)
	}
}

// A client that asks vLLM for prompt_logprobs gets them after the usage
// object of a chat answer, each prompt token's decoded_token among them:
// a prompt with the word "usage" in it puts a string "usage" there. The
// request is charged the engine's usage all the same; it was charged its
// estimate (the prompt and default_output_tokens, 22 tokens here), however
// long the engine generated (2,012 tokens).
func TestPromptLogprobsNamingUsageDoNotHideTheEnginesUsage(t *testing.T) {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"..."},"logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":12,"total_tokens":2012,"completion_tokens":2000,"prompt_tokens_details":null},"prompt_logprobs":[null,{"31507":{"logprob":-9.1,"rank":812,"decoded_token":"usage"},"9707":{"logprob":-1.2,"rank":1,"decoded_token":"Hello"}}],"kv_transfer_params":null}`)
	})
	key, hash := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 1000000}]},
			"rate": {"enabled": true, "default_output_tokens": 16}}]},
		"users": [{"name": "lp-user", "keys": [%q]}]}`, hash), up.url)
	want(t, apiCall(t, r.url, key, `{"model":"m","messages":[{"role":"user","content":"usage"}],"prompt_logprobs":1}`), 200, "")
	if v := metricFloat(t, r.url, `infera_user_quota_tokens_total{user="lp-user"}`); v != 2012 {
		t.Fatalf("charged %v weighted tokens, want the engine's usage, 2012", v)
	}
}
