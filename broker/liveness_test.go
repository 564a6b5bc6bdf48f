package broker

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"github.com/nats-io/nats.go"
)

// A requester subscribed to its exact reply subject (`nats req`, an old
// style nats.Request, a non-Go client) did not ask for probes: a probe to
// <reply without its last token>.probe would find no subscriber and end a
// live request. Its long prefill must be answered.
func TestWorkerDoesNotProbeARequesterThatDidNotAskForIt(t *testing.T) {
	old := probeEvery
	probeEvery = 50 * time.Millisecond
	t.Cleanup(func() { probeEvery = old })
	r := newRig(t, ClientConfig{}, ServerConfig{})
	router := connect(t, r.srv.nc.ConnectedUrl())
	inbox := router.NewInbox() // exact subject, no wildcard
	sub, err := router.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	req := nats.NewMsg(ReqSubject("w1"))
	req.Reply = inbox
	req.Header.Set(HdrID, "exact1")
	req.Header.Set(HdrPath, "/stream?n=1&every=1ms&before=600ms") // 12 probe periods
	if err := router.PublishMsg(req); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("the live requester got no reply: %v", err)
	}
	if k := m.Header.Get(HdrKind); k != KindHead {
		t.Fatalf("first reply is %q (%s), want the head", k, m.Header.Get(HdrError))
	}
	select {
	case p := <-r.eng.gone:
		t.Fatalf("the engine request %s was cancelled although its requester is alive", p)
	default:
	}
}

// Every data chunk published before the cancel takes effect comes back
// no-responders; the request is counted (and cancelled) once.
func TestWorkerCountsAGoneRouterOncePerRequest(t *testing.T) {
	r := newRig(t, ClientConfig{}, ServerConfig{})
	router, err := nats.Connect(r.srv.nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	inbox := router.NewRespInbox()
	got := make(chan *nats.Msg, 1<<16)
	sub, err := router.ChanSubscribe(inbox+".*", got)
	if err != nil {
		t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	req := nats.NewMsg(ReqSubject("w1"))
	req.Reply = inbox + ".fast1"
	req.Header.Set(HdrID, "fast1")
	req.Header.Set(HdrPath, "/stream?n=200000&every=20us") // chunks as fast as they go
	if err := router.PublishMsg(req); err != nil {
		t.Fatal(err)
	}
	for n := 0; n < 20; n++ {
		<-got
	}
	before := mSrvReaderGone.Get()
	router.Close()
	r.eng.waitGone(t)
	time.Sleep(300 * time.Millisecond) // late no-responders statuses
	if d := mSrvReaderGone.Get() - before; d != 1 {
		t.Fatalf("infera_worker_nats_requests_reader_gone_total grew by %d for one request", d)
	}
}

// A reply out of order breaks the stream, and the worker, which may still
// be sending, is told to stop.
func TestAnOutOfOrderReplyCancelsTheWorker(t *testing.T) {
	wnc, cli := scriptedWorker(t, ClientConfig{IdleTimeout: 300 * time.Millisecond})
	cancels := make(chan string, 4)
	wnc.Subscribe(CancelSubject("gap"), func(m *nats.Msg) { cancels <- string(m.Data) })
	wnc.Subscribe(ReqSubject("gap"), func(m *nats.Msg) {
		h := nats.NewMsg(m.Reply)
		h.Header.Set(HdrKind, KindHead)
		h.Header.Set(HdrStatus, "200")
		h.Header.Set(HdrSeq, "0")
		wnc.PublishMsg(h)
		d := nats.NewMsg(m.Reply)
		d.Header.Set(HdrKind, KindData)
		d.Header.Set(HdrSeq, "2") // 1 is missing
		d.Data = []byte("x")
		wnc.PublishMsg(d)
	})
	wnc.Flush()
	s, err := cli.Do(context.Background(), "gap", &Request{Path: "/x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(); !errors.Is(err, ErrBroken) {
		t.Fatalf("Next: %v, want ErrBroken", err)
	}
	s.Close()
	select {
	case id := <-cancels:
		if id != s.ID() {
			t.Fatalf("cancel for %q, want %q", id, s.ID())
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no cancel was published for the out-of-order stream")
	}
	select {
	case id := <-cancels:
		t.Fatalf("a second cancel for %q", id)
	case <-time.After(200 * time.Millisecond):
	}
}

// A late reader with the whole answer queued, up to the message bound,
// still gets its end: the bound is for data.
func TestTheEndOfAFullyQueuedAnswerIsNotCut(t *testing.T) {
	wnc, cli := scriptedWorker(t, ClientConfig{MaxQueued: 4, IdleTimeout: time.Second})
	wnc.Subscribe(ReqSubject("w4"), func(m *nats.Msg) {
		for i := 0; i <= 5; i++ {
			r := nats.NewMsg(m.Reply)
			r.Header.Set(HdrSeq, strconv.Itoa(i))
			switch i {
			case 0:
				r.Header.Set(HdrKind, KindHead)
				r.Header.Set(HdrStatus, "200")
			case 5:
				r.Header.Set(HdrKind, KindEnd)
			default:
				r.Header.Set(HdrKind, KindData)
				r.Data = []byte("x")
			}
			wnc.PublishMsg(r)
			if i == 0 {
				wnc.Flush()
				time.Sleep(100 * time.Millisecond) // Do has taken the head
			}
		}
	})
	wnc.Flush()
	s, err := cli.Do(context.Background(), "w4", &Request{Path: "/x"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	time.Sleep(200 * time.Millisecond) // everything has arrived
	for n := 0; ; n++ {
		if _, err := s.Next(); err != nil {
			if !errors.Is(err, io.EOF) || n != 4 {
				t.Fatalf("after %d data chunks: %v, want io.EOF after 4", n, err)
			}
			return
		}
	}
}

// Replies that arrive for a stream already closed are dropped: they are
// not queued, and an overflow among them sends no second cancel.
func TestRepliesAfterCloseAreDroppedWithoutASecondCancel(t *testing.T) {
	wnc, cli := scriptedWorker(t, ClientConfig{MaxQueued: 2, IdleTimeout: time.Second})
	var mu sync.Mutex
	cancels := 0
	wnc.Subscribe(CancelSubject("late"), func(*nats.Msg) { mu.Lock(); cancels++; mu.Unlock() })
	wnc.Subscribe(ReqSubject("late"), func(m *nats.Msg) {
		h := nats.NewMsg(m.Reply)
		h.Header.Set(HdrKind, KindHead)
		h.Header.Set(HdrStatus, "200")
		h.Header.Set(HdrSeq, "0")
		wnc.PublishMsg(h)
	})
	wnc.Flush()
	s, err := cli.Do(context.Background(), "late", &Request{Path: "/x"})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()                 // the cancel goes out
	for i := 1; i <= 5; i++ { // more than MaxQueued, as dispatch would deliver them
		d := nats.NewMsg("x")
		d.Header.Set(HdrKind, KindData)
		d.Header.Set(HdrSeq, strconv.Itoa(i))
		d.Data = []byte("x")
		s.push(d)
	}
	s.mu.Lock()
	queued := len(s.q) - s.qhead
	s.mu.Unlock()
	if queued != 0 {
		t.Fatalf("%d replies queued on a closed stream", queued)
	}
	wnc.Flush()
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if cancels != 1 {
		t.Fatalf("%d cancel notices, want 1", cancels)
	}
}

// cutProxy relays TCP to target; cut drops every connection and refuses
// new ones until heal. A proxy without a target (yet: to) refuses too.
type cutProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	target string
	down   bool
	conns  []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			var u net.Conn
			if !p.down && p.target != "" {
				u, _ = net.DialTimeout("tcp", p.target, time.Second)
			}
			if u == nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) cut() {
	p.mu.Lock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
}

func (p *cutProxy) heal() { p.mu.Lock(); p.down = false; p.mu.Unlock() }

// to sets the address new connections are relayed to.
func (p *cutProxy) to(target string) { p.mu.Lock(); p.target = target; p.mu.Unlock() }

// A router on one NATS server of a cluster, its worker on the other. The
// route between the servers drops for half a second during a 4 s prefill
// while both ends stay connected: a probe or two bounce, nothing is lost,
// and the request must be answered.
func TestARouteThatDropsForAMomentDoesNotEndAWaitingRequest(t *testing.T) {
	old := probeEvery
	probeEvery = time.Second
	t.Cleanup(func() { probeEvery = old })
	// The servers bind route ports of their own (-1) and say which
	// (RouteAddr); each advertises the proxy in front of it, which
	// relays there once it is known.
	pa, pb := newCutProxy(t, ""), newCutProxy(t, "")
	nb := testsrv.StartNATSArgs(t, "-n", "B", "--cluster_name", "c",
		"--cluster", "nats://127.0.0.1:-1", "--cluster_advertise", pb.addr())
	pb.to(nb.RouteAddr())
	na := testsrv.StartNATSArgs(t, "-n", "A", "--cluster_name", "c",
		"--cluster", "nats://127.0.0.1:-1", "--cluster_advertise", pa.addr(),
		"--routes", "nats://"+pb.addr())
	pa.to(na.RouteAddr())
	eng := startEngine(t)
	srv, err := NewServer(ServerConfig{Conn: connect(t, na.URL), WorkerID: "w1", EngineURL: eng.URL})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	rnc := connect(t, nb.URL)
	lost := make(chan struct{}, 1)
	rnc.SetDisconnectErrHandler(func(*nats.Conn, error) {
		select {
		case lost <- struct{}{}:
		default:
		}
	})
	cli, err := NewClient(ClientConfig{Conn: rnc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	for i := 0; ; i++ { // the route is up: the router reaches w1
		s, err := cli.Do(context.Background(), "w1", &Request{Path: "/stream?n=1&every=1ms"})
		if err == nil {
			s.Close()
			break
		}
		if i > 200 {
			t.Fatalf("the cluster never formed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	before := mSrvReaderGone.Get()
	done := make(chan error, 1)
	go func() {
		s, err := cli.Do(context.Background(), "w1", &Request{Path: "/stream?n=1&every=1ms&before=4s",
			FirstByte: time.Now().Add(10 * time.Second)})
		if err == nil {
			_, err = io.ReadAll(s)
			s.Close()
		}
		done <- err
	}()
	time.Sleep(1200 * time.Millisecond)
	pa.cut()
	pb.cut()
	time.Sleep(500 * time.Millisecond)
	pa.heal()
	pb.heal()
	if err := <-done; err != nil {
		t.Fatalf("a live router's request failed after a route dropped for a moment: %v", err)
	}
	select {
	case <-lost:
		t.Fatal("the router's own connection dropped: not the case under test")
	default:
	}
	if d := mSrvReaderGone.Get() - before; d != 0 {
		t.Fatalf("the worker took its live router for gone %d times", d)
	}
}

// A worker that dies with a request open (its NATS connection gone, as a
// killed sidecar's) sends nothing more, and no closed connection tells the
// router: the router's probes of the worker's cancel subject bounce, and
// after three in a row the request fails with ErrWorkerGone (Do's error
// is retryable; after the head it breaks the stream). A live worker's
// long prefill, probed all along, is answered.
func TestAStreamFailsWhenItsWorkerDies(t *testing.T) {
	old := probeEvery
	probeEvery = 50 * time.Millisecond
	t.Cleanup(func() { probeEvery = old })

	r := newRig(t, ClientConfig{}, ServerConfig{})
	s, err := r.cli.Do(context.Background(), "w1", &Request{Path: "/stream?n=1&every=1ms&before=600ms"})
	if err != nil {
		t.Fatalf("a live worker's long prefill: %v", err)
	}
	if got := readAll(t, s); got != "data: 0\n\n" {
		t.Fatalf("a live worker's long prefill: %q", got)
	}
	s.Close()

	for _, tc := range []struct {
		name, path string
		midStream  bool
	}{
		{"before the head", "/stream?n=1&every=1ms&before=10s", false},
		{"mid-stream", "/stream?n=100&every=100ms", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, ClientConfig{}, ServerConfig{})
			before := mWorkerGone.Get()
			type result struct {
				s   *Stream
				err error
			}
			done := make(chan result, 1)
			go func() {
				s, err := r.cli.Do(context.Background(), "w1", &Request{Path: tc.path})
				done <- result{s, err}
			}()
			var s *Stream
			if tc.midStream {
				res := <-done
				if res.err != nil {
					t.Fatal(res.err)
				}
				s = res.s
				if _, err := s.Next(); err != nil {
					t.Fatal(err)
				}
			} else {
				for i := 0; r.srv.InFlight() != 1; i++ {
					if i > 200 {
						t.Fatal("the worker never took the request")
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			r.srv.nc.Close() // the worker dies
			start := time.Now()
			if tc.midStream {
				go func() {
					var err error
					for err == nil {
						_, err = s.Next()
					}
					s.Close()
					done <- result{nil, err}
				}()
			}
			var err error
			select {
			case res := <-done:
				err = res.err
			case <-time.After(5 * time.Second):
				t.Fatal("the request still waits for a dead worker")
			}
			if !errors.Is(err, ErrWorkerGone) {
				t.Fatalf("got %v, want ErrWorkerGone", err)
			}
			if !tc.midStream && !Retryable(err) {
				t.Fatal("a request the dead worker never answered is not retryable")
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("the dead worker was noticed after %v", d)
			}
			if n := mWorkerGone.Get() - before; n != 1 {
				t.Fatalf("infera_nats_streams_worker_gone_total grew by %d", n)
			}
		})
	}
}

// A worker that shuts down with requests in flight (its drain timed out)
// aborts them: their routers must hear so at once. Nothing told them: the
// requests failed only when the routers' probes found the worker gone,
// 6-8 s later (a stream), or went to another worker that late (a request
// still waiting for its engine).
func TestAWorkerClosedWithRequestsInFlightAnswersThem(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		midStream  bool
	}{
		{"before the head", "/stream?n=1&every=1ms&before=10s", false},
		{"mid-stream", "/stream?n=100&every=100ms", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, ClientConfig{}, ServerConfig{})
			type result struct {
				s   *Stream
				err error
			}
			done := make(chan result, 1)
			go func() {
				s, err := r.cli.Do(context.Background(), "w1", &Request{Path: tc.path})
				done <- result{s, err}
			}()
			var s *Stream
			if tc.midStream {
				res := <-done
				if res.err != nil {
					t.Fatal(res.err)
				}
				s = res.s
				defer s.Close()
				if _, err := s.Next(); err != nil {
					t.Fatal(err)
				}
			} else {
				for i := 0; r.srv.InFlight() != 1; i++ {
					if i > 200 {
						t.Fatal("the worker never took the request")
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			start := time.Now()
			go r.srv.Close() // the drain timed out
			if tc.midStream {
				go func() {
					var err error
					for err == nil {
						_, err = s.Next()
					}
					done <- result{nil, err}
				}()
			}
			var err error
			select {
			case res := <-done:
				err = res.err
			case <-time.After(10 * time.Second):
				t.Fatal("the request still waits for a worker that shut down")
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("the request failed %v after its worker shut down (%v)", d, err)
			}
			if err == nil || err == io.EOF || errors.Is(err, ErrWorkerGone) {
				t.Fatalf("got %v, want the worker's own answer", err)
			}
			if !tc.midStream && !Retryable(err) {
				t.Fatalf("a request the worker never answered is not retryable: %v", err)
			}
		})
	}
}
