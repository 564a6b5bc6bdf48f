package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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
	bin := buildInfera(t)
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

var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// buildInfera builds the infera binary, once for the package's tests.
func buildInfera(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "infera-soak-test-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "infera")
		cmd := exec.Command("go", "build", "-o", built.bin, ".")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// An engine the soak kills is restarted at the address its worker and the
// router know, even when another process wants that port meanwhile: it
// restarted on its old port, which any process could take in the 8 s it
// was down (the restart then failed, and the engine stayed down for the
// rest of the run).
func TestAnEngineKilledAndRestartedKeepsItsAddress(t *testing.T) {
	bin, dir := buildInfera(t), t.TempDir()
	ctx := context.Background()
	e, err := newEngineProc("soak-t")
	if err != nil {
		t.Fatal(err)
	}
	defer e.front.Close()
	health := func() (int, string, error) {
		resp, err := http.Get(e.url + "/health")
		if err != nil {
			return 0, "", err
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("X-Infera-Engine-Id"), nil
	}
	eng, err := e.startEngine(ctx, dir, bin)
	if err != nil {
		t.Fatal(err)
	}
	if code, id, err := health(); code != 200 || id != "soak-t" {
		t.Fatalf("the engine at %s: %d %q %v", e.url, code, id, err)
	}
	e.kill(eng, nil)
	eng.Stop() // reaped
	if _, _, err := health(); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("the killed engine's address: %v, want connection refused", err)
	}
	// Another server wants the port while the engine is down.
	if ln, err := net.Listen("tcp", strings.TrimPrefix(e.url, "http://")); err == nil {
		defer ln.Close()
		t.Errorf("another server took the address of the engine that is down")
	}
	eng, err = e.startEngine(ctx, dir, bin)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	defer eng.Stop()
	if code, id, err := health(); code != 200 || id != "soak-t" {
		t.Fatalf("the restarted engine at %s: %d %q %v", e.url, code, id, err)
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
