package broker

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// TestStopAcceptingAnswersEveryPublishedRequest: requests published while the worker
// unsubscribes must each get an answer or "no responders"; none may be
// silently dropped (the router would wait for the idle timeout, 900s by
// default).
func TestStopAcceptingAnswersEveryPublishedRequest(t *testing.T) {
	r := newRig(t, ClientConfig{IdleTimeout: 1500 * time.Millisecond}, ServerConfig{})
	var ok, noResp, idle, other atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 400; i++ {
				select {
				case <-stop:
					return
				default:
				}
				s, err := r.cli.Do(context.Background(), "w1", &Request{Path: "/echo", Body: []byte("x")})
				switch {
				case err == nil:
					ok.Add(1)
					s.Close()
				case errors.Is(err, ErrNoResponders):
					noResp.Add(1)
					return
				case errors.Is(err, ErrIdleTimeout):
					idle.Add(1)
					return
				default:
					other.Add(1)
					return
				}
			}
		}()
	}
	time.Sleep(150 * time.Millisecond)
	r.srv.StopAccepting()
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("ok=%d noResponders=%d idleTimeout=%d other=%d", ok.Load(), noResp.Load(), idle.Load(), other.Load())
	if idle.Load() > 0 {
		t.Fatalf("%d requests were silently dropped by StopAccepting (router saw only the idle timeout)", idle.Load())
	}
}

// TestCancelBeforeHandlerRegistersStillCancels: a cancel that reaches the worker before its
// request handler registered the id is ignored, and the engine request runs
// to completion with nobody listening.
func TestCancelBeforeHandlerRegistersStillCancels(t *testing.T) {
	r := newRig(t, ClientConfig{}, ServerConfig{})
	const n = 200
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the client is already gone: Do publishes, then cancels at once
		_, _ = r.cli.Do(ctx, "w1", &Request{Path: "/stream?n=100&every=100ms"})
	}
	deadline := time.Now().Add(2 * time.Second)
	for r.eng.active.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if a := r.eng.active.Load(); a > 0 {
		t.Fatalf("%d of %d canceled requests still run at the engine", a, n)
	}
}

// A small fixed-length answer (a body that fits one chunk) goes out as one
// message, head and body, unless the engine's headers and the body pass
// the broker's max_payload together: then head, body and end go apart,
// headers kept. The headers were copied unbounded, the publish failed with
// nats.ErrMaxPayload unseen, and the router heard nothing until its probes
// gave up on the worker (a 502 blamed on it) or the idle timeout.
func TestAnAnswerWhoseHeadersPassTheChunkMarginIsDelivered(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte("max_payload: 16384\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := testsrv.StartNATSArgs(t, "-c", conf)
	body := strings.Repeat("b", 15000)
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/embeddings", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Engine-Trace", strings.Repeat("t", 3000)) // 3 KB of headers
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write([]byte(body))
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mux}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })

	wnc, rnc := connect(t, ns.URL), connect(t, ns.URL)
	if rnc.MaxPayload() != 16384 {
		t.Fatalf("max payload %d", rnc.MaxPayload())
	}
	srv, err := NewServer(ServerConfig{Conn: wnc, WorkerID: "w1", EngineURL: "http://" + ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cli, err := NewClient(ClientConfig{Conn: rnc, IdleTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	t0 := time.Now()
	s, err := cli.Do(ctx, "w1", &Request{Path: "/v1/embeddings", Body: []byte(`{"model":"m","input":"x"}`)})
	if err != nil {
		t.Fatalf("Do after %v: %v (the worker's answer was dropped)", time.Since(t0).Round(time.Millisecond), err)
	}
	defer s.Close()
	if got := readAll(t, s); s.Status() != 200 || got != body || len(s.Header().Get("X-Engine-Trace")) != 3000 {
		t.Fatalf("status %d, %d body bytes, trace header of %d bytes", s.Status(), len(got), len(s.Header().Get("X-Engine-Trace")))
	}
}
