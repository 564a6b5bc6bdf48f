package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/broker"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/netpeek"
	"github.com/infera/infera/sched"
	"github.com/valyala/fasthttp"
)

// hangUntilClosed holds a request until the router closes its connection
// (or 5 s pass).
func hangUntilClosed(ctx *fasthttp.RequestCtx) {
	fd := netpeek.SockFD(ctx.Conn())
	for i := 0; i < 500; i++ {
		time.Sleep(10 * time.Millisecond)
		if netpeek.Peek(fd) == netpeek.Closed {
			return
		}
	}
}

// SGLang: the decode engine waits for the prefill's KV and the prefill
// engine for the decode engine to join the room, so when the decode leg's
// first-packet wait ends while the prefill leg has not answered, either
// may be the one that hangs: the attempt is a 504 held against neither
// worker's breaker (the healthy decode worker's breaker opened before).
func TestPDSGLangDecodeTimingOutWhileThePrefillIsSilentBlamesNeither(t *testing.T) {
	p := startUpstream(t, hangUntilClosed)
	d := startUpstream(t, hangUntilClosed)
	f := defaultFlags()
	f.BreakerFailureThreshold = 1
	f.RequestMaxRetries = 0
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "sglang"
		c.Timeouts.StreamFirstPacketSeconds = 0.3
	}), pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	for i := 0; i < 3; i++ {
		code, b := postWithin(t, r.url+"/v1/chat/completions", streamBody, 10*time.Second)
		if code != 504 {
			t.Fatalf("attempt %d: %d %s, want 504", i, code, b)
		}
		noLoadLeft(t, r.fl)
		v := r.fl.View()
		for _, id := range []string{"p", "d"} {
			if st := v.ByID([]byte(id)).Breaker.State(); st != fleet.BreakerClosed {
				t.Fatalf("attempt %d: worker %s blamed (breaker %v) though it cannot be told which leg hangs", i, id, st)
			}
		}
	}
}

// A client that leaves before the first byte is one disconnect in
// infera_stream_client_disconnects_total, not two (the failed attempt and
// the dropped answer).
func TestAClientLeavingBeforeTheFirstByteIsCountedOnce(t *testing.T) {
	up := startUpstream(t, hangUntilClosed)
	r := startRouter(t, nil, nil, up.url)
	// Requests of earlier tests still ending may count: wait for quiet.
	before := mClientGone.Get()
	for quiet := 0; quiet < 4; {
		time.Sleep(50 * time.Millisecond)
		if now := mClientGone.Get(); now != before {
			before, quiet = now, 0
		} else {
			quiet++
		}
	}
	conn, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
	w := r.fl.View().ByID([]byte("w0"))
	if !holdsWithin(3*time.Second, func() bool { return w.Load.Requests.Load() == 1 }) {
		t.Fatal("the request never reached the worker")
	}
	conn.Close()
	if !holdsWithin(3*time.Second, func() bool { return w.Load.Requests.Load() == 0 }) {
		t.Fatal("the attempt outlived its client")
	}
	time.Sleep(100 * time.Millisecond)
	if d := mClientGone.Get() - before; d != 1 {
		t.Fatalf("infera_stream_client_disconnects_total +%d for one client that left", d)
	}
}

// With pd.mode empty and a prefill worker whose record names no
// connector, the client is told which worker and what to set, as the
// docs say, not a bare "no worker available".
func TestPDPrefillWorkerWithoutAConnectorIsNamedInTheAnswer(t *testing.T) {
	p := startUpstream(t, okHandler)
	d := startUpstream(t, okHandler)
	r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = "" }),
		pdWorker("p0", p.url, "prefill", ""), pdWorker("d0", d.url, "decode", ""))
	code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 5*time.Second)
	if code != 503 || !strings.Contains(b, `prefill worker \"p0\" does not advertise its KV connector`) || !strings.Contains(b, `"code":"pd_mode_unknown"`) {
		t.Fatalf("%d %s", code, b)
	}
}

// Which NATS failures of a PD leg mean its request never reached a
// worker's engine (so vLLM's prefill KV is still held for another decode
// worker) and which may have.
func TestPDLegsOverNATSKnowWhenTheRequestNeverReachedTheEngine(t *testing.T) {
	tr := &natsTransport{}
	for _, c := range []struct {
		err   error
		never bool
	}{
		{fmt.Errorf("x: %w", broker.ErrNoResponders), true},
		{fmt.Errorf("x: %w", broker.ErrEngineDial), true},
		{fmt.Errorf("x: %w", broker.ErrEngine), false}, // broken before a head, or a worker that does not say
		{fmt.Errorf("x: %w", broker.ErrNATS), true},
		{fmt.Errorf("x: %w", broker.ErrMaxPending), true},
		{fmt.Errorf("x: %w", broker.ErrWorkerBusy), true},
		{fmt.Errorf("x: %w", broker.ErrEngineProtocol), false},
		{fmt.Errorf("x: %w", broker.ErrConnLost), false},
		{fmt.Errorf("x: %w", broker.ErrIdleTimeout), false},
		{fmt.Errorf("x: %w", broker.ErrBroken), false},
		{fmt.Errorf("x: %w", broker.ErrWorkerGone), false},
	} {
		f := tr.failure(c.err, false, false)
		if got := neverReached(f); got != c.never {
			t.Errorf("%v (%s): never reached %v, want %v", c.err, f.class().code, got, c.never)
		}
	}
	if f := tr.failure(errors.New("x"), false, false); neverReached(f) {
		t.Error("an unclassified error counts as never reached")
	}
}

// vLLM: a stream's first packet is due stream_first_packet_s after the
// prefill leg is sent, as a mixed worker's (the prefill's wait is the
// first packet's): it waited pd.prefill_timeout_s, then the first packet's
// time again for the decode leg.
func TestPDVLLMStreamFirstPacketCoversThePrefillLeg(t *testing.T) {
	var pl, dl legLog
	var ok atomic.Int32
	prefill := vllmPrefill(&pl, "e", &ok)
	p := startUpstream(t, func(ctx *fasthttp.RequestCtx) { time.Sleep(1500 * time.Millisecond); prefill(ctx) })
	d := startUpstream(t, decodeEngine(&dl, "kv_transfer_params", &ok))
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "vllm"
		c.Timeouts.StreamFirstPacketSeconds = 0.4
	}), pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	start := time.Now()
	code, b := postWithin(t, r.url+"/v1/chat/completions", streamBody, 10*time.Second)
	if el := time.Since(start); code != 504 || el > 1200*time.Millisecond {
		t.Fatalf("%d after %v: %s; want 504 at about 0.4 s", code, el, b)
	}
	if dl.n() != 0 {
		t.Fatal("the decode leg was sent")
	}
	noLoadLeft(t, r.fl)
}

// A client leaving while a PD leg waits is not a leg failure: the leg
// failures counter (an alert's series) stayed at +1 per impatient client,
// on the prefill leg in vLLM mode and the decode leg in SGLang mode.
func TestPDAClientLeavingIsNoLegFailure(t *testing.T) {
	for _, mode := range []string{"vllm", "sglang"} {
		t.Run(mode, func(t *testing.T) {
			p := startUpstream(t, hangUntilClosed)
			d := startUpstream(t, hangUntilClosed)
			boot := ""
			if mode == "sglang" {
				boot = `{"pd_mode":"sglang","bootstrap_port":8998}`
			}
			r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) { c.PD.Mode = mode }),
				pdWorker("p", p.url, "prefill", boot), pdWorker("d", d.url, "decode", ""))
			before := [2]uint64{mPDLegFailures[sched.LegPrefill].Get(), mPDLegFailures[sched.LegDecode].Get()}
			conn, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
			if !holdsWithin(3*time.Second, func() bool { return p.hits.Load() == 1 }) {
				t.Fatal("the prefill leg never reached its worker")
			}
			conn.Close()
			noLoadLeft(t, r.fl)
			time.Sleep(100 * time.Millisecond)
			after := [2]uint64{mPDLegFailures[sched.LegPrefill].Get(), mPDLegFailures[sched.LegDecode].Get()}
			if after != before {
				t.Fatalf("leg failures (prefill, decode) went from %v to %v for a client that left", before, after)
			}
		})
	}
}

// A PD decode answer that breaks after its head (non-stream) or after an
// SSE comment (stream) is retried on another decode worker, as the mixed
// dispatch retries: it used to commit on its first byte, and the client got
// a cut 200.
func TestPDDecodeAnswerBrokenBeforeItsFirstEventIsRetried(t *testing.T) {
	for _, mode := range []string{"vllm", "sglang"} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", mode, stream), func(t *testing.T) {
				var pl legLog
				var ok atomic.Int32
				var p string
				if mode == "vllm" {
					p = startUpstream(t, vllmPrefill(&pl, "e", &ok)).url
				} else {
					p = startUpstream(t, okHandler).url
				}
				bad := startRaw(t, func(n int, req string, c net.Conn) {
					if stream {
						c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
						fmt.Fprintf(c, "%x\r\n%s\r\n", len(": keep-alive\n\n"), ": keep-alive\n\n")
					} else {
						c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"choices\""))
					}
					time.Sleep(30 * time.Millisecond)
					c.(*net.TCPConn).SetLinger(0)
					c.Close()
				})
				good := startUpstream(t, decodeEngine(&legLog{}, "", &ok))
				f := defaultFlags()
				f.RequestMaxRetries = 1
				f.RouterPolicy = "round-robin"
				r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
					c.PD.Mode = mode
					c.PD.DecodePolicy = "round-robin"
				}), pdWorker("p", p, "prefill", ""), pdWorker("d0", bad.url, "decode", ""), pdWorker("d1", good.url, "decode", ""))
				body := chatBody
				if stream {
					body = streamBody
				}
				for i := 0; i < 2; i++ {
					code, b := postNoFail(r.url+"/v1/chat/completions", body, 5*time.Second)
					if code != 200 || (stream && (strings.Contains(b, "error") || !strings.HasSuffix(b, "data: [DONE]\n\n"))) || (!stream && b != okJSON) {
						t.Fatalf("request %d: %d %q; want the good decode worker's answer", i, code, b)
					}
				}
				if bad.conns.Load() == 0 {
					t.Fatal("the broken decode worker was never tried")
				}
			})
		}
	}
}

// postNoFail posts and returns the status and what of the body arrived
// (a read error is appended, not fatal).
func postNoFail(url, body string, d time.Duration) (int, string) {
	c := &fasthttp.Client{ReadTimeout: d, WriteTimeout: d}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.SetBodyString(body)
	if err := c.DoTimeout(req, resp, d); err != nil {
		return -1, "ERR: " + err.Error()
	}
	return resp.StatusCode(), string(resp.Body())
}

// SGLang, pd.prefill_timeout_s 0, a stream: the prefill engine sends its
// head and a first chunk, then goes quiet while the decode leg answers the
// client in full. stream_idle_s bounds the prefill leg's reads after its
// first bytes, so its lease ends; before, it was held until the engine
// closed the connection.
func TestPDSGLangPrefillLegQuietAfterTheCommitEndsOnStreamIdle(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	p := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		ev := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
		fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
		select {
		case <-release:
		case <-time.After(5 * time.Second):
		}
	})
	var ok atomic.Int32
	d := startUpstream(t, decodeEngine(&legLog{}, "bootstrap_room", &ok))
	r := startPDRouter(t, nil, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "sglang"
		c.PD.PrefillTimeoutSeconds = 0
		c.Timeouts.StreamIdleSeconds = 0.3
		c.Timeouts.StreamFirstPacketSeconds = 0.3
	}), pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	code, b := postWithin(t, r.url+"/v1/chat/completions", streamBody, 5*time.Second)
	if code != 200 || !strings.HasSuffix(b, "data: [DONE]\n\n") {
		t.Fatalf("%d %q", code, b)
	}
	w := r.fl.View().ByID([]byte("p"))
	if !holdsWithin(2*time.Second, func() bool { return w.Load.Requests.Load() == 0 }) {
		t.Fatalf("the prefill leg, quiet for 2 s with stream_idle_s 0.3, still holds its lease (requests %d)", w.Load.Requests.Load())
	}
}

// SGLang. Prefill worker p0's bootstrap server cannot be reached (a wrong
// bootstrap_port in its record, or its KV server died while its HTTP API
// lives): every decode engine paired with it fails at once with a 500,
// while p0 waits for a decode engine to join the room. Once two decode
// workers in a row failed p0's handoffs, p0 is blamed: its breaker opens,
// the healthy decode workers' stay closed. Before, the decode workers took
// every fault and p0 none.
func TestPDSGLangUnreachableBootstrapBlamesThePrefillWorkerNotTheDecodeWorkers(t *testing.T) {
	sp := newSGLangRooms()
	defer sp.stop()
	var ok atomic.Int32
	badP := startUpstream(t, hangUntilClosed)
	goodP := startUpstream(t, sp.prefill(&legLog{}, &ok))
	dec := sp.decode(&legLog{}, &ok)
	decode := func(ctx *fasthttp.RequestCtx) {
		if strings.Contains(string(ctx.PostBody()), `"bootstrap_port":1111`) {
			ctx.SetStatusCode(500)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"KV transfer failed: bootstrap_room 1: cannot reach the prefill engine's KV server","type":"server_error"}}`)
			return
		}
		dec(ctx)
	}
	// Three decode workers to two prefill workers, both round-robin: p0
	// meets every decode worker in turn. (Two and two would pair p0 with
	// the same decode worker every time, where nothing tells them apart:
	// the decode worker is blamed, fleet.HandoffFailed's rule 5.)
	d0 := startUpstream(t, decode)
	d1 := startUpstream(t, decode)
	d2 := startUpstream(t, decode)
	f := defaultFlags()
	f.BreakerFailureThreshold = 2
	f.RequestMaxRetries = 2
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "sglang"
		c.PD.DecodePolicy = "round-robin"
	}),
		pdWorker("p0", badP.url, "prefill", `{"pd_mode":"sglang","bootstrap_port":1111}`),
		pdWorker("p1", goodP.url, "prefill", `{"pd_mode":"sglang","bootstrap_port":8998}`),
		pdWorker("d0", d0.url, "decode", ""), pdWorker("d1", d1.url, "decode", ""), pdWorker("d2", d2.url, "decode", ""))
	for i := 0; i < 10; i++ {
		if code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 5*time.Second); code != 200 {
			t.Fatalf("request %d: %d %s (a retry on another pair should have served it)", i, code, b)
		}
	}
	noLoadLeft(t, r.fl)
	v := r.fl.View()
	for _, id := range []string{"d0", "d1", "d2"} {
		if st := v.ByID([]byte(id)).Breaker.State(); st != fleet.BreakerClosed {
			t.Errorf("healthy decode worker %s blamed for p0's unreachable KV server: breaker %v", id, st)
		}
	}
	if _, pf := v.ByID([]byte("p0")).Counts(); pf == 0 || v.ByID([]byte("p0")).Breaker.State() == fleet.BreakerClosed {
		t.Fatalf("p0, whose KV server cannot be reached, was not blamed: %d faults, breaker %v", pf, v.ByID([]byte("p0")).Breaker.State())
	}
}

// The vLLM counterpart: prefill worker p0 answers kv_transfer_params naming
// a side channel the decode engines cannot reach; each decode engine fails
// the read with a 500. p0 takes the faults, not the healthy decode
// workers (it used to be credited a success for each).
func TestPDVLLMUnreachableSideChannelBlamesThePrefillWorkerNotTheDecodeWorkers(t *testing.T) {
	var ok atomic.Int32
	bad := func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"cmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],` +
			`"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[1]],"remote_engine_id":"bad","remote_request_id":"cmpl-1","remote_host":"10.9.9.9","remote_port":5600}}`)
	}
	badP := startUpstream(t, bad)
	goodP := startUpstream(t, vllmPrefill(&legLog{}, "good", &ok))
	decode := func(ctx *fasthttp.RequestCtx) {
		if strings.Contains(string(ctx.PostBody()), `10.9.9.9`) {
			ctx.SetStatusCode(500)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"KV transfer failed: cannot reach the prefill engine's side channel","type":"server_error"}}`)
			return
		}
		decodeEngine(&legLog{}, "kv_transfer_params", &ok)(ctx)
	}
	d0 := startUpstream(t, decode)
	d1 := startUpstream(t, decode)
	f := defaultFlags()
	f.BreakerFailureThreshold = 2
	f.RequestMaxRetries = 2
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "vllm"
		c.PD.DecodePolicy = "round-robin"
	}),
		pdWorker("p0", badP.url, "prefill", ""), pdWorker("p1", goodP.url, "prefill", ""),
		pdWorker("d0", d0.url, "decode", ""), pdWorker("d1", d1.url, "decode", ""))
	for i := 0; i < 10; i++ {
		postWithin(t, r.url+"/v1/chat/completions", chatBody, 5*time.Second)
	}
	noLoadLeft(t, r.fl)
	v := r.fl.View()
	p0 := v.ByID([]byte("p0"))
	_, pf := p0.Counts()
	_, f0 := v.ByID([]byte("d0")).Counts()
	_, f1 := v.ByID([]byte("d1")).Counts()
	// The first failure has no evidence either way (the decode worker is
	// blamed); from the second on, p0's handoffs have failed two decode
	// workers and p0 takes the faults.
	if pf < 2 || f0+f1 > 1 || p0.Breaker.State() == fleet.BreakerClosed {
		t.Fatalf("faults: p0 (bad side channel) %d (breaker %v), healthy d0 %d, d1 %d", pf, p0.Breaker.State(), f0, f1)
	}
	for _, id := range []string{"d0", "d1"} {
		if st := v.ByID([]byte(id)).Breaker.State(); st != fleet.BreakerClosed {
			t.Errorf("healthy decode worker %s blamed for p0's side channel: breaker %v", id, st)
		}
	}
}

// vLLM. The decode leg's 503 carried Retry-After; the retry's prefill leg
// failed 500 without one, and that prefill answer, relayed as the last
// failure, carries no Retry-After (it used to carry the decode worker's).
func TestPDPrefillErrorIsRelayedWithItsOwnRetryAfter(t *testing.T) {
	var ok atomic.Int32
	var n atomic.Int32
	good := vllmPrefill(&legLog{}, "e", &ok)
	p := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if n.Add(1) == 1 {
			good(ctx)
			return
		}
		ctx.SetStatusCode(500)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"prefill broke","type":"server_error"}}`)
	})
	dec := func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(503)
		ctx.Response.Header.Set("Retry-After", "30")
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"decode overloaded","type":"server_error"}}`)
	}
	d0, d1 := startUpstream(t, dec), startUpstream(t, dec)
	f := defaultFlags()
	f.RequestMaxRetries = 1
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d0", d0.url, "decode", ""), pdWorker("d1", d1.url, "decode", ""))
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || !strings.Contains(string(b), "prefill broke") {
		t.Fatalf("the last failure, the prefill's answer, was not relayed: %d %s", resp.StatusCode, b)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		t.Fatalf("the prefill's answer was relayed with Retry-After %q, which the prefill engine never sent", ra)
	}
}

// The other way round: a sick decode engine that answers 5xx to every
// request, behind two healthy prefill workers, is blamed, not the prefill
// workers whose KV it was handed: its handoffs fail with both prefill
// workers (fleet.HandoffFailed's rule 2), and their own handoffs to the
// healthy decode worker are taken.
func TestPDSickDecodeWorkerIsBlamedNotThePrefillWorkers(t *testing.T) {
	for _, mode := range []string{"vllm", "sglang"} {
		t.Run(mode, func(t *testing.T) {
			var ok atomic.Int32
			var p0, p1 string
			sp := newSGLangRooms()
			defer sp.stop()
			good := decodeEngine(&legLog{}, "kv_transfer_params", &ok)
			if mode == "vllm" {
				p0 = startUpstream(t, vllmPrefill(&legLog{}, "e0", &ok)).url
				p1 = startUpstream(t, vllmPrefill(&legLog{}, "e1", &ok)).url
			} else {
				p0 = startUpstream(t, sp.prefill(&legLog{}, &ok)).url
				p1 = startUpstream(t, sp.prefill(&legLog{}, &ok)).url
				good = sp.decode(&legLog{}, &ok)
			}
			sick := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
				ctx.SetStatusCode(500)
				ctx.SetContentType("application/json")
				ctx.SetBodyString(`{"error":{"message":"CUDA error: an illegal memory access was encountered","type":"server_error"}}`)
			})
			d1 := startUpstream(t, good)
			f := defaultFlags()
			f.BreakerFailureThreshold = 2
			f.RequestMaxRetries = 2
			r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
				c.PD.Mode = mode
				c.PD.DecodePolicy = "round-robin"
			}),
				pdWorker("p0", p0, "prefill", `{"pd_mode":"`+mode+`","bootstrap_port":8998}`),
				pdWorker("p1", p1, "prefill", `{"pd_mode":"`+mode+`","bootstrap_port":8998}`),
				pdWorker("d0", sick.url, "decode", ""), pdWorker("d1", d1.url, "decode", ""))
			for i := 0; i < 10; i++ {
				if code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 5*time.Second); code != 200 {
					t.Fatalf("request %d: %d %s", i, code, b)
				}
			}
			noLoadLeft(t, r.fl)
			v := r.fl.View()
			if st := v.ByID([]byte("d0")).Breaker.State(); st == fleet.BreakerClosed {
				t.Errorf("the sick decode worker's breaker stayed closed")
			}
			for _, id := range []string{"p0", "p1"} {
				if _, pf := v.ByID([]byte(id)).Counts(); pf != 0 {
					t.Errorf("healthy prefill worker %s blamed %d times for the sick decode worker", id, pf)
				}
			}
		})
	}
}

// SGLang, a stream, pd.prefill_timeout_s 0.5, stream_idle_s 5: the prefill
// engine sends its head and a first chunk, then never finishes (its KV push
// hangs); the decode engine waits for the KV. docs/pd.md: prefill_timeout_s
// is the "longest time from sending a prefill leg to its complete answer",
// and "a prefill leg that reaches its own deadline first is blamed as
// before". The stream_idle_s bound on the prefill leg's reads after its
// first bytes keeps the prefill deadline too (it replaced it at aadadeb:
// the leg ran until stream_idle_s, or the total for a trickling engine).
func TestPDSGLangPrefillTimeoutStillBoundsTheLegAfterItsFirstBytes(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	p := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		ev := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
		fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
		select {
		case <-release:
		case <-time.After(8 * time.Second):
		}
	})
	d := startUpstream(t, hangUntilClosed)
	f := defaultFlags()
	f.RequestMaxRetries = 0
	f.BreakerFailureThreshold = 1
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "sglang"
		c.PD.PrefillTimeoutSeconds = 0.5
		c.Timeouts.StreamIdleSeconds = 5
		c.Timeouts.StreamFirstPacketSeconds = 10
	}), pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	start := time.Now()
	code, b := postWithin(t, r.url+"/v1/chat/completions", streamBody, 10*time.Second)
	el := time.Since(start)
	if el > 2*time.Second {
		t.Fatalf("%d %q after %v: the prefill leg ran past pd.prefill_timeout_s 0.5 s (until stream_idle_s 5 s)", code, b, el)
	}
	if _, pf := r.fl.View().ByID([]byte("p")).Counts(); pf == 0 {
		t.Fatalf("%d %q: the prefill worker that hit its own deadline was not blamed", code, b)
	}
	noLoadLeft(t, r.fl)
}

// vLLM. The prefill worker's breaker is open and its cooldown over: the
// next request is its probe. The prefill leg does its part (a valid
// kv_transfer_params answer); the decode worker is sick (500), and the
// handoff records blame the decode worker (no evidence against the
// prefill: fleet.HandoffFailed's rule 5). The prefill worker's breaker
// learns the success; at aadadeb its lease ended neutral (the probe
// abandoned), so the breaker stayed open and every later request could
// only probe it, one at a time, as long as decode legs kept failing.
func TestPDVLLMPrefillProbeLearnsSuccessWhenTheDecodeWorkerIsBlamed(t *testing.T) {
	var pst, dst atomic.Int32
	p := startUpstream(t, vllmPrefill(&legLog{}, "e", &pst))
	d := startUpstream(t, decodeEngine(&legLog{}, "kv_transfer_params", &dst))
	f := defaultFlags()
	f.RequestMaxRetries = 0
	f.BreakerFailureThreshold = 1
	f.BreakerCooldownS = 0.2
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
		pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	pst.Store(500) // the prefill worker fails once: its breaker opens
	if code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 5*time.Second); code < 500 {
		t.Fatalf("%d %s", code, b)
	}
	pw := r.fl.View().ByID([]byte("p"))
	if pw.Breaker.State() == fleet.BreakerClosed {
		t.Fatal("setup: the prefill worker's breaker did not open")
	}
	pst.Store(0)
	dst.Store(500)
	time.Sleep(300 * time.Millisecond) // the cooldown: the next prefill leg is the probe
	if code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 5*time.Second); code != 500 {
		t.Fatalf("%d %s, want the decode worker's 500", code, b)
	}
	noLoadLeft(t, r.fl)
	if _, df := r.fl.View().ByID([]byte("d")).Counts(); df == 0 {
		t.Fatal("setup: the decode worker was not blamed")
	}
	if st := pw.Breaker.State(); st != fleet.BreakerClosed {
		t.Fatalf("the prefill worker answered its probe in full, the decode worker was blamed, yet its breaker is %s", fleet.BreakerStateName(st))
	}
}

// vLLM. A prefill answer without kv_transfer_params (its first token was a
// stop) hands no KV off: the decode leg computes the prompt itself. A decode
// 500 to such a request cannot be the prefill engine's KV endpoint: the
// decode worker is blamed, never the prefill worker (at aadadeb the handoff
// records' rule 4 blamed it).
func TestPDVLLMDecodeFailureWithoutAHandoffIsNotBlamedOnThePrefill(t *testing.T) {
	var ok atomic.Int32
	good := startUpstream(t, vllmPrefill(&legLog{}, "e", &ok))
	stop := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"stop"}],` +
			`"kv_transfer_params":null}`)
	})
	d := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if !strings.Contains(string(ctx.PostBody()), "remote_engine_id") {
			ctx.SetStatusCode(500) // the decode engine's own failure (it had the whole prompt to compute)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"CUDA out of memory","type":"server_error"}}`)
			return
		}
		decodeEngine(&legLog{}, "kv_transfer_params", &ok)(ctx)
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	f.BreakerFailureThreshold = 1
	f.RouterPolicy = "round-robin"
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
		pdWorker("p0", good.url, "prefill", ""), pdWorker("p1", stop.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	codes := []int{}
	for i := 0; i < 2; i++ {
		code, _ := postWithin(t, r.url+"/v1/chat/completions", chatBody, 5*time.Second)
		codes = append(codes, code)
	}
	noLoadLeft(t, r.fl)
	v := r.fl.View()
	_, p1f := v.ByID([]byte("p1")).Counts()
	_, df := v.ByID([]byte("d")).Counts()
	if p1f != 0 || df == 0 {
		t.Fatalf("answers %v: prefill p1 (which handed no KV off) has %d faults, decode d %d", codes, p1f, df)
	}
}

// A decode engine's 503 (overloaded) is its own state, not an ambiguous
// handoff failure: with one prefill worker and two overloaded decode
// workers, the prefill worker takes no fault, however many decode workers
// in a row answer 503 to its handoffs.
func TestPDDecodeOverloadIsNeverBlamedOnThePrefillWorker(t *testing.T) {
	for _, mode := range []string{"vllm", "sglang"} {
		t.Run(mode, func(t *testing.T) {
			var ok atomic.Int32
			sp := newSGLangRooms()
			defer sp.stop()
			p := startUpstream(t, vllmPrefill(&legLog{}, "e", &ok)).url
			if mode == "sglang" {
				p = startUpstream(t, hangUntilClosed).url // waits for a decode engine to join the room
			}
			busy := func(ctx *fasthttp.RequestCtx) {
				ctx.SetStatusCode(503)
				ctx.SetContentType("application/json")
				ctx.SetBodyString(`{"error":{"message":"overloaded","type":"server_error"}}`)
			}
			d0, d1 := startUpstream(t, busy), startUpstream(t, busy)
			f := defaultFlags()
			f.RequestMaxRetries = 1
			f.BreakerFailureThreshold = 100
			r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
				c.PD.Mode = mode
				c.PD.DecodePolicy = "round-robin"
			}), pdWorker("p", p, "prefill", `{"pd_mode":"`+mode+`","bootstrap_port":8998}`),
				pdWorker("d0", d0.url, "decode", ""), pdWorker("d1", d1.url, "decode", ""))
			for i := 0; i < 3; i++ {
				if code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 5*time.Second); code != 503 {
					t.Fatalf("request %d: %d %s, want the decode engines' 503", i, code, b)
				}
			}
			noLoadLeft(t, r.fl)
			v := r.fl.View()
			if _, pf := v.ByID([]byte("p")).Counts(); pf != 0 {
				t.Fatalf("the prefill worker took %d faults for overloaded decode workers", pf)
			}
			_, f0 := v.ByID([]byte("d0")).Counts()
			_, f1 := v.ByID([]byte("d1")).Counts()
			if f0+f1 != 6 {
				t.Fatalf("decode faults %d + %d, want 6 (3 requests, 2 attempts each)", f0, f1)
			}
		})
	}
}

// SGLang. Decode engine d0 hangs: it never joins its rooms, so every
// prefill engine paired with it waits for it until pd.prefill_timeout_s.
// Which engine hangs is for the handoff records to tell (the prefill
// engine waits for the decode engine as much as the other way round): d0,
// which fails with every prefill worker, takes the faults and its breaker
// opens; the healthy prefill workers take at most the first one (no
// evidence yet). Before, every such timeout
// was the prefill worker's: 10 of 10 faults on the healthy prefill
// engines (one breaker tripped), none on d0, and every request that met d0
// waited the full prefill timeout.
func TestPDSGLangPrefillTimingOutOnAHungDecodeEngineBlamesTheDecodeWorker(t *testing.T) {
	sp := newSGLangRooms()
	defer sp.stop()
	var ok atomic.Int32
	p0 := startUpstream(t, sp.prefill(&legLog{}, &ok))
	p1 := startUpstream(t, sp.prefill(&legLog{}, &ok))
	hung := startUpstream(t, hangUntilClosed)
	d1 := startUpstream(t, sp.decode(&legLog{}, &ok))
	f := defaultFlags()
	f.BreakerFailureThreshold = 2
	f.RequestMaxRetries = 2
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "sglang"
		c.PD.DecodePolicy = "round-robin"
		c.PD.SGLangIndependentPairing = true
		c.PD.PrefillTimeoutSeconds = 0.3
	}),
		pdWorker("p0", p0.url, "prefill", `{"pd_mode":"sglang","bootstrap_port":8998}`),
		pdWorker("p1", p1.url, "prefill", `{"pd_mode":"sglang","bootstrap_port":8998}`),
		pdWorker("d0", hung.url, "decode", ""), pdWorker("d1", d1.url, "decode", ""))
	for i := 0; i < 8; i++ {
		if code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 5*time.Second); code != 200 {
			t.Fatalf("request %d: %d %s (a retry on another pair should have served it)", i, code, b)
		}
	}
	noLoadLeft(t, r.fl)
	v := r.fl.View()
	// The first timeout has no evidence either way (the prefill worker,
	// whose deadline it was, is blamed); from the second on, d0 has failed
	// two prefill workers and takes the faults.
	_, f0 := v.ByID([]byte("p0")).Counts()
	_, f1 := v.ByID([]byte("p1")).Counts()
	if f0+f1 > 1 {
		t.Errorf("healthy prefill workers blamed for d0's hang: p0 %d faults, p1 %d", f0, f1)
	}
	for _, id := range []string{"p0", "p1"} {
		if st := v.ByID([]byte(id)).Breaker.State(); st != fleet.BreakerClosed {
			t.Errorf("healthy prefill worker %s blamed for d0's hang: breaker %v", id, st)
		}
	}
	d0 := v.ByID([]byte("d0"))
	if _, df := d0.Counts(); df < 2 || d0.Breaker.State() == fleet.BreakerClosed {
		t.Fatalf("d0, which never joins a room, was not blamed: %d faults, breaker %v", df, d0.Breaker.State())
	}
}

// The counterpart: prefill engine p0 hangs. Its timeouts stay its own
// (without evidence the leg that reached its deadline is blamed), and the
// healthy decode workers take none.
func TestPDSGLangPrefillTimingOutOnAHungPrefillEngineStillBlamesThePrefillWorker(t *testing.T) {
	sp := newSGLangRooms()
	defer sp.stop()
	var ok atomic.Int32
	hung := startUpstream(t, hangUntilClosed)
	p1 := startUpstream(t, sp.prefill(&legLog{}, &ok))
	d0 := startUpstream(t, sp.decode(&legLog{}, &ok))
	d1 := startUpstream(t, sp.decode(&legLog{}, &ok))
	f := defaultFlags()
	f.BreakerFailureThreshold = 2
	f.RequestMaxRetries = 2
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "sglang"
		c.PD.DecodePolicy = "round-robin"
		c.PD.SGLangIndependentPairing = true
		c.PD.PrefillTimeoutSeconds = 0.3
	}),
		pdWorker("p0", hung.url, "prefill", `{"pd_mode":"sglang","bootstrap_port":8998}`),
		pdWorker("p1", p1.url, "prefill", `{"pd_mode":"sglang","bootstrap_port":8998}`),
		pdWorker("d0", d0.url, "decode", ""), pdWorker("d1", d1.url, "decode", ""))
	for i := 0; i < 6; i++ {
		if code, b := postWithin(t, r.url+"/v1/chat/completions", chatBody, 5*time.Second); code != 200 {
			t.Fatalf("request %d: %d %s (a retry on another pair should have served it)", i, code, b)
		}
	}
	noLoadLeft(t, r.fl)
	v := r.fl.View()
	_, f0 := v.ByID([]byte("d0")).Counts()
	_, f1 := v.ByID([]byte("d1")).Counts()
	p0 := v.ByID([]byte("p0"))
	if _, pf := p0.Counts(); pf < 2 || f0+f1 > 0 || p0.Breaker.State() == fleet.BreakerClosed {
		t.Fatalf("faults: hung p0 %d (breaker %v), healthy d0 %d, d1 %d", pf, p0.Breaker.State(), f0, f1)
	}
}

// A prefill engine's error answer relayed as the last failure names that
// prefill worker in X-Infera-Worker (debug.decision_header), as a mixed
// worker's relayed answer names it: it named the decode worker, which in
// vLLM mode was never sent the request.
func TestPDRelayedPrefillErrorNamesThePrefillWorker(t *testing.T) {
	for _, mode := range []string{"vllm", "sglang"} {
		t.Run(mode, func(t *testing.T) {
			var dl legLog
			var ok atomic.Int32
			sp := newSGLangRooms()
			defer sp.stop()
			sick := func(id string) fasthttp.RequestHandler {
				return func(ctx *fasthttp.RequestCtx) {
					ctx.SetStatusCode(503)
					ctx.SetContentType("application/json")
					ctx.SetBodyString(`{"error":{"message":"prefill ` + id + ` overloaded","type":"server_error"}}`)
				}
			}
			p0, p1 := startUpstream(t, sick("p0")), startUpstream(t, sick("p1"))
			dec := decodeEngine(&dl, "kv_transfer_params", &ok)
			if mode == "sglang" {
				dec = sp.decode(&dl, &ok) // waits for a prefill that never comes
			}
			d := startUpstream(t, dec)
			f := defaultFlags()
			f.RequestMaxRetries = 1
			r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
				c.PD.Mode = mode
				c.Debug.DecisionHeader = true
			}),
				pdWorker("p0", p0.url, "prefill", `{"bootstrap_port":8998}`),
				pdWorker("p1", p1.url, "prefill", `{"bootstrap_port":8998}`),
				pdWorker("d0", d.url, "decode", ""))
			resp, err := (&http.Client{Timeout: 5 * time.Second}).Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 503 {
				t.Fatalf("the last prefill answer was not relayed: %d %s", resp.StatusCode, b)
			}
			want := "p0"
			if strings.Contains(string(b), "prefill p1 ") {
				want = "p1"
			}
			if got := resp.Header.Get("X-Infera-Worker"); got != want {
				t.Fatalf("prefill %s's answer (%s) was relayed naming worker %q", want, b, got)
			}
			if mode == "vllm" && dl.n() != 0 {
				t.Fatalf("the decode worker got %d requests", dl.n())
			}
			noLoadLeft(t, r.fl)
		})
	}
}

// An SGLang prefill engine's error answer that breaks before its end is
// kept nowhere, and no earlier attempt's answer stands in for it: the
// client got the 503 (and Retry-After) a decode worker answered on the
// attempt before, as if that were the last failure.
func TestPDSGLangBrokenPrefillErrorDoesNotRelayAnEarlierAnswer(t *testing.T) {
	var pl, dl legLog
	var ok atomic.Int32
	sp := newSGLangRooms()
	defer sp.stop()
	p := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		pl.add(ctx)
		time.Sleep(200 * time.Millisecond) // after the first attempt's decode answer
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) { // the engine dies while it sends its error answer
			c.Write([]byte("HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"error\":"))
		})
	})
	var calls atomic.Int32
	wait := sp.decode(&dl, &ok) // waits for the KV
	dec := func(ctx *fasthttp.RequestCtx) {
		if calls.Add(1) == 1 { // the first attempt's decode worker
			ctx.SetStatusCode(503)
			ctx.Response.Header.Set("Retry-After", "30")
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"decode overloaded","type":"server_error"}}`)
			return
		}
		wait(ctx)
	}
	d0, d1 := startUpstream(t, dec), startUpstream(t, dec)
	f := defaultFlags()
	f.RequestMaxRetries = 1
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "sglang"
	}),
		pdWorker("p0", p.url, "prefill", `{"bootstrap_port":8998}`),
		pdWorker("d0", d0.url, "decode", ""), pdWorker("d1", d1.url, "decode", ""))
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if calls.Load() != 2 || dl.n() != 1 {
		t.Fatalf("want two attempts, the second waiting for its KV: %d decode legs", calls.Load())
	}
	if resp.StatusCode != 502 || strings.Contains(string(b), "decode overloaded") || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("the last failure was a broken prefill answer; the client got %d (Retry-After %q) %s",
			resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	noLoadLeft(t, r.fl)
}
