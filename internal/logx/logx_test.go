package logx

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestThrottle(t *testing.T) {
	th := &Throttle{Every: time.Hour}
	if ok, _ := th.Allow(); !ok {
		t.Fatal("first line suppressed")
	}
	for i := 0; i < 5; i++ {
		if ok, _ := th.Allow(); ok {
			t.Fatal("line within the interval allowed")
		}
	}
	th.last.Store(0) // the interval has passed
	if ok, n := th.Allow(); !ok || n != 5 {
		t.Fatalf("after the interval: ok=%v suppressed=%d, want true 5", ok, n)
	}
}

// The Redis client's own lines go to slog at warning level, one a second:
// they were printed unstructured on standard error whatever the log level.
func TestRedisClientLinesGoThroughSlogThrottled(t *testing.T) {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	defer slog.SetDefault(old)
	r := NewRedis()
	r.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v\n", 5, "connection refused")
	r.Printf(context.Background(), "redis: again")
	out := buf.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, `"level":"WARN"`) ||
		!strings.Contains(out, `"msg":"redis client: redis: connection pool: failed to dial after 5 attempts: connection refused"`) {
		t.Fatalf("slog got %q", out)
	}
	buf.Reset()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError})))
	NewRedis().Printf(context.Background(), "redis: below the level")
	if buf.Len() != 0 {
		t.Fatalf("a line below --log-level was written: %q", buf.String())
	}
}
