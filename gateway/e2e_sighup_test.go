package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// One SIGHUP is one reload: a broken config sent with it is refused once,
// logged once and counted once (the config watcher and Run both handled
// the signal, so each reload ran, logged and counted twice).
func TestE2EOneSIGHUPReloadsOnce(t *testing.T) {
	_, e1 := startEngine(t, "--speedup", "50")
	cfg := filepath.Join(t.TempDir(), "infera.json")
	if err := os.WriteFile(cfg, []byte(`{"debug":{"decision_header":true}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startChild(t, "serve", 0, "--workers", e1, "--config", cfg, "--config-poll", "0")
	if err := os.WriteFile(cfg, []byte(`{"debug":{"decision_header":tru}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r.cmd.Process.Signal(syscall.SIGHUP)
	waitUntil(t, "the reload refused", func() bool { return strings.Contains(r.logText(), "config reload rejected") })
	time.Sleep(300 * time.Millisecond) // a second handler would have run by now
	if n := strings.Count(r.logText(), "config reload rejected"); n != 1 {
		t.Fatalf("one SIGHUP logged %d rejections:\n%s", n, r.logText())
	}
	if v := metric(t, r.url, `infera_config_reloads_total{result="error"}`); v != "1" {
		t.Fatalf(`infera_config_reloads_total{result="error"} %s after one SIGHUP`, v)
	}
}
