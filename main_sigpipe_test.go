package main

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain runs `infera` itself (main's run, arguments from the
// environment) when the test binary is started as a child.
func TestMain(m *testing.M) {
	if js := os.Getenv("INFERA_MAIN_CHILD_ARGS"); js != "" {
		var args []string
		if err := json.Unmarshal([]byte(js), &args); err != nil {
			os.Exit(3)
		}
		os.Exit(run(args, os.Stderr))
	}
	os.Exit(m.Run())
}

// A router whose log reader goes away (journald restarted, a `| tee` or a
// log shipper that exits) keeps serving. Its next log line killed it with
// SIGPIPE (Go's default for a write to a broken pipe on fd 1 or 2), which
// systemd counts as a clean exit: Restart=on-failure left it down.
func TestTheRouterSurvivesItsLogReaderGoingAway(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "infera.json")
	if err := os.WriteFile(cfg, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// --port 0: the router binds a port of its own and says which in its
	// "infera serving" line.
	js, _ := json.Marshal([]string{"serve", "--host", "127.0.0.1", "--port", "0", "--admin-port", "0",
		"--workers", "a=http://127.0.0.1:1", "--worker-model", "sim-model", "--config", cfg, "--config-poll", "100ms"})
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "INFERA_MAIN_CHILD_ARGS="+string(js))
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	sc := bufio.NewScanner(r) // the log reader sees the router start, then goes away
	addr := ""
	for addr == "" && sc.Scan() {
		if l := sc.Text(); strings.Contains(l, "infera serving") {
			_, a, _ := strings.Cut(l, " addr=")
			addr, _, _ = strings.Cut(a, " ")
		}
	}
	r.Close()
	if addr == "" {
		t.Fatal("the router never said where it serves")
	}
	// Something the router logs: a config reload.
	if err := os.WriteFile(cfg, []byte(`{"debug":{"decision_header":true}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
		t.Fatalf("the router died when its log reader went away: %v (signal %v)", cmd.ProcessState, ws.Signal())
	case <-time.After(2 * time.Second):
	}
	c, err := net.DialTimeout("tcp4", addr, time.Second)
	if err != nil {
		t.Fatalf("the router no longer serves: %v", err)
	}
	c.Close()
}
