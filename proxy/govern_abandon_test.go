package proxy

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"github.com/valyala/fasthttp"
)

// abandonUsers is alice's template for the abandoned-request tests: one
// request a minute, a day's quota counting requests and tokens at weight
// 1, and a concurrency rule whose count tells when a request has settled.
const abandonUsers = `
	"user_limit": {"templates": [{"name": "t", "default": true,
		"concurrency": {"enabled": true, "limit": 8},
		"rate": {"enabled": true, "rpm": 1, "tpm": 1000000},
		"quota": {"enabled": true, "weights": {"input": 1, "output": 1, "cached": 1},
			"windows": [{"period": "day", "max_requests": 100}]}}]},
	"users": [{"name": "alice", "keys": [%q]}]`

// abandonBody is a request with a long prompt and a large max_tokens.
func abandonBody(stream bool) string {
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":1000,"stream":%t}`,
		strings.Repeat("tell me a long story ", 40), stream)
}

// A client that leaves before the first byte, after the engine was sent
// its request (a long prompt, max_tokens 1000, an answer the engine
// delays), keeps its request counted in its RPM bucket and its quota, and
// is charged its prompt: only the completion part of its estimate is
// refunded, and its next request is refused for the RPM of 1. It was
// refunded entirely: a client leaving just before each answer escaped its
// RPM, request quota, token quota and TPM while the engines did the
// prefill (and, unstreamed, the whole generation) for nothing.
func TestAClientLeavingAfterTheEngineHadItsRequestKeepsItsCountsAndPaysItsPrompt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream bool
		redis  bool
		pd     bool // a vLLM pair: the client leaves during the prefill leg
	}{{"local", false, false, false}, {"local stream", true, false, false}, {"redis", false, true, false}, {"pd", false, false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			state := ""
			if tc.redis {
				state = testsrv.StartRedis(t).URL
			}
			key, hash := mintKey(t)
			js := `{` + abandonUsers + `}`
			if tc.pd {
				js = `{"pd": {"mode": "vllm", "prefill_timeout_s": 10},` + abandonUsers + `}`
			}
			cfg := govConfig(t, fmt.Sprintf(js, hash))
			g := newGovernorAt(t, state, cfg)
			var up *holdUpstream
			var r *testRouter
			if tc.pd {
				var pl, dl legLog
				var ok atomic.Int32
				up = startHoldWith(t, vllmPrefill(&pl, "engine-p", &ok))
				d := startUpstream(t, decodeEngine(&dl, `"remote_engine_id":"engine-p"`, &ok))
				r = startPDRouterGov(t, nil, cfg, g, pdWorker("p", up.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
				defer func() {
					if d.hits.Load() != 0 {
						t.Errorf("the decode engine saw %d requests, want none", d.hits.Load())
					}
				}()
			} else {
				up = startHold(t)
				r = startRouterGov(t, nil, cfg, g, up.url)
			}
			body := abandonBody(tc.stream)
			c := rawRequest(t, r.url, key, body)
			waitUntil(t, "the engine holding the request", func() bool { return up.inflight.Load() == 1 })
			us := userStatus(t, g)
			est := us.Quota[0].Tokens // the prompt's estimate plus max_tokens
			if us.Active != 1 || est <= 1000 {
				t.Fatalf("in flight: %d active, %v tokens reserved; want 1 and more than 1000", us.Active, est)
			}
			c.Close()
			waitUntil(t, "the abandoned request settled", func() bool { return userStatus(t, g).Active == 0 })
			us = userStatus(t, g)
			if us.Quota[0].Requests != 1 || us.Quota[0].Tokens != est-1000 {
				t.Fatalf("settled: %d requests, %v tokens; want 1 request and its prompt, %v tokens",
					us.Quota[0].Requests, us.Quota[0].Tokens, est-1000)
			}
			if us.RPM.Remaining != 0 {
				t.Fatalf("%d requests left in the RPM bucket, want 0", us.RPM.Remaining)
			}
			if v := metricFloat(t, r.url, `infera_user_quota_tokens_total{user="alice"}`); v != est-1000 {
				t.Fatalf("infera_user_quota_tokens_total %v, want %v", v, est-1000)
			}
			up.release <- struct{}{} // the abandoned request's handler
			waitUntil(t, "the engine's handler ended", func() bool { return up.inflight.Load() == 0 })
			up.release <- struct{}{} // a request let through would be answered at once
			want(t, apiCall(t, r.url, key, body), 429, "rate_limit_rpm")
			if up.hits.Load() != 1 {
				t.Fatalf("the engine saw %d requests, want 1", up.hits.Load())
			}
		})
	}
}

// startHoldWith is startHold answering with h once released.
func startHoldWith(t testing.TB, h fasthttp.RequestHandler) *holdUpstream {
	u := &holdUpstream{release: make(chan struct{}, 1000)}
	u.upstream = startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		u.inflight.Add(1)
		defer u.inflight.Add(-1)
		select {
		case <-u.release:
		case <-time.After(10 * time.Second):
		}
		h(ctx)
	})
	return u
}

// A client that leaves while its request waits for a concurrency seat,
// before any engine was sent it, is refunded entirely: its request counts
// and its tokens are given back.
func TestAClientLeavingBeforeAnyEngineHadItsRequestIsRefundedEntirely(t *testing.T) {
	up := startHold(t)
	key, hash := mintKey(t)
	cfg := govConfig(t, fmt.Sprintf(`{
		"rate_limit": {"prefill_concurrency": 1, "overlimit": "queue", "queue_size": 10, "queue_timeout_ms": 30000},`+
		strings.Replace(abandonUsers, `"rpm": 1`, `"rpm": 2`, 1)+`}`, hash))
	g := newGovernor(t, cfg)
	r := startRouterGov(t, nil, cfg, g, up.url)
	body := abandonBody(false)
	held := async(t, r.url, key, body) // takes the only seat
	waitUntil(t, "the engine holding a request", func() bool { return up.inflight.Load() == 1 })
	c := rawRequest(t, r.url, key, body)
	waitUntil(t, "a request queued for a seat", func() bool { return g.QueueLength() == 1 })
	if us := userStatus(t, g); us.Active != 2 || us.Quota[0].Requests != 2 {
		t.Fatalf("%d active, %d requests counted; want 2 and 2", us.Active, us.Quota[0].Requests)
	}
	c.Close()
	waitUntil(t, "the abandoned request settled", func() bool { return userStatus(t, g).Active == 1 })
	us := userStatus(t, g)
	if us.Quota[0].Requests != 1 || us.RPM.Remaining != 1 {
		t.Fatalf("after the client left: %d requests counted, %d left in the RPM bucket; want 1 and 1",
			us.Quota[0].Requests, us.RPM.Remaining)
	}
	up.release <- struct{}{}
	want(t, <-held, 200, "")
	if up.hits.Load() != 1 {
		t.Fatalf("the engine saw %d requests, want 1 (the abandoned one was never sent)", up.hits.Load())
	}
}
