package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
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

// A reload whose workers list holds a worker the fleet would skip (an id
// with a space, credentials in the url, a malformed KV endpoint, a block
// size out of range) is refused whole, naming the worker: accepting it
// half-applied the reload (the other settings and workers swapped in, that
// worker silently missing from the fleet) and logged the url's password in
// the change audit.
func TestReloadRefusesAWorkerTheFleetWouldSkip(t *testing.T) {
	good := `{"workers":[{"id":"a","url":"http://127.0.0.1:1","models":["m"]}]}`
	for _, bad := range []string{
		`{"id":"b c","url":"http://127.0.0.1:2"}`,
		`{"id":"b","url":"http://user:pw@127.0.0.1:2"}`,
		`{"id":"b","url":"http://"}`,
		`{"id":"b","url":"http://127.0.0.1:2","kv_events_endpoint":"bogus"}`,
		`{"id":"b","url":"http://127.0.0.1:2","block_size":-1}`,
		`{"id":"b","url":"http://127.0.0.1:2","dp_size":5000}`,
	} {
		s, path := openTemp(t, good)
		doc := `{"load_balancing":{"algorithm":"round-robin"},"workers":[{"id":"x","url":"http://127.0.0.1:3"},` + bad + `]}`
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		ok, err := s.Reload()
		var fe *FieldError
		if ok || !errors.As(err, &fe) || fe.Path != "workers[1]" {
			t.Fatalf("reload with worker %s: swapped=%v err=%v, want refused at workers[1]", bad, ok, err)
		}
		if strings.Contains(err.Error(), "pw") {
			t.Fatalf("the error shows the url's password: %v", err)
		}
		if c := s.Load(); len(c.Workers) != 1 || c.LoadBalancing.Algorithm != "least-requests" {
			t.Fatalf("reload with worker %s half-applied: %+v", bad, c.Workers)
		}
	}
}
