package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// Regression: an https worker can never be reached: the forwarded request keeps the
// client's http scheme and HostClient{IsTLS:true} refuses it before dialing.
func TestHTTPSWorkerIsReachable(t *testing.T) {
	// Nothing listens on this port: a correct router fails with a dial error.
	u := strings.Replace(deadURL(t), "http://", "https://", 1)
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, nil, u)
	code, body := post(t, r.url+"/v1/chat/completions", chatBody)
	t.Logf("code %d body %s", code, body)
	if strings.Contains(body, "different protocol") {
		t.Fatalf("https worker rejected by fasthttp before dialing: %s", body)
	}
}

// Regression: a retry whose request deadline already passed (non_stream_total_s is
// measured from the request start, shared by all attempts) returns ErrTimeout
// from DoDeadline without contacting the worker, and the innocent alternate
// worker gets a breaker fault.
func TestSpentDeadlineDoesNotBlameAlternateWorker(t *testing.T) {
	slow := startUpstream(t, func(ctx *fasthttp.RequestCtx) { time.Sleep(600 * time.Millisecond); okHandler(ctx) })
	fast := startUpstream(t, okHandler)
	cfg := config.Default()
	cfg.Timeouts.NonStreamTotalSeconds = 0.2
	f := defaultFlags()
	f.RequestMaxRetries = 1
	f.BreakerFailureThreshold = 1
	r := startRouter(t, f, cfg, slow.url, fast.url)
	wFast := r.fl.Get("w1")
	for i := 0; i < 3 && slow.hits.Load() == 0; i++ {
		post(t, r.url+"/v1/chat/completions", chatBody)
	}
	if slow.hits.Load() == 0 {
		t.Skip("slow worker never picked")
	}
	t.Logf("fast hits %d, fast breaker trips %d state %d", fast.hits.Load(), wFast.Breaker.Trips(), wFast.Breaker.State())
	if wFast.Breaker.Trips() != 0 {
		t.Fatalf("fast worker (served every request it received) was tripped by a retry that never reached it")
	}
}

// Regression: a streamed 4xx answer to the half-open probe calls Abandon twice: once
// in forward, once when the stream closes. The second Abandon frees the probe
// slot of a *newer* probe still in flight, so two probes run at once.
func TestStreamed4xxProbeEndDoesNotFreeNewerProbe(t *testing.T) {
	var hit atomic.Int64
	release4xx := make(chan struct{})
	release2 := make(chan struct{})
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		switch hit.Add(1) {
		case 1: // trips the breaker (threshold 1)
			ctx.SetStatusCode(500)
			ctx.SetBodyString(`{"error":{"message":"boom"}}`)
		case 2: // the probe: a slow 4xx body, as an event stream (a plain
			// JSON error answer to a stream request is read whole before
			// its head is relayed, as a non-stream request's is)
			ctx.SetStatusCode(400)
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				w.WriteString(`{"error":`)
				w.Flush()
				<-release4xx
				w.WriteString(`{"message":"bad"}}`)
				w.Flush()
			})
		default: // the next probe: a slow 200 stream
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				w.WriteString("data: {\"i\":0}\n\n")
				w.Flush()
				<-release2
				w.WriteString("data: [DONE]\n\n")
				w.Flush()
			})
		}
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	f.BreakerFailureThreshold = 1
	f.BreakerCooldownS = 0.05
	f.BreakerMaxCooldownS = 1
	r := startRouter(t, f, nil, up.url)
	w := r.fl.Get("w0")
	post(t, r.url+"/v1/chat/completions", chatBody)
	if w.Breaker.State() != fleet.BreakerOpen {
		t.Fatalf("not open: %d", w.Breaker.State())
	}
	time.Sleep(80 * time.Millisecond)
	open := func() *http.Response {
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp1 := open() // probe #1 gets a 4xx stream, held open
	if resp1.StatusCode != 400 {
		t.Fatalf("probe 1: %d", resp1.StatusCode)
	}
	resp2 := open() // probe #2 (slot freed by the 4xx) gets a 200 stream, held open
	br := bufio.NewReader(resp2.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if w.Breaker.State() != fleet.BreakerHalfOpen {
		t.Fatalf("probe 2 in flight: state %d", w.Breaker.State())
	}
	close(release4xx)
	io.ReadAll(resp1.Body)
	resp1.Body.Close()
	time.Sleep(50 * time.Millisecond)
	st := w.Breaker.State()
	close(release2)
	io.ReadAll(br)
	resp2.Body.Close()
	if st != fleet.BreakerHalfOpen {
		t.Fatalf("probe 1's stream end reopened the probe slot while probe 2 is in flight: state %d", st)
	}
}

// Regression: with StreamTotalSeconds, the wall-clock cap of a healthy, long
// generation is reported as a worker fault (Breaker.Failure) and, on
// threshold, trips a healthy worker.
func TestStreamTotalCapIsNotAWorkerFault(t *testing.T) {
	su := &sseUpstream{n: 20, delay: 30 * time.Millisecond}
	up := startUpstream(t, su.handler)
	cfg := config.Default()
	cfg.Timeouts.StreamTotalSeconds = 0.15
	f := defaultFlags()
	f.BreakerFailureThreshold = 2
	f.RequestMaxRetries = 0
	r := startRouter(t, f, cfg, up.url)
	w := r.fl.Get("w0")
	for i := 0; i < 2; i++ {
		_, body := post(t, r.url+"/v1/chat/completions", streamBody)
		if i == 0 {
			t.Logf("body tail: %q", body[max(0, len(body)-200):])
		}
	}
	if w.Breaker.State() != fleet.BreakerClosed {
		t.Fatalf("stream_total_s cap tripped a healthy worker: state %d", w.Breaker.State())
	}
}

var _ = fmt.Sprint

// Regression: a request dispatched before the trip that ends successfully later
// calls Breaker.Success, which closes an open breaker (and resets the
// doubling cooldown) although no probe ran.
func TestStaleSuccessDoesNotCloseOpenBreaker(t *testing.T) {
	var hit atomic.Int64
	gate := make(chan struct{})
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if hit.Add(1) == 1 {
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				w.WriteString("data: {\"i\":0}\n\n")
				w.Flush()
				<-gate
				w.WriteString("data: [DONE]\n\n")
				w.Flush()
			})
			return
		}
		ctx.SetStatusCode(500)
		ctx.SetBodyString(`{"error":{"message":"boom"}}`)
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	f.BreakerCooldownS = 30
	f.BreakerMaxCooldownS = 60
	r := startRouter(t, f, nil, up.url)
	w := r.fl.Get("w0")
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	br.ReadString('\n')
	for i := 0; i < 3; i++ {
		post(t, r.url+"/v1/chat/completions", chatBody)
	}
	if w.Breaker.State() != fleet.BreakerOpen {
		t.Fatalf("not tripped: %d", w.Breaker.State())
	}
	close(gate)
	io.ReadAll(br)
	resp.Body.Close()
	waitFor(t, func() bool { return w.Load.Requests.Load() == 0 }, "stream closed")
	if st := w.Breaker.State(); st != fleet.BreakerOpen {
		t.Fatalf("an old stream's success closed the open breaker (state %d) 0 s into a 30 s cooldown, without a probe", st)
	}
}

// Regression: a stream request answered 429 by the only worker (retries=1, so the
// first attempt is not final): the engine body is dropped (stream != nil) and
// the client gets 429 with type server_error instead of rate_limit_error.
func TestStream429AnswerKeepsRateLimitType(t *testing.T) {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(429)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"engine full","type":"rate_limit_error"}}`)
	})
	r := startRouter(t, nil, nil, up.url)
	code, body := post(t, r.url+"/v1/chat/completions", streamBody)
	t.Logf("%d %s", code, body)
	if code == 429 && !strings.Contains(body, "rate_limit_error") {
		t.Fatalf("429 with wrong OpenAI error type: %s", body)
	}
}

// Regression: concurrent streams, half abandoned by the client, one flaky worker;
// load counters must return to 0 and -race must stay quiet.
func TestLoadCountersReturnToZeroUnderStress(t *testing.T) {
	su := &sseUpstream{n: 5, delay: 5 * time.Millisecond}
	good := startUpstream(t, su.handler)
	var k atomic.Int64
	flaky := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if k.Add(1)%2 == 0 {
			ctx.SetStatusCode(503)
			return
		}
		su.handler(ctx)
	})
	f := defaultFlags()
	f.BreakerFailureThreshold = 0
	r := startRouter(t, f, nil, good.url, flaky.url, deadURL(t))
	done := make(chan struct{})
	for i := 0; i < 40; i++ {
		go func(i int) {
			defer func() { done <- struct{}{} }()
			body := streamBody
			if i%3 == 0 {
				body = chatBody
			}
			resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				return
			}
			if i%2 == 0 {
				bufio.NewReader(resp.Body).ReadString('\n')
				resp.Body.Close()
				return
			}
			io.ReadAll(resp.Body)
			resp.Body.Close()
		}(i)
	}
	for i := 0; i < 40; i++ {
		<-done
	}
	waitFor(t, func() bool {
		for _, w := range r.fl.View().All {
			if w.Load.Requests.Load() != 0 || w.Load.Pending.Load() != 0 || w.Load.Tokens.Load() != 0 {
				return false
			}
		}
		return true
	}, "load counters back to 0")
}
