package broker

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"github.com/nats-io/nats.go"
)

// lossyRig is a router and a worker on one NATS server whose router
// connection drops what it publishes while disconnected (no reconnect
// buffer): a cancel notice sent during a broker restart is lost for sure.
// The worker's connection buffers as usual: its chunks reach the router
// after the restart.
type lossyRig struct {
	ns  *testsrv.NATS
	eng *testEngine
	cli *Client
}

func newLossyRig(t *testing.T) *lossyRig {
	t.Helper()
	r := &lossyRig{ns: testsrv.StartNATS(t), eng: startEngine(t)}
	wnc, err := nats.Connect(r.ns.URL, Reconnect()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wnc.Close)
	srv, err := NewServer(ServerConfig{Conn: wnc, WorkerID: "w1", EngineURL: r.eng.URL})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	var cli *Client
	rnc, err := nats.Connect(r.ns.URL, append(Reconnect(), nats.ReconnectBufSize(-1), nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
		if cli != nil {
			cli.Disconnected(err)
		}
	}))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rnc.Close)
	if cli, err = NewClient(ClientConfig{Conn: rnc}); err != nil {
		t.Fatal(err)
	}
	r.cli = cli
	t.Cleanup(func() { cli.Close() })
	return r
}

// A broker restart in the middle of a stream: the router gives the stream
// up and its cancel notice is lost, but the worker's next chunk reaches
// the router's inbox again, which answers that the request is over: the
// engine request is cancelled, not run to its end.
func TestAStreamWhoseCancelWasLostInABrokerRestartIsStoppedByItsNextChunk(t *testing.T) {
	r := newLossyRig(t)
	s, err := r.cli.Do(context.Background(), "w1", &Request{Path: "/stream?n=100000&every=5ms"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	r.ns.Stop()
	for i := 0; i < 100000; i++ {
		if _, err := s.Next(); err != nil {
			if !errors.Is(err, ErrConnLost) {
				t.Fatalf("Next: %v, want ErrConnLost", err)
			}
			break
		}
	}
	s.Close() // the cancel notice goes nowhere
	r.ns.Start()
	select {
	case <-r.eng.gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine request ran on after the router gave it up")
	}
}

// The same before the first chunk (a prefill, a whole non-streamed
// answer): the worker's probe of the router's inbox is answered that the
// request is over.
func TestARequestWaitingForItsEngineWhoseCancelWasLostIsStoppedByItsProbe(t *testing.T) {
	old := probeEvery
	probeEvery = 50 * time.Millisecond
	t.Cleanup(func() { probeEvery = old })
	r := newLossyRig(t)
	done := make(chan error, 1)
	go func() {
		_, err := r.cli.Do(context.Background(), "w1", &Request{Path: "/stream?n=1&every=1ms&before=60s"})
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for r.eng.streams.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	r.ns.Stop()
	select {
	case err := <-done:
		if !errors.Is(err, ErrConnLost) {
			t.Fatalf("Do: %v, want ErrConnLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Do did not fail when the broker went away")
	}
	r.ns.Start()
	select {
	case <-r.eng.gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine request waited on after the router gave it up")
	}
}

// A worker restarted under the same id does not know the requests its
// predecessor had open: the router's probe asks, and after two answers
// that it does not know one, the stream fails at once instead of waiting
// for the idle timeout.
func TestAStreamFailsWhenItsWorkerRestartedUnderTheSameID(t *testing.T) {
	old := probeEvery
	probeEvery = 50 * time.Millisecond
	t.Cleanup(func() { probeEvery = old })
	ns := testsrv.StartNATS(t)
	eng := startEngine(t)
	start := func() (*Server, *nats.Conn) {
		nc := connect(t, ns.URL)
		srv, err := NewServer(ServerConfig{Conn: nc, WorkerID: "w1", EngineURL: eng.URL})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		return srv, nc
	}
	_, first := start()
	cli, err := NewClient(ClientConfig{Conn: connect(t, ns.URL)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	s, err := cli.Do(context.Background(), "w1", &Request{Path: "/stream?n=2&every=1ms&gate=1"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	// The worker comes back under its id before the old process is gone
	// (so no probe ever finds the cancel subject without a subscriber: the
	// no-responders path cannot end the stream), then the old one dies.
	second, _ := start()
	t.Cleanup(second.Close)
	first.Close()
	got := make(chan error, 1)
	go func() {
		_, err := s.Next()
		got <- err
	}()
	select {
	case err := <-got:
		if !errors.Is(err, ErrWorkerGone) {
			t.Fatalf("Next: %v, want ErrWorkerGone", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream stayed silent after its worker restarted")
	}
}

// Two sidecars under one id (a rollout): the one that does not serve the
// request says so, the one that does says it knows it, and the stream
// goes on.
func TestAStreamGoesOnWhileASecondSidecarSharesItsWorkerID(t *testing.T) {
	old := probeEvery
	probeEvery = 50 * time.Millisecond
	t.Cleanup(func() { probeEvery = old })
	r := newRig(t, ClientConfig{}, ServerConfig{})
	other, err := NewServer(ServerConfig{Conn: connect(t, r.srv.nc.ConnectedUrl()), WorkerID: "w1", EngineURL: r.eng.URL})
	if err != nil {
		t.Fatal(err)
	}
	// Only its cancel subject: every request goes to the first sidecar.
	other.goneInbox = "unused"
	sub, err := other.nc.Subscribe(CancelSubject("w1"), other.onCancel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	answers := make(chan *nats.Msg, 64)
	asub, err := r.nc.ChanSubscribe(r.cli.prefix+goneTag+"w1", answers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { asub.Unsubscribe() })
	s, err := r.cli.Do(context.Background(), "w1", &Request{Path: "/stream?n=40&every=25ms"}) // 20 probe periods
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	readAll(t, s)
	unknown := 0
	for len(answers) > 0 {
		if (<-answers).Header.Get(HdrUnknown) == s.ID() {
			unknown++
		}
	}
	if unknown < unknownStrikes {
		t.Fatalf("the second sidecar answered it does not know the request %d times, want %d or more (the test checks nothing)", unknown, unknownStrikes)
	}
}

// How the worker tells its engine's failures apart: one it could not
// connect to, one that closed without answering (it may have read the
// request), one that answered something that is not HTTP, and one whose
// answer broke off after its head.
func TestTheWorkerClassifiesItsEngineFailures(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + dead.Addr().String()
	dead.Close()
	script := func(answer string) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
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
						l, err := br.ReadString('\n')
						if err != nil || l == "\r\n" {
							break
						}
					}
					c.Write([]byte(answer))
				}()
			}
		}()
		return "http://" + ln.Addr().String()
	}
	ns := testsrv.StartNATS(t)
	cli, err := NewClient(ClientConfig{Conn: connect(t, ns.URL), IdleTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	worker := func(id, url string) {
		srv, err := NewServer(ServerConfig{Conn: connect(t, ns.URL), WorkerID: id, EngineURL: url})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
	}
	worker("dead", deadURL)
	worker("hangup", script("")) // reads the request, closes
	worker("garbage", script("SSH-2.0-OpenSSH_9.2\r\n\r\n"))
	worker("short", script("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":\"cmpl-1\","))
	ctx := context.Background()
	if _, err := cli.Do(ctx, "dead", &Request{Path: "/v1/chat/completions"}); !errors.Is(err, ErrEngineDial) {
		t.Fatalf("engine not listening: %v, want ErrEngineDial", err)
	}
	if _, err := cli.Do(ctx, "hangup", &Request{Path: "/v1/chat/completions"}); !errors.Is(err, ErrEngine) {
		t.Fatalf("engine closing without an answer: %v, want ErrEngine (reached, broken before a head)", err)
	}
	if _, err := cli.Do(ctx, "garbage", &Request{Path: "/v1/chat/completions"}); !errors.Is(err, ErrEngineProtocol) {
		t.Fatalf("engine answering garbage: %v, want ErrEngineProtocol", err)
	}
	s, err := cli.Do(ctx, "short", &Request{Path: "/v1/chat/completions"})
	if err != nil {
		t.Fatalf("engine breaking off its answer: %v, want its head", err)
	}
	defer s.Close()
	if s.Status() != 200 {
		t.Fatalf("status %d, want the engine's 200", s.Status())
	}
	var body strings.Builder
	for {
		b, err := s.Next()
		body.Write(b)
		if err != nil {
			if !errors.Is(err, ErrBroken) {
				t.Fatalf("after %q: %v, want ErrBroken", body.String(), err)
			}
			break
		}
	}
	if body.String() != `{"id":"cmpl-1",` {
		t.Fatalf("body %q, want what the engine sent", body.String())
	}
}
