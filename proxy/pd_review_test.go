package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// postWithin is post with a bound on the whole exchange.
func postWithin(t *testing.T, url, body string, d time.Duration) (int, string) {
	t.Helper()
	cl := &http.Client{Timeout: d}
	resp, err := cl.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// holdsWithin polls cond until it holds or d passed; it reports whether it held.
func holdsWithin(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// finishSpyUp marks when a response was finished (its connection closed or
// pooled, and the upConn possibly recycled).
type finishSpyUp struct {
	upResponse
	finished *atomic.Bool
}

func (u finishSpyUp) finish(ok bool) { u.finished.Store(true); u.upResponse.finish(ok) }

// lateAbortTarget counts aborts that reach a connection after its response
// was finished (the upConn may belong to another request by then).
type lateAbortTarget struct {
	inner    interface{ abort() }
	finished *atomic.Bool
	late     *atomic.Int32
}

func (s *lateAbortTarget) abort() {
	if s.finished.Load() {
		s.late.Add(1)
	}
	s.inner.abort()
}

// lateAbortTransport wraps the abort targets and responses of one role's
// legs to count late aborts.
type lateAbortTransport struct {
	inner transport
	late  atomic.Int32
	role  string
}

func (t *lateAbortTransport) roundTrip(c *call) (upResponse, *failure) {
	up, f := t.inner.roundTrip(c)
	if f != nil || c.lease.Worker.Role.String() != t.role {
		return up, f
	}
	fin := new(atomic.Bool)
	c.cancel.mu.Lock()
	if c.cancel.target != nil {
		c.cancel.target = &lateAbortTarget{inner: c.cancel.target, finished: fin, late: &t.late}
	}
	c.cancel.mu.Unlock()
	return finishSpyUp{up, fin}, nil
}

// brokenAnswerEngine answers a 200 head and part of the body, then drops
// the connection (an engine that died mid-answer).
func brokenAnswerEngine(t *testing.T, hits *atomic.Int32) string {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				if hits != nil {
					hits.Add(1)
				}
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"choices\""))
				time.Sleep(50 * time.Millisecond)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// An SGLang prefill answer that breaks mid-body: pushPrefill closes the
// connection, and the dispatch then aborts the prefill leg's slot to stop
// it. The abort must not reach the closed (recycled) connection.
func TestPDAbortNeverReachesAPrefillConnectionAlreadyReleased(t *testing.T) {
	bad := brokenAnswerEngine(t, nil)
	d := startUpstream(t, func(ctx *fasthttp.RequestCtx) { time.Sleep(2 * time.Second); okHandler(ctx) })
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "sglang" }),
		pdWorker("p", bad, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	spy := &lateAbortTransport{inner: r.srv.tr, role: "prefill"}
	r.srv.tr = spy
	code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 10*time.Second)
	t.Logf("%d %s; aborts after finish: %d", code, b, spy.late.Load())
	if spy.late.Load() != 0 {
		t.Fatalf("the dispatch aborted the prefill leg's connection after it was closed and released (%d)", spy.late.Load())
	}
}

// docs/pd.md: a prefill leg whose answer breaks goes to another prefill
// worker (the client has received nothing).
func TestPDBrokenPrefillAnswerGoesToAnotherPrefillWorker(t *testing.T) {
	for _, mode := range []string{"vllm", "sglang"} {
		t.Run(mode, func(t *testing.T) {
			var hits atomic.Int32
			bad := brokenAnswerEngine(t, &hits)
			var pl, dl legLog
			var ok atomic.Int32
			var good, dec *upstream
			if mode == "vllm" {
				good = startUpstream(t, vllmPrefill(&pl, "e", &ok))
				dec = startUpstream(t, decodeEngine(&dl, "kv_transfer_params", &ok))
			} else {
				sp := newSGLangRooms()
				defer sp.stop()
				good = startUpstream(t, sp.prefill(&pl, &ok))
				dec = startUpstream(t, sp.decode(&dl, &ok))
			}
			f := defaultFlags() // one retry
			f.RouterPolicy = "least-requests"
			r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = mode; c.PD.SGLangIndependentPairing = mode == "sglang" }),
				pdWorker("p0-broken", bad, "prefill", ""), pdWorker("p1-good", good.url, "prefill", ""), pdWorker("d", dec.url, "decode", ""))
			v := r.fl.View()
			v.ByID([]byte("p1-good")).Acquire(1, 0, 1) // the broken prefill first
			code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 10*time.Second)
			v.ByID([]byte("p1-good")).Release(1, 0, 1, false)
			t.Logf("%d %s; broken prefill hits %d, good prefill %d", code, b, hits.Load(), pl.n())
			if hits.Load() != 1 || code != 200 {
				t.Fatalf("a broken prefill answer was not retried on the other prefill worker (broken hits %d): %d %s", hits.Load(), code, b)
			}
		})
	}
}

// vLLM: a decode worker that took the request and dropped the connection
// before answering may have read (and freed) the KV: both legs run again,
// never the decode leg alone with the same kv_transfer_params.
func TestPDVLLMDecodeThatGotTheRequestAndFailedRunsBothLegsAgain(t *testing.T) {
	var mu sync.Mutex
	held := map[string]bool{} // remote_request_id -> KV still held on the prefill engine
	var seq, prefills atomic.Int32
	p := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		prefills.Add(1)
		id := "cmpl-" + string(rune('a'+seq.Add(1)))
		mu.Lock()
		held[id] = true
		mu.Unlock()
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"` + id + `","choices":[{"index":0,"message":{"role":"assistant","content":"a"}}],` +
			`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1]],"remote_engine_id":"e",` +
			`"remote_request_id":"` + id + `","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}}`)
	})
	read := func(ctx *fasthttp.RequestCtx) bool { // the decode engine's read frees the blocks
		var req struct {
			KV struct {
				ID string `json:"remote_request_id"`
			} `json:"kv_transfer_params"`
		}
		json.Unmarshal(ctx.PostBody(), &req)
		mu.Lock()
		defer mu.Unlock()
		ok := held[req.KV.ID]
		delete(held, req.KV.ID)
		return ok
	}
	crash := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		read(ctx)
		ctx.Conn().Close() // the engine died during the transfer
	})
	good := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if !read(ctx) {
			ctx.SetStatusCode(500)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"KV transfer failed: no KV held for the request","type":"server_error"}}`)
			return
		}
		okHandler(ctx)
	})
	f := defaultFlags() // one retry
	f.RouterPolicy = "least-requests"
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm"; c.PD.DecodePolicy = "least-requests" }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d0-crash", crash.url, "decode", ""), pdWorker("d1-good", good.url, "decode", ""))
	v := r.fl.View()
	v.ByID([]byte("d1-good")).Acquire(1, 0, 1) // the crashing decode first
	code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 10*time.Second)
	v.ByID([]byte("d1-good")).Release(1, 0, 1, false)
	t.Logf("client got %d %s; prefill legs %d", code, b, prefills.Load())
	if code != 200 || prefills.Load() != 2 {
		t.Fatalf("the decode leg was retried with KV a reached decode worker may have consumed (prefill legs %d): %d %s",
			prefills.Load(), code, b)
	}
}

// vLLM: a decode worker that could not be dialled never got the request:
// the KV is still held, and only the decode leg runs again.
func TestPDVLLMDecodeNeverDialledReusesTheKV(t *testing.T) {
	var pl, dl legLog
	var ok atomic.Int32
	p := startUpstream(t, vllmPrefill(&pl, "e", &ok))
	d := startUpstream(t, decodeEngine(&dl, "kv_transfer_params", &ok))
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close() // connection refused
	f := defaultFlags()
	f.RouterPolicy = "least-requests"
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm"; c.PD.DecodePolicy = "least-requests" }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d0-dead", dead, "decode", ""), pdWorker("d1", d.url, "decode", ""))
	v := r.fl.View()
	v.ByID([]byte("d1")).Acquire(1, 0, 1) // the dead decode first
	code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 10*time.Second)
	v.ByID([]byte("d1")).Release(1, 0, 1, false)
	if code != 200 || pl.n() != 1 || dl.n() != 1 {
		t.Fatalf("%d %s; prefill legs %d, decode legs %d (want 1 and 1)", code, b, pl.n(), dl.n())
	}
}

// SGLang: a decode engine that refuses the request (4xx, the client's
// answer) never joins the room: the prefill leg is stopped at once and its
// worker is not blamed.
func TestPDDecodeRefusalStopsTheSGLangPrefillLegWithoutBlame(t *testing.T) {
	p := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		// Like SGLang's bootstrap queue: wait for the room's decode engine
		// (it never comes), then fail with 500.
		time.Sleep(2 * time.Second)
		ctx.SetStatusCode(500)
		ctx.SetBodyString(`{"error":{"message":"KV transfer failed: no decode engine connected","type":"server_error"}}`)
	})
	d := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(400)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"decode refuses","type":"invalid_request_error"}}`)
	})
	f := defaultFlags()
	f.BreakerFailureThreshold = 1
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "sglang" }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	late := mPDPrefillLate.Get()
	code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 10*time.Second)
	if code != 400 {
		t.Fatalf("%d %s", code, b)
	}
	pw := r.fl.View().ByID([]byte("p"))
	if !holdsWithin(time.Second, func() bool { return pw.Load.Requests.Load() == 0 }) {
		t.Fatalf("the prefill leg still holds its lease after the decode worker's 4xx (load %d)", pw.Load.Requests.Load())
	}
	if mPDPrefillLate.Get() != late || pw.Breaker.State() != fleet.BreakerClosed {
		t.Fatalf("the prefill worker was blamed for the decode worker's refusal (late +%d, breaker %v)",
			mPDPrefillLate.Get()-late, pw.Breaker.State())
	}
}

// SGLang: the dispatch stopping the prefill leg after a decode failure is
// no client disconnect.
func TestPDStoppingThePrefillLegIsNoClientDisconnect(t *testing.T) {
	p := startUpstream(t, func(ctx *fasthttp.RequestCtx) { time.Sleep(300 * time.Millisecond); okHandler(ctx) })
	d503 := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(503)
		ctx.SetBodyString(`{"error":{"message":"busy","type":"server_error"}}`)
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "sglang" }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d", d503.url, "decode", ""))
	before := mClientGone.Get()
	code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 10*time.Second)
	pw := r.fl.View().ByID([]byte("p"))
	holdsWithin(time.Second, func() bool { return pw.Load.Requests.Load() == 0 }) // the prefill goroutine ended
	t.Logf("%d %s; client-gone +%d", code, b, mClientGone.Get()-before)
	if got := mClientGone.Get() - before; got != 0 {
		t.Fatalf("infera_stream_client_disconnects_total +%d for a client that stayed", got)
	}
}

// SGLang batch whose legs resolve different model names: both bodies carry
// the same bootstrap rooms.
func TestPDSGLangBatchLegsShareTheirRoomsWhenModelsDiffer(t *testing.T) {
	var mu sync.Mutex
	bodies := map[string]string{}
	h := func(role string) fasthttp.RequestHandler {
		return func(ctx *fasthttp.RequestCtx) {
			mu.Lock()
			bodies[role] = string(ctx.PostBody())
			mu.Unlock()
			okHandler(ctx)
		}
	}
	p := startUpstream(t, h("prefill"))
	d := startUpstream(t, h("decode"))
	pr := pdWorker("p", p.url, "prefill", "")
	pr.Models, pr.Service = []string{"org/served-prefill"}, "svc"
	dr := pdWorker("d", d.url, "decode", "")
	dr.Models, dr.Service = []string{"served-decode"}, "svc"
	r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "sglang"
		c.ModelRouting.Enabled = true
		c.ModelRouting.Mappings = []config.ModelMapping{{Pattern: "m", Services: []string{"svc"}}}
	}), pr, dr)
	code, b := postWithin(t, r.url+"/v1/chat/completions", `{"model":"m","n":3,"messages":[{"role":"user","content":"x"}]}`, 10*time.Second)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	if !holdsWithin(2*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(bodies) == 2 }) {
		t.Fatal("the legs' bodies did not arrive")
	}
	mu.Lock()
	defer mu.Unlock()
	var pm, dm map[string]json.RawMessage
	if err := json.Unmarshal([]byte(bodies["prefill"]), &pm); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(bodies["decode"]), &dm); err != nil {
		t.Fatal(err)
	}
	var rooms []uint64
	if err := json.Unmarshal(pm["bootstrap_room"], &rooms); err != nil || len(rooms) != 3 || string(pm["model"]) == string(dm["model"]) {
		t.Fatalf("prefill rooms %s (%v), models %s and %s", pm["bootstrap_room"], err, pm["model"], dm["model"])
	}
	if string(pm["bootstrap_room"]) != string(dm["bootstrap_room"]) {
		t.Fatalf("the legs carry different rooms: prefill %s decode %s", pm["bootstrap_room"], dm["bootstrap_room"])
	}
}

// SGLang: when the last failure is the prefill engine's error answer (a
// 5xx here), the client gets that answer, as in vLLM mode and from mixed
// workers, not a generic 502.
func TestPDSGLangRelaysTheLastPrefillErrorAnswer(t *testing.T) {
	sp := newSGLangRooms()
	defer sp.stop()
	var pre, dec legLog
	var ok, st503 atomic.Int32
	st503.Store(503)
	p := startUpstream(t, sp.prefill(&pre, &st503))
	d := startUpstream(t, sp.decode(&dec, &ok))
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "sglang" }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	start := time.Now()
	code, b := post(t, r.url+"/v1/chat/completions", chatBody)
	if code != 503 || !strings.Contains(b, "scripted prefill failure") {
		t.Fatalf("%d %s; want the prefill engine's 503 answer", code, b)
	}
	if took := time.Since(start); took > 5*time.Second { // the decode engine waits noPartner (10 s) for its room
		t.Fatalf("took %v: the decode leg was not aborted", took)
	}
	noLoadLeft(t, r.fl)
}

// splitAnswerEngine answers every request on a connection with parts,
// written one by one with pause between them: an engine whose answer
// reaches the router in several TCP segments. hits counts the requests.
func splitAnswerEngine(t *testing.T, hits *atomic.Int32, pause time.Duration, parts ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					c.SetDeadline(time.Now().Add(10 * time.Second))
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					hits.Add(1)
					for i, p := range parts {
						if i > 0 {
							time.Sleep(pause)
						}
						if _, err := c.Write([]byte(p)); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// waitingDecode is a decode engine that never gets its KV: it answers 500
// after 3 s, or when the test ends.
func waitingDecode(t *testing.T) string {
	stop := make(chan struct{})
	d := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		select {
		case <-stop:
		case <-time.After(3 * time.Second):
		}
		ctx.SetStatusCode(500)
		ctx.SetBodyString(`{"error":{"message":"KV transfer failed: no prefill","type":"server_error"}}`)
	})
	t.Cleanup(func() { close(stop) }) // before the engine's shutdown, which waits for the handler
	return d.url
}

// splitParts cuts s into n pieces of about the same length.
func splitParts(s string, n int) []string {
	var out []string
	for k := 0; k < n; k++ {
		out = append(out, s[k*len(s)/n:(k+1)*len(s)/n])
	}
	return out
}

// docs/pd.md: an SGLang prefill engine's refusal (4xx) is the client's
// answer, also when its body comes in reads after the head (a later TCP
// segment, chunks, a body larger than one read): the client gets that
// status and exactly that body, and the prefill leg is not sent again.
func TestPDSGLangPrefillRefusalSplitAcrossReadsReachesTheClient(t *testing.T) {
	const refusal = `{"error":{"message":"the prompt is too long: scripted","type":"invalid_request_error","param":null,"code":400}}`
	large := `{"error":{"message":"` + strings.Repeat("x", 100<<10) + `","type":"invalid_request_error"}}`
	head := func(status string, n int) string {
		return "HTTP/1.1 " + status + "\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(n) + "\r\n\r\n"
	}
	chunk := func(s string) string { return strconv.FormatInt(int64(len(s)), 16) + "\r\n" + s + "\r\n" }
	const chunkedHead = "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
	cs := splitParts(refusal, 3)
	for _, tc := range []struct {
		name  string
		body  string
		parts []string
	}{
		{"head then body in two segments", refusal, []string{head("400 Bad Request", len(refusal)), refusal[:20], refusal[20:]}},
		{"head with the body's start, then its rest", refusal, []string{head("400 Bad Request", len(refusal)) + refusal[:20], refusal[20:]}},
		{"chunked", refusal, []string{chunkedHead, chunk(cs[0]), chunk(cs[1]), chunk(cs[2]) + "0\r\n\r\n"}},
		{"larger than one read", large, append([]string{head("400 Bad Request", len(large))}, splitParts(large, 4)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Two prefill workers and one retry: a refusal taken for a
			// failure would be sent to the other one.
			var hits atomic.Int32
			p0 := splitAnswerEngine(t, &hits, 50*time.Millisecond, tc.parts...)
			p1 := splitAnswerEngine(t, &hits, 50*time.Millisecond, tc.parts...)
			f := defaultFlags()
			r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "sglang" }),
				pdWorker("p0", p0, "prefill", ""), pdWorker("p1", p1, "prefill", ""), pdWorker("d", waitingDecode(t), "decode", ""))
			start := time.Now()
			code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 10*time.Second)
			took := time.Since(start)
			if code != 400 || b != tc.body {
				t.Fatalf("client got %d %.200q (prefill legs sent: %d); want the prefill engine's 400 %.200q", code, b, hits.Load(), tc.body)
			}
			if hits.Load() != 1 {
				t.Fatalf("the prefill leg was sent %d times; want once", hits.Load())
			}
			if took > 2*time.Second {
				t.Fatalf("took %v: the decode leg was not stopped", took)
			}
			noLoadLeft(t, r.fl)
			for _, w := range r.fl.View().All {
				if w.Breaker.State() != fleet.BreakerClosed {
					t.Fatalf("worker %s was blamed for the prefill engine's refusal", w.ID)
				}
			}
		})
	}
}

// SGLang: a prefill engine's 5xx whose body comes after the head is still
// retried on another prefill worker, and the last such answer is relayed
// whole.
func TestPDSGLangPrefillErrorSplitAcrossReadsIsRetriedThenRelayed(t *testing.T) {
	const answer = `{"error":{"message":"KV transfer failed: scripted","type":"server_error"}}`
	head := "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(answer)) + "\r\n\r\n"
	var hits atomic.Int32
	p0 := splitAnswerEngine(t, &hits, 50*time.Millisecond, head, answer[:20], answer[20:])
	p1 := splitAnswerEngine(t, &hits, 50*time.Millisecond, head, answer[:20], answer[20:])
	f := defaultFlags() // one retry
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "sglang" }),
		pdWorker("p0", p0, "prefill", ""), pdWorker("p1", p1, "prefill", ""), pdWorker("d", waitingDecode(t), "decode", ""))
	code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 10*time.Second)
	if code != 503 || b != answer {
		t.Fatalf("client got %d %q (prefill legs sent: %d); want the last prefill engine's 503 %q", code, b, hits.Load(), answer)
	}
	if hits.Load() != 2 {
		t.Fatalf("the prefill leg was sent %d times; want twice (one retry)", hits.Load())
	}
	noLoadLeft(t, r.fl)
}

// vLLM: a decode worker that got the request and failed makes both legs
// run again, on another decode worker; with none left, no prefill is sent
// again: its KV would stay held on the prefill engine until its abort
// timeout with nobody to read it (it was sent, then the decode lease
// failed).
func TestPDVLLMNoPrefillIsSentWithoutADecodeWorkerLeftToReadIt(t *testing.T) {
	p := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"cmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"a"}}],` +
			`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1]],"remote_engine_id":"e",` +
			`"remote_request_id":"cmpl-1","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}}`)
	})
	d := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(500)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"boom","type":"server_error"}}`)
	})
	r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 10*time.Second)
	if code != 500 || p.hits.Load() != 1 || d.hits.Load() != 1 {
		t.Fatalf("%d %s: prefill legs %d, decode legs %d; want the decode's 500 after one of each", code, b, p.hits.Load(), d.hits.Load())
	}
	noLoadLeft(t, r.fl)
}

// A retry is counted (infera_request_retries_total, infera_pd_retries_total,
// the access log's retries) when another attempt follows the failed one, as
// for mixed workers: a pair whose only prefill worker failed was counted a
// retry that never happened, in both modes.
func TestPDRetriesAreCountedOnlyWhenAnotherAttemptFollows(t *testing.T) {
	sp := newSGLangRooms()
	defer sp.stop()
	var pl, dl legLog
	var fail, ok atomic.Int32
	fail.Store(503)
	retries := func(r *testRouter) (total, prefill string) {
		return metricValue(t, r.url, "infera_request_retries_total"), metricValue(t, r.url, `infera_pd_retries_total{leg="prefill"}`)
	}
	for _, mode := range []string{"vllm", "sglang"} {
		pre, bad, dec := vllmPrefill(&pl, "engine-p1", &ok), vllmPrefill(&pl, "engine-p0", &fail), decodeEngine(&dl, "kv_transfer_params", &ok)
		if mode == "sglang" {
			pre, bad, dec = sp.prefill(&pl, &ok), sp.prefill(&pl, &fail), sp.decode(&dl, &ok)
		}
		p0, p1, d0 := startUpstream(t, bad), startUpstream(t, pre), startUpstream(t, dec)
		boot := `{"pd_mode":"` + mode + `","bootstrap_port":8998}`
		cfg := pdConfig(t, func(c *config.Config) { c.PD.Mode = mode })

		// The only prefill worker fails: nothing follows it.
		r := startPDRouter(t, nil, cfg, pdWorker("p0", p0.url, "prefill", boot), pdWorker("d0", d0.url, "decode", ""))
		total, prefill := retries(r)
		if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 503 {
			t.Fatalf("%s: %d %s", mode, code, b)
		}
		if t2, p2 := retries(r); t2 != total || p2 != prefill {
			t.Fatalf("%s: a failure with no worker left to try counted a retry: retries %s -> %s, prefill leg %s -> %s", mode, total, t2, prefill, p2)
		}
		noLoadLeft(t, r.fl)

		// A second prefill worker takes the retry: one retry.
		r = startPDRouter(t, nil, cfg, pdWorker("p0", p0.url, "prefill", boot), pdWorker("p1", p1.url, "prefill", boot),
			pdWorker("d0", d0.url, "decode", ""))
		r.fl.View().ByID([]byte("p1")).Acquire(1, 0, 1) // p0 first
		total, _ = retries(r)
		code, b := post(t, r.url+"/v1/chat/completions", chatBody)
		r.fl.View().ByID([]byte("p1")).Release(1, 0, 1, false)
		if code != 200 {
			t.Fatalf("%s: %d %s", mode, code, b)
		}
		if t2, _ := retries(r); metricDelta(t, total, t2) != 1 {
			t.Fatalf("%s: a retry on another prefill worker: retries %s -> %s, want one more", mode, total, t2)
		}
		noLoadLeft(t, r.fl)
	}
}

func metricDelta(t *testing.T, before, after string) int {
	t.Helper()
	a, err1 := strconv.Atoi(before)
	b, err2 := strconv.Atoi(after)
	if err1 != nil || err2 != nil {
		t.Fatalf("counters %q, %q", before, after)
	}
	return b - a
}

// An SGLang prefill engine that takes a leg on a reused keep-alive
// connection, pushes its KV, then drops the connection without an answer:
// the leg was not sent again on a fresh connection with the same
// bootstrap_room. It was (the transport's resend of a stale keep-alive),
// and the second prefill waited for a decode engine that had already
// taken the room's KV, holding the prefill worker's lease (and prefill
// seat) until pd.prefill_timeout_s, 300 s by default, after the client had
// its answer.
func TestPDSGLangLegDroppedOnAReusedConnectionIsNotSentAgainWithItsRoom(t *testing.T) {
	sp := newSGLangRooms()
	defer sp.stop()
	var pl, dl legLog
	var ok, n atomic.Int32
	var mu sync.Mutex
	seen := map[string]bool{}
	dups := 0
	pre := func(ctx *fasthttp.RequestCtx) {
		room := roomOf(ctx.PostBody())
		mu.Lock()
		dup := seen[room]
		seen[room] = true
		if dup {
			dups++
		}
		mu.Unlock()
		if dup {
			// A real engine waits for the room's decode engine, which
			// already took the KV, until its bootstrap timeout.
			select {
			case <-sp.stopped:
			case <-time.After(noPartner):
			}
			ctx.SetStatusCode(500)
			return
		}
		if n.Add(1) != 2 {
			sp.prefill(&pl, &ok)(ctx)
			return
		}
		// The second request, on the first one's pooled connection: the
		// KV is pushed, the decode engine answers, the connection drops.
		pl.add(ctx)
		close(sp.ch(sp.rooms, room))
		select {
		case <-sp.ch(sp.joined, room):
		case <-sp.stopped:
		}
		time.Sleep(100 * time.Millisecond) // the decode answer reaches the client first
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) { c.Close() })
	}
	p0, d0 := startUpstream(t, pre), startUpstream(t, sp.decode(&dl, &ok))
	r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = "sglang" }),
		pdWorker("p0", p0.url, "prefill", `{"pd_mode":"sglang","bootstrap_port":8998}`), pdWorker("d0", d0.url, "decode", ""))
	for i := 0; i < 2; i++ {
		if code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 5*time.Second); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, b)
		}
		if !holdsWithin(time.Second, func() bool { return r.fl.View().ByID([]byte("p0")).Load.Requests.Load() == 0 }) {
			mu.Lock()
			d := dups
			mu.Unlock()
			t.Fatalf("request %d: the prefill lease is still held a second after the answer (prefill legs sent again with their room: %d)", i, d)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if dups != 0 {
		t.Fatalf("%d prefill legs were sent again with a room already used", dups)
	}
	noLoadLeft(t, r.fl)
}

// A PD request whose last attempt failed on its prefill worker leaves no
// prefix record of that worker, as a mixed request's last failed attempt
// does (TestALastFailedAttemptLeavesNoPrefixRecord): the prefix layer sent
// the same prompt's next request back to the prefill worker that had
// failed it, as a prefix hit, in both modes.
func TestPDALastFailedPrefillLeavesNoPrefixRecord(t *testing.T) {
	sp := newSGLangRooms()
	defer sp.stop()
	var pl legLog
	var fail, ok atomic.Int32
	fail.Store(500)
	for _, mode := range []string{"vllm", "sglang"} {
		var aServed atomic.Int32
		a, b, d := vllmPrefill(&pl, "engine-a", &fail), vllmPrefill(&pl, "engine-b", &ok), decodeEngine(&legLog{}, "kv_transfer_params", &ok)
		if mode == "sglang" {
			a, b, d = sp.prefill(&pl, &fail), sp.prefill(&pl, &ok), sp.decode(&legLog{}, &ok)
		}
		ua := startUpstream(t, func(ctx *fasthttp.RequestCtx) { aServed.Add(1); a(ctx) })
		ub, ud := startUpstream(t, b), startUpstream(t, d)
		f := defaultFlags()
		f.RequestMaxRetries = 0
		f.BreakerFailureThreshold = 100
		boot := `{"pd_mode":"` + mode + `","bootstrap_port":8998}`
		r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
			c.PD.Mode = mode
			c.PD.SGLangIndependentPairing = mode == "sglang"
			c.PrefixCache.Enabled = true
			c.Debug.DecisionHeader = true
		}), pdWorker("a", ua.url, "prefill", boot), pdWorker("b", ub.url, "prefill", boot), pdWorker("d", ud.url, "decode", ""))
		testLastFailedAttempt(t, r, &aServed)
		noLoadLeft(t, r.fl)
	}
}

// vLLM legs are not sent twice either: a prefill leg makes its engine hold
// the prompt's KV for a read (VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s), and
// a decode leg's read frees it. An engine that took a leg on a reused
// keep-alive connection and dropped it without an answer got it again on
// a fresh connection: a second prefill whose first one's KV stayed held,
// or a second read of KV the first had freed (the engine's 500 "KV
// transfer failed" went to the client, and the handoff records could
// blame the prefill worker for the decode engine's fault).
func TestPDVLLMLegDroppedOnAReusedConnectionIsNotSentAgain(t *testing.T) {
	drop := func(ctx *fasthttp.RequestCtx) {
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) { c.Close() })
	}
	for _, leg := range []string{"prefill", "decode"} {
		var pl, dl legLog
		var ok atomic.Int32
		pre, dec := vllmPrefill(&pl, "engine-p", &ok), decodeEngine(&dl, "kv_transfer_params", &ok)
		if leg == "prefill" {
			inner := pre
			pre = func(ctx *fasthttp.RequestCtx) {
				if pl.n() == 1 { // the second prefill leg, on the first one's connection
					pl.add(ctx)
					drop(ctx)
					return
				}
				inner(ctx)
			}
		} else {
			inner := dec
			dec = func(ctx *fasthttp.RequestCtx) {
				if dl.n() == 1 { // the second decode leg reads the KV, then drops
					dl.add(ctx)
					drop(ctx)
					return
				}
				inner(ctx)
			}
		}
		p, d := startUpstream(t, pre), startUpstream(t, dec)
		f := defaultFlags()
		f.RequestMaxRetries = 0 // one leg of each role per request
		r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
			pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
		if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
			t.Fatalf("%s: %d %s", leg, code, b)
		}
		code, b := post(t, r.url+"/v1/chat/completions", chatBody)
		if pl.n() != 2 || dl.n() > 2 {
			t.Fatalf("%s dropped: %d prefill and %d decode legs sent for 2 requests without retries (answer %d %s)", leg, pl.n(), dl.n(), code, b)
		}
		if code != 502 && code != 503 {
			t.Fatalf("%s dropped: %d %s, want 502 or 503 (the worker closed the connection without an answer)", leg, code, b)
		}
		noLoadLeft(t, r.fl)
	}
}

// A pooled PD dispatch does not keep a large request's leg bodies: each
// leg body is a copy of the client's body (with the router's fields), and
// the pool kept them whole, as the request state does not
// (reqState.Reset). After a burst of 16 concurrent 4 MB vLLM requests,
// the router's heap stayed at 55 MB through steady small traffic and
// repeated GCs (a mixed fleet's went back to 6 MB).
func TestAPooledPDDispatchDoesNotPinALargeRequestsBodies(t *testing.T) {
	p := pdPool.Get().(*pdDispatch)
	p.refs.Store(1)
	p.pbody = make([]byte, 4<<20)
	p.dbody = make([]byte, 4<<20)
	p.kvp = make([]byte, 1<<20)
	p.release()
	if cap(p.pbody) > 256<<10 || cap(p.dbody) > 256<<10 || cap(p.kvp) > 256<<10 {
		t.Fatalf("the pooled dispatch keeps %d, %d and %d bytes of leg bodies", cap(p.pbody), cap(p.dbody), cap(p.kvp))
	}
}

// A prefill/decode pair's access-log line names both workers: `worker` the
// decode worker that answered, `prefill_worker` the prefill worker whose
// leg computed the prompt (the last one tried when a prefill leg was
// retried), in both modes. Only the decode worker was named: an operator
// could not tell which prefill engine served a slow or failed request.
func TestAPDRequestsAccessLogLineNamesItsPrefillWorker(t *testing.T) {
	sp := newSGLangRooms()
	defer sp.stop()
	var pl, dl legLog
	var fail, ok atomic.Int32
	fail.Store(503)
	for _, mode := range []string{"vllm", "sglang"} {
		pre, bad, dec := vllmPrefill(&pl, "engine-p1", &ok), vllmPrefill(&pl, "engine-p0", &fail), decodeEngine(&dl, "kv_transfer_params", &ok)
		if mode == "sglang" {
			pre, bad, dec = sp.prefill(&pl, &ok), sp.prefill(&pl, &fail), sp.decode(&dl, &ok)
		}
		p0, p1, d0 := startUpstream(t, bad), startUpstream(t, pre), startUpstream(t, dec)
		boot := `{"pd_mode":"` + mode + `","bootstrap_port":8998}`
		cfg := pdConfig(t, func(c *config.Config) { c.PD.Mode = mode })
		path := filepath.Join(t.TempDir(), "access.log")
		l, err := OpenAccessLog(path)
		if err != nil {
			t.Fatal(err)
		}
		r := startPDRouterWith(t, nil, cfg, nil, func(o *Options) { o.AccessLog = l },
			pdWorker("p0", p0.url, "prefill", boot), pdWorker("p1", p1.url, "prefill", boot), pdWorker("d0", d0.url, "decode", ""))
		// p0 first: it fails, p1 takes the retry.
		r.fl.View().ByID([]byte("p1")).Acquire(1, 0, 1)
		code, b := post(t, r.url+"/v1/chat/completions", chatBody)
		r.fl.View().ByID([]byte("p1")).Release(1, 0, 1, false)
		if code != 200 {
			t.Fatalf("%s: %d %s", mode, code, b)
		}
		r.srv.Shutdown()
		l.Close()
		lines := readAccessLog(t, path)
		if len(lines) != 1 {
			t.Fatalf("%s: %d access-log lines, want 1", mode, len(lines))
		}
		if w, p := lines[0]["worker"], lines[0]["prefill_worker"]; w != "d0" || p != "p1" {
			t.Fatalf("%s: access log worker %v, prefill_worker %v; want d0 and p1 (the retried prefill leg's worker)", mode, w, p)
		}
		noLoadLeft(t, r.fl)
	}
}
