package broker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// Every answer on a kept-alive engine connection is judged by the router's
// rules, not only the first: the request marks the connection it got
// (httptrace's GotConn) while net/http's read loop already waits on it.
// An answer with Content-Length beside chunked framing on a reused
// connection is ErrEngineProtocol (net/http took it, and the body came
// through as 200), and the answers around it come through whole.
func TestTheWorkerJudgesEveryAnswerOnAKeptAliveConnection(t *testing.T) {
	const ok = `{"id":"x"}`
	good := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(ok), ok)
	bad := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(ok), ok)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var conns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					b, _ := io.ReadAll(req.Body)
					if strings.Contains(string(b), "bad") {
						io.WriteString(c, bad)
					} else {
						io.WriteString(c, good)
					}
				}
			}()
		}
	}()
	ns := testsrv.StartNATS(t)
	cli, err := NewClient(ClientConfig{Conn: connect(t, ns.URL), IdleTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	srv, err := NewServer(ServerConfig{Conn: connect(t, ns.URL), WorkerID: "ka", EngineURL: "http://" + ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	for i, what := range []string{"good", "good", "bad", "good", "good", "bad"} {
		s, err := cli.Do(context.Background(), "ka", &Request{Path: "/v1/chat/completions", Body: []byte(what)})
		if what == "bad" {
			if !errors.Is(err, ErrEngineProtocol) {
				t.Fatalf("answer %d (%s): %v, want ErrEngineProtocol", i, what, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("answer %d (%s): %v", i, what, err)
		}
		var body []byte
		for {
			b, err := s.Next()
			body = append(body, b...)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("answer %d (%s): %v after %q", i, what, err, body)
			}
		}
		s.Close()
		if s.Status() != 200 || string(body) != ok {
			t.Fatalf("answer %d (%s): %d %q", i, what, s.Status(), body)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d engine connections, want 2 (one kept alive until the bad answer, one after)", n)
	}
}

// The worker never sends a request the router sends once (Request.Once: a
// PD leg) to its engine twice: net/http replays a request on a reused
// connection that closed after the write with no answer when the request
// looks idempotent, and a client's Idempotency-Key header (passed through,
// as any) made a POST look so. A PD leg sent twice holds a bootstrap room or
// reads freed KV; the router retries on another worker itself. Here the
// engine answers each connection's first request and drops its second
// unanswered: the second request reached it twice. It fails as an engine
// that broke before a head (ErrEngine).
func TestTheWorkerNeverReplaysARequestSentOnceToItsEngine(t *testing.T) {
	e := startReuseClosingEngine(t)
	cli := reuseRig(t, e.url)
	for i := 0; i < 2; i++ {
		s, err := cli.Do(ctxTimeout(t, 10*time.Second), "w1", &Request{Path: "/v1/chat/completions", Body: []byte(`{"n":1}`),
			Header: http.Header{"Idempotency-Key": {fmt.Sprint("k", i)}}, Once: true})
		if i == 1 {
			if !errors.Is(err, ErrEngine) {
				t.Fatalf("err %v, want ErrEngine", err)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, s)
		s.Close()
	}
	if n := e.got.Load(); n != 2 {
		t.Fatalf("the engine got %d requests for 2 sent", n)
	}
}
