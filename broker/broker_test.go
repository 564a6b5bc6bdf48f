package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"github.com/nats-io/nats.go"
)

// testEngine is a loopback HTTP engine that streams slowly and records
// clients that went away.
type testEngine struct {
	URL     string
	gone    chan string   // path of a request whose client went away
	release chan struct{} // unblocks /stream-gate after its first chunk
	active  atomic.Int64
	streams atomic.Int64 // /stream requests received
}

func startEngine(t testing.TB) *testEngine {
	t.Helper()
	e := &testEngine{gone: make(chan string, 16), release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Method", r.Method)
		w.Header().Set("X-Query", r.URL.RawQuery)
		w.Header().Set("X-Got", r.Header.Get("X-Test"))
		w.WriteHeader(201)
		w.Write(b)
	})
	// /stream?n=N&every=D streams N SSE events, one per D, or stops when the
	// client goes away.
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		e.streams.Add(1)
		e.active.Add(1)
		defer e.active.Add(-1)
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		every, _ := time.ParseDuration(r.URL.Query().Get("every"))
		if d, _ := time.ParseDuration(r.URL.Query().Get("before")); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				e.gone <- r.URL.Path
				return
			}
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		for i := 0; i < n; i++ {
			if i > 0 || r.URL.Query().Get("gate") == "" {
				select {
				case <-time.After(every):
				case <-r.Context().Done():
					e.gone <- r.URL.Path
					return
				}
			}
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			if i == 0 && r.URL.Query().Get("gate") != "" {
				select {
				case <-e.release:
				case <-r.Context().Done():
					e.gone <- r.URL.Path
					return
				}
			}
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	e.URL = "http://" + ln.Addr().String()
	return e
}

func (e *testEngine) waitGone(t *testing.T) {
	t.Helper()
	select {
	case <-e.gone:
	case <-time.After(5 * time.Second):
		t.Fatal("engine never saw its client go away (cancel did not reach it)")
	}
}

type rig struct {
	eng *testEngine
	srv *Server
	cli *Client
	nc  *nats.Conn
}

func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func newRig(t testing.TB, cc ClientConfig, sc ServerConfig) *rig {
	t.Helper()
	ns := testsrv.StartNATS(t)
	r := &rig{eng: startEngine(t)}
	wnc := connect(t, ns.URL)
	r.nc = connect(t, ns.URL)
	sc.Conn, sc.EngineURL = wnc, r.eng.URL
	if sc.WorkerID == "" {
		sc.WorkerID = "w1"
	}
	var err error
	if r.srv, err = NewServer(sc); err != nil {
		t.Fatal(err)
	}
	if err := r.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.srv.Close)
	cc.Conn = r.nc
	if r.cli, err = NewClient(cc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.cli.Close() })
	return r
}

func readAll(t *testing.T, s *Stream) string {
	t.Helper()
	var sb strings.Builder
	for i := 0; i < 10000; i++ {
		b, err := s.Next()
		if err == io.EOF {
			return sb.String()
		}
		if err != nil {
			t.Fatalf("Next: %v (after %q)", err, sb.String())
		}
		sb.Write(b)
	}
	t.Fatal("stream never ended")
	return ""
}

func TestTransport(t *testing.T) {
	r := newRig(t, ClientConfig{IdleTimeout: 300 * time.Millisecond}, ServerConfig{})
	ctx := context.Background()

	t.Run("echo", func(t *testing.T) {
		f := func(method, path, body string, wantStatus int) {
			t.Helper()
			h := http.Header{"X-Test": {"yes"}, "Connection": {"close"}, "Infera-Path": {"/evil"}}
			s, err := r.cli.Do(ctx, "w1", &Request{Method: method, Path: path, Header: h, Body: []byte(body)})
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			defer s.Close()
			if s.Status() != wantStatus {
				t.Fatalf("status %d, want %d", s.Status(), wantStatus)
			}
			if got := s.Header().Get("X-Method"); got != method {
				t.Fatalf("method %q, want %q", got, method)
			}
			if got := s.Header().Get("X-Got"); got != "yes" {
				t.Fatalf("forwarded header %q", got)
			}
			if got := readAll(t, s); got != body {
				t.Fatalf("body %q, want %q", got, body)
			}
		}
		f("POST", "/echo", `{"model":"m","prompt":"hi"}`, 201)
		f("PUT", "/echo?a=b", strings.Repeat("x", 200000), 201)
		f("POST", "/echo", "", 201)
	})

	t.Run("streams incrementally", func(t *testing.T) {
		s, err := r.cli.Do(ctx, "w1", &Request{Path: "/stream?n=3&every=1ms&gate=1"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if ct := s.Header().Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("content type %q", ct)
		}
		// The engine is blocked after its first event: it must arrive now.
		b, err := s.Next()
		if err != nil || string(b) != "data: 0\n\n" {
			t.Fatalf("first chunk %q, %v", b, err)
		}
		if r.eng.active.Load() != 1 {
			t.Fatal("engine already finished")
		}
		r.eng.release <- struct{}{}
		if got := readAll(t, s); got != "data: 1\n\ndata: 2\n\n" {
			t.Fatalf("rest %q", got)
		}
	})

	t.Run("idle timeout mid-stream cancels engine", func(t *testing.T) {
		s, err := r.cli.Do(ctx, "w1", &Request{Path: "/stream?n=3&every=10s"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		start := time.Now()
		_, err = s.Next()
		if !errors.Is(err, ErrIdleTimeout) || HTTPStatus(err) != 504 {
			t.Fatalf("err %v, want idle timeout", err)
		}
		if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
			t.Fatalf("idle timeout after %v", d)
		}
		r.eng.waitGone(t)
	})

	t.Run("idle timeout before first byte is retryable", func(t *testing.T) {
		_, err := r.cli.Do(ctx, "w1", &Request{Path: "/stream?n=1&every=1ms&before=10s"})
		if !errors.Is(err, ErrIdleTimeout) || !Retryable(err) {
			t.Fatalf("err %v, want retryable idle timeout", err)
		}
		r.eng.waitGone(t)
	})

	t.Run("early close cancels engine", func(t *testing.T) {
		s, err := r.cli.Do(ctx, "w1", &Request{Path: "/stream?n=100&every=50ms"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Next(); err != nil {
			t.Fatal(err)
		}
		s.Close()
		r.eng.waitGone(t)
		if _, err := s.Next(); err == nil || err == io.EOF {
			t.Fatalf("Next after Close: %v", err)
		}
	})

	t.Run("context cancel", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		s, err := r.cli.Do(cctx, "w1", &Request{Path: "/stream?n=100&every=50ms"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		cancel()
		for i := 0; i < 200; i++ {
			if _, err = s.Next(); err != nil {
				break
			}
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v", err)
		}
		r.eng.waitGone(t)
	})

	t.Run("connection lost fails open streams", func(t *testing.T) {
		s, err := r.cli.Do(ctx, "w1", &Request{Path: "/stream?n=100&every=50ms"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		r.cli.Disconnected(nil)
		start := time.Now()
		for i := 0; i < 200; i++ {
			if _, err = s.Next(); err != nil {
				break
			}
		}
		if !errors.Is(err, ErrConnLost) || time.Since(start) > time.Second {
			t.Fatalf("err %v after %v", err, time.Since(start))
		}
		s.Close()
		r.eng.waitGone(t)
	})

	t.Run("no responders", func(t *testing.T) {
		_, err := r.cli.Do(ctx, "nobody", &Request{Path: "/echo"})
		if !errors.Is(err, ErrNoResponders) || !Retryable(err) {
			t.Fatalf("err %v", err)
		}
	})

	t.Run("bad worker id", func(t *testing.T) {
		if _, err := r.cli.Do(ctx, "a.b", &Request{Path: "/echo"}); err == nil {
			t.Fatal("want error")
		}
	})

	t.Run("too large", func(t *testing.T) {
		_, err := r.cli.Do(ctx, "w1", &Request{Path: "/echo", Body: make([]byte, r.nc.MaxPayload()+1)})
		if !errors.Is(err, ErrTooLarge) || HTTPStatus(err) != 413 || Retryable(err) {
			t.Fatalf("err %v", err)
		}
	})
	if n := r.srv.InFlight(); n != 0 {
		// give the last canceled handlers a moment
		time.Sleep(200 * time.Millisecond)
		if n = r.srv.InFlight(); n != 0 {
			t.Fatalf("in flight %d after all tests", n)
		}
	}
}

func TestMaxDuration(t *testing.T) {
	r := newRig(t, ClientConfig{MaxDuration: 400 * time.Millisecond}, ServerConfig{})
	s, err := r.cli.Do(context.Background(), "w1", &Request{Path: "/stream?n=200&every=20ms"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	chunks := 0
	for ; chunks < 1000; chunks++ {
		if _, err = s.Next(); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrMaxDuration) || HTTPStatus(err) != 504 {
		t.Fatalf("err %v", err)
	}
	if chunks < 3 {
		t.Fatalf("only %d chunks before max duration", chunks)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("max duration fired after %v", d)
	}
	r.eng.waitGone(t)
}

func TestMaxPending(t *testing.T) {
	ctx := context.Background()
	t.Run("router side", func(t *testing.T) {
		r := newRig(t, ClientConfig{MaxPending: 1}, ServerConfig{})
		s, err := r.cli.Do(ctx, "w1", &Request{Path: "/stream?n=100&every=20ms"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.cli.Do(ctx, "w1", &Request{Path: "/echo"})
		if !errors.Is(err, ErrMaxPending) || HTTPStatus(err) != 429 || !Retryable(err) {
			t.Fatalf("err %v", err)
		}
		if r.cli.Pending("w1") != 1 {
			t.Fatalf("pending %d", r.cli.Pending("w1"))
		}
		s.Close()
		s2, err := r.cli.Do(ctx, "w1", &Request{Path: "/echo", Body: []byte("ok")})
		if err != nil {
			t.Fatalf("after close: %v", err)
		}
		readAll(t, s2)
		s2.Close()
		if r.cli.Pending("w1") != 0 {
			t.Fatalf("pending %d", r.cli.Pending("w1"))
		}
	})
	t.Run("worker side", func(t *testing.T) {
		r := newRig(t, ClientConfig{}, ServerConfig{MaxPending: 1})
		s, err := r.cli.Do(ctx, "w1", &Request{Path: "/stream?n=100&every=20ms"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.cli.Do(ctx, "w1", &Request{Path: "/echo"})
		if !errors.Is(err, ErrWorkerBusy) || HTTPStatus(err) != 429 || !Retryable(err) {
			t.Fatalf("err %v", err)
		}
		if r.srv.InFlight() != 1 {
			t.Fatalf("in flight %d", r.srv.InFlight())
		}
		s.Close()
		r.eng.waitGone(t)
		if err := r.srv.Wait(ctxTimeout(t, 3*time.Second)); err != nil {
			t.Fatalf("in flight did not drop: %v", err)
		}
	})
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestEngineDown(t *testing.T) {
	ns := testsrv.StartNATS(t)
	wnc, cnc := connect(t, ns.URL), connect(t, ns.URL)
	// An engine that is down: a port held and never listened on refuses
	// connections, as a port picked free and closed would until another
	// process took it.
	srv, err := NewServer(ServerConfig{Conn: wnc, WorkerID: "w9", EngineURL: "http://" + testsrv.NewFront(t).Addr})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := NewClient(ClientConfig{Conn: cnc, IdleTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	_, err = cli.Do(context.Background(), "w9", &Request{Path: "/x"})
	if !errors.Is(err, ErrEngineDial) || !Retryable(err) || HTTPStatus(err) != 502 {
		t.Fatalf("err %v", err)
	}
}

// A request's Idle is the gap between two data packets of a stream: the
// wait for the head and the first chunk (a prefill, a queue) is bounded by
// FirstByte, not by it, as over HTTP (timeouts.stream_first_packet_s, then
// timeouts.stream_idle_s). The transport's own IdleTimeout applies to every
// reply message.
func TestRequestIdleStartsAfterTheFirstChunk(t *testing.T) {
	r := newRig(t, ClientConfig{IdleTimeout: 10 * time.Second}, ServerConfig{})
	ctx := context.Background()
	// The head at once, the first event after 600 ms, the next 600 ms later.
	s, err := r.cli.Do(ctx, "w1", &Request{Path: "/stream?n=2&every=600ms", Idle: 250 * time.Millisecond,
		FirstByte: time.Now().Add(5 * time.Second)})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	defer s.Close()
	if b, err := s.Next(); err != nil || string(b) != "data: 0\n\n" {
		t.Fatalf("first chunk %q, %v: the idle timeout cut the wait for the first packet", b, err)
	}
	start := time.Now()
	if _, err := s.Next(); !errors.Is(err, ErrIdleTimeout) {
		t.Fatalf("second chunk: %v, want the idle timeout", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 550*time.Millisecond {
		t.Fatalf("idle timeout after %v, want about 250ms", d)
	}
	r.eng.waitGone(t)

	// The transport's own limit still bounds the first packet.
	r2 := newRig(t, ClientConfig{IdleTimeout: 250 * time.Millisecond}, ServerConfig{})
	s, err = r2.cli.Do(ctx, "w1", &Request{Path: "/stream?n=1&every=2s", FirstByte: time.Now().Add(5 * time.Second)})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	defer s.Close()
	if _, err := s.Next(); !errors.Is(err, ErrIdleTimeout) {
		t.Fatalf("first chunk under the transport's idle limit: %v, want the idle timeout", err)
	}
}

// NATS has no backpressure: a reader slower than the worker (the router
// relaying to a client that reads slowly) would make the router hold the
// whole answer. Past the per-stream bound, in bytes or in messages, the
// stream fails with ErrOverrun, not ErrBroken (it is not the worker's
// fault), and the worker is told to cancel at once, before the reader
// comes back, and only once.
func TestSlowReaderOverrunIsCutAndCancelled(t *testing.T) {
	for _, cc := range []ClientConfig{{MaxQueuedBytes: 64}, {MaxQueued: 4}} {
		r := newRig(t, cc, ServerConfig{})
		cancels := mCancelsSent.Get()
		s, err := r.cli.Do(context.Background(), "w1", &Request{Path: "/stream?n=200&every=2ms"})
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		// Read nothing: the engine must be cancelled while the stream sits.
		r.eng.waitGone(t)
		var got int
		for i := 0; ; i++ {
			b, err := s.Next()
			if err != nil {
				if !errors.Is(err, ErrOverrun) || errors.Is(err, ErrBroken) {
					t.Fatalf("%+v: err %v, want the overrun", cc, err)
				}
				break
			}
			got += len(b)
			if i > 100 {
				t.Fatalf("%+v: the stream was never cut", cc)
			}
		}
		if cc.MaxQueuedBytes > 0 && got > cc.MaxQueuedBytes {
			t.Fatalf("%d bytes were buffered, bound %d", got, cc.MaxQueuedBytes)
		}
		s.Close()
		if n := mCancelsSent.Get() - cancels; n != 1 {
			t.Fatalf("%+v: %d cancel notices for one cut stream, want 1", cc, n)
		}
	}
}

// A router that dies mid-stream sends no cancel notice; over HTTP its
// closed connection would stop the engine. Here the worker learns it from
// the NATS server: its next data chunk finds nobody at the router's inbox,
// and the engine request is cancelled at once instead of generating to
// the end for nobody.
func TestWorkerCancelsTheEngineWhenTheRouterIsGone(t *testing.T) {
	r := newRig(t, ClientConfig{}, ServerConfig{})
	ns := r.srv.nc.ConnectedUrl()
	router, err := nats.Connect(ns)
	if err != nil {
		t.Fatal(err)
	}
	inbox := router.NewInbox()
	got := make(chan *nats.Msg, 256)
	sub, err := router.ChanSubscribe(inbox, got)
	if err != nil {
		t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	req := nats.NewMsg(ReqSubject("w1"))
	req.Reply = inbox
	req.Header.Set(HdrID, "crash1")
	req.Header.Set(HdrPath, "/stream?n=200&every=20ms") // 4 s of chunks
	if err := router.PublishMsg(req); err != nil {
		t.Fatal(err)
	}
	for n := 0; n < 3; { // the head and two chunks: the stream is running
		select {
		case <-got:
			n++
		case <-time.After(5 * time.Second):
			t.Fatal("no reply from the worker")
		}
	}
	router.Close() // the router process dies: no cancel notice
	start := time.Now()
	r.eng.waitGone(t)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the engine ran %v after its router was gone", d)
	}
	for i := 0; r.srv.InFlight() != 0; i++ {
		if i > 200 {
			t.Fatal("the request is still in flight at the worker")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The same while nothing has been published yet (a long prefill, a whole
// non-streaming answer): the worker probes each waiting request's router
// every probeEvery, and a dead router's inbox answers the probe
// no-responders too.
func TestWorkerCancelsAWaitingEngineRequestWhenTheRouterIsGone(t *testing.T) {
	old := probeEvery
	probeEvery = 100 * time.Millisecond
	t.Cleanup(func() { probeEvery = old })
	r := newRig(t, ClientConfig{}, ServerConfig{})
	// A live router's inbox ignores the probes: its request is answered.
	s, err := r.cli.Do(context.Background(), "w1", &Request{Path: "/stream?n=1&every=1ms&before=400ms"})
	if err != nil {
		t.Fatalf("a live router's request: %v", err)
	}
	if got := readAll(t, s); got != "data: 0\n\n" {
		t.Fatalf("a live router's request: %q", got)
	}
	s.Close()

	router, err := nats.Connect(r.srv.nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	inbox := router.NewRespInbox()
	if _, err := router.Subscribe(inbox+".*", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	req := nats.NewMsg(ReqSubject("w1"))
	req.Reply = inbox + ".crash2"
	req.Header.Set(HdrID, "crash2")
	req.Header.Set(HdrProbe, "1")
	req.Header.Set(HdrPath, "/stream?n=1&every=1ms&before=10s") // 10 s before the head
	if err := router.PublishMsg(req); err != nil {
		t.Fatal(err)
	}
	router.Flush()
	for i := 0; r.srv.InFlight() != 1; i++ {
		if i > 200 {
			t.Fatal("the worker never took the request")
		}
		time.Sleep(10 * time.Millisecond)
	}
	router.Close()
	start := time.Now()
	r.eng.waitGone(t)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the engine waited %v after its router was gone", d)
	}
}

// MaxDuration caps the whole request from its Start, over every attempt:
// a retry began a fresh window (a request that failed over ran 2 s + 3 s
// under a 3 s cap).
func TestMaxDurationCountsFromTheRequestsStart(t *testing.T) {
	r := newRig(t, ClientConfig{MaxDuration: 400 * time.Millisecond}, ServerConfig{})
	start := time.Now().Add(-300 * time.Millisecond) // an earlier attempt took 300 ms
	s, err := r.cli.Do(context.Background(), "w1", &Request{Path: "/stream?n=200&every=20ms", Start: start})
	if err == nil {
		defer s.Close()
		for chunks := 0; chunks < 1000; chunks++ {
			if _, err = s.Next(); err != nil {
				break
			}
		}
	}
	if !errors.Is(err, ErrMaxDuration) {
		t.Fatalf("err %v", err)
	}
	if d := time.Since(start); d > 650*time.Millisecond {
		t.Fatalf("the 400 ms cap counted from the request's start fired %v after it", d)
	}
	r.eng.waitGone(t)
}
