package kv

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/infera/infera/fleet"
)

// A worker's KV warnings are throttled to one per 10 seconds; at debug
// level the ones held back (every gap, every decode error) go out as debug
// lines, and above it they are dropped as before.
func TestThrottledKVWarningsGoOutAtDebugLevel(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		var buf bytes.Buffer
		old := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level})))
		ws := &workerState{w: &fleet.Worker{ID: "w0"}}
		ws.logf("KV event gap without replay, resyncing", "rank", 0, "want", 5, "got", 7)
		ws.logf("KV event gap without replay, resyncing", "rank", 0, "want", 8, "got", 9)
		slog.SetDefault(old)
		out := buf.String()
		if !strings.Contains(out, `level=WARN msg="KV event gap without replay, resyncing" worker=w0 rank=0 want=5 got=7`) {
			t.Errorf("level %v: the first gap was not a warning:\n%s", level, out)
		}
		second := strings.Contains(out, `level=DEBUG msg="KV event gap without replay, resyncing" worker=w0 rank=0 want=8 got=9`)
		if second != (level == slog.LevelDebug) {
			t.Errorf("level %v: the throttled gap logged at debug: %v:\n%s", level, second, out)
		}
	}
}
