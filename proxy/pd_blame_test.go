package proxy

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/broker"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/netpeek"
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

// SGLang: a decode engine cannot answer before the prefill engine has
// pushed it the KV. When the decode leg's first-packet wait ends while the
// prefill leg has not answered, the prefill worker is the one blamed; the
// decode worker, which was waiting on it, is not.
func TestPDSGLangDecodeTimingOutWhileThePrefillIsSilentBlamesThePrefill(t *testing.T) {
	p := startUpstream(t, hangUntilClosed)
	d := startUpstream(t, hangUntilClosed)
	f := defaultFlags()
	f.BreakerFailureThreshold = 1
	f.RequestMaxRetries = 0
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) {
		c.PD.Mode = "sglang"
		c.Timeouts.StreamFirstPacketSeconds = 0.3
	}), pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	code, b := postWithin(t, r.url+"/v1/chat/completions", streamBody, 10*time.Second)
	if code != 504 {
		t.Fatalf("%d %s, want 504", code, b)
	}
	noLoadLeft(t, r.fl)
	v := r.fl.View()
	if st := v.ByID([]byte("d")).Breaker.State(); st != fleet.BreakerClosed {
		t.Fatalf("the decode worker, waiting for the prefill's KV, was blamed (breaker %v)", st)
	}
	if st := v.ByID([]byte("p")).Breaker.State(); st == fleet.BreakerClosed {
		t.Fatal("the silent prefill worker was not blamed")
	}
}

// A client that leaves before the first byte is one disconnect in
// infera_stream_client_disconnects_total, not two (the failed attempt and
// the dropped answer).
func TestAClientLeavingBeforeTheFirstByteIsCountedOnce(t *testing.T) {
	up := startUpstream(t, hangUntilClosed)
	r := startRouter(t, nil, nil, up.url)
	before := mClientGone.Get()
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
		{fmt.Errorf("x: %w", broker.ErrEngine), true},
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
