package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// An admin write to a config file reached through a symlink (a deploy
// tool's current -> release link, /etc/infera/infera.json -> ...) writes
// the file the link points to and leaves the link: replacing the link with
// a regular file detached the router from the file the operator edits,
// whose later edits were then never seen.
func TestApplyThroughASymlinkKeepsTheLink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "release", "infera.json")
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "infera.json")
	if err := os.Symlink(filepath.Join("release", "infera.json"), link); err != nil {
		t.Fatal(err)
	}
	s, err := Open(link)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(withAlg(s.Load(), "round-robin"), 0); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the symlink was replaced: %v %v", fi.Mode(), err)
	}
	if c, err := ReadFile(target); err != nil || c.LoadBalancing.Algorithm != "round-robin" {
		t.Fatalf("the file behind the link was not written: %v", err)
	}
	// A later edit of that file is still the config.
	if err := os.WriteFile(target, []byte(`{"load_balancing":{"algorithm":"least-tokens"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Reload(); !ok || err != nil || s.Load().LoadBalancing.Algorithm != "least-tokens" {
		t.Fatalf("edit behind the link after the write: %v %v %q", ok, err, s.Load().LoadBalancing.Algorithm)
	}
}

// A setting given twice in one object (two "workers" lists pasted into one
// file, a section repeated further down, a key repeated in another case,
// which encoding/json matches too) is refused, naming it: the decoder kept
// the last copy, or merged two sections field by field, so the first copy
// silently did nothing.
func TestParseRefusesARepeatedSetting(t *testing.T) {
	f := func(in, path string) {
		t.Helper()
		c, err := Parse([]byte(in))
		var fe *FieldError
		if c != nil || !errors.As(err, &fe) || fe.Path != path || !strings.Contains(fe.Msg, "repeated") {
			t.Fatalf("Parse(%s): err %v, want a repeated key at %q", in, err, path)
		}
	}
	f(`{"workers":[{"id":"a","url":"http://127.0.0.1:1"}],"workers":[{"id":"b","url":"http://127.0.0.1:2"}]}`, "workers")
	f(`{"timeouts":{"stream_idle_s":5},"debug":{},"timeouts":{"non_stream_total_s":5}}`, "timeouts")
	f(`{"timeouts":{"stream_idle_s":5,"stream_idle_s":6}}`, "timeouts.stream_idle_s")
	f(`{"workers":[{"id":"a","url":"http://127.0.0.1:1"},{"id":"b","url":"http://127.0.0.1:2","ID":"c"}]}`, "workers[1].ID")
	f(`{"Timeouts":{},"timeouts":{}}`, "timeouts")
	f(`{"canary":{"enabled":true,"rules":[{"model":"*","targets":[{"service":"a","weight":1,"weight":0}]}]}}`, "canary.rules[0].targets[0].weight")

	// The same name in different objects is no repeat.
	if _, err := Parse([]byte(`{"workers":[{"id":"a","url":"http://127.0.0.1:1"},{"id":"b","url":"http://127.0.0.1:2"}],"session_affinity":{"ttl_s":5},"prefix_index":{"ttl_s":5}}`)); err != nil {
		t.Fatal(err)
	}
}

// The poll sees a file replaced by one of the same size whose modification
// time was kept (cp -p, rsync -t, tar, an install that preserves times):
// it compared only the size and the modification time, so the new config
// was never loaded (until a SIGHUP). The change time and the inode, which
// no copy keeps, are compared too.
func TestPollSeesAReplacementThatKeptSizeAndMtime(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.json")
	if err := os.WriteFile(path, []byte(`{"load_balancing":{"algorithm":"round-robin" }}`), 0o644); err != nil {
		t.Fatal(err)
	}
	old, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go s.Watch(20*time.Millisecond, stop)
	time.Sleep(100 * time.Millisecond)
	// Same length as the first document, same modification time, renamed
	// into place as rsync does.
	tmp := filepath.Join(dir, ".c.json.tmp")
	if err := os.WriteFile(tmp, []byte(`{"load_balancing":{"algorithm":"least-tokens"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, old.ModTime(), old.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for s.Load().LoadBalancing.Algorithm != "least-tokens" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := s.Load().LoadBalancing.Algorithm; got != "least-tokens" {
		t.Fatalf("2 s after the replacement the config still says %q", got)
	}
}
