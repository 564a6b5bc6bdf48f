package config

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// At debug level a reload logs which sections it changed, by name only
// (a section's values may be keys); above it, nothing.
func TestAReloadLogsTheSectionsItChangedAtDebugLevel(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		var mu sync.Mutex
		var buf bytes.Buffer
		old := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: level})))
		path := filepath.Join(t.TempDir(), "c.json")
		os.WriteFile(path, []byte(`{"load_balancing":{"algorithm":"round-robin"},"timeouts":{"stream_idle_s":30}}`), 0o644)
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(path, []byte(`{"load_balancing":{"algorithm":"least-requests"},"timeouts":{"stream_idle_s":31},"debug":{"decision_header":true}}`), 0o644)
		if ok, err := s.Reload(); !ok || err != nil {
			t.Fatal(ok, err)
		}
		slog.SetDefault(old)
		mu.Lock()
		out := buf.String()
		mu.Unlock()
		const want = `level=DEBUG msg="config changed" version=2 sections="[debug load_balancing timeouts]"`
		if got := strings.Contains(out, want); got != (level == slog.LevelDebug) {
			t.Errorf("level %v: line %q logged: %v, in:\n%s", level, want, got, out)
		}
		if strings.Contains(out, "least-requests") {
			t.Errorf("a value was logged:\n%s", out)
		}
	}
}
