package gateway

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"github.com/redis/go-redis/v9"
)

// A SIGHUP that arrives while the router is still starting (here: waiting
// up to 10 s for an unreachable etcd's first sync) does not end it: SIGHUP's
// default action ends a process, and nothing handled it before the config
// watcher and Run were up. A config reloader, a log rotator or an operator
// sending it during a slow start killed the router.
func TestSIGHUPDuringStartupDoesNotKillTheRouter(t *testing.T) {
	// The router's port is its own (--port 0: never dialled here); etcd's
	// is held and never up, so connecting is refused for the whole test.
	c := launchChild(t, "serve", "", "serve.log", []string{
		"--host", "127.0.0.1", "--port", "0", "--admin-port", "0",
		"--discovery-backend", "etcd", "--etcd-endpoint", testsrv.NewFront(t).Addr, "--request-transport", "http", "--kv-event-transport", "zmq",
	})
	// Wait until the child is inside New (its first log lines), then HUP it.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(c.logText(), "level=") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if strings.Contains(c.logText(), "infera serving") {
		t.Skip("the router started before the signal could be sent")
	}
	c.cmd.Process.Signal(syscall.SIGHUP)
	select {
	case <-c.done:
		t.Fatalf("the router died of a SIGHUP during startup: %v", c.cmd.ProcessState)
	case <-time.After(time.Second):
	}
}

// A SIGHUP sent for a config edit after New has read the file for the last
// time and before Run registers its handler is acted on once Run starts:
// holdhup's placeholder took it and dropped it, and with --config-poll 0
// (reload on SIGHUP only) the edit was never applied. In `infera serve` the
// window is the rest of New, net.Listen and the start-up log line.
func TestASIGHUPBetweenNewAndRunIsActedOn(t *testing.T) {
	_, e1 := startEngine(t, "--speedup", "50")
	cfg := filepath.Join(t.TempDir(), "infera.json")
	os.WriteFile(cfg, []byte(`{"debug":{"decision_header":false}}`), 0o600)
	g, err := New(parseServe(t, "--workers", e1, "--config", cfg, "--config-poll", "0", "--admin-port", "0"))
	if err != nil {
		t.Fatal(err)
	}
	// The operator's edit and its SIGHUP, while the router is still starting.
	os.WriteFile(cfg, []byte(`{"debug":{"decision_header":true}}`), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	time.Sleep(100 * time.Millisecond)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done; g.Close() })
	time.Sleep(500 * time.Millisecond)
	if !g.Store().Load().Debug.DecisionHeader {
		t.Fatalf("the edit signalled with SIGHUP during start-up was never applied (config version %d): the SIGHUP was dropped", g.Store().Version())
	}
}

// The router hands the Redis client's own lines (a pool that cannot dial)
// to slog, at warning level: they went unstructured to standard error,
// whatever --log-level said.
func TestTheRedisClientsOwnLinesGoThroughSlog(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	defer slog.SetDefault(old)
	g, err := New(parseServe(t, "--workers", "a=http://127.0.0.1:1", "--worker-model", "m", "--admin-port", "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	c := redis.NewClient(&redis.Options{Addr: testsrv.NewFront(t).Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond}) // held, never up
	defer c.Close()
	if c.Ping(context.Background()).Err() == nil {
		t.Fatal("a closed port answered")
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(buf.String(), `"msg":"redis client: redis: connection pool: failed to dial`) {
		t.Fatalf("slog got %q", buf.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
