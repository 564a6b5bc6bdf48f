package config

import (
	"os"
	"path/filepath"
	"testing"
)

// R5: --config-poll 0 passes Validate, and Store.Watch then panics in
// time.NewTicker (in serve.go it runs in a goroutine: the process dies).
func TestWatchWithZeroPollDoesNotPanic(t *testing.T) {
	f := &Serve{Port: 8000, MaxBodyBytes: 1, BreakerCooldownS: 1, BreakerMaxCooldownS: 2, ConfigPoll: 0}
	if err := f.Validate(); err != nil {
		t.Skipf("rejected by Validate: %v", err)
	}
	p := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(p, []byte(`{}`), 0o644)
	s, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	close(stop)
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Watch(0) panicked: %v", r)
		}
	}()
	s.Watch(f.ConfigPoll, stop)
}
