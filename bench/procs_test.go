package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

// WaitListenAddr finds the address a server started with --port 0 logs,
// in slog's text format (infera serve) and its default format (infera
// engine), and fails at once when the process exits without logging it.
func TestWaitListenAddrReadsTheAddressAServerLogs(t *testing.T) {
	f := func(script, msg, want, wantErr string) {
		t.Helper()
		p, err := StartProc("srv", t.TempDir(), "/bin/sh", "-c", script)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Stop()
		start := time.Now()
		got, err := p.WaitListenAddr(context.Background(), msg, 10*time.Second)
		if wantErr == "" && (err != nil || got != want) {
			t.Fatalf("%q: %q %v, want %q", script, got, err, want)
		}
		if wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)) {
			t.Fatalf("%q: %q %v, want an error with %q", script, got, err, wantErr)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("%q: took %v", script, d)
		}
	}
	f(`echo 'time=2026-12-07T08:00:00Z level=INFO msg="infera serving" addr=127.0.0.1:40123 workers=0'; exec sleep 30`,
		"infera serving", "127.0.0.1:40123", "")
	f(`echo 'level=INFO msg="other" addr=127.0.0.1:1'; sleep 0.2; echo '2026/12/07 08:00:00 INFO infera engine listening addr=127.0.0.1:40124 id=e1'; exec sleep 30`,
		"infera engine listening", "127.0.0.1:40124", "")
	f(`echo 'ERROR fatal err="cannot listen"'; exit 1`, "infera serving", "", "exited")
}
