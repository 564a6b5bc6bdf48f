package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/holdhup"
)

// The router speaks sd_notify on a real NOTIFY_SOCKET datagram socket:
// READY=1 when serving, RELOADING=1 with MONOTONIC_USEC then READY=1 around
// a SIGHUP reload, WATCHDOG=1 at half WatchdogSec, STOPPING=1 at shutdown.
func TestSystemdNotifyMessages(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "400000") // 0.4 s: pings every 0.2 s
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))

	_, e1 := startEngine(t, "--speedup", "50")
	cfgPath := filepath.Join(dir, "infera.json")
	os.WriteFile(cfgPath, []byte(`{}`), 0o644)
	f := parseServe(t, "--workers", "a="+e1, "--config", cfgPath, "--config-poll", "0", "--router-policy", "round-robin")
	g, err := New(f)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, ln) }()

	msgs := make(chan string, 64)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	next := func(want string) string {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					t.Fatalf("socket closed waiting for %q", want)
				}
				if strings.Contains(m, want) {
					return m
				}
			case <-deadline:
				t.Fatalf("no %q message", want)
			}
		}
	}
	next("READY=1")
	// The listener is up when READY=1 arrives.
	if resp, b := doPost(t, "http://"+ln.Addr().String()+"/v1/chat/completions", e2eChat); resp.StatusCode != 200 {
		t.Fatalf("after READY: %d %s", resp.StatusCode, b)
	}
	next("WATCHDOG=1")
	os.WriteFile(cfgPath, []byte(`{"debug":{"decision_header":true}}`), 0o644)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	m := next("RELOADING=1")
	if !strings.Contains(m, "MONOTONIC_USEC=") {
		t.Fatalf("RELOADING without MONOTONIC_USEC: %q", m)
	}
	next("READY=1")
	if !g.Store().Load().Debug.DecisionHeader {
		t.Fatal("SIGHUP did not reload the config")
	}
	cancel()
	// The stop's time: the drain (--shutdown-timeout, 30 s by default) and
	// the cut after it, so systemd does not SIGKILL a longer drain at the
	// unit's TimeoutStopSec.
	if m := next("STOPPING=1"); !strings.Contains(m, "EXTEND_TIMEOUT_USEC=47000000") {
		t.Fatalf("STOPPING=1 without the drain's EXTEND_TIMEOUT_USEC: %q", m)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// Shutdown drains: a stream in flight when SIGTERM (here: ctx) arrives
// completes, new connections are refused, and Run returns after the stream.
func TestShutdownDrainsInFlightStreams(t *testing.T) {
	_, e1 := startEngine(t, "--speedup", "5")
	f := parseServe(t, "--workers", "a="+e1, "--router-policy", "round-robin", "--shutdown-timeout", "20s")
	g, err := New(f)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, ln) }()
	type result struct {
		body string
		at   time.Time
	}
	body := make(chan result, 1)
	go func() {
		resp, b := doPost(t, url+"/v1/chat/completions", `{"model":"sim-model","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"drain me"}]}`)
		if resp.StatusCode != 200 {
			body <- result{"status " + strconv.Itoa(resp.StatusCode), time.Now()}
			return
		}
		body <- result{string(b), time.Now()}
	}()
	time.Sleep(300 * time.Millisecond) // the stream is running
	cancel()
	var runErr error
	var returned time.Time
	select {
	case runErr = <-done:
		returned = time.Now()
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	r := <-body
	if !strings.HasSuffix(r.body, "data: [DONE]\n\n") || strings.Contains(r.body, `"error"`) {
		t.Fatalf("stream cut by the shutdown: %q", r.body[max(0, len(r.body)-200):])
	}
	if returned.Before(r.at.Add(-100 * time.Millisecond)) {
		t.Fatalf("Run returned %v before the stream ended", r.at.Sub(returned))
	}
	if runErr != nil {
		t.Fatalf("Run: %v", runErr)
	}
	// Nothing is served any more.
	if resp, err := http.Get(url + "/health"); err == nil {
		resp.Body.Close()
		t.Fatalf("served after shutdown: %d", resp.StatusCode)
	}
}

// A SIGHUP (systemctl reload) while the config file holds a document the
// poll already refused says so in STATUS=, and the old config keeps
// serving: the refused bytes were reported once, so the reload returned no
// error and systemd was told "serving" as if the file had been loaded.
func TestSIGHUPOverARefusedFileSaysRejected(t *testing.T) {
	g, cfgPath, next := startNotifyingRouter(t)
	os.WriteFile(cfgPath, []byte(`{"debug":{"decision_header":"yes"}}`), 0o644)
	if _, err := g.Store().Reload(); err == nil { // as the poll would
		t.Fatal("the bad file was loaded")
	}
	for i := 0; i < 2; i++ { // the same answer every time it is asked
		syscall.Kill(os.Getpid(), syscall.SIGHUP)
		if m := next(); !strings.Contains(m, "RELOADING=1") {
			t.Fatalf("SIGHUP %d: %q, want RELOADING=1", i+1, m)
		}
		if m := next(); !strings.Contains(m, "READY=1") || !strings.Contains(m, "rejected") {
			t.Fatalf("SIGHUP %d over a refused file: %q, want READY=1 and a STATUS saying it was rejected", i+1, m)
		}
	}
	if g.Store().Version() != 1 {
		t.Fatalf("version %d: the refused file was applied", g.Store().Version())
	}
}

// A reload's reason with a newline in it (a config key spelled with one:
// the decoder's error names it as it was decoded) stays in STATUS=: the
// sd_notify message is newline-separated assignments, and the reason's
// own lines were sent as assignments of their own (STOPPING=1, which has
// systemd stop the unit, or MAINPID=).
func TestANewlineInARejectedReloadsReasonStaysInStatus(t *testing.T) {
	_, cfgPath, next := startNotifyingRouter(t)
	os.WriteFile(cfgPath, []byte(`{"x\nSTOPPING=1\rMAINPID=1":1}`), 0o644)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	if m := next(); !strings.HasPrefix(m, "RELOADING=1\n") {
		t.Fatalf("%q, want RELOADING=1", m)
	}
	m := next()
	lines := strings.Split(m, "\n")
	if len(lines) != 2 || lines[0] != "READY=1" || !strings.HasPrefix(lines[1], "STATUS=config reload rejected") || strings.ContainsAny(lines[1], "\r") {
		t.Fatalf("%q: want READY=1 and one STATUS= line", m)
	}
}

// A rejected reload's STATUS= ends when a good config is applied without a
// SIGHUP (the file fixed and picked up by the poll): it said "config reload
// rejected ...; previous config serving" until the next SIGHUP, so
// systemctl status showed a rejection while the fixed file served.
func TestARejectedReloadsStatusEndsWhenTheFixedFileIsLoaded(t *testing.T) {
	g, cfgPath, next := startNotifyingRouter(t)
	os.WriteFile(cfgPath, []byte(`{"debug":{"decision_header":"yes"}}`), 0o644)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	next() // RELOADING=1
	if m := next(); !strings.Contains(m, "STATUS=config reload rejected") {
		t.Fatalf("%q, want the rejection in STATUS=", m)
	}
	os.WriteFile(cfgPath, []byte(`{"debug":{"decision_header":true}}`), 0o644)
	if ok, err := g.Store().Reload(); !ok || err != nil { // as the poll would
		t.Fatalf("the fixed file was not loaded: %v %v", ok, err)
	}
	if m := next(); m != "STATUS=serving" {
		t.Fatalf("%q after the fixed file was loaded, want STATUS=serving", m)
	}
}

// The same when the broken edit is reverted: the file holds the serving
// config's bytes again, so the poll applies nothing, and the rejection
// stayed in STATUS= until the next SIGHUP.
func TestARejectedReloadsStatusEndsWhenTheEditIsReverted(t *testing.T) {
	g, cfgPath, next := startNotifyingRouter(t)
	good, _ := os.ReadFile(cfgPath)
	os.WriteFile(cfgPath, []byte(`{"debug":{"decision_header":"yes"}}`), 0o644)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	next() // RELOADING=1
	if m := next(); !strings.Contains(m, "STATUS=config reload rejected") {
		t.Fatalf("%q, want the rejection in STATUS=", m)
	}
	os.WriteFile(cfgPath, good, 0o644)
	if ok, err := g.Store().Reload(); ok || err != nil { // as the poll would: nothing to apply
		t.Fatalf("the reverted file: %v %v", ok, err)
	}
	if m := next(); m != "STATUS=serving" {
		t.Fatalf("%q after the edit was reverted, want STATUS=serving", m)
	}
}

// startNotifyingRouter runs a router with a config file (polled only on
// SIGHUP) whose sd_notify messages arrive on a real NOTIFY_SOCKET datagram
// socket; next returns the next message, READY=1 already read.
func startNotifyingRouter(t *testing.T) (g *Gateway, cfgPath string, next func() string) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", sock)

	_, e1 := startEngine(t, "--speedup", "50")
	cfgPath = filepath.Join(dir, "infera.json")
	os.WriteFile(cfgPath, []byte(`{}`), 0o644)
	f := parseServe(t, "--workers", "a="+e1, "--config", cfgPath, "--config-poll", "0", "--router-policy", "round-robin")
	g, err = New(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	holdhup.Pending() // a SIGHUP an earlier test sent is not this router's to act on
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	next = func() string {
		t.Helper()
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4096)
		n, _, err := conn.ReadFromUnix(buf)
		if err != nil {
			t.Fatalf("no sd_notify message: %v", err)
		}
		return string(buf[:n])
	}
	if m := next(); !strings.Contains(m, "READY=1") {
		t.Fatalf("first message %q", m)
	}
	return g, cfgPath, next
}

// A stream still open when the drain timeout runs out is cut, and Run
// returns nil: the stop happened as asked. It returned an error ("requests
// still open after ..."), so infera serve exited 1 and systemd recorded a
// plain `systemctl stop` as a failure.
func TestADrainThatRunsOutEndsTheStopWithoutAnError(t *testing.T) {
	_, e1 := startEngine(t, "--speedup", "1")
	f := parseServe(t, "--workers", "a="+e1, "--router-policy", "round-robin", "--shutdown-timeout", "300ms")
	g, err := New(f)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, ln) }()
	streaming := make(chan struct{})
	go func() {
		req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(`{"model":"sim-model","stream":true,"max_tokens":4000,"messages":[{"role":"user","content":"a long answer"}]}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			close(streaming)
			return
		}
		defer resp.Body.Close()
		buf := make([]byte, 1)
		resp.Body.Read(buf) // the stream has begun
		close(streaming)
		io.Copy(io.Discard, resp.Body)
	}()
	select {
	case <-streaming:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream never began")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after a drain that ran out: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the drain timeout")
	}
}

// --shutdown-timeout 0 drains for the default 30 s (docs/router.md), and
// the "shutting down" line and STOPPING=1's extension say that figure:
// the line said drain_timeout=0s while the drain took 30 s.
func TestAZeroShutdownTimeoutDrainsForTheDefaultAndSaysSo(t *testing.T) {
	f := parseServe(t, "--workers", "a=http://127.0.0.1:1", "--shutdown-timeout", "0")
	g, err := New(f)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if d := g.drainTimeout(); d != 30*time.Second {
		t.Fatalf("drain timeout %v, want 30s", d)
	}
}
