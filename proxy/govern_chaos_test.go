// Governance accounting under failures: every seat, user slot and quota
// settles exactly once, whatever ends the request.

package proxy

import (
	"bufio"
	"fmt"
	"github.com/infera/infera/config"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/testsrv"
	"github.com/valyala/fasthttp"
)

// chaos answers per a script shared by every engine using it.
type chaos struct {
	mu  sync.Mutex
	seq []string
	i   int
}

func (c *chaos) next() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.seq[c.i%len(c.seq)]
	c.i++
	return b
}

func (c *chaos) handler(ok fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		switch c.next() {
		case "500":
			ctx.SetStatusCode(500)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"boom","type":"server_error"}}`)
		case "503":
			ctx.SetStatusCode(503)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"busy","type":"server_error"}}`)
		case "429":
			ctx.SetStatusCode(429)
			ctx.Response.Header.Set("Retry-After", "3")
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"busy","type":"rate_limit_error"}}`)
		case "400":
			ctx.SetStatusCode(400)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"bad","type":"invalid_request_error"}}`)
		case "close":
			ctx.Conn().Close()
		default:
			ok(ctx)
		}
	}
}

// userStatus reads alice's counters.
func userStatus(t *testing.T, g *govern.Governor) govern.UserStatus {
	t.Helper()
	us, err := g.UserStatus("alice")
	if err != nil {
		t.Fatal(err)
	}
	return us
}

func checkSettled(t *testing.T, url string, g *govern.Governor, served, usage200 int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		us := userStatus(t, g)
		seats := metricFloat(t, url, `infera_rate_limit_seats{counter="overall"}`) +
			metricFloat(t, url, `infera_rate_limit_seats{counter="prefill"}`) +
			metricFloat(t, url, `infera_rate_limit_seats{counter="decode"}`)
		okNow := us.Active == 0 && seats == 0 && us.Quota[0].Requests == int64(served) && us.Quota[0].Tokens == float64(8*usage200)
		if okNow {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled: active %d seats %v; quota requests %d (want %d served), tokens %v (want %d)",
				us.Active, seats, us.Quota[0].Requests, served, us.Quota[0].Tokens, 8*usage200)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const reviewUsers = `
	"user_limit": {"templates": [{"name": "t", "default": true,
		"concurrency": {"enabled": true, "limit": 8},
		"quota": {"enabled": true, "weights": {"input": 1, "output": 1, "cached": 1},
			"windows": [{"period": "day", "max_requests": 100000}]}}]},
	"users": [{"name": "alice", "keys": [%q]}]`

// A mixed fleet whose engines fail in every way before the first byte:
// every seat comes back, the user's slot comes back, and the quota counts
// exactly the requests that were served (2xx and 4xx answers), with the
// engine's usage.
func TestMixedFailuresSettleEverySeatAndQuotaExactly(t *testing.T) {
	t.Run("local", func(t *testing.T) { mixedChaos(t, "") })
	t.Run("redis", func(t *testing.T) { mixedChaos(t, testsrv.StartRedis(t).URL) })
}

func mixedChaos(t *testing.T, state string) {
	c := &chaos{seq: []string{"ok", "500", "429", "ok", "close", "400", "503", "ok", "500", "500", "close", "429"}}
	var ups []string
	for i := 0; i < 3; i++ {
		ups = append(ups, startUpstream(t, c.handler(okHandler)).url)
	}
	key, hash := mintKey(t)
	f := defaultFlags()
	f.BreakerFailureThreshold = 1000
	cfg := govConfig(t, fmt.Sprintf(`{"rate_limit": {"scope": "instance", "overall_concurrency": 4, "prefill_concurrency": 4},`+reviewUsers+`}`, hash))
	g := newGovernorAt(t, state, cfg)
	r := startRouterGov(t, f, cfg, g, ups...)
	served, ok200 := 0, 0
	for i := 0; i < 48; i++ {
		resp := apiCall(t, r.url, key, chatBody)
		if resp.status < 500 && resp.status != 429 {
			served++
		}
		if resp.status == 200 {
			ok200++
		}
	}
	checkSettled(t, r.url, g, served, ok200)
}

// The same through vLLM PD pairs.
func TestPDPullFailuresSettleEverySeatAndQuotaExactly(t *testing.T) {
	t.Run("local", func(t *testing.T) { pullChaos(t, "") })
	t.Run("redis", func(t *testing.T) { pullChaos(t, testsrv.StartRedis(t).URL) })
}

func pullChaos(t *testing.T, state string) {
	pc := &chaos{seq: []string{"ok", "ok", "500", "ok", "429", "ok", "close", "ok", "400", "ok"}}
	dc := &chaos{seq: []string{"ok", "500", "429", "ok", "close", "400", "503", "ok", "500", "close", "429"}}
	var pl, dl legLog
	var st atomic.Int32
	p1 := startUpstream(t, pc.handler(vllmPrefill(&pl, "engine-p", &st)))
	p2 := startUpstream(t, pc.handler(vllmPrefill(&pl, "engine-p", &st)))
	d1 := startUpstream(t, dc.handler(decodeEngine(&dl, `"remote_engine_id":"engine-p"`, &st)))
	d2 := startUpstream(t, dc.handler(decodeEngine(&dl, `"remote_engine_id":"engine-p"`, &st)))
	key, hash := mintKey(t)
	cfg := govConfig(t, fmt.Sprintf(`{"rate_limit": {"scope": "instance", "prefill_concurrency": 4, "decode_concurrency": 4},
		"pd": {"mode": "vllm", "prefill_timeout_s": 10},`+reviewUsers+`}`, hash))
	g := newGovernorAt(t, state, cfg)
	f := defaultFlags()
	f.BreakerFailureThreshold = 1000
	f.RequestMaxRetries = 2
	r := startPDRouterGov(t, f, cfg, g, pdWorker("p1", p1.url, "prefill", ""), pdWorker("p2", p2.url, "prefill", ""),
		pdWorker("d1", d1.url, "decode", ""), pdWorker("d2", d2.url, "decode", ""))
	served, ok200 := 0, 0
	for i := 0; i < 48; i++ {
		resp := apiCall(t, r.url, key, chatBody)
		if resp.status < 500 && resp.status != 429 {
			served++
		}
		if resp.status == 200 {
			ok200++
		}
	}
	noLoadLeft(t, r.fl)
	checkSettled(t, r.url, g, served, ok200)
}

// slowStream streams a few events with usage, slowly.
func slowStream(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/event-stream")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		for i := 0; i < 5; i++ {
			w.WriteString("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
			if w.Flush() != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		w.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1,\"total_tokens\":8}}\n\ndata: [DONE]\n\n")
		w.Flush()
	})
}

// Streams, concurrent clients, clients that leave before or after the
// first byte, engines that fail or hang: every seat and slot comes back.
func TestStreamFailuresAndClientsLeavingReturnEverySeat(t *testing.T) {
	t.Run("local", func(t *testing.T) { streamChaos(t, "") })
	t.Run("redis", func(t *testing.T) { streamChaos(t, testsrv.StartRedis(t).URL) })
}

func streamChaos(t *testing.T, state string) {
	c := &chaos{seq: []string{"ok", "500", "ok", "429", "close", "ok", "hang", "400", "ok", "503"}}
	h := c.handler(slowStream)
	hang := func(ctx *fasthttp.RequestCtx) {
		if c.next() == "hang" {
			time.Sleep(400 * time.Millisecond)
		}
		h(ctx)
	}
	var ups []string
	for i := 0; i < 3; i++ {
		ups = append(ups, startUpstream(t, hang).url)
	}
	key, hash := mintKey(t)
	f := defaultFlags()
	f.BreakerFailureThreshold = 1000
	cfg := govConfig(t, fmt.Sprintf(`{"rate_limit": {"scope": "instance", "overall_concurrency": 3, "prefill_concurrency": 2, "overlimit": "queue", "queue_size": 100, "queue_timeout_ms": 2000},
		"timeouts": {"stream_first_packet_s": 0.2},`+reviewUsers+`}`, hash))
	g := newGovernorAt(t, state, cfg)
	r := startRouterGov(t, f, cfg, g, ups...)
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			conn := rawRequest(t, r.url, key, body)
			defer conn.Close()
			switch i % 4 {
			case 0: // leaves at once
				time.Sleep(time.Duration(i) * time.Millisecond)
				return
			case 1: // leaves after the first bytes
				conn.SetReadDeadline(time.Now().Add(3 * time.Second))
				b := make([]byte, 512)
				conn.Read(b)
				return
			default:
				conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				b := make([]byte, 4096)
				for {
					if _, err := conn.Read(b); err != nil {
						return
					}
				}
			}
		}(i)
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		us := userStatus(t, g)
		seats := metricFloat(t, r.url, `infera_rate_limit_seats{counter="overall"}`) +
			metricFloat(t, r.url, `infera_rate_limit_seats{counter="prefill"}`)
		if us.Active == 0 && seats == 0 && g.QueueLength() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled: active %d seats %v queued %d", us.Active, seats, g.QueueLength())
		}
		time.Sleep(20 * time.Millisecond)
	}
	noLoadLeft(t, r.fl)
}

// A request refused because smart model selection chose a model outside
// the user's list ended while still under the liveness watchdog: its
// pooled state kept the client's socket, and when that client hung up the
// watchdog aborted the attempt and canceled the governance context of
// whichever request used the state next, which was dropped (no answer at
// all, counted 499). Releasing a state now always stops its watch.
func TestASmartSelectionRefusalLeavesNoWatchOnThePooledState(t *testing.T) {
	cls := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"tier":"L3"}`) })
	up := startUpstream(t, okHandler)
	key, hash := mintKey(t)
	cfg := govConfig(t, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true, "rate": {"enabled": true, "rpm": 100000}}]},
		"users": [{"name": "alice", "keys": [%q], "models": ["auto", "m"]}]}`, hash))
	cfg.SmartModelSelection = config.SmartModelSelection{Enabled: true, ClassifierURL: cls.url + "/v1/classify",
		TimeoutMS: 10000, FallbackTier: "L3", MatchModels: []string{"auto"},
		Tiers: config.TierModels{L1: "t3", L2: "t3", L3: "t3"}, MaxTextBytes: 8192}
	g := newGovernor(t, cfg)
	r := startRouterGov(t, nil, cfg, g, up.url)
	for round := 0; round < 5; round++ {
		// The refused request: its client reads the 403, then hangs up.
		c := rawRequest(t, r.url, key, `{"model":"auto","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 4096)
		n, _ := c.Read(b)
		if !strings.Contains(string(b[:n]), " 403 ") {
			t.Fatalf("want 403 model_not_allowed: %q", b[:n])
		}
		time.Sleep(150 * time.Millisecond) // past livenessAfter
		c.Close()
		time.Sleep(500 * time.Millisecond) // the watchdog ticks
		for i := 0; i < 10; i++ {
			req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(chatBody))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Close = true
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("round %d request %d: a healthy request got no answer: %v", round, i, err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("round %d request %d: %d", round, i, resp.StatusCode)
			}
		}
	}
}
