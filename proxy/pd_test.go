package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/netpeek"
	"github.com/infera/infera/sched"
	"github.com/valyala/fasthttp"
)

// startPDRouter starts a proxy Server in front of the workers recs.
func startPDRouter(t *testing.T, f *config.Serve, cfg *config.Config, recs ...fleet.Record) *testRouter {
	t.Helper()
	return startPDRouterGov(t, f, cfg, nil, recs...)
}

// startPDRouterGov is startPDRouter with governance g (nil: none).
func startPDRouterGov(t *testing.T, f *config.Serve, cfg *config.Config, g *govern.Governor, recs ...fleet.Record) *testRouter {
	t.Helper()
	return startPDRouterWith(t, f, cfg, g, nil, recs...)
}

// startPDRouterWith is startPDRouterGov with opt applied to the server's
// options (nil: none).
func startPDRouterWith(t *testing.T, f *config.Serve, cfg *config.Config, g *govern.Governor, opt func(*Options), recs ...fleet.Record) *testRouter {
	t.Helper()
	if f == nil {
		f = defaultFlags()
	}
	fl := fleet.NewFleet(fleet.BreakerConfig{Threshold: f.BreakerFailureThreshold, Cooldown: f.BreakerCooldown(), MaxCooldown: f.BreakerMaxCooldown()})
	t.Cleanup(fl.Close)
	fl.AddHook(HTTPHook(f))
	if errs := fl.Sync(recs); len(errs) > 0 {
		t.Fatal(errs)
	}
	store := config.NewStore("", cfg)
	sc := sched.NewScheduler(fl, mustPolicy(f.RouterPolicy))
	mode, _ := sched.ParseMode(f.RouterMode)
	sc.Mode = mode
	t.Cleanup(sc.Close)
	o := Options{Flags: f, Store: store, Sched: sc, BlockSize: 16, Governor: g}
	if opt != nil {
		opt(&o)
	}
	srv := New(o)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	return &testRouter{url: "http://" + ln.Addr().String(), srv: srv, fl: fl, store: store, flags: f}
}

func pdWorker(id, url, role, bootstrap string) fleet.Record {
	r := fleet.Record{ID: id, URL: url, Models: []string{"m"}, Role: role}
	if bootstrap != "" {
		r.Bootstrap = json.RawMessage(bootstrap)
	}
	return r
}

func pdConfig(t *testing.T, f func(c *config.Config)) *config.Config {
	t.Helper()
	c := config.Default()
	c.PD.PrefillTimeoutSeconds = 10
	f(c)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

// legLog records what a scripted engine received.
type legLog struct {
	mu     sync.Mutex
	bodies []string
	ids    []string
}

func (l *legLog) add(ctx *fasthttp.RequestCtx) {
	l.mu.Lock()
	l.bodies = append(l.bodies, string(ctx.PostBody()))
	l.ids = append(l.ids, string(ctx.Request.Header.Peek("X-Request-Id")))
	l.mu.Unlock()
}

func (l *legLog) n() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.bodies)
}

func (l *legLog) last(t *testing.T) map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.bodies) == 0 {
		t.Fatal("the engine got no request")
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(l.bodies[len(l.bodies)-1]), &m); err != nil {
		t.Fatalf("leg body is not JSON: %v: %s", err, l.bodies[len(l.bodies)-1])
	}
	return m
}

// vllmPrefill answers like a vLLM prefill engine with the NixlConnector.
func vllmPrefill(log *legLog, engineID string, status *atomic.Int32) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		log.add(ctx)
		if st := int(status.Load()); st != 0 {
			ctx.SetStatusCode(st)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"scripted","type":"x"}}`)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],` +
			`"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8},` +
			`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2]],"remote_engine_id":"` + engineID +
			`","remote_request_id":"cmpl-1","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}}`)
	}
}

// decodeEngine answers a stream or JSON, after checking it got what it needs.
func decodeEngine(log *legLog, need string, status *atomic.Int32) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		log.add(ctx)
		if st := int(status.Load()); st != 0 {
			ctx.SetStatusCode(st)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"KV transfer failed: scripted","type":"server_error"}}`)
			return
		}
		if !strings.Contains(string(ctx.PostBody()), need) {
			ctx.SetStatusCode(400)
			ctx.SetBodyString(`{"error":{"message":"missing ` + need + `","type":"invalid_request_error"}}`)
			return
		}
		var req struct {
			Stream bool `json:"stream"`
		}
		json.Unmarshal(ctx.PostBody(), &req)
		if req.Stream {
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyString("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n")
			return
		}
		okHandler(ctx)
	}
}

func noLoadLeft(t *testing.T, fl *fleet.Fleet) {
	t.Helper()
	for i := 0; i < 100; i++ {
		busy := ""
		for _, w := range fl.View().All {
			if w.Load.Requests.Load() != 0 || w.Load.Tokens.Load() != 0 || w.Load.Pending.Load() != 0 {
				busy = w.ID
			}
		}
		if busy == "" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("a leg's lease was never ended")
}

// vLLM: the prefill leg carries kv_transfer_params.do_remote_decode, stream
// false and max_tokens 1, without the fields vLLM's proxy removes; the
// decode leg the client's body plus the prefill's kv_transfer_params; both
// one X-Request-Id. The client gets the decode engine's stream.
func TestPDPullSendsTheVLLMLegs(t *testing.T) {
	var pl, dl legLog
	var ok atomic.Int32
	p := startUpstream(t, vllmPrefill(&pl, "engine-p", &ok))
	d := startUpstream(t, decodeEngine(&dl, `"remote_engine_id":"engine-p"`, &ok))
	r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm"; c.Debug.DecisionHeader = true }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	client := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":9,"max_completion_tokens":9,` +
		`"min_tokens":2,"min_completion_tokens":2,"kv_transfer_params":{"evil":1},"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(client))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") || !strings.Contains(string(b), `"content":"b"`) {
		t.Fatalf("client got %d %q", resp.StatusCode, b)
	}
	if resp.Header.Get("X-Infera-Worker") != "d" || resp.Header.Get("X-Infera-Prefill-Worker") != "p" {
		t.Fatalf("decision headers %q %q", resp.Header.Get("X-Infera-Worker"), resp.Header.Get("X-Infera-Prefill-Worker"))
	}
	pb := pl.last(t)
	wantKV := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	if fmt.Sprint(pb["kv_transfer_params"]) != fmt.Sprint(wantKV) || pb["stream"] != false ||
		pb["max_tokens"] != float64(1) || pb["max_completion_tokens"] != float64(1) {
		t.Fatalf("prefill leg body %v", pb)
	}
	for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens"} {
		if _, ok := pb[k]; ok {
			t.Fatalf("prefill leg kept %s: %v", k, pb)
		}
	}
	if strings.Count(pl.bodies[0], "kv_transfer_params") != 1 {
		t.Fatalf("the client's kv_transfer_params reached the prefill leg: %s", pl.bodies[0])
	}
	db := dl.last(t)
	kv, _ := db["kv_transfer_params"].(map[string]any)
	if kv["remote_engine_id"] != "engine-p" || kv["remote_request_id"] != "cmpl-1" || kv["do_remote_prefill"] != true ||
		db["stream"] != true || db["max_tokens"] != float64(9) || db["min_tokens"] != float64(2) || db["stream_options"] == nil {
		t.Fatalf("decode leg body %v", db)
	}
	if pl.ids[0] == "" || pl.ids[0] != dl.ids[0] {
		t.Fatalf("X-Request-Id: prefill %q decode %q", pl.ids[0], dl.ids[0])
	}
	noLoadLeft(t, r.fl)

	// A client's own X-Request-Id goes to both legs unchanged.
	req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Request-Id", "mine")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || pl.ids[1] != "mine" || dl.ids[1] != "mine" {
		t.Fatalf("status %d ids %q %q", resp.StatusCode, pl.ids[1], dl.ids[1])
	}
}

// vLLM failover: a prefill worker that fails goes to another prefill
// worker; a decode worker that cannot be reached to another decode worker
// with the same kv_transfer_params (the KV is still held); a decode worker
// that answers 5xx (its read may have freed the KV) repeats both legs.
func TestPDPullFailoverPerLeg(t *testing.T) {
	var pl1, pl2, dl1 legLog
	var fail1, ok atomic.Int32
	fail1.Store(503)
	p1 := startUpstream(t, vllmPrefill(&pl1, "engine-p1", &fail1))
	p2 := startUpstream(t, vllmPrefill(&pl2, "engine-p2", &ok))
	d1 := startUpstream(t, decodeEngine(&dl1, "kv_transfer_params", &ok))
	dead := deadURL(t)
	f := defaultFlags()
	f.RequestMaxRetries = 2
	f.RouterPolicy = "least-requests"
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
		pdWorker("p1", p1.url, "prefill", ""), pdWorker("p2", p2.url, "prefill", ""),
		pdWorker("d0-dead", dead, "decode", ""), pdWorker("d1", d1.url, "decode", ""))
	v := r.fl.View()
	// Make the scheduler try p1 and the dead decode first.
	v.ByID([]byte("p2")).Acquire(1, 0, 1)
	v.ByID([]byte("d1")).Acquire(1, 0, 1)
	code, b := post(t, r.url+"/v1/chat/completions", chatBody)
	v.ByID([]byte("p2")).Release(1, 0, 1, false)
	v.ByID([]byte("d1")).Release(1, 0, 1, false)
	if code != 200 || b != okJSON {
		t.Fatalf("%d %s", code, b)
	}
	if pl1.n() != 1 || pl2.n() != 1 || dl1.n() != 1 {
		t.Fatalf("legs sent: p1 %d p2 %d d1 %d; want the failed prefill once, the good prefill once (the unreachable decode needs no new prefill), d1 once", pl1.n(), pl2.n(), dl1.n())
	}
	if kv := dl1.last(t)["kv_transfer_params"].(map[string]any); kv["remote_engine_id"] != "engine-p2" {
		t.Fatalf("decode got %v", kv)
	}
	// The breakers counted each worker's own fault.
	if v.ByID([]byte("p1")).Breaker.State() != fleet.BreakerClosed {
		t.Fatal("one fault opened p1")
	}
	noLoadLeft(t, r.fl)

	// A decode worker answering 500: both legs again, on another decode worker.
	var dl2 legLog
	var fail500 atomic.Int32
	fail500.Store(500)
	d2 := startUpstream(t, decodeEngine(&dl2, "kv_transfer_params", &fail500))
	r2 := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
		pdWorker("p2", p2.url, "prefill", ""), pdWorker("d1", d1.url, "decode", ""), pdWorker("d2", d2.url, "decode", ""))
	r2.fl.View().ByID([]byte("d1")).Acquire(1, 0, 1) // d2 first
	before, beforeD1 := pl2.n(), dl1.n()
	code, b = post(t, r2.url+"/v1/chat/completions", chatBody)
	r2.fl.View().ByID([]byte("d1")).Release(1, 0, 1, false)
	if code != 200 || pl2.n()-before != 2 || dl2.n() != 1 || dl1.n()-beforeD1 != 1 {
		t.Fatalf("%d %s: prefill legs %d (want 2), d2 %d, d1 %d", code, b, pl2.n()-before, dl2.n(), dl1.n()-beforeD1)
	}
	noLoadLeft(t, r2.fl)
}

// A prefill engine refusing the request (4xx) is the client's answer; a
// prefill answer whose kv_transfer_params are no object with
// do_remote_prefill true is a protocol fault, but one without them (vLLM's
// answer for a prefill whose first token was a stop: its connector hands
// no KV over) sends the decode leg without them, as vLLM's own proxy
// does (it was a 502 that opened healthy prefill workers' breakers).
func TestPDPullRelaysPrefillRefusals(t *testing.T) {
	var pl, dl legLog
	var st, ok atomic.Int32
	st.Store(400)
	p := startUpstream(t, vllmPrefill(&pl, "e", &st))
	d := startUpstream(t, decodeEngine(&dl, "kv_transfer_params", &ok))
	r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 400 || !strings.Contains(b, "scripted") || dl.n() != 0 {
		t.Fatalf("prefill 400: %d %s, decode legs %d", code, b, dl.n())
	}
	bad := startUpstream(t, func(ctx *fasthttp.RequestCtx) { // params that are no such object
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[],"kv_transfer_params":{"do_remote_prefill":false}}`)
	})
	r2 := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
		pdWorker("p", bad.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	code, b := post(t, r2.url+"/v1/chat/completions", chatBody)
	if code != 502 || !strings.Contains(b, "upstream_protocol_error") || dl.n() != 0 {
		t.Fatalf("invalid kv_transfer_params: %d %s", code, b)
	}
	noLoadLeft(t, r2.fl)

	stopped := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"stop"}],"kv_transfer_params":null}`)
	})
	var dl3 legLog
	d3 := startUpstream(t, decodeEngine(&dl3, "messages", &ok))
	r3 := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
		pdWorker("p", stopped.url, "prefill", ""), pdWorker("d", d3.url, "decode", ""))
	before := mPDNoKVParams.Get()
	for range 4 { // more than the breaker's threshold (3)
		code, b = post(t, r3.url+"/v1/chat/completions", chatBody)
		if code != 200 {
			t.Fatalf("a prefill that stopped at its first token: %d %s", code, b)
		}
		if _, has := dl3.last(t)["kv_transfer_params"]; has {
			t.Fatalf("the decode leg got kv_transfer_params: %v", dl3.last(t))
		}
	}
	if dl3.n() != 4 || mPDNoKVParams.Get()-before != 4 || r3.fl.View().ByID([]byte("p")).Breaker.State() != fleet.BreakerClosed {
		t.Fatalf("decode legs %d, counted %d, prefill breaker %d", dl3.n(), mPDNoKVParams.Get()-before, r3.fl.View().ByID([]byte("p")).Breaker.State())
	}
	noLoadLeft(t, r3.fl)
}

// sglangRooms scripts SGLang prefill and decode engines sharing a KV
// "transfer": a decode engine answers only once a prefill engine received
// the same room (so the legs must be in flight together), a prefill engine
// only once a decode engine joined its room.
type sglangRooms struct {
	mu             sync.Mutex
	rooms          map[string]chan struct{}
	joined         map[string]chan struct{}
	prefillDrained atomic.Int32
	stopped        chan struct{}
}

// noPartner is how long a leg waits for its partner. It is far above the
// tests' bounds on how long an aborted pairing may take, so a leg the
// router failed to abort shows; a test ends the waits of legs it left
// behind with stop (deferred: it runs before the upstreams' cleanup, which
// waits for their handlers).
const noPartner = 10 * time.Second

func newSGLangRooms() *sglangRooms {
	return &sglangRooms{rooms: map[string]chan struct{}{}, joined: map[string]chan struct{}{}, stopped: make(chan struct{})}
}

func (sp *sglangRooms) stop() { close(sp.stopped) }

func (sp *sglangRooms) ch(m map[string]chan struct{}, room string) chan struct{} {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	c := m[room]
	if c == nil {
		c = make(chan struct{})
		m[room] = c
	}
	return c
}

func roomOf(body []byte) string {
	var m map[string]json.RawMessage
	json.Unmarshal(body, &m)
	return string(m["bootstrap_room"])
}

func (sp *sglangRooms) prefill(log *legLog, st *atomic.Int32) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		log.add(ctx)
		if st := int(st.Load()); st != 0 {
			ctx.SetStatusCode(st)
			ctx.SetBodyString(`{"error":{"message":"scripted prefill failure","type":"x"}}`)
			return
		}
		room := roomOf(ctx.PostBody())
		close(sp.ch(sp.rooms, room))
		select {
		case <-sp.ch(sp.joined, room):
		case <-time.After(noPartner):
			ctx.SetStatusCode(500)
			return
		case <-sp.stopped:
			ctx.SetStatusCode(500)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			w.WriteString(`{"choices":[{"text":"a"}]}`)
			w.Flush()
			sp.prefillDrained.Add(1)
		})
	}
}

func (sp *sglangRooms) decode(log *legLog, st *atomic.Int32) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		log.add(ctx)
		if st := int(st.Load()); st != 0 {
			ctx.SetStatusCode(st)
			ctx.SetBodyString(`{"error":{"message":"KV transfer failed: scripted","type":"server_error"}}`)
			return
		}
		room := roomOf(ctx.PostBody())
		close(sp.ch(sp.joined, room))
		select {
		case <-sp.ch(sp.rooms, room):
		case <-time.After(noPartner):
			ctx.SetStatusCode(500)
			ctx.SetBodyString(`{"error":{"message":"KV transfer failed: no prefill","type":"server_error"}}`)
			return
		case <-sp.stopped:
			ctx.SetStatusCode(500)
			return
		}
		decodeEngine(&legLog{}, "bootstrap_room", &atomic.Int32{})(ctx)
	}
}

// SGLang: the same body, with the prefill worker's bootstrap host and port
// and a fresh room, goes to both workers at once; the client gets the
// decode worker's answer; the prefill answer is drained.
func TestPDPushSendsTheSGLangLegsTogether(t *testing.T) {
	sp := newSGLangRooms()
	defer sp.stop()
	var pre, dec legLog
	var ok atomic.Int32
	p := startUpstream(t, sp.prefill(&pre, &ok))
	d := startUpstream(t, sp.decode(&dec, &ok))
	r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = "sglang" }),
		pdWorker("p", p.url, "prefill", `{"pd_mode":"sglang","bootstrap_host":"10.1.2.3","bootstrap_port":8998}`),
		pdWorker("d", d.url, "decode", ""))
	client := `{"model":"m","stream":true,"bootstrap_room":7,"bootstrap_host":"evil","messages":[{"role":"user","content":"hi"}]}`
	rooms := map[string]bool{}
	for i := 0; i < 3; i++ {
		code, b := post(t, r.url+"/v1/chat/completions", client)
		if code != 200 || !strings.HasSuffix(b, "data: [DONE]\n\n") {
			t.Fatalf("%d %q", code, b)
		}
		if pre.bodies[i] != dec.bodies[i] {
			t.Fatalf("legs differ:\n%s\n%s", pre.bodies[i], dec.bodies[i])
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(dec.bodies[i]), &m); err != nil {
			t.Fatal(err)
		}
		if string(m["bootstrap_host"]) != `"10.1.2.3"` || string(m["bootstrap_port"]) != "8998" || string(m["stream"]) != "true" {
			t.Fatalf("body %s", dec.bodies[i])
		}
		var room uint64
		if err := json.Unmarshal(m["bootstrap_room"], &room); err != nil || room > 1<<63-1 || string(m["bootstrap_room"]) == "7" {
			t.Fatalf("room %s (%v)", m["bootstrap_room"], err)
		}
		if strings.Count(dec.bodies[i], "bootstrap_room") != 1 || strings.Contains(dec.bodies[i], "evil") {
			t.Fatalf("client's bootstrap fields kept: %s", dec.bodies[i])
		}
		rooms[string(m["bootstrap_room"])] = true
	}
	if len(rooms) != 3 {
		t.Fatalf("rooms %v: want a fresh one per request", rooms)
	}
	noLoadLeft(t, r.fl)
	if n := sp.prefillDrained.Load(); n != 3 {
		t.Fatalf("prefill answers drained %d", n)
	}
}

// A prefill record without bootstrap_port sends null (the decode engine
// uses its own bootstrap port) and the worker URL's host; a batch gets
// lists with a room per sequence.
func TestPDPushBootstrapDefaultsAndBatches(t *testing.T) {
	var mu sync.Mutex
	var seen []string // every leg body the engines received, in order
	h := func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		seen = append(seen, string(ctx.PostBody()))
		mu.Unlock()
		ctx.SetStatusCode(400) // like the simulated engine, which serves one sequence
		ctx.SetBodyString(`{"error":{"message":"batch","type":"invalid_request_error"}}`)
	}
	p := startUpstream(t, h)
	d := startUpstream(t, h)
	r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = "sglang" }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	// The first leg to fail ends the request and aborts the other, which an
	// engine may still read later: a leg body of an earlier request can come
	// in after this one's, so each check looks for a body of its own
	// request among those received since it was sent.
	f := func(path, body string, check func(m map[string]json.RawMessage) bool) {
		t.Helper()
		mu.Lock()
		from := len(seen)
		mu.Unlock()
		code, _ := post(t, r.url+path, body)
		if code != 400 {
			t.Fatalf("%s: %d", body, code)
		}
		var got []string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			got = append(got[:0], seen[from:]...)
			mu.Unlock()
			for _, b := range got {
				var m map[string]json.RawMessage
				if json.Unmarshal([]byte(b), &m) == nil && check(m) {
					return
				}
			}
		}
		t.Fatalf("%s: no leg body as expected among %q", body, got)
	}
	f("/v1/completions", `{"model":"m","prompt":"one"}`, func(m map[string]json.RawMessage) bool {
		return string(m["bootstrap_port"]) == "null" && string(m["bootstrap_host"]) == `"127.0.0.1"`
	})
	f("/v1/completions", `{"model":"m","prompt":["one","two"]}`, func(m map[string]json.RawMessage) bool {
		var rooms []uint64
		json.Unmarshal(m["bootstrap_room"], &rooms)
		return string(m["bootstrap_port"]) == "[null,null]" && string(m["bootstrap_host"]) == `["127.0.0.1","127.0.0.1"]` &&
			len(rooms) == 2 && rooms[0] != rooms[1]
	})
	f("/v1/chat/completions", `{"model":"m","n":3,"messages":[{"role":"user","content":"x"}]}`, func(m map[string]json.RawMessage) bool {
		var rooms []uint64
		json.Unmarshal(m["bootstrap_room"], &rooms)
		return len(rooms) == 3
	})
	if code, b := post(t, r.url+"/v1/chat/completions", `{"model":"m","n":100000,"messages":[{"role":"user","content":"x"}]}`); code != 400 || !strings.Contains(b, "batch") {
		t.Fatalf("huge n: %d %s", code, b)
	}
	noLoadLeft(t, r.fl)
}

// SGLang reads n as pydantic's lax int does (3.0 and "3" are 3) and
// generates that many sequences, each needing its bootstrap room: the
// router read such an n as 1 and sent one room (the legs of the other
// sequences had none to meet in), and an n of 100000.0 went past the
// batch bound.
func TestAnSGLangNWrittenAsAFloatOrAStringGetsARoomPerSequence(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	h := func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		seen = append(seen, string(ctx.PostBody()))
		mu.Unlock()
		ctx.SetStatusCode(400)
		ctx.SetBodyString(`{"error":{"message":"batch","type":"invalid_request_error"}}`)
	}
	p := startUpstream(t, h)
	d := startUpstream(t, h)
	r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = "sglang" }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	for _, n := range []string{`3.0`, `"3"`, `3e0`} {
		mu.Lock()
		from := len(seen)
		mu.Unlock()
		if code, b := post(t, r.url+"/v1/chat/completions", `{"model":"m","n":`+n+`,"messages":[{"role":"user","content":"x"}]}`); code != 400 {
			t.Fatalf("n %s: %d %s", n, code, b)
		}
		ok := false
		var got []string
		for deadline := time.Now().Add(10 * time.Second); !ok && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			got = append(got[:0], seen[from:]...)
			mu.Unlock()
			for _, b := range got {
				var m map[string]json.RawMessage
				var rooms []uint64
				if json.Unmarshal([]byte(b), &m) == nil && json.Unmarshal(m["bootstrap_room"], &rooms) == nil && len(rooms) == 3 {
					ok = true
				}
			}
		}
		if !ok {
			t.Errorf("n %s: no leg body with 3 bootstrap rooms among %q", n, got)
		}
	}
	if code, b := post(t, r.url+"/v1/chat/completions", `{"model":"m","n":100000.0,"messages":[{"role":"user","content":"x"}]}`); code != 400 || !strings.Contains(b, "batch of more than") {
		t.Errorf("n 100000.0: %d %s, want the batch refusal", code, b)
	}
	noLoadLeft(t, r.fl)
}

// SGLang failover: a failing prefill leg stops its decode leg at once (no
// wait for the decode engine's KV timeout) and both legs go again with a
// new room, the prefill to another prefill worker; a failing decode leg
// goes to another decode worker, again with a new room.
func TestPDPushFailoverPerLeg(t *testing.T) {
	sp := newSGLangRooms()
	defer sp.stop()
	var preBad, preGood, dec1, dec2 legLog
	var ok, st503 atomic.Int32
	st503.Store(503)
	pBad := startUpstream(t, sp.prefill(&preBad, &st503))
	pGood := startUpstream(t, sp.prefill(&preGood, &ok))
	// Decode engines wait for their room's prefill (for the failing prefill
	// it never comes: the router must abort the decode leg).
	d1 := startUpstream(t, sp.decode(&dec1, &ok))
	d2 := startUpstream(t, sp.decode(&dec2, &ok))
	f := defaultFlags()
	f.RequestMaxRetries = 2
	f.RouterPolicy = "least-requests"
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "sglang"
		c.PD.SGLangIndependentPairing = true
	}), pdWorker("p-bad", pBad.url, "prefill", ""), pdWorker("p-good", pGood.url, "prefill", ""),
		pdWorker("d1", d1.url, "decode", ""), pdWorker("d2", d2.url, "decode", ""))
	v := r.fl.View()
	v.ByID([]byte("p-good")).Acquire(1, 0, 1) // the failing prefill goes first
	v.ByID([]byte("d2")).Acquire(5, 0, 1)     // d1 serves both attempts
	start := time.Now()
	code, b := post(t, r.url+"/v1/chat/completions", chatBody)
	took := time.Since(start)
	v.ByID([]byte("p-good")).Release(1, 0, 1, false)
	v.ByID([]byte("d2")).Release(5, 0, 1, false)
	if code != 200 || b != okJSON {
		t.Fatalf("%d %s", code, b)
	}
	if took > 5*time.Second {
		t.Fatalf("took %v: the decode leg of the failed prefill was not aborted", took)
	}
	// (The first decode leg may be aborted before it reached d1.)
	if preBad.n() != 1 || preGood.n() != 1 || dec1.n() < 1 || dec1.n() > 2 || dec2.n() != 0 {
		t.Fatalf("legs: failing prefill %d, good prefill %d, d1 %d, d2 %d", preBad.n(), preGood.n(), dec1.n(), dec2.n())
	}
	if roomOf([]byte(preBad.bodies[0])) == roomOf([]byte(preGood.bodies[0])) {
		t.Fatal("the retry reused the room")
	}
	// The decode worker was not blamed for the prefill's failure.
	if w := v.ByID([]byte("d1")); w.Breaker.State() != fleet.BreakerClosed {
		t.Fatal("the decode leg of the failed prefill was blamed")
	}
	noLoadLeft(t, r.fl)

	// A decode worker answering 500 before its first byte: another decode
	// worker, both legs again with a new room.
	var preOK, decBroken, decOK legLog
	var st500 atomic.Int32
	st500.Store(500)
	p2 := startUpstream(t, sp.prefill(&preOK, &ok))
	dBroken := startUpstream(t, sp.decode(&decBroken, &st500))
	dOK := startUpstream(t, sp.decode(&decOK, &ok))
	r2 := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "sglang"; c.PD.SGLangIndependentPairing = true }),
		pdWorker("p", p2.url, "prefill", ""), pdWorker("d-broken", dBroken.url, "decode", ""), pdWorker("d-ok", dOK.url, "decode", ""))
	r2.fl.View().ByID([]byte("d-ok")).Acquire(1, 0, 1)
	code, b = post(t, r2.url+"/v1/chat/completions", chatBody)
	r2.fl.View().ByID([]byte("d-ok")).Release(1, 0, 1, false)
	// (The first prefill leg may be aborted before it reached the engine.)
	if code != 200 || decBroken.n() != 1 || decOK.n() != 1 || preOK.n() < 1 || preOK.n() > 2 {
		t.Fatalf("%d %s: broken decode %d, good decode %d, prefill legs %d", code, b, decBroken.n(), decOK.n(), preOK.n())
	}
	if roomOf([]byte(decBroken.bodies[0])) == roomOf([]byte(decOK.bodies[0])) {
		t.Fatal("the retry reused the room")
	}
	noLoadLeft(t, r2.fl)

	// A prefill engine's refusal (4xx) is relayed as it is.
	var preRef, decRef legLog
	var st400 atomic.Int32
	st400.Store(400)
	p3 := startUpstream(t, sp.prefill(&preRef, &st400))
	d3 := startUpstream(t, sp.decode(&decRef, &ok))
	r3 := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "sglang" }),
		pdWorker("p", p3.url, "prefill", ""), pdWorker("d", d3.url, "decode", ""))
	start = time.Now()
	if code, b := post(t, r3.url+"/v1/chat/completions", chatBody); code != 400 || !strings.Contains(b, "scripted prefill failure") || time.Since(start) > 5*time.Second {
		t.Fatalf("refused prefill: %d %s after %v", code, b, time.Since(start))
	}
	noLoadLeft(t, r3.fl)
}

// Router mode direct over HTTP: the headers pick each leg and are not
// forwarded.
func TestPDDirectHeaders(t *testing.T) {
	var pl1, pl2, dl1, dl2 legLog
	var ok atomic.Int32
	p1 := startUpstream(t, vllmPrefill(&pl1, "e1", &ok))
	p2 := startUpstream(t, vllmPrefill(&pl2, "e2", &ok))
	d1 := startUpstream(t, decodeEngine(&dl1, "kv_transfer_params", &ok))
	d2 := startUpstream(t, decodeEngine(&dl2, "kv_transfer_params", &ok))
	f := defaultFlags()
	f.RouterMode = "direct"
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
		pdWorker("p1", p1.url, "prefill", ""), pdWorker("p2", p2.url, "prefill", ""),
		pdWorker("d1", d1.url, "decode", ""), pdWorker("d2", d2.url, "decode", ""))
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(chatBody))
		req.Header.Set("x-worker-instance-id", "d2")
		req.Header.Set("x-prefill-instance-id", "p2")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatal(resp.StatusCode)
		}
	}
	if pl2.n() != 3 || dl2.n() != 3 || pl1.n() != 0 || dl1.n() != 0 {
		t.Fatalf("direct legs: p1 %d p2 %d d1 %d d2 %d", pl1.n(), pl2.n(), dl1.n(), dl2.n())
	}
}

func TestPDBodyEdits(t *testing.T) {
	f := func(got, want string) {
		t.Helper()
		if got != want {
			t.Fatalf("\ngot  %s\nwant %s", got, want)
		}
		if !json.Valid([]byte(got)) {
			t.Fatalf("invalid JSON %s", got)
		}
	}
	// Escaped and duplicate keys are the same keys to the engine.
	body := `{ "model" : "alias", "bootstr\u0061p_room":1, "messages":[], "bootstrap_room":2 , "x":{"bootstrap_room":3}}`
	f(string(appendPushBody(nil, []byte(body), "", "h", 0, 5, 0)),
		`{"model" : "alias","messages":[],"x":{"bootstrap_room":3},"bootstrap_host":"h","bootstrap_port":null,"bootstrap_room":5}`)
	f(string(appendPushBody(nil, []byte(body), "real/model", "[::1]", 8998, 5, 0)),
		`{"model":"real/model","messages":[],"x":{"bootstrap_room":3},"bootstrap_host":"[::1]","bootstrap_port":8998,"bootstrap_room":5}`)
	f(string(appendPullPrefillBody(nil, []byte(`{"stream":true,"max_tokens":5,"min_tokens":1}`), "")),
		`{"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},"stream":false,"max_tokens":1}`)
	f(string(appendPullPrefillBody(nil, []byte(`{"a":1,"max_completion_tokens":5}`), "")),
		`{"a":1,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},"stream":false,"max_tokens":1,"max_completion_tokens":1}`)
	f(string(appendPullDecodeBody(nil, []byte(`{"a":1,"kv_transfer_params":null,"b":[1]}`), "", []byte(`{"do_remote_prefill":true}`))),
		`{"a":1,"b":[1],"kv_transfer_params":{"do_remote_prefill":true}}`)

	f(string(appendPullDecodeBody(nil, []byte(`{"a":1,"kv_transfer_params":{"x":1}}`), "", nil)), `{"a":1}`)
	f(string(appendPullDecodeBody(nil, []byte(`{"kv_transfer_params":1}`), "", nil)), `{}`)

	kv := func(body, want string, ok, valid bool) {
		t.Helper()
		got, gotOK, gotValid := kvTransferParams([]byte(body))
		if gotOK != ok || gotValid != valid || (ok && string(got) != want) {
			t.Fatalf("kvTransferParams(%s) = %s %v %v", body, got, gotOK, gotValid)
		}
	}
	kv(`{"kv_transfer_params":{"do_remote_prefill":true,"x":[1]}}`, `{"do_remote_prefill":true,"x":[1]}`, true, true)
	kv(`{"kv_transfer_params":{"do_remote_prefill":true},"kv_transfer_params":{"do_remote_prefill":false}}`, "", false, false)
	kv(`{"kv_transfer_params":{"do_remote_prefill":"true"}}`, "", false, false)
	kv(`{"kv_transfer_params":"x"}`, "", false, false)
	// vLLM's answer for a prefill that stopped before its length cap.
	kv(`{"choices":[{"finish_reason":"stop"}],"kv_transfer_params":null}`, "", false, true)
	kv(`{"choices":[]}`, "", false, true)
	kv(`{"kv_transfer_params":{"do_remote_prefill":true}`, "", false, false) // truncated
	kv(`{"kv_transfer_params":{"do_remote_prefill":true}} x`, "", false, false)
	kv(`[1]`, "", false, false)
	kv(``, "", false, false)
}

// FuzzPDBodies: whatever valid JSON object the client sent, every leg body
// is valid JSON whose router-set members appear once, with the router's
// values, and whose other members are the client's.
func FuzzPDBodies(f *testing.F) {
	for _, s := range []string{`{"model":"m","messages":[]}`, `{}`, `{"bootstrap_room":1,"a":{"b":[1,2,{}]}}`,
		`{"kv_transfer_params":{"x":1},"stream":true,"stream_options":{"include_usage":true}}`, `{"max_completion_tokens":3,"\u006dodel":"x"}`,
		` { "a" : "\"}" , "b" : -1.5e3 } `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		// As a prefill answer: params found only in a valid object, and they
		// are what a JSON decoder sees.
		// (Maps: exact keys, the last duplicate wins, as in Python.)
		if kv, ok, _ := kvTransferParams([]byte(body)); ok {
			var ans, params map[string]json.RawMessage
			if json.Unmarshal([]byte(body), &ans) != nil || json.Unmarshal(kv, &params) != nil ||
				string(params["do_remote_prefill"]) != "true" || string(ans["kv_transfer_params"]) != string(kv) {
				t.Fatalf("kv_transfer_params %s from %s", kv, body)
			}
		}
		var client map[string]any
		if json.Unmarshal([]byte(body), &client) != nil || !strings.HasPrefix(strings.TrimSpace(body), "{") {
			return
		}
		if _, err := skipValue([]byte(body), 0, 0); err != nil {
			return // the proxy's parser refuses it before any leg is built
		}
		check := func(out []byte, set map[string]string, dropped ...string) {
			var got map[string]json.RawMessage
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("leg body %s is not JSON: %v (client %s)", out, err, body)
			}
			for k, v := range set {
				if string(got[k]) != v {
					t.Fatalf("%s = %s, want %s (leg %s)", k, got[k], v, out)
				}
			}
			for k, v := range client {
				if _, ours := set[k]; ours || k == "model" {
					continue
				}
				if slices.Contains(dropped, k) {
					if _, kept := got[k]; kept && k != "max_completion_tokens" {
						t.Fatalf("%s kept in %s", k, out)
					}
					continue
				}
				want, _ := json.Marshal(v)
				var g any
				json.Unmarshal(got[k], &g)
				gb, _ := json.Marshal(g)
				if string(gb) != string(want) {
					t.Fatalf("client member %s = %s became %s", k, want, gb)
				}
			}
		}
		push := map[string]string{"bootstrap_host": `"h"`, "bootstrap_port": "9", "bootstrap_room": "42"}
		if _, ok := client["model"]; ok {
			push["model"] = `"mm"`
		}
		check(appendPushBody(nil, []byte(body), "mm", "h", 9, 42, 0), push)
		check(appendPullPrefillBody(nil, []byte(body), ""), map[string]string{"stream": "false", "max_tokens": "1",
			"kv_transfer_params": `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`},
			pullPrefillDrop...)
		check(appendPullDecodeBody(nil, []byte(body), "", []byte(`{"a":1}`)), map[string]string{"kv_transfer_params": `{"a":1}`})
	})
}

// A client that leaves while the legs are in flight ends both leases (and
// closes the legs' connections, so the engines stop), for both connectors.
func TestPDClientLeavesEndsBothLegs(t *testing.T) {
	for _, mode := range []string{"vllm", "sglang"} {
		t.Run(mode, func(t *testing.T) {
			var hits, gone atomic.Int32
			hang := func(ctx *fasthttp.RequestCtx) {
				hits.Add(1)
				// Hold the request until the router closes the connection.
				fd := netpeek.SockFD(ctx.Conn())
				for i := 0; i < 300; i++ {
					time.Sleep(10 * time.Millisecond)
					if netpeek.Peek(fd) == netpeek.Closed {
						gone.Add(1)
						return
					}
				}
			}
			p := startUpstream(t, hang)
			d := startUpstream(t, hang)
			r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = mode }),
				pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
			conn, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
			want := int32(1)
			if mode == "sglang" {
				want = 2
			}
			for i := 0; hits.Load() < want; i++ {
				if i > 200 {
					t.Fatalf("legs sent: %d", hits.Load())
				}
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(150 * time.Millisecond)
			conn.Close()
			start := time.Now()
			noLoadLeft(t, r.fl)
			if time.Since(start) > 1500*time.Millisecond {
				t.Fatalf("leases ended %v after the client left", time.Since(start))
			}
			for i := 0; gone.Load() < want; i++ {
				if i > 100 {
					t.Fatalf("legs whose connection the router closed: %d of %d", gone.Load(), want)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// With responses_passthrough on and prefill/decode workers in the fleet, a
// /v1/responses request is converted: the PD legs speak chat completions
// (vLLM's 1-token prefill and kv_transfer_params exist there only). Passed
// through, the prefill leg kept the client's max_output_tokens (500) beside
// an appended max_tokens vLLM's Responses API has no field for, handed
// over no KV, and both legs generated the whole answer.
func TestAResponsesRequestToPDPairsIsConvertedEvenInPassthrough(t *testing.T) {
	var pl, dl legLog
	var ok atomic.Int32
	p := startUpstream(t, vllmPrefill(&pl, "engine-p", &ok))
	d := startUpstream(t, decodeEngine(&dl, `"remote_engine_id":"engine-p"`, &ok))
	r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "vllm"
		c.Protocol.ResponsesPassthrough = true
	}), pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	resp, err := http.Post(r.url+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"m","input":"hi","max_output_tokens":500}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	pb := pl.last(t)
	if _, has := pb["max_output_tokens"]; has || pb["max_tokens"] != float64(1) || pb["messages"] == nil {
		t.Fatalf("prefill leg %s: want a chat request capped at 1 token", pl.bodies[0])
	}
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"object":"response"`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

// A completion batching several prompts is not split into vLLM legs: the
// prefill engine answers the kv_transfer_params of its first prompt only
// (vLLM's serving_completion takes final_res_batch[0]'s), so the decode leg
// read that prompt's KV for every prompt of the batch and the prefill
// engine held the other prompts' blocks until its abort timeout. One
// worker serves the batch as the client sent it; a single prompt (also
// given as a one-element list) still goes to the pair.
func TestAVLLMBatchOfPromptsIsServedWholeByOneWorker(t *testing.T) {
	var pl, dl legLog
	var ok atomic.Int32
	p := startUpstream(t, vllmPrefill(&pl, "engine-p", &ok))
	d := startUpstream(t, func(ctx *fasthttp.RequestCtx) { // a vLLM instance: with or without remote KV
		dl.add(ctx)
		okHandler(ctx)
	})
	r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	batch := `{"model":"m","max_tokens":4,"prompt":["first prompt","second prompt"]}`
	code, b := post(t, r.url+"/v1/completions", batch)
	if code != 200 {
		t.Fatalf("batch: %d %s", code, b)
	}
	if n := pl.n() + dl.n(); n != 1 {
		t.Fatalf("the batch was sent %d times (prefill %d, decode %d), want once whole", n, pl.n(), dl.n())
	}
	var sent string
	if pl.n() == 1 {
		sent = pl.bodies[0]
	} else {
		sent = dl.bodies[0]
	}
	if strings.Contains(sent, "kv_transfer_params") || !strings.Contains(sent, `"second prompt"`) {
		t.Fatalf("the batch went as %s", sent)
	}
	noLoadLeft(t, r.fl)
	if code, b := post(t, r.url+"/v1/completions", `{"model":"m","max_tokens":4,"prompt":["one prompt"]}`); code != 200 || pl.n()+dl.n() != 3 {
		t.Fatalf("a one-prompt list: %d %s (legs %d)", code, b, pl.n()+dl.n())
	}
	noLoadLeft(t, r.fl)
}
