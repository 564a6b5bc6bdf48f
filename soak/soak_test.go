package soak

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// A short soak: the harness drives a real router over NATS and etcd while
// it kills, hangs and faults engines and restarts NATS, and every request
// ends in a complete answer or a clean error.
func TestShortSoakLosesNothing(t *testing.T) {
	for _, b := range []string{"/usr/bin/etcd", "/usr/sbin/nats-server"} {
		if _, err := os.Stat(b); err != nil {
			if os.Getenv("INFERA_REQUIRE_SERVERS") != "" {
				t.Fatalf("%s missing (make deps)", b)
			}
			t.Skip(b + " missing")
		}
	}
	bin := filepath.Join(t.TempDir(), "infera")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	c := &Cmd{Duration: 30 * time.Second, Engines: 3, Clients: 8, StreamPct: 70, ChaosEvery: 5 * time.Second,
		ReloadEvery: 3 * time.Second, InferaBin: bin, Etcd: "/usr/bin/etcd", NATS: "/usr/sbin/nats-server", Seed: 7}
	var log bytes.Buffer
	rep, err := c.run(context.Background(), &log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Logf("%+v", rep)
	if rep.Lost != 0 || rep.Duplicated != 0 || rep.OK == 0 || len(rep.Chaos) < 4 {
		t.Fatalf("lost %d duplicated %d ok %d chaos %v\n%s", rep.Lost, rep.Duplicated, rep.OK, rep.Chaos, log.String())
	}
}

// A request counts as OK only if it ends in a complete answer, one that
// carries its finish_reason. A stream that stops after its first token
// but is closed with data: [DONE] and no error event used to count as OK:
// a router that papered over a cut stream would pass the soak with
// "0 lost".
func TestTruncatedStreamEndingInDoneIsLost(t *testing.T) {
	const (
		tok  = `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}` + "\n\n"
		fin  = `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}` + "\n\n"
		done = "data: [DONE]\n\n"
	)
	f := func(stream bool, body string, want outcome) {
		t.Helper()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if stream {
				w.Header().Set("Content-Type", "text/event-stream")
			}
			_, _ = w.Write([]byte(body))
		}))
		defer srv.Close()
		if out, status := oneRequest(srv.Client(), srv.URL, 1, stream, 8); out != want {
			t.Fatalf("stream %v, body %q: outcome %d (status %q), want %d", stream, body, out, status, want)
		}
	}
	f(true, tok+done, outLost)
	f(true, tok+fin+done, outOK)
	f(true, tok+`data: {"error":{"message":"cut"}}`+"\n\n"+done, outCleanError)
	f(false, `{"choices":[{"index":0,"message":{"role":"assistant","content":"tok"},"finish_reason":null}]}`, outLost)
	f(false, `{"choices":[{"index":0,"message":{"role":"assistant","content":"tok"},"finish_reason":"stop"}]}`, outOK)
}
