package broker

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"github.com/nats-io/nats.go"
)

// TestAnAnswerFitsTheMaxPayloadOfTheBrokerReconnectedTo: the worker sized
// its reply chunks once, from the max_payload of the broker it first
// connected to. Reconnected to one with a smaller max_payload (a cluster
// node configured apart, a broker restarted with a new config), an answer
// larger than that went out as one message, which NATS refused: the
// worker dropped it without a word, and the router waited until its
// probes found the request unknown to the worker (a 20 KB answer with a
// 16 KB max_payload: 503 worker_unavailable after the engine's time
// plus 4-6 s, and the breaker counted a fault).
func TestAnAnswerFitsTheMaxPayloadOfTheBrokerReconnectedTo(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 2000) // 20,000 bytes
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eng := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fixed" {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		} else {
			w.(http.Flusher).Flush() // chunked
		}
		w.Write(body)
	})}
	go eng.Serve(ln)
	t.Cleanup(func() { eng.Close() })

	conf := filepath.Join(t.TempDir(), "nats.conf")
	setMax := func(n int) {
		if err := os.WriteFile(conf, []byte("max_payload: "+strconv.Itoa(n)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	setMax(1 << 20)
	ns := testsrv.StartNATSArgs(t, "-c", conf)
	dial := func() *nats.Conn {
		nc, err := nats.Connect(ns.URL, Reconnect()...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	wnc, rnc := dial(), dial()
	srv, err := NewServer(ServerConfig{Conn: wnc, WorkerID: "w1", EngineURL: "http://" + ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cli, err := NewClient(ClientConfig{Conn: rnc, IdleTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })

	ns.Stop()
	setMax(16 << 10)
	ns.Start()
	deadline := time.Now().Add(5 * time.Second)
	for !wnc.IsConnected() || !rnc.IsConnected() || wnc.MaxPayload() != 16<<10 {
		if time.Now().After(deadline) {
			t.Fatalf("not reconnected: worker %v, router %v, max payload %d", wnc.Status(), rnc.Status(), wnc.MaxPayload())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := wnc.Flush(); err != nil { // the worker's subscriptions are back
		t.Fatal(err)
	}

	for _, path := range []string{"/fixed", "/chunked"} {
		st, err := cli.Do(context.Background(), "w1", &Request{Path: path})
		if err != nil {
			t.Fatalf("%s: Do: %v", path, err)
		}
		got := readAll(t, st)
		st.Close()
		if got != string(body) {
			t.Fatalf("%s: got %d bytes, want %d", path, len(got), len(body))
		}
	}
}
