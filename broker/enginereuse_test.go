package broker

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// reuseClosingEngine answers the first request on each connection with a
// keep-alive answer and closes the connection when a second request comes
// on it, after reading it: an engine closing an idle keep-alive connection
// just as it is reused, which a loaded machine hits at random.
type reuseClosingEngine struct {
	url  string
	got  atomic.Int32 // requests read
	conn atomic.Int32 // connections accepted
}

func startReuseClosingEngine(t *testing.T) *reuseClosingEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &reuseClosingEngine{url: "http://" + ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.conn.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					e.got.Add(1)
					if n > 0 {
						return
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
				}
			}()
		}
	}()
	return e
}

func reuseRig(t *testing.T, engineURL string) *Client {
	t.Helper()
	ns := testsrv.StartNATS(t)
	srv, err := NewServer(ServerConfig{Conn: connect(t, ns.URL), WorkerID: "w1", EngineURL: engineURL})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cli, err := NewClient(ClientConfig{Conn: connect(t, ns.URL), IdleTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// A keep-alive connection to the engine that the engine closes as the
// worker reuses it (nothing of an answer comes) is no engine the worker
// could not reach: the request goes again on a fresh connection, as the
// router's HTTP transport sends it (it was 502 ErrEngine, and the client
// of a one-worker fleet got 503 no_workers_reachable).
func TestAReusedEngineConnectionClosedUnderARequestIsRetriedOnAFreshOne(t *testing.T) {
	e := startReuseClosingEngine(t)
	cli := reuseRig(t, e.url)
	for i := 0; i < 2; i++ {
		s, err := cli.Do(ctxTimeout(t, 10*time.Second), "w1", &Request{Path: "/v1/chat/completions", Body: []byte(`{}`)})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if s.Status() != 200 || readAll(t, s) != "{}" {
			t.Fatalf("request %d: status %d", i, s.Status())
		}
		s.Close()
	}
	if got, conns := e.got.Load(), e.conn.Load(); got != 3 || conns != 2 {
		t.Fatalf("the engine read %d requests on %d connections, want 3 on 2", got, conns)
	}
}
