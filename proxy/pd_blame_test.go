package proxy

import (
	"errors"
	"fmt"
	"net"
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
