package config

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func openTemp(t *testing.T, doc string) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(path, []byte(doc), 0o640); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return s, path
}

func withAlg(c *Config, alg string) *Config {
	n := *c
	n.LoadBalancing.Algorithm = alg
	return &n
}

func TestApplyWritesFileBackAndRestartKeepsIt(t *testing.T) {
	s, path := openTemp(t, `{"load_balancing":{"algorithm":"round-robin"}}`)
	cfg, v := s.Current()
	if v != 1 {
		t.Fatalf("initial version %d", v)
	}
	var hooks int
	s.OnChange(func(old, cur *Config) { hooks++ })
	nv, err := s.Apply(withAlg(cfg, "least-tokens"), v)
	if err != nil || nv != 2 || s.Version() != 2 {
		t.Fatalf("apply: v=%d err=%v", nv, err)
	}
	if s.Load().LoadBalancing.Algorithm != "least-tokens" || hooks != 1 {
		t.Fatalf("not swapped: %q hooks=%d", s.Load().LoadBalancing.Algorithm, hooks)
	}
	// Our own write is not seen as a change by the watcher or SIGHUP.
	if ok, err := s.Reload(); ok || err != nil {
		t.Fatalf("reload after own write: %v %v", ok, err)
	}
	if s.Version() != 2 {
		t.Fatalf("version moved to %d", s.Version())
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("permissions not kept: %v %v", fi.Mode(), err)
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("temporary files left behind: %v", ents)
	}
	s2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s2.Load(), s.Load()) {
		t.Fatalf("restart lost the write:\n%+v\n%+v", s2.Load(), s.Load())
	}
}

func TestApplyStaleVersionConflicts(t *testing.T) {
	s, path := openTemp(t, `{}`)
	cfg, v := s.Current()
	if _, err := s.Apply(withAlg(cfg, "round-robin"), v); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	_, err := s.Apply(withAlg(cfg, "least-tokens"), v)
	var vc *VersionConflict
	if !errors.As(err, &vc) || vc.Want != 1 || vc.Have != 2 {
		t.Fatalf("stale write: %v", err)
	}
	after, _ := os.ReadFile(path)
	if string(before) != string(after) || s.Load().LoadBalancing.Algorithm != "round-robin" {
		t.Fatal("a refused write changed something")
	}
	// Version 0 is an unconditional write.
	if _, err := s.Apply(withAlg(cfg, "least-tokens"), 0); err != nil {
		t.Fatal(err)
	}
}

func TestApplyRefusesInvalidConfig(t *testing.T) {
	s, _ := openTemp(t, `{}`)
	cfg, v := s.Current()
	_, err := s.Apply(withAlg(cfg, "fastest"), v)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Path != "load_balancing.algorithm" {
		t.Fatalf("invalid config: %v", err)
	}
	if s.Version() != v {
		t.Fatal("version moved")
	}
}

func TestHandEditBeatsConcurrentAPIWrite(t *testing.T) {
	s, path := openTemp(t, `{}`)
	cfg, v := s.Current()
	// The operator edits the file; the poll has not noticed yet.
	if err := os.WriteFile(path, []byte(`{"load_balancing":{"algorithm":"round-robin"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := s.Apply(withAlg(cfg, "least-tokens"), v)
	var vc *VersionConflict
	if !errors.As(err, &vc) {
		t.Fatalf("API write over an unseen hand edit: %v", err)
	}
	if s.Load().LoadBalancing.Algorithm != "round-robin" || s.Version() != 2 {
		t.Fatalf("hand edit not picked up: %q v%d", s.Load().LoadBalancing.Algorithm, s.Version())
	}
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), "round-robin") {
		t.Fatal("hand edit overwritten")
	}
	// A broken hand edit refuses API writes even unconditional ones.
	if err := os.WriteFile(path, []byte(`{"load_balancing":`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = s.Apply(withAlg(cfg, "least-tokens"), 0)
	if !errors.As(err, &vc) || !strings.Contains(err.Error(), "does not parse") {
		t.Fatalf("write over a broken hand edit: %v", err)
	}
	if data, _ := os.ReadFile(path); string(data) != `{"load_balancing":` {
		t.Fatal("broken hand edit overwritten")
	}
}

func TestReloadSinkReceivesFileChanges(t *testing.T) {
	s, path := openTemp(t, `{}`)
	var got []*Config
	fail := true
	s.SetReloadSink(func(c *Config, _ bool) error {
		if fail {
			return errors.New("storage down")
		}
		got = append(got, c)
		return nil
	})
	os.WriteFile(path, []byte(`{"load_balancing":{"algorithm":"round-robin"}}`), 0o644)
	if ok, err := s.Reload(); ok || err == nil {
		t.Fatalf("failed sink reported success: %v %v", ok, err)
	}
	fail = false
	if ok, err := s.Reload(); !ok || err != nil {
		t.Fatalf("retry after a failed sink: %v %v", ok, err)
	}
	if len(got) != 1 || got[0].LoadBalancing.Algorithm != "round-robin" {
		t.Fatalf("sink got %v", got)
	}
	if s.Load().LoadBalancing.Algorithm != "least-requests" || s.Version() != 1 {
		t.Fatal("a sink reload swapped locally")
	}
	s.Replace(got[0], 7)
	if c, v := s.Current(); v != 7 || c != got[0] {
		t.Fatalf("replace: v%d", v)
	}
}

func TestMarshalFileRoundTrips(t *testing.T) {
	// Every setting must survive write-back: a type that does not marshal
	// to what Parse reads would corrupt the config file on the first admin
	// write.
	c := Default()
	c.Workers = []WorkerSpec{{ID: "a", URL: "http://127.0.0.1:1", Models: []string{"m"}, Role: "mixed"}}
	c.Canary = Canary{Enabled: true, Rules: []CanaryRule{{Model: "*", Targets: []CanaryTarget{{Service: "s", Weight: 3}}}}}
	data, err := MarshalFile(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(data)
	if err != nil {
		t.Fatalf("written config does not parse: %v\n%s", err, data)
	}
	if !reflect.DeepEqual(c, back) {
		t.Fatalf("round trip changed the config:\n%+v\n%+v", c, back)
	}
}

func TestBackupValidate(t *testing.T) {
	f := func(b Backup, path string) {
		t.Helper()
		err := b.Validate()
		var fe *FieldError
		switch {
		case path == "" && err != nil:
			t.Fatalf("%+v: %v", b, err)
		case path != "" && (!errors.As(err, &fe) || fe.Path != path):
			t.Fatalf("%+v: got %v, want error at %s", b, err, path)
		}
	}
	f(DefaultBackup(), "")
	f(Backup{IntervalSeconds: 0, Keep: 1}, "backup.interval_s")
	f(Backup{IntervalSeconds: 0.5, Keep: 1}, "backup.interval_s")
	f(Backup{IntervalSeconds: 1e300, Keep: 1}, "backup.interval_s")
	f(Backup{IntervalSeconds: 60, Keep: 0}, "backup.keep")
	f(Backup{IntervalSeconds: 60, Keep: MaxBackupKeep + 1}, "backup.keep")
}

func TestMarshalFileKeepsLiteralSecretsAndReferences(t *testing.T) {
	t.Setenv("INFERA_TEST_MIRROR_TOKEN", "tok-from-env")
	doc := `{"mirror":{"enabled":true,"target_address":"http://127.0.0.1:9","sampling_ratio":5,"timeout_ms":1000,"queue_size":8,"concurrency":2,"auth_token":"env:INFERA_TEST_MIRROR_TOKEN"},
	  "split_proxy":{"enabled":true,"strategy":"weight","proxies":[{"local":true,"weight":1},{"name":"ext","address":"http://127.0.0.1:10","api_key":"sk-literal-1","weight":1}]}}`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	data, err := MarshalFile(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"sk-literal-1"`) || !strings.Contains(string(data), `"env:INFERA_TEST_MIRROR_TOKEN"`) {
		t.Fatalf("secrets not written as given:\n%s", data)
	}
	back, err := Parse(data)
	if err != nil {
		t.Fatalf("written config does not parse: %v", err)
	}
	if !reflect.DeepEqual(c, back) {
		t.Fatal("round trip changed the config")
	}
	var paths []string
	if _, err := EncodeJSON(c, func(path, key string) (string, error) {
		paths = append(paths, path+"="+key)
		return "sealed", nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(paths) != 1 || paths[0] != "split_proxy.proxies[1].api_key=sk-literal-1" {
		t.Fatalf("literal callback saw %v", paths)
	}
}

// A config file that disappears (deleted, an unmounted volume) is logged
// once by the poll, not silently ignored; the config serving stays.
// A broken edit, reverted, then made again is a new edit: refused,
// logged and counted again (the revert used to leave the broken bytes
// marked as already reported, and the second time went unnoticed).
func TestABrokenEditMadeAgainAfterARevertIsReportedAgain(t *testing.T) {
	good := `{"load_balancing":{"algorithm":"round-robin"}}`
	bad := `{"load_balancing":{"algorithm":"nope"}}`
	s, path := openTemp(t, good)
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(doc), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	write(bad)
	if _, err := s.Reload(); err == nil {
		t.Fatal("the broken edit was not refused")
	}
	write(good)
	if _, err := s.Reload(); err != nil || s.Refused() != nil {
		t.Fatalf("the revert: %v, refused %v", err, s.Refused())
	}
	write(bad)
	failed := reloadsFailed.Get()
	if _, err := s.Reload(); err == nil {
		t.Fatal("the same broken edit, made again, was not refused")
	}
	if reloadsFailed.Get() != failed+1 || s.Refused() == nil {
		t.Fatalf("not counted (%d) or not marked refused (%v)", reloadsFailed.Get()-failed, s.Refused())
	}
	if s.Load().LoadBalancing.Algorithm != "round-robin" {
		t.Fatal("the config serving changed")
	}
}

func TestWatchLogsAConfigFileThatDisappearsOnce(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	logged := func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }
	path := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(path, []byte(`{"load_balancing":{"algorithm":"round-robin"}}`), 0o644)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go s.Watch(10*time.Millisecond, stop)
	failed := reloadsFailed.Get()
	os.Remove(path)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logged(), "config file unreadable") {
		if time.Now().After(deadline) {
			t.Fatalf("the missing file was not logged:\n%s", logged())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(150 * time.Millisecond) // 15 more polls
	if n := strings.Count(logged(), "config file unreadable"); n != 1 {
		t.Fatalf("logged %d times:\n%s", n, logged())
	}
	if n := reloadsFailed.Get() - failed; n != 1 {
		t.Fatalf("infera_config_reloads_total{result=\"error\"} rose by %d, want 1 (once per disappearance)", n)
	}
	if s.Load().LoadBalancing.Algorithm != "round-robin" {
		t.Fatal("the config serving changed")
	}
	os.WriteFile(path, []byte(`{"load_balancing":{"algorithm":"round-robin"}}`), 0o644)
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(logged(), "config file readable again") {
		if time.Now().After(deadline) {
			t.Fatalf("the file's return was not logged:\n%s", logged())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A reload asked for (SIGHUP) resolves env: and file: references again
// though the file's bytes did not change: rotating a key is "change the
// file the reference names, then reload" (the old key was kept until an
// unrelated edit of the config file).
func TestAReloadAskedForReadsARotatedSecretFile(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	os.WriteFile(keyFile, []byte("sk-ONE\n"), 0o600)
	path := filepath.Join(dir, "c.json")
	os.WriteFile(path, []byte(`{"mirror":{"enabled":true,"target_address":"http://127.0.0.1:9","auth_token":"file:`+keyFile+`"}}`), 0o644)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Load().Mirror.AuthToken.Reveal(); got != "sk-ONE" {
		t.Fatalf("token %q", got)
	}
	os.WriteFile(keyFile, []byte("sk-TWO\n"), 0o600)
	if changed, err := s.Reload(); changed || err != nil { // the poll: the file is the same
		t.Fatalf("poll reload: %v %v", changed, err)
	}
	if changed, err := s.ReloadAsked(); !changed || err != nil {
		t.Fatalf("asked reload: %v %v", changed, err)
	}
	if got := s.Load().Mirror.AuthToken.Reveal(); got != "sk-TWO" {
		t.Fatalf("token after SIGHUP %q, want the rotated one", got)
	}
}

// A rotation refused (the key file held a bad key) is retried by the next
// reload asked for once the key file is fixed: the refusal of the
// unchanged config file was answered again at every SIGHUP, the key file
// never read again, and the old key kept being sent until the config file
// itself changed.
func TestAReloadAskedForAfterARefusedRotationReadsTheFixedSecretFile(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	os.WriteFile(keyFile, []byte("sk-ONE\n"), 0o600)
	path := filepath.Join(dir, "c.json")
	os.WriteFile(path, []byte(`{"mirror":{"enabled":true,"target_address":"http://127.0.0.1:9","auth_token":"file:`+keyFile+`"}}`), 0o644)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(keyFile, []byte("sk TWO with spaces\n"), 0o600)
	if changed, err := s.ReloadAsked(); changed || err == nil {
		t.Fatalf("a bad key was taken: %v %v", changed, err)
	}
	os.WriteFile(keyFile, []byte("sk-THREE\n"), 0o600)
	if changed, err := s.ReloadAsked(); !changed || err != nil {
		t.Fatalf("reload asked for after the key file was fixed: %v %v", changed, err)
	}
	if got := s.Load().Mirror.AuthToken.Reveal(); got != "sk-THREE" {
		t.Fatalf("token %q, want the fixed key file's", got)
	}
}

// A reload asked for on an unchanged file whose references resolve to the
// same keys as before (a SIGHUP for log rotation or a certificate renewal)
// makes no new version: it made one at every SIGHUP, so every ETag an
// operator held went stale and their next write got 409.
func TestASIGHUPThatRotatesNoKeyMakesNoVersion(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	os.WriteFile(keyFile, []byte("sk-ONE\n"), 0o600)
	path := filepath.Join(dir, "c.json")
	os.WriteFile(path, []byte(`{"mirror":{"enabled":true,"target_address":"http://127.0.0.1:9","auth_token":"file:`+keyFile+`"}}`), 0o644)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := s.ReloadAsked(); changed || err != nil || s.Version() != 1 {
		t.Fatalf("SIGHUP rotating nothing: changed %v, err %v, version %d", changed, err, s.Version())
	}
	os.WriteFile(keyFile, []byte("sk-TWO\n"), 0o600)
	if changed, err := s.ReloadAsked(); !changed || err != nil || s.Version() != 2 || s.Load().Mirror.AuthToken.Reveal() != "sk-TWO" {
		t.Fatalf("SIGHUP after a rotation: changed %v, err %v, version %d", changed, err, s.Version())
	}
}

// FileServes: the file holds what serves once a refused edit is reverted,
// not while the refused bytes or a change the sink could not store are in
// it, nor while it is missing.
func TestFileServesFollowsWhatTheFileHolds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	good := []byte(`{}`)
	os.WriteFile(path, good, 0o644)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if !s.FileServes() {
		t.Fatal("the file read at start does not serve")
	}
	os.WriteFile(path, []byte(`{"debug":{"decision_header":"yes"}}`), 0o644)
	if _, err := s.ReloadAsked(); err == nil || s.FileServes() {
		t.Fatalf("a refused edit serves (%v)", err)
	}
	os.WriteFile(path, good, 0o644)
	if !s.FileServes() {
		t.Fatal("the reverted file does not serve")
	}
	os.Remove(path)
	if s.FileServes() {
		t.Fatal("a missing file serves")
	}
	s.SetReloadSink(func(*Config, bool) error { return errors.New("redis down") })
	os.WriteFile(path, []byte(`{"debug":{"decision_header":true}}`), 0o644)
	if _, err := s.ReloadAsked(); err == nil || s.FileServes() {
		t.Fatalf("a change the sink could not store serves (%v)", err)
	}
	// A rotation the sink could not store.
	keyFile := filepath.Join(t.TempDir(), "key")
	os.WriteFile(keyFile, []byte("sk-ONE"), 0o600)
	ref := []byte(`{"mirror":{"enabled":true,"target_address":"http://127.0.0.1:9","auth_token":"file:` + keyFile + `"}}`)
	os.WriteFile(path, ref, 0o644)
	s.SetReloadSink(nil)
	if ok, err := s.ReloadAsked(); !ok || err != nil || !s.FileServes() {
		t.Fatalf("the file with a reference: %v %v, serves %v", ok, err, s.FileServes())
	}
	s.SetReloadSink(func(*Config, bool) error { return errors.New("redis down") })
	os.WriteFile(keyFile, []byte("sk-TWO"), 0o600)
	if _, err := s.ReloadAsked(); err == nil || s.FileServes() {
		t.Fatalf("a rotation the sink could not store serves (%v)", err)
	}
}
