package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/sockio"
	"github.com/infera/infera/kv"
	"github.com/infera/infera/kvroute"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
	"github.com/infera/infera/tokenizer"
	"github.com/valyala/fasthttp"
)

// upstream is a real fasthttp server on a loopback port standing in for an
// engine; each test scripts its behaviour.
type upstream struct {
	url  string
	ln   net.Listener
	hits atomic.Int64
	srv  *fasthttp.Server

	// live holds the state of each connection the server has not closed
	// yet (ConnState), for stop.
	mu   sync.Mutex
	live map[net.Conn]fasthttp.ConnState
}

// connState records c's state for stop.
func (u *upstream) connState(c net.Conn, st fasthttp.ConnState) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if st == fasthttp.StateClosed || st == fasthttp.StateHijacked {
		delete(u.live, c)
		return
	}
	u.live[c] = st
}

// stop shuts the server down. Shutdown closes the idle connections (the
// router's pooled ones), then finds them still counted open, as their
// goroutines end a moment later, and waits for its next poll, 100 ms
// later: for each upstream of each test. stop closes the idle connections
// first and waits (at most a second) until the server is done with them
// (StateClosed comes after the server stops counting a connection open),
// so that Shutdown finds them gone; Shutdown still waits, as before, for
// any other connection.
func (u *upstream) stop() {
	u.mu.Lock()
	var idle []net.Conn
	for c, st := range u.live {
		if st == fasthttp.StateIdle {
			idle = append(idle, c)
			c.Close()
		}
	}
	u.mu.Unlock()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		u.mu.Lock()
		n := 0
		for _, c := range idle {
			if _, ok := u.live[c]; ok {
				n++
			}
		}
		u.mu.Unlock()
		if n == 0 {
			break
		}
	}
	u.srv.Shutdown()
}

func startUpstream(t testing.TB, h fasthttp.RequestHandler) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{url: "http://" + ln.Addr().String(), ln: ln, live: map[net.Conn]fasthttp.ConnState{}}
	u.srv = &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		u.hits.Add(1)
		h(ctx)
	}, CloseOnShutdown: true, ConnState: u.connState}
	go u.srv.Serve(ln)
	t.Cleanup(u.stop)
	return u
}

// deadURL returns a loopback URL that refuses connections.
func deadURL(t testing.TB) string {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

const okJSON = `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":3}}}`

func okHandler(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	ctx.SetBodyString(okJSON)
}

type testRouter struct {
	url   string
	srv   *Server
	fl    *fleet.Fleet
	store *config.Store
	flags *config.Serve
}

func defaultFlags() *config.Serve {
	return &config.Serve{
		MaxBodyBytes: 1 << 20, RouterMode: "auto", RouterPolicy: "round-robin",
		RequestMaxRetries: 1, BreakerFailureThreshold: 3, BreakerCooldownS: 5, BreakerMaxCooldownS: 60,
		MaxConnsPerWorker: 512, ConnectTimeout: time.Second, KVBlockSize: 16,
		RouterTokenizeMaxBytes: 262144,
	}
}

// startRouter starts a proxy Server on a loopback port in front of urls.
func startRouter(t testing.TB, f *config.Serve, cfg *config.Config, urls ...string) *testRouter {
	t.Helper()
	if f == nil {
		f = defaultFlags()
	}
	if cfg == nil {
		cfg = config.Default()
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
	if f.RouterPolicy == "kv-aware" {
		// The kv-aware request path: render, tokenize and hash every prompt.
		idx := radix.New()
		sc.KV = kvroute.NewKVAware(kvroute.KVAwareConfig{Index: idx, OverlapWeight: 1, BlockSize: 16})
		opts.Tokenizer, opts.HashBlocks = tokenizer.Simple{}, kv.HashBlocks
		if f.RouterTokenizerPath != "" {
			tok, err := tokenizer.Load(f.RouterTokenizerPath)
			if err != nil {
				t.Fatal(err)
			}
			opts.Tokenizer = tok
		}
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

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// checkOpenAIError asserts an OpenAI-shaped error body.
func checkOpenAIError(t *testing.T, body string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body: %q (%v)", body, err)
	}
}

func TestNonStreamForwardsBodyUntouched(t *testing.T) {
	var got atomic.Value
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		got.Store(string(ctx.PostBody()) + "|" + string(ctx.Path()) + "|" + string(ctx.Request.Header.Peek("x-worker-instance-id")))
		okHandler(ctx)
	})
	r := startRouter(t, nil, nil, up.url)
	body := `{"model":"m", "messages":[{"role":"user","content":"h\u00e9llo"}], "extra":{"keep":[1,2,3]}}`
	req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("x-worker-instance-id", "w0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != okJSON {
		t.Fatalf("status %d body %q", resp.StatusCode, b)
	}
	if want := body + "|/v1/chat/completions|"; got.Load() != want {
		t.Fatalf("upstream got %q, want %q", got.Load(), want)
	}
	if resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("content type %q", resp.Header.Get("Content-Type"))
	}
	for _, w := range r.fl.View().All {
		if n := w.Load.Requests.Load(); n != 0 {
			t.Fatalf("worker %s still has %d active requests", w.ID, n)
		}
	}
}

func TestCompletionsAndModels(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	if code, b := post(t, r.url+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`); code != 200 {
		t.Fatalf("completions: %d %s", code, b)
	}
	resp, err := http.Get(r.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"id":"m"`) || !strings.Contains(string(b), `"object":"list"`) {
		t.Fatalf("models: %s", b)
	}
}

func TestBadInput(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.MaxBodyBytes = 4096
	r := startRouter(t, f, nil, up.url)
	check := func(path, body string, want int) {
		t.Helper()
		code, b := post(t, r.url+path, body)
		if code != want {
			t.Fatalf("%s %q: status %d, want %d (%s)", path, trunc(body), code, want, b)
		}
		checkOpenAIError(t, b)
	}
	check("/v1/chat/completions", `{"model":"m","messages":[`, 400)
	check("/v1/chat/completions", `not json`, 400)
	check("/v1/chat/completions", `[1,2]`, 400)
	check("/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, 400)
	check("/v1/chat/completions", `{"model":3,"messages":[{"role":"user","content":"x"}]}`, 400)
	check("/v1/chat/completions", `{"model":"m"}`, 400)
	check("/v1/chat/completions", `{"model":"m","messages":[]}`, 400)
	check("/v1/chat/completions", `{"model":"m","messages":"x"}`, 400)
	check("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"maybe"}`, 400)
	check("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-1}`, 400)
	check("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]} trailing`, 400)
	check("/v1/completions", `{"model":"m"}`, 400)
	check("/v1/completions", `{"model":"m","prompt":{}}`, 400)
	check("/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404)
	check("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("x", 5000)+`"}]}`, 413)
	check("/v1/nothing", `{}`, 404)
	resp, err := http.Get(r.url + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Fatalf("GET chat: %d", resp.StatusCode)
	}
	if up.hits.Load() != 0 {
		t.Fatalf("bad input reached the engine %d times", up.hits.Load())
	}
	// The server keeps serving.
	if code, _ := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
		t.Fatalf("after bad input: %d", code)
	}
}

func trunc(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

func TestAPIKey(t *testing.T) {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if len(ctx.Request.Header.Peek("Authorization")) != 0 {
			ctx.SetStatusCode(500) // the router's key must not leak to engines
			return
		}
		okHandler(ctx)
	})
	f := defaultFlags()
	f.APIKey = "sekret"
	r := startRouter(t, f, nil, up.url)
	if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 401 {
		t.Fatalf("no key: %d %s", code, b)
	}
	req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer sekret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("with key: %d", resp.StatusCode)
	}
}

// sseUpstream streams n events; before event i (i >= 1) it waits on gate
// when gate is non-nil. It records whether a write to the client failed.
type sseUpstream struct {
	n         int
	gate      chan struct{}
	delay     time.Duration
	preDelay  time.Duration
	written   atomic.Int64
	writeErrs atomic.Int64
	finished  atomic.Int64
}

func (s *sseUpstream) handler(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/event-stream")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		time.Sleep(s.preDelay)
		for i := 0; i < s.n; i++ {
			if i > 0 && s.gate != nil {
				<-s.gate
			}
			if i > 0 && s.delay > 0 {
				time.Sleep(s.delay)
			}
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			if err := w.Flush(); err != nil {
				s.writeErrs.Add(1)
				return
			}
			s.written.Add(1)
		}
		fmt.Fprintf(w, "data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", s.n)
		if err := w.Flush(); err != nil {
			s.writeErrs.Add(1)
			return
		}
		s.finished.Add(1)
	})
}

const streamBody = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":8}`

func TestStreamFirstEventBeforeUpstreamFinishes(t *testing.T) {
	su := &sseUpstream{n: 3, gate: make(chan struct{})}
	up := startUpstream(t, su.handler)
	r := startRouter(t, nil, nil, up.url)
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	// The upstream is blocked on the gate: it cannot have finished.
	if line != "data: {\"i\":0}\n" || su.finished.Load() != 0 {
		t.Fatalf("first line %q finished=%d", line, su.finished.Load())
	}
	close(su.gate)
	rest, _ := io.ReadAll(br)
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || !strings.Contains(string(rest), `{"i":2}`) {
		t.Fatalf("rest %q", rest)
	}
	waitFor(t, func() bool { return r.fl.View().All[0].Load.Requests.Load() == 0 }, "load released")
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for i := 0; i < 300; i++ {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestClientDisconnectStopsUpstream(t *testing.T) {
	su := &sseUpstream{n: 10000, delay: 2 * time.Millisecond}
	up := startUpstream(t, su.handler)
	r := startRouter(t, nil, nil, up.url)
	conn, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(streamBody), streamBody)
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"i":3`) {
			break
		}
	}
	conn.Close()
	waitFor(t, func() bool { return su.writeErrs.Load() == 1 }, "the engine to see its client go away")
	if su.finished.Load() != 0 || su.written.Load() >= 10000 {
		t.Fatalf("engine kept generating: written=%d", su.written.Load())
	}
	waitFor(t, func() bool { return r.fl.View().All[0].Load.Requests.Load() == 0 }, "load released")
}

func TestFailoverOnRefusedConnection(t *testing.T) {
	up := startUpstream(t, okHandler)
	dead := deadURL(t)
	r := startRouter(t, nil, nil, dead, up.url)
	for i := 0; i < 10; i++ {
		if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, b)
		}
	}
	// retries 0: fail fast, some requests see 502.
	f := defaultFlags()
	f.RequestMaxRetries = 0
	f.BreakerFailureThreshold = 0
	r0 := startRouter(t, f, nil, dead, up.url)
	var bad int
	for i := 0; i < 10; i++ {
		code, b := post(t, r0.url+"/v1/chat/completions", chatBody)
		if code == 502 {
			checkOpenAIError(t, b)
			bad++
		} else if code != 200 {
			t.Fatalf("unexpected %d %s", code, b)
		}
	}
	if bad != 5 {
		t.Fatalf("round-robin over a dead and a live worker with no retries: %d failures, want 5", bad)
	}
}

// Every worker refusing connections, every one tried within the retries:
// the fleet is down for the request, 503 no_workers_reachable, from the
// first request on (it was a 502 upstream_unreachable until the breakers
// opened); a worker left untried by the retries keeps it a 502.
func TestEveryWorkerRefusingConnectionsIs503FromTheFirstRequest(t *testing.T) {
	r := startRouter(t, nil, nil, deadURL(t), deadURL(t)) // 1 retry: both tried
	for i := 0; i < 2; i++ {
		code, b := post(t, r.url+"/v1/chat/completions", chatBody)
		if code != 503 || !strings.Contains(b, "no_workers_reachable") {
			t.Fatalf("request %d: %d %s", i, code, b)
		}
	}
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r0 := startRouter(t, f, nil, deadURL(t), deadURL(t))
	if code, b := post(t, r0.url+"/v1/chat/completions", chatBody); code != 502 || !strings.Contains(b, "upstream_unreachable") {
		t.Fatalf("one of two dead workers tried: %d %s", code, b)
	}
}

// A response head without its body, or cut part-way (inside the status
// line or the headers, after a 100 Continue), then a close or a reset, is
// an invalid response: both workers are tried and the client gets 502
// upstream_protocol_error. It was a connection failure (502
// upstream_unreachable, then 503 no_workers_reachable though both workers
// had answered).
func TestAHeadWithoutItsBodyOrCutPartWayIsAnInvalidResponse(t *testing.T) {
	for _, tc := range []struct {
		head  string
		reset bool
	}{
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n", false},
		{"HTT", true},
		{"HTTP/1.1 200 OK\r\n", true},
		{"HTTP/1.1 200 OK\r\nContent-Type: appl", true},
		{"HTTP/1.1 100 Continue\r\n\r\n", true},
	} {
		t.Run(tc.head, func(t *testing.T) {
			cut := func(n int, req string, c net.Conn) {
				c.Write([]byte(tc.head))
				if tc.reset {
					time.Sleep(20 * time.Millisecond)
					c.(*net.TCPConn).SetLinger(0)
				}
				c.Close()
			}
			a, b := startRaw(t, cut), startRaw(t, cut)
			r := startRouter(t, nil, nil, a.url, b.url)
			code, body := post(t, r.url+"/v1/chat/completions", chatBody)
			if code != 502 || !strings.Contains(body, "upstream_protocol_error") {
				t.Fatalf("%d %s", code, body)
			}
			if a.conns.Load() == 0 || b.conns.Load() == 0 {
				t.Fatalf("both workers tried? %d %d", a.conns.Load(), b.conns.Load())
			}
		})
	}
}

func TestRetryOn429And5xxNotMidStream(t *testing.T) {
	var busy atomic.Bool
	busy.Store(true)
	full := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(429)
		ctx.SetBodyString(`{"error":{"message":"full","type":"rate_limit_error"}}`)
	})
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, full.url, up.url)
	for i := 0; i < 6; i++ {
		if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
	}
	// 429 never trips the breaker.
	for _, w := range r.fl.View().All {
		if w.Breaker.State() != fleet.BreakerClosed {
			t.Fatalf("429 tripped the breaker of %s", w.ID)
		}
	}
	// When the only worker answers 429 the client gets that answer.
	r1 := startRouter(t, nil, nil, full.url)
	if code, b := post(t, r1.url+"/v1/chat/completions", chatBody); code != 429 || !strings.Contains(b, "full") {
		t.Fatalf("%d %s", code, b)
	}
}

func TestBreaker(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	bad := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if failing.Load() {
			ctx.SetStatusCode(500)
			ctx.SetBodyString(`{"error":{"message":"boom"}}`)
			return
		}
		okHandler(ctx)
	})
	good := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RequestMaxRetries = 0
	f.BreakerCooldownS = 0.2
	f.BreakerMaxCooldownS = 0.5
	r := startRouter(t, f, nil, bad.url, good.url)
	w := r.fl.Get("w0")
	for i := 0; i < 6; i++ { // round-robin: 3 go to the bad worker
		post(t, r.url+"/v1/chat/completions", chatBody)
	}
	if w.Breaker.State() != fleet.BreakerOpen || w.Breaker.Trips() != 1 {
		t.Fatalf("after 3 faults: state %d trips %d", w.Breaker.State(), w.Breaker.Trips())
	}
	hits := bad.hits.Load()
	for i := 0; i < 10; i++ {
		if code, _ := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
			t.Fatalf("open worker not excluded: %d", code)
		}
	}
	if bad.hits.Load() != hits {
		t.Fatalf("open worker received traffic")
	}
	// After the cooldown one probe is admitted; it fails: the cooldown doubles.
	time.Sleep(250 * time.Millisecond)
	for i := 0; i < 4; i++ {
		post(t, r.url+"/v1/chat/completions", chatBody)
	}
	if bad.hits.Load() != hits+1 || w.Breaker.Trips() != 2 {
		t.Fatalf("probe: hits %d (want %d) trips %d", bad.hits.Load(), hits+1, w.Breaker.Trips())
	}
	time.Sleep(250 * time.Millisecond) // doubled cooldown (0.4 s) not over
	for i := 0; i < 4; i++ {
		post(t, r.url+"/v1/chat/completions", chatBody)
	}
	if bad.hits.Load() != hits+1 {
		t.Fatalf("probe admitted before the doubled cooldown")
	}
	failing.Store(false)
	time.Sleep(200 * time.Millisecond)
	for i := 0; i < 4; i++ {
		post(t, r.url+"/v1/chat/completions", chatBody)
	}
	if w.Breaker.State() != fleet.BreakerClosed || bad.hits.Load() < hits+3 {
		t.Fatalf("successful probe did not restore: state %d hits %d", w.Breaker.State(), bad.hits.Load()-hits)
	}
}

func TestBreaker4xxDoesNotTripAndAllOpenDispatches(t *testing.T) {
	var status atomic.Int64
	status.Store(400)
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(int(status.Load()))
		ctx.SetBodyString(`{"error":{"message":"x"}}`)
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, nil, up.url)
	w := r.fl.Get("w0")
	for i := 0; i < 10; i++ {
		if code, _ := post(t, r.url+"/v1/chat/completions", chatBody); code != 400 {
			t.Fatalf("got %d", code)
		}
	}
	if w.Breaker.State() != fleet.BreakerClosed {
		t.Fatal("4xx tripped the breaker")
	}
	status.Store(503)
	for i := 0; i < 3; i++ {
		post(t, r.url+"/v1/chat/completions", chatBody)
	}
	if w.Breaker.State() != fleet.BreakerOpen {
		t.Fatal("5xx did not trip the breaker")
	}
	hits := up.hits.Load()
	status.Store(200)
	// The only candidate is open: the router dispatches anyway.
	if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 || up.hits.Load() != hits+1 {
		t.Fatalf("all-open: %d %s", code, b)
	}
}

func TestTimeouts(t *testing.T) {
	hang := startUpstream(t, func(ctx *fasthttp.RequestCtx) { time.Sleep(2 * time.Second) })
	cfg := config.Default()
	cfg.Timeouts.NonStreamTotalSeconds = 0.2
	cfg.Timeouts.StreamFirstPacketSeconds = 0.2
	cfg.Timeouts.StreamIdleSeconds = 0.2
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, cfg, hang.url)
	t0 := time.Now()
	code, b := post(t, r.url+"/v1/chat/completions", chatBody)
	if code != 504 || time.Since(t0) > time.Second {
		t.Fatalf("non-stream total: %d after %v: %s", code, time.Since(t0), b)
	}
	checkOpenAIError(t, b)
	code, b = post(t, r.url+"/v1/chat/completions", streamBody)
	if code != 504 {
		t.Fatalf("first packet: %d %s", code, b)
	}

	// Idle: first event, then silence longer than the idle timeout.
	stall := &sseUpstream{n: 2, gate: make(chan struct{})}
	defer close(stall.gate)
	su := startUpstream(t, stall.handler)
	r2 := startRouter(t, f, cfg, su.url)
	t0 = time.Now()
	code, b = post(t, r2.url+"/v1/chat/completions", streamBody)
	if code != 200 || !strings.HasPrefix(b, "data: {\"i\":0}\n\n") || !strings.Contains(b, "timed out") || !strings.HasSuffix(b, "data: [DONE]\n\n") ||
		!strings.Contains(b, `"code":"timeout"`) { // as the 504 before the first byte (it was null)
		t.Fatalf("idle: %d %q", code, b)
	}
	if el := time.Since(t0); el > time.Second {
		t.Fatalf("idle timeout took %v", el)
	}

	// Total: events keep flowing but the whole stream is capped.
	slow := &sseUpstream{n: 50, delay: 20 * time.Millisecond}
	su2 := startUpstream(t, slow.handler)
	cfg2 := config.Default()
	cfg2.Timeouts.StreamTotalSeconds = 0.3
	r3 := startRouter(t, f, cfg2, su2.url)
	t0 = time.Now()
	code, b = post(t, r3.url+"/v1/chat/completions", streamBody)
	if code != 200 || !strings.Contains(b, "timed out") || strings.Contains(b, `"i":49`) || !strings.Contains(b, `"code":"timeout"`) {
		t.Fatalf("total: %d %q", code, trunc(b))
	}
	if el := time.Since(t0); el > 900*time.Millisecond {
		t.Fatalf("total timeout took %v", el)
	}

	// Slow first packet but in time: the stream is fine (deadline cleared).
	okSlow := &sseUpstream{n: 3, preDelay: 50 * time.Millisecond, delay: 100 * time.Millisecond}
	su3 := startUpstream(t, okSlow.handler)
	r4 := startRouter(t, f, cfg, su3.url)
	for i := 0; i < 2; i++ { // second run reuses the pooled connection
		code, b = post(t, r4.url+"/v1/chat/completions", streamBody)
		if code != 200 || !strings.HasSuffix(b, "data: [DONE]\n\n") || strings.Contains(b, "error") {
			t.Fatalf("in-time stream: %d %q", code, b)
		}
	}
}

func TestMidStreamFailureIsNotRetried(t *testing.T) {
	// The upstream sends one event, then drops the connection.
	drop := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			w.WriteString("data: {\"i\":0}\n\n")
			w.Flush()
			time.Sleep(20 * time.Millisecond)
			ctx.Conn().Close()
		})
	})
	other := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, drop.url, other.url)
	r.srv.sched.Policy = sched.PolicyRoundRobin
	var sawDrop bool
	for i := 0; i < 2; i++ {
		code, b := post(t, r.url+"/v1/chat/completions", streamBody)
		if strings.HasPrefix(b, "data: {\"i\":0}") {
			sawDrop = true
			if code != 200 || !strings.Contains(b, `"error"`) || !strings.HasSuffix(b, "data: [DONE]\n\n") {
				t.Fatalf("mid-stream failure: %d %q", code, b)
			}
		}
	}
	if !sawDrop || other.hits.Load() != 1 {
		t.Fatalf("sawDrop=%v other hits=%d", sawDrop, other.hits.Load())
	}
}

func TestLeastRequestsSpreadsLoad(t *testing.T) {
	var mu sync.Mutex
	perWorker := map[string]int{}
	gate := make(chan struct{})
	mk := func(name string) *upstream {
		return startUpstream(t, func(ctx *fasthttp.RequestCtx) {
			mu.Lock()
			perWorker[name]++
			mu.Unlock()
			<-gate
			okHandler(ctx)
		})
	}
	a, b2 := mk("a"), mk("b")
	cfg := config.Default()
	cfg.LoadBalancing.Algorithm = "least-requests"
	f := defaultFlags()
	f.RouterPolicy = "config"
	r := startRouter(t, f, cfg, a.url, b2.url)
	// One request at a time, each held at its worker before the next is
	// sent: every decision sees the ones before it in flight. (Sent all at
	// once, two decisions may read the same counts and pick one worker.)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); post(t, r.url+"/v1/chat/completions", chatBody) }()
		waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return perWorker["a"]+perWorker["b"] == i+1 }, "dispatch")
	}
	close(gate)
	wg.Wait()
	if perWorker["a"] != 4 || perWorker["b"] != 4 {
		t.Fatalf("least-requests split %v", perWorker)
	}
}

func TestHealthAndMetrics(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	post(t, r.url+"/v1/chat/completions", chatBody)
	resp, err := http.Get(r.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !json.Valid(b) || !bytes.Contains(b, []byte(`"routable":1`)) {
		t.Fatalf("health %d %s", resp.StatusCode, b)
	}
	resp, err = http.Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`infera_router_worker_breaker_state{worker="w0"} 0`, `infera_usage_tokens_total{kind="cached"}`, `infera_requests_total{endpoint="chat"}`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Fatalf("metrics lack %q", want)
		}
	}
	// No routable worker: 503.
	r0 := startRouter(t, nil, nil)
	resp, _ = http.Get(r0.url + "/health")
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("empty fl health %d", resp.StatusCode)
	}
	if code, b := post(t, r0.url+"/v1/chat/completions", chatBody); code != 503 {
		t.Fatalf("empty fl: %d %s", code, b)
	}
}

func mustPolicy(s string) sched.Policy {
	p, ok := sched.ParsePolicy(s)
	if !ok {
		panic("bad policy " + s)
	}
	return p
}

// Client and upstream sockets go through sockio (raw system calls, lazy
// deadlines, and a request/response exchange with no read that finds
// nothing): a refactor that dialed or accepted around it would silently
// bring the runtime's per-call scheduler work back.
func TestClientAndUpstreamConnectionsUseRawSocketIO(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	p := r.fl.Get("w0").Client.(*httpPool)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle) != 1 {
		t.Fatalf("%d idle upstream connections, want 1", len(p.idle))
	}
	if _, ok := p.idle[0].nc.(*sockio.Conn); !ok {
		t.Fatalf("upstream connection is a %T, not a *sockio.Conn", p.idle[0].nc)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go net.Dial("tcp4", ln.Addr().String())
	c, err := (&listener{Listener: ln}).Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if cc, ok := c.(*clientConn); !ok || cc.fd < 0 {
		t.Fatalf("accepted %T, not a clientConn with its descriptor", c)
	} else if _, ok := cc.Conn.(*sockio.Conn); !ok {
		t.Fatalf("client connection is a %T, not a *sockio.Conn", cc.Conn)
	}
}

// A request body too big for one buffer (over 64 KiB) is written on a
// pooled connection whose previous deadline has passed while it was idle:
// the new request's deadline applies, not the stale one.
func TestLargeBodyOnAPooledConnectionAfterItsOldDeadlinePassed(t *testing.T) {
	up := startUpstream(t, okHandler)
	cfg := config.Default()
	cfg.Timeouts.NonStreamTotalSeconds = 0.2
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, cfg, up.url)
	if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
		t.Fatalf("first request: %d %s", code, b)
	}
	time.Sleep(300 * time.Millisecond) // its deadline passes on the idle connection
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 100<<10) + `"}],"max_tokens":4}`
	if code, b := post(t, r.url+"/v1/chat/completions", big); code != 200 {
		t.Fatalf("large body on the pooled connection: %d %s", code, b)
	}
	if n := up.hits.Load(); n != 2 {
		t.Fatalf("upstream hits %d, want 2", n)
	}
}

// qwen3Dir returns the Qwen3 tokenizer's directory, skipping the test when
// it is missing (failing it under INFERA_REQUIRE_TOKENIZER).
func qwen3Dir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join("..", "testdata", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("INFERA_REQUIRE_TOKENIZER") != "" {
			t.Fatal("Qwen3 tokenizer missing (make tokenizer)")
		}
		t.Skip("Qwen3 tokenizer missing (make tokenizer)")
	}
	return dir
}
